// Symmetric block quantisation: what compressed collectives put on the wire
// between nodes (algorithms/net/net_compressed.cpp).
//
// A buffer of `count` elements is cut into blocks of `block` elements; each
// block gets one float32 scale (its largest finite magnitude / L) and one
// code per element, round(x / scale) in [-L, L]:
//   int8: L = 126, one byte per element;
//   int4: L = 6, two elements per byte (element i in byte i/2, low nibble
//         first).
// The remaining codes carry non-finite values exactly: +Inf (L+1), -Inf
// (-(L+1)) and NaN (-(L+2)); a gradient that overflowed stays Inf/NaN
// instead of turning into an ordinary number.
// Wire layout: the scales (float32, one per block), then the codes.
// Error bound per element: |dequantize(quantize(x)) - x| <= scale / 2
// (+ float32 rounding), scale = max |finite x in its block| / L.
// float32, bfloat16 and float16 only (compressible()); bf16/fp16 are read and
// written through float32.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace rsdp {

enum class QuantBits : uint8_t { kNone = 0, kInt4 = 4, kInt8 = 8 };

const char* quant_name(QuantBits b);  // "none", "int4", "int8"

inline bool compressible(DType dt) {
  return dt == DType::kFloat32 || dt == DType::kBFloat16 || dt == DType::kFloat16;
}

// Bytes of the quantised form of `count` elements.
size_t quant_bytes(size_t count, QuantBits bits, size_t block);

void quantize(const void* in, DType dt, size_t count, QuantBits bits, size_t block, void* out);
// out (dtype dt, count elements) = the values `q` encodes.
void dequantize(const void* q, size_t count, QuantBits bits, size_t block, DType dt, void* out);
// Error feedback: quantises in + residual (float32, count elements) and
// leaves in the residual what that loses, so it is added to the next call's
// values instead of being lost. residual == nullptr: plain quantize().
void quantize_feedback(const void* in, DType dt, size_t count, QuantBits bits, size_t block,
                       float* residual, void* out);
// acc[i] += the value `q` encodes for element i (for reductions in float32).
void dequantize_add(const void* q, size_t count, QuantBits bits, size_t block, float* acc);
// acc[i] += in[i] exactly (bf16/fp16 widened), and the way back (rounded to
// nearest even once): the exact parts of a compressed reduction.
void add_widened(const void* in, DType dt, size_t count, float* acc);
void store_narrowed(const float* acc, size_t count, DType dt, void* out);

}  // namespace rsdp

// Block quantisation kernels (the format is in quantize.h).
//
// Each block is two passes over its elements: the largest finite magnitude,
// then the codes. Both are branch-free loops GCC vectorises (non-finite
// values are selected with compares, not branches); the entry points are
// built for AVX-512 / AVX2 / baseline and picked at load time, as the
// reduction kernels are (reduce_kernels.cpp).
#include "core/quantize.h"

#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#include <algorithm>

#include "core/half_convert.h"
#include "core/target_clones.h"

namespace rsdp {
namespace {

struct F32 {
  using S = float;
  static RSDP_AI float ld(S v) { return v; }
  static RSDP_AI S st(float v) { return v; }
};
struct BF16 {
  using S = uint16_t;
  static RSDP_AI float ld(S v) { return bf16_to_f32(v); }
  static RSDP_AI S st(float v) { return f32_to_bf16(v); }
};
struct F16 {
  using S = uint16_t;
  static RSDP_AI float ld(S v) { return f16_to_f32(v); }
  static RSDP_AI S st(float v) { return f32_to_f16(v); }
};

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

template <int L>
RSDP_AI int code_of(float x, float inv) {
  // Round to nearest even by the 1.5 * 2^23 trick (|x * inv| <= L here, far
  // below 2^22): two adds every vector ISA has, where rint needs SSE4.1.
  // A non-finite x gives garbage here and is replaced below.
  constexpr float kMagic = 12582912.f;
  float q = (x * inv + kMagic) - kMagic;
  q = q > L ? L : (q < -L ? -L : q);
  // Non-finite values get their own codes (a NaN compares false with all).
  q = x != x ? -(L + 2) : (x == kInf ? L + 1 : (x == -kInf ? -(L + 1) : q));
  return static_cast<int>(q);
}

template <int L>
RSDP_AI float value_of(int c, float scale) {
  float v = static_cast<float>(c) * scale;
  return c == L + 1 ? kInf : (c == -(L + 1) ? -kInf : (c == -(L + 2) ? kNaN : v));
}

// The largest finite magnitude, as an integer max over the bit patterns
// (for non-negative floats their order is the values'): a reduction GCC
// vectorises, where a float max with NaN handling needs -ffast-math.
template <class Tr>
RSDP_AI float block_scale(const typename Tr::S* x, size_t n, float levels) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t u = f32_bits(Tr::ld(x[i])) & 0x7fffffffu;
    u = u < 0x7f800000u ? u : 0u;  // NaN and Inf do not count
    m = u > m ? u : m;
  }
  return f32_from_bits(m) / levels;
}

template <class Tr, int L, bool kPacked>
RSDP_AI void quantize_t(const void* in, size_t count, size_t block, void* out) {
  using S = typename Tr::S;
  const S* x = static_cast<const S*>(in);
  const size_t nblocks = (count + block - 1) / block;
  float* scales = static_cast<float*>(out);
  uint8_t* codes = reinterpret_cast<uint8_t*>(scales + nblocks);
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t lo = b * block, n = count - lo < block ? count - lo : block;
    float scale = block_scale<Tr>(x + lo, n, static_cast<float>(L));
    // A block below float32's normal range (|x| < ~1e-36) rounds to zero:
    // 1/scale would overflow there.
    if (scale < FLT_MIN) scale = 0.f;
    scales[b] = scale;
    const float inv = scale > 0.f ? 1.f / scale : 0.f;
    if constexpr (!kPacked) {
      int8_t* c = reinterpret_cast<int8_t*>(codes) + lo;
      for (size_t i = 0; i < n; ++i) c[i] = static_cast<int8_t>(code_of<L>(Tr::ld(x[lo + i]), inv));
    } else {
      // block is even, so a block starts on a byte; an odd tail fills the
      // low nibble of the last byte.
      uint8_t* c = codes + lo / 2;
      const size_t pairs = n / 2;
      for (size_t i = 0; i < pairs; ++i) {
        const int a = code_of<L>(Tr::ld(x[lo + 2 * i]), inv);
        const int d = code_of<L>(Tr::ld(x[lo + 2 * i + 1]), inv);
        c[i] = static_cast<uint8_t>((a & 0xF) | ((d & 0xF) << 4));
      }
      if (n & 1) c[pairs] = static_cast<uint8_t>(code_of<L>(Tr::ld(x[lo + n - 1]), inv) & 0xF);
    }
  }
}

RSDP_AI int nibble(uint8_t byte, int hi) {
  const int v = hi ? byte >> 4 : byte & 0xF;
  return v >= 8 ? v - 16 : v;  // sign-extend 4 bits
}

// kAdd: out is a float accumulator (+=); else out is S (=).
template <class Tr, int L, bool kPacked, bool kAdd>
RSDP_AI void dequantize_t(const void* q, size_t count, size_t block, void* out) {
  using S = typename Tr::S;
  const size_t nblocks = (count + block - 1) / block;
  const float* scales = static_cast<const float*>(q);
  const uint8_t* codes = reinterpret_cast<const uint8_t*>(scales + nblocks);
  for (size_t b = 0; b < nblocks; ++b) {
    const size_t lo = b * block, n = count - lo < block ? count - lo : block;
    const float scale = scales[b];
    for (size_t i = 0; i < n; ++i) {
      int c;
      if constexpr (kPacked) c = nibble(codes[(lo + i) / 2], static_cast<int>((lo + i) & 1));
      else c = reinterpret_cast<const int8_t*>(codes)[lo + i];
      const float v = value_of<L>(c, scale);
      if constexpr (kAdd) static_cast<float*>(out)[lo + i] += v;
      else static_cast<S*>(out)[lo + i] = Tr::st(v);
    }
  }
}

template <class Tr>
void quantize_dt(const void* in, size_t count, QuantBits bits, size_t block, void* out) {
  if (bits == QuantBits::kInt8) quantize_t<Tr, 126, false>(in, count, block, out);
  else quantize_t<Tr, 6, true>(in, count, block, out);
}

template <class Tr>
void dequantize_dt(const void* q, size_t count, QuantBits bits, size_t block, void* out) {
  if (bits == QuantBits::kInt8) dequantize_t<Tr, 126, false, false>(q, count, block, out);
  else dequantize_t<Tr, 6, true, false>(q, count, block, out);
}

RSDP_CLONES void quantize_f32(const void* in, size_t n, QuantBits b, size_t bl, void* out) {
  quantize_dt<F32>(in, n, b, bl, out);
}
RSDP_CLONES void quantize_bf16(const void* in, size_t n, QuantBits b, size_t bl, void* out) {
  quantize_dt<BF16>(in, n, b, bl, out);
}
RSDP_CLONES void quantize_f16(const void* in, size_t n, QuantBits b, size_t bl, void* out) {
  quantize_dt<F16>(in, n, b, bl, out);
}
RSDP_CLONES void dequantize_f32(const void* q, size_t n, QuantBits b, size_t bl, void* out) {
  dequantize_dt<F32>(q, n, b, bl, out);
}
RSDP_CLONES void dequantize_bf16(const void* q, size_t n, QuantBits b, size_t bl, void* out) {
  dequantize_dt<BF16>(q, n, b, bl, out);
}
RSDP_CLONES void dequantize_f16(const void* q, size_t n, QuantBits b, size_t bl, void* out) {
  dequantize_dt<F16>(q, n, b, bl, out);
}
template <class Tr>
RSDP_AI void add_t(const void* in, size_t n, float* acc) {
  const auto* x = static_cast<const typename Tr::S*>(in);
  for (size_t i = 0; i < n; ++i) acc[i] += Tr::ld(x[i]);
}
template <class Tr>
RSDP_AI void store_t(const float* acc, size_t n, void* out) {
  auto* y = static_cast<typename Tr::S*>(out);
  for (size_t i = 0; i < n; ++i) y[i] = Tr::st(acc[i]);
}
RSDP_CLONES void add_widened_any(const void* in, DType dt, size_t n, float* acc) {
  if (dt == DType::kFloat32) add_t<F32>(in, n, acc);
  else if (dt == DType::kBFloat16) add_t<BF16>(in, n, acc);
  else add_t<F16>(in, n, acc);
}
RSDP_CLONES void store_narrowed_any(const float* acc, size_t n, DType dt, void* out) {
  if (dt == DType::kFloat32) store_t<F32>(acc, n, out);
  else if (dt == DType::kBFloat16) store_t<BF16>(acc, n, out);
  else store_t<F16>(acc, n, out);
}
RSDP_CLONES void dequantize_add_f32(const void* q, size_t n, QuantBits b, size_t bl, float* acc) {
  if (b == QuantBits::kInt8) dequantize_t<F32, 126, false, true>(q, n, bl, acc);
  else dequantize_t<F32, 6, true, true>(q, n, bl, acc);
}

}  // namespace

const char* quant_name(QuantBits b) {
  switch (b) {
    case QuantBits::kNone: return "none";
    case QuantBits::kInt4: return "int4";
    case QuantBits::kInt8: return "int8";
  }
  return "?";
}

size_t quant_bytes(size_t count, QuantBits bits, size_t block) {
  const size_t nblocks = (count + block - 1) / block;
  const size_t codes = bits == QuantBits::kInt8 ? count : (count + 1) / 2;
  return nblocks * sizeof(float) + codes;
}

void quantize(const void* in, DType dt, size_t count, QuantBits bits, size_t block, void* out) {
  if (count == 0) return;
  switch (dt) {
    case DType::kFloat32: return quantize_f32(in, count, bits, block, out);
    case DType::kBFloat16: return quantize_bf16(in, count, bits, block, out);
    case DType::kFloat16: return quantize_f16(in, count, bits, block, out);
    default: return;  // callers check compressible()
  }
}

void dequantize(const void* q, size_t count, QuantBits bits, size_t block, DType dt, void* out) {
  if (count == 0) return;
  switch (dt) {
    case DType::kFloat32: return dequantize_f32(q, count, bits, block, out);
    case DType::kBFloat16: return dequantize_bf16(q, count, bits, block, out);
    case DType::kFloat16: return dequantize_f16(q, count, bits, block, out);
    default: return;
  }
}

void dequantize_add(const void* q, size_t count, QuantBits bits, size_t block, float* acc) {
  if (count == 0) return;
  dequantize_add_f32(q, count, bits, block, acc);
}

void add_widened(const void* in, DType dt, size_t count, float* acc) {
  if (count) add_widened_any(in, dt, count, acc);
}

void store_narrowed(const float* acc, size_t count, DType dt, void* out) {
  if (count) store_narrowed_any(acc, count, dt, out);
}

void quantize_feedback(const void* in, DType dt, size_t count, QuantBits bits, size_t block,
                       float* residual, void* out) {
  if (!residual) return quantize(in, dt, count, bits, block, out);
  std::vector<float> x(residual, residual + count);
  add_widened(in, dt, count, x.data());
  quantize(x.data(), DType::kFloat32, count, bits, block, out);
  std::fill(residual, residual + count, 0.f);
  dequantize_add(out, count, bits, block, residual);
  for (size_t i = 0; i < count; ++i) residual[i] = x[i] - residual[i];
}

}  // namespace rsdp

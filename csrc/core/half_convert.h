// Hand-written float32 <-> bfloat16 / float16 conversions (no torch, no F16C).
//
// All functions are branch-free (every path is computed, then selected) so
// that GCC can vectorise loops that call them. Rounding is round-to-nearest-
// even, NaN stays NaN (quieted), +-inf and fp16 subnormals are exact.
// The fp16 subnormal paths use one float add/sub whose operands are normal
// floats (or float subnormals that must flush to 0 anyway), so they are exact
// in the default rounding mode and unaffected by FTZ/DAZ.
#pragma once

#include <cstdint>
#include <cstring>

// Forced inlining: the kernels call these inside hot loops, and a single
// out-of-line call blocks vectorisation (GCC's size heuristics give up on the
// big multiversioned kernel bodies otherwise).
#if defined(__GNUC__)
#define RSDP_HALF_INLINE inline __attribute__((always_inline))
#else
#define RSDP_HALF_INLINE inline
#endif

namespace rsdp {

RSDP_HALF_INLINE float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

RSDP_HALF_INLINE uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

// Branch-free select. The fp16 paths use it instead of ?: because GCC would
// otherwise sink the (possibly trapping) float op of the subnormal path into a
// branch, and then refuse to vectorise the loop ("control flow in loop").
RSDP_HALF_INLINE uint32_t select_u32(bool c, uint32_t x, uint32_t y) {
  const uint32_t m = 0u - uint32_t(c);
  return (x & m) | (y & ~m);
}

// ---- bfloat16: the top half of a float32 --------------------------------

RSDP_HALF_INLINE float bf16_to_f32(uint16_t h) { return f32_from_bits(uint32_t(h) << 16); }

RSDP_HALF_INLINE uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_bits(f);
  // RNE: add 0x7FFF plus the lowest kept bit, then truncate. Cannot overflow
  // 32 bits for non-NaN input; the max finite values correctly carry into inf.
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  // NaN: truncating could clear every mantissa bit (-> inf), so set the quiet bit.
  const uint32_t nan = (u >> 16) | 0x0040u;
  return uint16_t((u & 0x7FFFFFFFu) > 0x7F800000u ? nan : rounded);
}

// ---- IEEE binary16 ---------------------------------------------------------

RSDP_HALF_INLINE float f16_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t em = uint32_t(h & 0x7FFFu) << 13;  // exponent+mantissa in float position
  const uint32_t exp = em & 0x0F800000u;             // the 5 fp16 exponent bits
  const uint32_t normal = em + (uint32_t(127 - 15) << 23);  // rebias 15 -> 127
  const uint32_t infnan = em + (uint32_t(255 - 31) << 23);  // exponent 31 -> 255, payload kept
  // Subnormal m * 2^-24: build 2^-14 * (1 + m/1024) and subtract 2^-14 (exact).
  const float magic = f32_from_bits(113u << 23);  // 2^-14
  const uint32_t sub = f32_bits(f32_from_bits(em + (113u << 23)) - magic);
  const uint32_t r = select_u32(exp == 0x0F800000u, infnan, select_u32(exp == 0, sub, normal));
  return f32_from_bits(r | sign);
}

RSDP_HALF_INLINE uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const uint32_t a = u & 0x7FFFFFFFu;
  // Normal result: rebias the exponent and round at bit 13 (RNE). Values in
  // [65520, 65536) carry into the exponent and correctly become inf.
  const uint32_t normal =
      (a - (uint32_t(127 - 15) << 23) + 0x0FFFu + ((a >> 13) & 1u)) >> 13;
  // Subnormal result (|f| < 2^-14): adding 0.5f puts the fp16 quantum 2^-24 at
  // the float's last mantissa bit, so the FPU's RNE does the rounding for us.
  const uint32_t sub = f32_bits(f32_from_bits(a) + 0.5f) - f32_bits(0.5f);
  // |f| >= 65536 (or inf/NaN): inf, or a quiet NaN keeping the top payload bits.
  const uint32_t infnan = a > 0x7F800000u ? (0x7E00u | ((a >> 13) & 0x03FFu)) : 0x7C00u;
  const uint32_t r = select_u32(a >= 0x47800000u, infnan, select_u32(a < 0x38800000u, sub, normal));
  return uint16_t(r | sign);
}

}  // namespace rsdp

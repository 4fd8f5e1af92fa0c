// Hand-written float32 <-> bfloat16 / float16 conversions (no torch, no F16C).
//
// All functions are branch-free (every path is computed, then selected) so
// that GCC can vectorise loops that call them. Rounding is round-to-nearest-
// even, NaN stays NaN (narrowing quiets it), +-inf and fp16 subnormals are
// exact. Checked on all 2^32 floats (fp16: bit-identical to F16C vcvtps2ph,
// NaN payloads included; bf16: against an exact reference).
// The fp16 paths use a float add/sub whose operands and results are normal
// floats (an input float subnormal only ever rounds to 0 anyway), so they are
// exact in the default rounding mode and unaffected by FTZ/DAZ.
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

// Branch-free select. The fp16 paths use it instead of ?: where one side comes
// from a float op: with ?: GCC sinks that (possibly trapping) float op into a
// branch and then refuses to vectorise the loop ("control flow in loop").
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
  // Normal: rebias 15 -> 127 by an integer add; exponent 31 (inf/NaN) -> 255.
  const uint32_t normal = em + (exp == 0x0F800000u ? (224u << 23) : (112u << 23));
  // Subnormal m * 2^-24: build 2^-14 * (1 + m/1024) and subtract 2^-14. Both
  // operands and the result are normal floats, so this is exact even under DAZ/FTZ.
  const uint32_t sub = f32_bits(f32_from_bits(em + (113u << 23)) - f32_from_bits(113u << 23));
  return f32_from_bits(select_u32(exp == 0, sub, normal) | sign);
}

RSDP_HALF_INLINE uint16_t f32_to_f16(float f) {
  // The FPU does the rounding (same scheme as Marat Dukhan's FP16 library):
  // add |f| (scaled by 4) to a power of two whose ulp equals 4x the fp16 ulp of
  // f, so the float add rounds |f| to fp16 precision (RNE, subnormals included),
  // then read the fp16 exponent and mantissa out of the sum's bits.
  const uint32_t u = f32_bits(f);
  const uint32_t a = u & 0x7FFFFFFFu;
  // |f| * 2^112 overflows to inf exactly when |f| >= 2^16; the net scale is 4,
  // which is exact and never produces a float subnormal from a normal input.
  // (GCC may fuse "* 2^-110" and the add below into an FMA: same result, as
  // the product is exact.)
  const float base = (f32_from_bits(a) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t e = (a << 1) & 0xFF000000u;   // float exponent in the top byte
  e = e < 0x71000000u ? 0x71000000u : e;  // below fp16 normals: fixed 2^-14 quantum
  const uint32_t bits = f32_bits(f32_from_bits((e >> 1) + 0x07800000u) + base);
  // Low 5 exponent bits of the sum are the fp16 exponent minus one; the 12 low
  // mantissa bits hold the implicit 1 (adds that one back) plus the rounded
  // mantissa, whose carry correctly bumps the exponent (up to inf).
  const uint32_t nonsign = ((bits >> 13) & 0x7C00u) + (bits & 0x0FFFu);
  // NaN: quiet NaN keeping the top payload bits (what F16C's vcvtps2ph does).
  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x03FFu);
  return uint16_t(((u >> 16) & 0x8000u) | select_u32(a > 0x7F800000u, nan, nonsign));
}

}  // namespace rsdp

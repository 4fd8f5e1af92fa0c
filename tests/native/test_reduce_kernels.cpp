// Standalone tests for rsdp::reduce_n and the fp16/bf16 conversions (no torch,
// no gtest). Every kernel result is compared with a plain scalar model that
// shares no code with the kernels except the fp16/bf16 conversions, which are
// themselves checked against independent double-based references first.
//   g++ -O2 -std=c++17 -I csrc tests/native/test_reduce_kernels.cpp csrc/core/reduce_kernels.cpp
//   ./a.out            run the tests; last line "N passed, M failed"
//   ./a.out --bench    memory-bandwidth micro-benchmark instead
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/half_convert.h"
#include "core/reduce_kernels.h"
#include "check.h"

using namespace rsdp;
using Bytes = std::vector<uint8_t>;


static std::mt19937_64 rng(12345);
static const DType kAllTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                                  DType::kInt8, DType::kUInt8, DType::kInt32, DType::kInt64,
                                  DType::kBool, DType::kComplex64, DType::kComplex128};
static const RedOp kAllOps[] = {RedOp::kSum, RedOp::kAvg, RedOp::kProduct, RedOp::kMin,
                                RedOp::kMax, RedOp::kBand, RedOp::kBor, RedOp::kBxor};

template <class T> T get(const Bytes& b, size_t i) { T v; std::memcpy(&v, &b[i * sizeof(T)], sizeof(T)); return v; }
template <class T> void put(Bytes& b, size_t i, T v) { std::memcpy(&b[i * sizeof(T)], &v, sizeof(T)); }

// ---- independent conversion references (exact arithmetic in double) -------
// Rounds finite x to a binary format with `mant` fraction bits and minimum
// normal exponent `emin` (RNE via nearbyint), returns the value (inf on overflow).
static double round_ref(double x, int mant, int emin, double maxval_plus_half_ulp) {
  const double ax = std::fabs(x);
  if (ax >= maxval_plus_half_ulp) return std::copysign(INFINITY, x);
  int e = 0;
  std::frexp(ax, &e);  // ax = m * 2^e, m in [0.5, 1)
  const int q = std::max(e - 1, emin) - mant;
  return std::copysign(std::ldexp(std::nearbyint(std::ldexp(ax, -q)), q), x);
}
static bool same_float(float a, float b) { return std::isnan(a) ? std::isnan(b) : std::memcmp(&a, &b, 4) == 0; }

static void test_conversions() {
  // fp16 -> f32: all 65536 patterns against a field-by-field decoding.
  int bad = 0;
  for (uint32_t h = 0; h < 65536; ++h) {
    const int e = (h >> 10) & 31, m = h & 1023;
    double v = e == 0 ? std::ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : std::ldexp(1024 + m, e - 25);
    if (h & 0x8000) v = -v;
    bad += !same_float(f16_to_f32(uint16_t(h)), float(v));
    const float f = f16_to_f32(uint16_t(h));  // round trip must be exact (NaN stays NaN)
    bad += std::isnan(f) ? !std::isnan(f16_to_f32(f32_to_f16(f))) : f32_to_f16(f) != h;
    const float g = bf16_to_f32(uint16_t(h));
    bad += std::isnan(g) ? !std::isnan(bf16_to_f32(f32_to_bf16(g))) : f32_to_bf16(g) != h;
  }
  CHECK(bad == 0, "%d fp16/bf16 decode or round-trip mismatches", bad);
  // f32 -> fp16 / bf16: a stride through all bit patterns plus edge cases.
  std::vector<uint32_t> pats = {  // zeros, inf/NaN, fp16 overflow/subnormal edges, ties
      0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0x7F800001u, 0xFF800001u,
      0x477FEFFFu, 0x477FF000u, 0x477FFFFFu, 0x47800000u, 0x38800000u, 0x387FFFFFu, 0x33000000u,
      0x33000001u, 0x32FFFFFFu, 0x00000001u, 0x7F7FFFFFu, 0x7F7F8000u, 0x3F808000u, 0x3F818000u};
  for (uint64_t u = 0; u < (1ull << 32); u += 4093) pats.push_back(uint32_t(u));
  int bad16 = 0, badbf = 0;
  for (uint32_t p : pats) {
    const float f = f32_from_bits(p);
    const uint16_t h = f32_to_f16(f), b = f32_to_bf16(f);
    if (std::isnan(f)) {
      bad16 += !std::isnan(f16_to_f32(h)) || (h >> 15) != (p >> 31);
      badbf += !std::isnan(bf16_to_f32(b)) || (b >> 15) != (p >> 31);
      continue;
    }
    bad16 += !same_float(f16_to_f32(h), float(round_ref(f, 10, -14, 65520.0)));
    badbf += !same_float(bf16_to_f32(b), float(round_ref(f, 7, -126, std::ldexp(0x1FF, 119))));
  }
  CHECK(bad16 == 0, "%d f32->fp16 mismatches of %zu", bad16, pats.size());
  CHECK(badbf == 0, "%d f32->bf16 mismatches of %zu", badbf, pats.size());
}

// ---- scalar reference model -------------------------------------------------
template <class T> T fop(RedOp op, T a, T b) {
  switch (op) {
    case RedOp::kProduct: return a * b;
    case RedOp::kMin: return (std::isnan(a) || std::isnan(b)) ? T(NAN) : (b < a ? b : a);
    case RedOp::kMax: return (std::isnan(a) || std::isnan(b)) ? T(NAN) : (b > a ? b : a);
    default: return a + b;  // SUM, AVG
  }
}
template <class T> T iop(RedOp op, T a, T b) {  // wrap-around via 64-bit unsigned
  const uint64_t x = uint64_t(int64_t(a)), y = uint64_t(int64_t(b));
  uint64_t r = 0;
  switch (op) {
    case RedOp::kSum: case RedOp::kAvg: r = x + y; break;  // AVG: divided after the fold
    case RedOp::kProduct: r = x * y; break;
    case RedOp::kMin: return b < a ? b : a;
    case RedOp::kMax: return b > a ? b : a;
    case RedOp::kBand: r = x & y; break;
    case RedOp::kBor: r = x | y; break;
    default: r = x ^ y; break;
  }
  T t;
  std::memcpy(&t, &r, sizeof(T));  // low bytes (little endian)
  return t;
}

// Left-to-right fold of element i over all inputs (stored as L, loaded by ld).
template <class T, class L, class Ld, class Op>
static T fold(const std::vector<Bytes>& in, size_t i, Ld ld, Op op) {
  T a = ld(get<L>(in[0], i));
  for (size_t j = 1; j < in.size(); ++j) a = op(a, ld(get<L>(in[j], i)));
  return a;
}

template <class T> int64_t idiv(T a, bool avg, int div) { return avg ? int64_t(a) / div : int64_t(a); }

// Expected element i of reducing `in`, written to `out`.
static void ref_elem(DType dt, RedOp op, const std::vector<Bytes>& in, size_t i, int div, Bytes& out) {
  const bool avg = op == RedOp::kAvg;
  auto as_is = [](auto v) { return v; };
  auto f = [op](auto a, auto b) { return fop(op, a, b); };
  auto g = [op](auto a, auto b) { return iop(op, a, b); };
  switch (dt) {
    case DType::kFloat32: case DType::kComplex64: {
      const float a = fold<float, float>(in, i, as_is, f);
      return put(out, i, avg ? a / float(div) : a);
    }
    case DType::kFloat64: case DType::kComplex128: {
      const double a = fold<double, double>(in, i, as_is, f);
      return put(out, i, avg ? a / double(div) : a);
    }
    case DType::kFloat16: case DType::kBFloat16: {  // in double, rounded once
      const bool h = dt == DType::kFloat16;
      auto ld = [h](uint16_t v) { return double(h ? f16_to_f32(v) : bf16_to_f32(v)); };
      const double a = fold<double, uint16_t>(in, i, ld, f);
      const float r = float(avg ? a / div : a);
      return put(out, i, h ? f32_to_f16(r) : f32_to_bf16(r));
    }
    case DType::kBool: {
      const bool any = op == RedOp::kSum || op == RedOp::kMax || op == RedOp::kBor;
      auto b = [&](bool x, bool y) { return any ? (x || y) : op == RedOp::kBxor ? x != y : (x && y); };
      return put(out, i, uint8_t(fold<bool, uint8_t>(in, i, [](uint8_t v) { return v != 0; }, b)));
    }
    // AVG: the wrapped sum, divided once, truncating toward zero (NCCL's integer average)
    case DType::kInt8: return put(out, i, int8_t(idiv(fold<int8_t, int8_t>(in, i, as_is, g), avg, div)));
    case DType::kUInt8: return put(out, i, uint8_t(idiv(fold<uint8_t, uint8_t>(in, i, as_is, g), avg, div)));
    case DType::kInt32: return put(out, i, int32_t(idiv(fold<int32_t, int32_t>(in, i, as_is, g), avg, div)));
    case DType::kInt64: return put(out, i, int64_t(idiv(fold<int64_t, int64_t>(in, i, as_is, g), avg, div)));
  }
}

// Bitwise equality, except that any NaN matches any NaN.
static bool same_elem(DType dt, const Bytes& a, const Bytes& b, size_t i) {
  switch (dt) {
    case DType::kFloat32: case DType::kComplex64: return same_float(get<float>(a, i), get<float>(b, i));
    case DType::kFloat64: case DType::kComplex128: {
      const double x = get<double>(a, i), y = get<double>(b, i);
      return std::isnan(x) ? std::isnan(y) : std::memcmp(&x, &y, 8) == 0;
    }
    case DType::kFloat16: return same_float(f16_to_f32(get<uint16_t>(a, i)), f16_to_f32(get<uint16_t>(b, i)));
    case DType::kBFloat16: return same_float(bf16_to_f32(get<uint16_t>(a, i)), bf16_to_f32(get<uint16_t>(b, i)));
    default: return std::memcmp(&a[i * dtype_size(dt)], &b[i * dtype_size(dt)], dtype_size(dt)) == 0;
  }
}

// Random inputs. fp16/bf16 get k * 2^e, |k| <= 15 (<= 3 beyond 5 sources), so
// float32 accumulation, products included, is exact and the double reference
// sees the same value before the single final rounding.
static Bytes random_input(DType dt, size_t count, int nsrc) {
  const int kmax = nsrc <= 5 ? 15 : 3;
  const size_t es = dtype_size(dt), n = dtype_is_complex(dt) ? 2 * count : count;
  Bytes b(count * es);
  std::uniform_real_distribution<double> u(-100.0, 100.0);
  for (size_t i = 0; i < n; ++i) {
    if (dt == DType::kFloat32 || dt == DType::kComplex64) put(b, i, float(u(rng)));
    else if (dt == DType::kFloat64 || dt == DType::kComplex128) put(b, i, u(rng));
    else if (dt == DType::kFloat16 || dt == DType::kBFloat16) {
      const float v = std::ldexp(float(int(rng() % (2 * kmax + 1)) - kmax), int(rng() % 9) - 4);
      put(b, i, dt == DType::kFloat16 ? f32_to_f16(v) : f32_to_bf16(v));
    } else if (dt == DType::kBool) put(b, i, uint8_t(rng() & 1));
  }
  if (dtype_is_integral(dt) && dt != DType::kBool)
    for (auto& x : b) x = uint8_t(rng());
  return b;
}

// Runs reduce_n on copies of `in` placed at element offset `off` (to test
// misalignment), with dst separate (alias -1), dst == srcs[alias], or (-2) one
// buffer as dst and every source (inputs must then be equal). Checks that
// nothing beyond `count` elements of dst is touched.
static Bytes run_kernel(DType dt, RedOp op, const std::vector<Bytes>& in, size_t count, int alias,
                        size_t off, int div, bool* tail_ok) {
  const size_t es = dtype_size(dt), pad = 64;
  std::vector<Bytes> bufs;
  std::vector<const void*> ptrs;
  for (const Bytes& b : in) {
    bufs.emplace_back(off * es + b.size() + pad, uint8_t(0xA5));
    if (!b.empty()) std::memcpy(bufs.back().data() + off * es, b.data(), b.size());
  }
  Bytes sep(off * es + count * es + pad, uint8_t(0xA5));
  for (Bytes& b : bufs) ptrs.push_back((alias == -2 ? bufs[0] : b).data() + off * es);
  Bytes& d = alias == -1 ? sep : bufs[size_t(std::max(alias, 0))];
  reduce_n(d.data() + off * es, ptrs.data(), int(in.size()), count, dt, op, div);
  *tail_ok = true;
  for (size_t k = off * es + count * es; k < d.size(); ++k) *tail_ok &= d[k] == 0xA5;
  return Bytes(d.begin() + long(off * es), d.begin() + long(off * es + count * es));
}

static void check_case(DType dt, RedOp op, const std::vector<Bytes>& in, size_t count, int alias,
                       size_t off, int div, const char* what) {
  Bytes want(count * dtype_size(dt));
  const size_t n = dtype_is_complex(dt) ? 2 * count : count;
  for (size_t i = 0; i < n; ++i) ref_elem(dt, op, in, i, div, want);
  bool tail_ok = false;
  Bytes got = run_kernel(dt, op, in, count, alias, off, div, &tail_ok);
  size_t bad = n;
  for (size_t i = 0; i < n && bad == n; ++i)
    if (!same_elem(dt, want, got, i)) bad = i;
  CHECK(bad == n && tail_ok, "%s %s %s nsrc=%zu count=%zu alias=%d: first mismatch at %zu, tail %s",
        what, dtype_name(dt), redop_name(op), in.size(), count, alias, bad, tail_ok ? "ok" : "CLOBBERED");
}

// Every dtype x supported op x nsrc x count x aliasing (dst at the first, last
// or a middle source). count 1000 runs on buffers misaligned by one element.
static void test_matrix() {
  for (DType dt : kAllTypes)
    for (RedOp op : kAllOps) {
      if (!host_redop_supported(dt, op)) continue;
      for (int nsrc : {1, 2, 3, 4, 5, 8, 11})  // 5/8/11: blocked path, 1-3 sources in last pass
        for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(1000), size_t(4099), size_t(20011)}) {
          std::vector<Bytes> in;
          for (int j = 0; j < nsrc; ++j) in.push_back(random_input(dt, count, nsrc));
          std::vector<int> aliases = {-1, 0};  // separate dst, dst == first/last/middle src
          if (nsrc > 1) aliases.push_back(nsrc - 1);
          if (nsrc > 2) aliases.push_back(nsrc / 2);
          for (int alias : aliases) check_case(dt, op, in, count, alias, count == 1000 ? 1 : 0, nsrc, "matrix");
        }
    }
  // nsrc == 1 AVG with a divisor that is not nsrc.
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16, DType::kComplex128,
                   DType::kInt8, DType::kInt64})
    check_case(dt, RedOp::kAvg, {random_input(dt, 777, 1)}, 777, -1, 0, 3, "avg/3");
  // An integer average whose divisor does not fit the type: -128 / 128 is -1, 127 / 200 is 0.
  for (int div : {128, 200})
    check_case(DType::kInt8, RedOp::kAvg, {Bytes{0x80, 0x7f, 0x81, 0x00}}, 4, -1, 0, div, "int8 avg/big");
  // One buffer as dst and as every source (2 and 6 times).
  for (DType dt : {DType::kFloat32, DType::kFloat16, DType::kInt8, DType::kBool}) {
    const Bytes x = random_input(dt, 3000, 6);
    check_case(dt, RedOp::kSum, {x, x}, 3000, -2, 0, 2, "same-ptr");
    check_case(dt, RedOp::kMax, {x, x, x, x, x, x}, 3000, -2, 0, 6, "same-ptr");
  }
}

// Helpers for hand-built cases: encode values in a dtype, run, read back.
static uint16_t h16(DType dt, float f) { return dt == DType::kFloat16 ? f32_to_f16(f) : f32_to_bf16(f); }
static Bytes fvals(DType dt, const std::vector<float>& v) {  // float dtypes
  Bytes b(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::kFloat32) put(b, i, v[i]);
    else if (dt == DType::kFloat64) put(b, i, double(v[i]));
    else put(b, i, h16(dt, v[i]));
  }
  return b;
}
static Bytes ivals(DType dt, const std::vector<int64_t>& v) {  // integer dtypes, truncated
  Bytes b(v.size() * dtype_size(dt));
  for (size_t i = 0; i < v.size(); ++i) std::memcpy(&b[i * dtype_size(dt)], &v[i], dtype_size(dt));
  return b;
}
static Bytes run(DType dt, RedOp op, const std::vector<Bytes>& in, int alias = -1, int div = 1) {
  bool tail_ok = false;
  Bytes r = run_kernel(dt, op, in, in[0].size() / dtype_size(dt), alias, 0, div, &tail_ok);
  CHECK(tail_ok, "dst tail clobbered");
  return r;
}

static void test_special_values() {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = INFINITY;
  for (DType dt : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16}) {
    // Integer-valued floats: exact sums (|sum| <= 100 is exact in all four).
    std::vector<std::vector<float>> v(5, std::vector<float>(4099));
    std::vector<float> sum(4099, 0.f);
    for (int j = 0; j < 5; ++j)
      for (size_t i = 0; i < 4099; ++i) sum[i] += v[j][i] = float(int((i * 7 + j * 13) % 41) - 20);
    std::vector<Bytes> in;
    for (auto& x : v) in.push_back(fvals(dt, x));
    CHECK(run(dt, RedOp::kSum, in, 4) == fvals(dt, sum), "integer sum %s", dtype_name(dt));
    // NaN in any position propagates through MIN/MAX; infinities order normally.
    for (RedOp op : {RedOp::kMin, RedOp::kMax}) {
      const bool mn = op == RedOp::kMin;
      in = {fvals(dt, {nan, 1, 2, nan, -inf, 5}), fvals(dt, {1, nan, 3, nan, 7, inf}),
            fvals(dt, {2, 4, nan, 0, 8, -3})};
      const Bytes want = fvals(dt, {nan, nan, nan, nan, mn ? -inf : 8, mn ? -3 : inf});
      for (int alias : {-1, 0, 2}) {
        const Bytes got = run(dt, op, in, alias);
        bool ok = true;
        for (size_t i = 0; i < 6; ++i) ok &= same_elem(dt, want, got, i);
        CHECK(ok, "NaN %s %s alias=%d", redop_name(op), dtype_name(dt), alias);
      }
    }
  }
  // Strict left-to-right order: (1e8 + 1) - 1e8 is 0 in float32, not 1.
  const DType f32 = DType::kFloat32;
  CHECK(run(f32, RedOp::kSum, {fvals(f32, {1e8f}), fvals(f32, {1}), fvals(f32, {-1e8f})}) == fvals(f32, {0}), "order");
  for (DType dt : {DType::kFloat16, DType::kBFloat16}) {
    // Rounded once: 1 + u/2 + u/2 (u = ulp of 1) is 1 + u, not 1.
    const float u = dt == DType::kFloat16 ? 0x1p-10f : 0x1p-7f;
    CHECK(run(dt, RedOp::kSum, {fvals(dt, {1}), fvals(dt, {u / 2}), fvals(dt, {u / 2})}, 0) == fvals(dt, {1 + u}),
          "single rounding %s", dtype_name(dt));
    // AVG divides the exact float32 sum 3 + 5u: 1 + 5u/3 -> 1 + 2u. Rounding the
    // sum to 16 bits first (3 + 4u, a tie to even) would give 1 + u.
    const std::vector<Bytes> in = {fvals(dt, {1 + u}), fvals(dt, {1 + 2 * u}), fvals(dt, {1 + 2 * u})};
    CHECK(run(dt, RedOp::kAvg, in, -1, 3) == fvals(dt, {1 + 2 * u}), "avg single rounding %s", dtype_name(dt));
  }
  // Integer wrap-around (two's complement, computed without UB) and bool.
  struct IntCase { DType dt; RedOp op; std::vector<std::vector<int64_t>> in; std::vector<int64_t> want; int alias; };
  const IntCase cases[] = {
      {DType::kInt8, RedOp::kSum, {{127}, {1}}, {-128}, -1},
      {DType::kInt8, RedOp::kProduct, {{-128}, {-1}}, {-128}, 0},
      {DType::kUInt8, RedOp::kSum, {{255}, {1}}, {0}, 1},
      {DType::kUInt8, RedOp::kProduct, {{16}, {16}, {3}}, {0}, -1},
      {DType::kInt32, RedOp::kSum, {{INT32_MAX}, {1}}, {INT32_MIN}, -1},
      {DType::kInt32, RedOp::kProduct, {{65536}, {65536}}, {0}, -1},
      {DType::kInt64, RedOp::kSum, {{INT64_MAX}, {1}, {0}}, {INT64_MIN}, 0},
      {DType::kInt64, RedOp::kProduct, {{1ll << 40}, {1ll << 40}}, {0}, -1},
      // bool: any non-zero byte is true; outputs are 0/1 (also for one source).
      {DType::kBool, RedOp::kSum, {{0, 2, 255, 0}, {0, 0, 7, 9}}, {0, 1, 1, 1}, -1},
      {DType::kBool, RedOp::kMin, {{0, 2, 255, 0}, {0, 0, 7, 9}}, {0, 0, 1, 0}, 1},
      {DType::kBool, RedOp::kBxor, {{0, 2, 255, 0}, {0, 0, 7, 9}}, {0, 1, 0, 1}, -1},
      {DType::kBool, RedOp::kMax, {{0, 2, 255, 0}}, {0, 1, 1, 0}, -1},
      // nsrc == 1 without AVG is a bitwise copy (a signalling-NaN bf16 stays as is).
      {DType::kBFloat16, RedOp::kSum, {{0x7F81, 0xFF80}}, {0x7F81, 0xFF80}, -1},
  };
  for (const IntCase& c : cases) {
    std::vector<Bytes> in;
    for (const auto& x : c.in) in.push_back(ivals(c.dt, x));
    CHECK(run(c.dt, c.op, in, c.alias) == ivals(c.dt, c.want), "%s %s", dtype_name(c.dt), redop_name(c.op));
  }
}

static std::string error_of(DType dt, RedOp op, int nsrc, int div) {
  float a = 0, b = 0;
  const void* s[] = {&a, &a};
  try {
    reduce_n(&b, s, nsrc, 1, dt, op, div);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "";
}

static void test_errors() {  // every unsupported pair, with the exact message
  for (DType dt : kAllTypes)
    for (RedOp op : kAllOps) {
      if (host_redop_supported(dt, op)) continue;
      const std::string want = std::string("reduce op ") + redop_name(op) + " is not defined for " + dtype_name(dt);
      const std::string got = error_of(dt, op, 2, 2);
      CHECK(got == want, "got '%s', want '%s'", got.c_str(), want.c_str());
    }
  CHECK(!error_of(DType::kFloat32, RedOp::kSum, 0, 1).empty(), "nsrc=0 rejected");
  CHECK(!error_of(DType::kFloat32, RedOp::kAvg, 2, 0).empty(), "AVG with divisor 0 rejected");
  CHECK(error_of(DType::kFloat32, RedOp::kSum, 2, 0).empty(), "SUM ignores divisor");
}

// ---- --bench: bandwidth of 2-source reductions vs memcpy --------------------
// Timed with the thread's CPU clock (so time the scheduler gives to other
// processes on a shared machine does not count), best of 15 interleaved rounds.
static double cpu_seconds(const std::function<void()>& fn) {
  timespec t0{}, t1{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
  fn();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t1);
  return double(t1.tv_sec - t0.tv_sec) + 1e-9 * double(t1.tv_nsec - t0.tv_nsec);
}

static int bench() {
  const size_t bytes = size_t(64) << 20;  // per buffer
  std::vector<Bytes> src(8, Bytes(bytes));
  Bytes d(bytes);
  for (size_t j = 0; j < src.size(); ++j)  // small normal floats (no subnormal slow paths)
    for (size_t i = 0; i < bytes / 4; ++i) put(src[j], i, 1.0f + float((i + j) % 97));
  struct Run { std::string name; double moved; std::function<void()> fn; double best; };
  std::vector<Run> runs;
  runs.push_back({"memcpy", 2.0, [&] { std::memcpy(d.data(), src[0].data(), bytes); }, 1e30});
  for (DType dt : {DType::kFloat32, DType::kBFloat16, DType::kFloat16})
    for (int nsrc : {2, 4, 8})
      for (bool inplace : {false, true}) {
        if ((nsrc > 2 && inplace) || (nsrc == 8 && dt == DType::kFloat16)) continue;
        char name[64];
        std::snprintf(name, sizeof name, "reduce SUM %-8s x%d %s", dtype_name(dt), nsrc, inplace ? "(dst=srcs[0])" : "-> dst");
        runs.push_back({name, double(nsrc + 1), [&, dt, nsrc, inplace] {
          std::vector<const void*> s;
          for (int j = 0; j < nsrc; ++j) s.push_back(j == 0 && inplace ? d.data() : src[size_t(j)].data());
          reduce_n(d.data(), s.data(), nsrc, bytes / dtype_size(dt), dt, RedOp::kSum, nsrc);
        }, 1e30});
      }
  for (Run& r : runs) r.fn();  // warm-up: page faults, ifunc resolution
  for (int round = 0; round < 15; ++round)
    for (Run& r : runs) r.best = std::min(r.best, cpu_seconds(r.fn));
  std::printf("64 MiB buffers; GB/s = (bytes read + written) / best CPU time of 15, 1 GB = 1e9 B\n");
  const double mem = runs[0].moved * double(bytes) / runs[0].best / 1e9;
  for (const Run& r : runs) {
    const double gbs = r.moved * double(bytes) / r.best / 1e9;
    std::printf("%-38s %6.1f GB/s  (%.2f x memcpy)\n", r.name.c_str(), gbs, gbs / mem);
  }
  return 0;
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "--bench") return bench();
  test_conversions();
  test_matrix();
  test_special_values();
  test_errors();
  std::printf("%d passed, %d failed\n", g_pass, g_fail);
  return g_fail == 0 ? 0 : 1;
}

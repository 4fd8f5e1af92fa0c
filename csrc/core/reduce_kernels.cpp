// Element-wise reduction kernels (see reduce_kernels.h for the contract).
//
// Structure:
//  * Traits describe a storage type S and the compute type C it is reduced in
//    (bf16/fp16 -> float32, bool -> normalised 0/1 byte, others unchanged).
//  * One always_inline loop, k_pass, folds K (1..4) sources, optionally after
//    a float-or-T accumulator, into the accumulator or into dst.
//  * run(): nsrc <= 4 is a single streaming pass (partials in registers);
//    more sources go block-wise through an 8 KiB stack accumulator that stays
//    in L1 (passes of 2-4 sources, then acc + 3 sources), so partial results
//    never travel to memory between sources.
//  * One target_clones entry point per storage type instantiates everything
//    for AVX-512 / AVX2 / baseline; the ifunc picks one at load time.
// Evaluation order is always srcs[0] op srcs[1] op ... for every element, and
// fp16/bf16 are rounded once at the end, so results are bit-reproducible
// (the same on every rank and clone: no FMA-contractible a*b+c appears in any
// reduction, and GCC does not reassociate without -ffast-math).
#include "core/reduce_kernels.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/half_convert.h"
#include "core/target_clones.h"

namespace rsdp {
namespace {

// Accumulator block for nsrc > kMaxFuse: 8 KiB of partial results plus the
// lines in flight of the (up to 4) streams of a pass fit easily in a 32-48 KiB
// L1d. (4, 8, 16 and 32 KiB measured within noise of each other.)
constexpr size_t kAccBytes = 8192;

// ---- storage/compute traits ------------------------------------------------

template <class T>
struct Plain {  // float, double, integers: computed as themselves
  using S = T;
  using C = T;
  static RSDP_AI C ld(S v) { return v; }
  static RSDP_AI S st(C v) { return v; }
};
struct BF16 {
  using S = uint16_t;
  using C = float;
  static RSDP_AI C ld(S v) { return bf16_to_f32(v); }
  static RSDP_AI S st(C v) { return f32_to_bf16(v); }
};
struct F16 {
  using S = uint16_t;
  using C = float;
  static RSDP_AI C ld(S v) { return f16_to_f32(v); }
  static RSDP_AI S st(C v) { return f32_to_f16(v); }
};
struct Bool {  // any non-zero byte is true; results are always 0 or 1
  using S = uint8_t;
  using C = uint8_t;
  static RSDP_AI C ld(S v) { return v != 0; }
  static RSDP_AI S st(C v) { return v; }
};

template <RedOp>
struct dependent_false : std::false_type {};

// ---- the binary operators, on the compute type ----------------------------

template <RedOp kOp, class C>
RSDP_AI C apply(C a, C b) {
  if constexpr (std::is_floating_point<C>::value) {
    if constexpr (kOp == RedOp::kSum || kOp == RedOp::kAvg) return a + b;
    else if constexpr (kOp == RedOp::kProduct) return a * b;
    // NaN-propagating like torch.minimum/maximum; `|` keeps it branch-free.
    else if constexpr (kOp == RedOp::kMin) return ((a < b) | (a != a)) ? a : b;
    else if constexpr (kOp == RedOp::kMax) return ((a > b) | (a != a)) ? a : b;
    else static_assert(dependent_false<kOp>::value, "op not defined for floats");
  } else {
    // Wrapping arithmetic in unsigned (widened to unsigned int for bytes so the
    // usual promotion to signed int cannot overflow).
    using U = typename std::make_unsigned<C>::type;
    using W = typename std::conditional<(sizeof(U) < sizeof(unsigned)), unsigned, U>::type;
    if constexpr (kOp == RedOp::kSum) return C(U(W(U(a)) + W(U(b))));
    else if constexpr (kOp == RedOp::kProduct) return C(U(W(U(a)) * W(U(b))));
    else if constexpr (kOp == RedOp::kMin) return a < b ? a : b;
    else if constexpr (kOp == RedOp::kMax) return a > b ? a : b;
    else if constexpr (kOp == RedOp::kBand) return C(a & b);
    else if constexpr (kOp == RedOp::kBor) return C(a | b);
    else if constexpr (kOp == RedOp::kBxor) return C(a ^ b);
    else static_assert(dependent_false<kOp>::value, "op not defined for integers");
  }
}

// AVG: a real division so results match torch.sum(...) / n bit for bit.
template <bool kDiv, class C>
RSDP_AI C fin(C x, C div) {
  if constexpr (kDiv) return x / div;
  else return x;
}

// ---- the one loop -------------------------------------------------------------
// One pass over n elements folding K sources left to right, optionally after
// the accumulator: x = [acc op] s[0] op s[1] ... op s[K-1]; then either
// acc = x, or dst = st(fin(x)). Fusing several sources into one pass keeps
// K + 1 memory streams in flight, which a single core needs to approach DRAM
// bandwidth (one or two streams per pass run at roughly 2/3 of it).
//
// Aliasing: acc is a private stack buffer, so it is __restrict. dst and the
// sources are not: dst may equal a source. That costs GCC one runtime check per
// source (dst - src outside (0, vector width)), which passes for dst == src
// (same-index read-before-write is safe), so in-place calls stay vectorised.
// The source pointers are copied to locals so that stores to dst cannot alias
// the pointer array and force a reload.
template <class Tr, RedOp kOp, bool kDiv, int K, bool kAccIn, bool kToDst>
RSDP_AI void k_pass(typename Tr::S* dst, typename Tr::C* __restrict acc, const void* const* src,
                    size_t n, typename Tr::C div) {
  using S = typename Tr::S;
  using C = typename Tr::C;
  const S* s[K];
  for (int j = 0; j < K; ++j) s[j] = static_cast<const S*>(src[j]);
  for (size_t i = 0; i < n; ++i) {
    C x;
    if constexpr (kAccIn) x = acc[i];
    else x = Tr::ld(s[0][i]);
    for (int j = kAccIn ? 0 : 1; j < K; ++j) x = apply<kOp>(x, Tr::ld(s[j][i]));
    if constexpr (kToDst) dst[i] = Tr::st(fin<kDiv>(x, div));
    else acc[i] = x;
  }
}

// ---- driver -----------------------------------------------------------------

constexpr int kMaxFuse = 4;  // sources per pass (code size grows with it)

// Selects the compile-time K (1..kMaxFuse) for k sources.
template <class Tr, RedOp kOp, bool kDiv, bool kToDst>
RSDP_AI void pass_k(typename Tr::S* dst, typename Tr::C* acc, const void* const* src, int k,
                    size_t n, typename Tr::C div) {
  static_assert(kMaxFuse == 4, "cases below");
  if (k == 1) k_pass<Tr, kOp, kDiv, 1, false, kToDst>(dst, acc, src, n, div);
  else if (k == 2) k_pass<Tr, kOp, kDiv, 2, false, kToDst>(dst, acc, src, n, div);
  else if (k == 3) k_pass<Tr, kOp, kDiv, 3, false, kToDst>(dst, acc, src, n, div);
  else k_pass<Tr, kOp, kDiv, 4, false, kToDst>(dst, acc, src, n, div);
}

template <class Tr, RedOp kOp, bool kDiv>
RSDP_AI void run(void* dstv, const void* const* srcs, int nsrc, size_t count,
                 typename Tr::C div) {
  using S = typename Tr::S;
  using C = typename Tr::C;
  S* dst = static_cast<S*>(dstv);
  if (nsrc <= kMaxFuse) {  // one streaming pass, partial results in registers
    pass_k<Tr, kOp, kDiv, true>(dst, nullptr, srcs, nsrc, count, div);
    return;
  }
  // More sources: block-wise through an L1-resident accumulator. Per block, a
  // first pass folds 2..4 sources into acc, then every later pass folds acc
  // and 3 more sources (so no pass runs with few streams), the last one into
  // dst. dst is written only after every source of that block has been read,
  // so dst == any src is still fine.
  constexpr int kStep = kMaxFuse - 1;
  const int passes = (nsrc - kMaxFuse + kStep - 1) / kStep;  // after the first
  const int first = nsrc - passes * kStep;                   // 2..kMaxFuse
  constexpr size_t kBlock = kAccBytes / sizeof(C);
  alignas(64) C acc[kBlock];
  const void* blk[kMaxFuse];  // this block's slice of one pass's sources
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t n = count - off < kBlock ? count - off : kBlock;
    for (int q = 0; q < first; ++q) blk[q] = static_cast<const S*>(srcs[q]) + off;
    pass_k<Tr, kOp, kDiv, false>(nullptr, acc, blk, first, n, div);
    for (int j = first; j < nsrc; j += kStep) {
      for (int q = 0; q < kStep; ++q) blk[q] = static_cast<const S*>(srcs[j + q]) + off;
      if (j + kStep < nsrc) k_pass<Tr, kOp, kDiv, kStep, true, false>(nullptr, acc, blk, n, div);
      else k_pass<Tr, kOp, kDiv, kStep, true, true>(dst + off, acc, blk, n, div);
    }
  }
}

// Runtime op -> template instantiation. Only ops valid for the trait are
// instantiated; reduce_n has already rejected the others.
template <class Tr>
RSDP_AI void dispatch_float(void* dst, const void* const* srcs, int nsrc, size_t count, RedOp op,
                            int divisor) {
  using C = typename Tr::C;
  const C div = C(divisor);
  switch (op) {
    case RedOp::kSum: return run<Tr, RedOp::kSum, false>(dst, srcs, nsrc, count, div);
    case RedOp::kAvg: return run<Tr, RedOp::kSum, true>(dst, srcs, nsrc, count, div);
    case RedOp::kProduct: return run<Tr, RedOp::kProduct, false>(dst, srcs, nsrc, count, div);
    case RedOp::kMin: return run<Tr, RedOp::kMin, false>(dst, srcs, nsrc, count, div);
    case RedOp::kMax: return run<Tr, RedOp::kMax, false>(dst, srcs, nsrc, count, div);
    default: return;
  }
}

template <class Tr>
RSDP_AI void dispatch_int(void* dst, const void* const* srcs, int nsrc, size_t count, RedOp op,
                         int divisor) {
  using C = typename Tr::C;
  switch (op) {
    case RedOp::kAvg: {  // NCCL's integer average: the wrapped sum, divided once (truncating)
      run<Tr, RedOp::kSum, false>(dst, srcs, nsrc, count, C(0));
      using S = typename Tr::S;
      S* d = static_cast<S*>(dst);  // in 64 bits: a divisor may not fit an 8-bit type
      for (size_t i = 0; i < count; ++i) d[i] = S(int64_t(d[i]) / int64_t(divisor));
      return;
    }
    case RedOp::kSum: return run<Tr, RedOp::kSum, false>(dst, srcs, nsrc, count, C(0));
    case RedOp::kProduct: return run<Tr, RedOp::kProduct, false>(dst, srcs, nsrc, count, C(0));
    case RedOp::kMin: return run<Tr, RedOp::kMin, false>(dst, srcs, nsrc, count, C(0));
    case RedOp::kMax: return run<Tr, RedOp::kMax, false>(dst, srcs, nsrc, count, C(0));
    case RedOp::kBand: return run<Tr, RedOp::kBand, false>(dst, srcs, nsrc, count, C(0));
    case RedOp::kBor: return run<Tr, RedOp::kBor, false>(dst, srcs, nsrc, count, C(0));
    case RedOp::kBxor: return run<Tr, RedOp::kBxor, false>(dst, srcs, nsrc, count, C(0));
    default: return;
  }
}

// ---- multiversioned entry points (one per storage type) -------------------

#define RSDP_FLOAT_ENTRY(name, Tr)                                                       \
  RSDP_CLONES void name(void* dst, const void* const* srcs, int nsrc, size_t count,      \
                        RedOp op, int divisor) {                                         \
    dispatch_float<Tr>(dst, srcs, nsrc, count, op, divisor);                             \
  }
#define RSDP_INT_ENTRY(name, Tr)                                                         \
  RSDP_CLONES void name(void* dst, const void* const* srcs, int nsrc, size_t count,      \
                        RedOp op, int divisor) {                                         \
    dispatch_int<Tr>(dst, srcs, nsrc, count, op, divisor);                               \
  }

RSDP_FLOAT_ENTRY(reduce_f32, Plain<float>)
RSDP_FLOAT_ENTRY(reduce_f64, Plain<double>)
RSDP_FLOAT_ENTRY(reduce_bf16, BF16)
RSDP_FLOAT_ENTRY(reduce_f16, F16)
RSDP_INT_ENTRY(reduce_i8, Plain<int8_t>)
RSDP_INT_ENTRY(reduce_u8, Plain<uint8_t>)
RSDP_INT_ENTRY(reduce_i32, Plain<int32_t>)
RSDP_INT_ENTRY(reduce_i64, Plain<int64_t>)

// bool is cold: no clones. SUM/MAX are OR, PRODUCT/MIN are AND.
void reduce_bool(void* dst, const void* const* srcs, int nsrc, size_t count, RedOp op) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kMax:
    case RedOp::kBor: return run<Bool, RedOp::kBor, false>(dst, srcs, nsrc, count, 0);
    case RedOp::kProduct:
    case RedOp::kMin:
    case RedOp::kBand: return run<Bool, RedOp::kBand, false>(dst, srcs, nsrc, count, 0);
    case RedOp::kBxor: return run<Bool, RedOp::kBxor, false>(dst, srcs, nsrc, count, 0);
    default: return;
  }
}

[[noreturn]] void unsupported(DType dtype, RedOp op) {
  throw std::invalid_argument(std::string("reduce op ") + redop_name(op) +
                              " is not defined for " + dtype_name(dtype));
}

}  // namespace

void reduce_n(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype,
              RedOp op, int divisor) {
  if (!host_redop_supported(dtype, op)) unsupported(dtype, op);
  if (nsrc < 1 || srcs == nullptr)
    throw std::invalid_argument("reduce_n: nsrc must be >= 1, got " + std::to_string(nsrc));
  if (op == RedOp::kAvg && divisor < 1)
    throw std::invalid_argument("reduce_n: AVG needs divisor >= 1, got " +
                                std::to_string(divisor));
  if (count == 0) return;

  // A single non-AVG input is a bitwise copy (bool still gets normalised).
  if (nsrc == 1 && op != RedOp::kAvg && dtype != DType::kBool) {
    if (dst != srcs[0]) std::memcpy(dst, srcs[0], count * dtype_size(dtype));
    return;
  }

  switch (dtype) {
    case DType::kFloat32: return reduce_f32(dst, srcs, nsrc, count, op, divisor);
    case DType::kFloat64: return reduce_f64(dst, srcs, nsrc, count, op, divisor);
    case DType::kBFloat16: return reduce_bf16(dst, srcs, nsrc, count, op, divisor);
    case DType::kFloat16: return reduce_f16(dst, srcs, nsrc, count, op, divisor);
    // complex SUM/AVG are element-wise on the (re, im) scalars.
    case DType::kComplex64: return reduce_f32(dst, srcs, nsrc, 2 * count, op, divisor);
    case DType::kComplex128: return reduce_f64(dst, srcs, nsrc, 2 * count, op, divisor);
    case DType::kInt8: return reduce_i8(dst, srcs, nsrc, count, op, divisor);
    case DType::kUInt8: return reduce_u8(dst, srcs, nsrc, count, op, divisor);
    case DType::kInt32: return reduce_i32(dst, srcs, nsrc, count, op, divisor);
    case DType::kInt64: return reduce_i64(dst, srcs, nsrc, count, op, divisor);
    case DType::kBool: return reduce_bool(dst, srcs, nsrc, count, op);
  }
  unsupported(dtype, op);  // out-of-range enum value
}

}  // namespace rsdp

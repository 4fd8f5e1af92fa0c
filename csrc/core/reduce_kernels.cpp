// Element-wise reduction kernels (see reduce_kernels.h for the contract).
//
// Structure:
//  * Traits describe a storage type S and the compute type C it is reduced in
//    (bf16/fp16 -> float32, bool -> normalised 0/1 byte, others unchanged).
//  * Small always_inline loops (k_*) do one pass each. Their pointers are
//    __restrict only where that is true for the call: dst may equal a src, so
//    the in-place cases get their own loop that reads and writes one pointer.
//  * run() walks the range: nsrc <= 2 is a single streaming pass; nsrc > 2
//    reduces block-wise into a float-or-T stack buffer that stays in L1, so the
//    partial result never goes back to memory between sources.
//  * One target_clones entry point per storage type instantiates everything
//    for AVX-512 / AVX2 / baseline; the ifunc picks one at load time.
// Evaluation order is always srcs[0] op srcs[1] op ... for every element, and
// fp16/bf16 are rounded once at the end, so results are bit-reproducible.
#include "core/reduce_kernels.h"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "core/half_convert.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// x86-64-v4 (AVX-512 F/BW/DQ/VL) rather than plain "avx512f": VL gives the
// 256-bit code 32 registers, mask blends and vpternlog, which makes the
// branch-free fp16/bf16 conversions much cheaper. Every AVX-512 x86 CPU except
// Xeon Phi has it; the others fall back to the AVX2 clone.
#define RSDP_CLONES __attribute__((target_clones("arch=x86-64-v4", "avx2", "default")))
#else
#define RSDP_CLONES
#endif
#define RSDP_AI inline __attribute__((always_inline))

namespace rsdp {
namespace {

// Accumulator block: 8 KiB of partial results plus one block of each of the
// two streams being combined fits comfortably in a 32-48 KiB L1d.
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

// Operand `a` of the final pass is either the C-typed accumulator or a source.
template <class Tr, bool kAcc, class A>
RSDP_AI typename Tr::C lda(A v) {
  if constexpr (kAcc) return v;
  else return Tr::ld(v);
}

// ---- single-pass loops ------------------------------------------------------
// o = st(fin(a op b)). Four aliasing shapes; a may equal b in all of them
// (two read-only restrict pointers may alias).

template <class Tr, RedOp kOp, bool kDiv, bool kAcc, class A, class S = typename Tr::S,
          class C = typename Tr::C>
RSDP_AI void k_out(S* __restrict o, const A* __restrict a, const S* __restrict b, size_t n,
                   C div) {
  for (size_t i = 0; i < n; ++i)
    o[i] = Tr::st(fin<kDiv>(apply<kOp>(lda<Tr, kAcc>(a[i]), Tr::ld(b[i])), div));
}

// o == a (only for a source operand).
template <class Tr, RedOp kOp, bool kDiv, class S = typename Tr::S, class C = typename Tr::C>
RSDP_AI void k_in_a(S* __restrict x, const S* __restrict b, size_t n, C div) {
  for (size_t i = 0; i < n; ++i)
    x[i] = Tr::st(fin<kDiv>(apply<kOp>(Tr::ld(x[i]), Tr::ld(b[i])), div));
}

// o == b.
template <class Tr, RedOp kOp, bool kDiv, bool kAcc, class A, class S = typename Tr::S,
          class C = typename Tr::C>
RSDP_AI void k_in_b(const A* __restrict a, S* __restrict x, size_t n, C div) {
  for (size_t i = 0; i < n; ++i)
    x[i] = Tr::st(fin<kDiv>(apply<kOp>(lda<Tr, kAcc>(a[i]), Tr::ld(x[i])), div));
}

// Accumulator passes (acc is a private stack buffer, so restrict always holds).
template <class Tr, class S = typename Tr::S, class C = typename Tr::C>
RSDP_AI void k_load(C* __restrict acc, const S* __restrict a, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = Tr::ld(a[i]);
}

template <class Tr, RedOp kOp, class S = typename Tr::S, class C = typename Tr::C>
RSDP_AI void k_first(C* __restrict acc, const S* __restrict a, const S* __restrict b,
                     size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = apply<kOp>(Tr::ld(a[i]), Tr::ld(b[i]));
}

template <class Tr, RedOp kOp, class S = typename Tr::S, class C = typename Tr::C>
RSDP_AI void k_mid(C* __restrict acc, const S* __restrict b, size_t n) {
  for (size_t i = 0; i < n; ++i) acc[i] = apply<kOp>(acc[i], Tr::ld(b[i]));
}

// nsrc == 1: o = st(fin(ld(a))) -- AVG of one input, or bool normalisation.
template <class Tr, bool kDiv, class S = typename Tr::S, class C = typename Tr::C>
RSDP_AI void k_one(S* __restrict o, const S* __restrict a, size_t n, C div) {
  for (size_t i = 0; i < n; ++i) o[i] = Tr::st(fin<kDiv>(Tr::ld(a[i]), div));
}

template <class Tr, bool kDiv, class S = typename Tr::S, class C = typename Tr::C>
RSDP_AI void k_one_in(S* __restrict x, size_t n, C div) {
  for (size_t i = 0; i < n; ++i) x[i] = Tr::st(fin<kDiv>(Tr::ld(x[i]), div));
}

// ---- driver -----------------------------------------------------------------

template <class Tr, RedOp kOp, bool kDiv>
RSDP_AI void run(void* dstv, const void* const* srcsv, int nsrc, size_t count,
                 typename Tr::C div) {
  using S = typename Tr::S;
  using C = typename Tr::C;
  S* dst = static_cast<S*>(dstv);
  const S* const* src = reinterpret_cast<const S* const*>(srcsv);

  if (nsrc == 1) {
    if (dst == src[0]) k_one_in<Tr, kDiv>(dst, count, div);
    else k_one<Tr, kDiv>(dst, src[0], count, div);
    return;
  }
  const S* a = src[0];
  const S* b = src[1];
  if (nsrc == 2 && !(a == b && dst == a)) {  // one streaming pass, no buffer
    if (dst == a) k_in_a<Tr, kOp, kDiv>(dst, b, count, div);
    else if (dst == b) k_in_b<Tr, kOp, kDiv, false>(a, dst, count, div);
    else k_out<Tr, kOp, kDiv, false>(dst, a, b, count, div);
    return;
  }
  // Blocked: acc = s0 op s1 op ... op s[n-2] (stays in L1), then the last
  // source is folded in while writing dst. dst is written only after every
  // source of that block was read, so dst == any earlier src is harmless.
  // (Also takes nsrc == 2 with dst == s0 == s1, where the loads go via acc.)
  constexpr size_t kBlock = kAccBytes / sizeof(C);
  alignas(64) C acc[kBlock];
  const S* last = src[nsrc - 1];
  for (size_t off = 0; off < count; off += kBlock) {
    const size_t n = count - off < kBlock ? count - off : kBlock;
    if (nsrc == 2) k_load<Tr>(acc, a + off, n);
    else k_first<Tr, kOp>(acc, a + off, b + off, n);
    for (int j = 2; j < nsrc - 1; ++j) k_mid<Tr, kOp>(acc, src[j] + off, n);
    if (dst == last) k_in_b<Tr, kOp, kDiv, true>(acc, dst + off, n, div);
    else k_out<Tr, kOp, kDiv, true>(dst + off, acc, last + off, n, div);
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
RSDP_AI void dispatch_int(void* dst, const void* const* srcs, int nsrc, size_t count, RedOp op) {
  using C = typename Tr::C;
  switch (op) {
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

#define RSDP_FLOAT_ENTRY(name, Tr)                                                        \
  RSDP_CLONES void name(void* dst, const void* const* srcs, int nsrc, size_t count, RedOp op, \
                        int divisor) {                                                    \
    dispatch_float<Tr>(dst, srcs, nsrc, count, op, divisor);                              \
  }
#define RSDP_INT_ENTRY(name, Tr)                                                          \
  RSDP_CLONES void name(void* dst, const void* const* srcs, int nsrc, size_t count,       \
                        RedOp op) {                                                       \
    dispatch_int<Tr>(dst, srcs, nsrc, count, op);                                         \
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
  if (!redop_supported(dtype, op)) unsupported(dtype, op);
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
    case DType::kInt8: return reduce_i8(dst, srcs, nsrc, count, op);
    case DType::kUInt8: return reduce_u8(dst, srcs, nsrc, count, op);
    case DType::kInt32: return reduce_i32(dst, srcs, nsrc, count, op);
    case DType::kInt64: return reduce_i64(dst, srcs, nsrc, count, op);
    case DType::kBool: return reduce_bool(dst, srcs, nsrc, count, op);
  }
  unsupported(dtype, op);  // out-of-range enum value
}

}  // namespace rsdp

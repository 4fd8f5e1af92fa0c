// Element-wise reduction on the GPU (see device_reduce.h for the contract).
//
// Structure:
//  * Traits describe a storage type S and the compute type C it is reduced in
//    (bf16/fp16 -> float32, bool -> normalised 0/1 byte, others unchanged),
//    exactly as in the CPU twin core/reduce_kernels.cpp.
//  * One kernel per (traits, op, AVG?) runs a grid-stride loop over 16-byte
//    packs (when every pointer can be brought to a 16-byte boundary by the
//    same scalar head) plus a scalar loop over the head and tail elements.
//  * Each thread folds all sources of its elements in source order 0..nsrc-1
//    in registers and writes dst once, after every source has been read; no
//    atomics, no cross-thread combining. So results do not depend on the
//    launch configuration, are the same on every rank, and dst may alias a
//    source element-for-element.
// Float arithmetic uses the explicit round-to-nearest intrinsics: they are
// never contracted into an FMA, and the AVG division stays correctly rounded
// whatever -prec-div says. With the default -ftz=false (subnormals kept, as on
// the CPU) results match the CPU twin bit for bit, NaN payloads aside: GPU
// float arithmetic returns the canonical NaN, x86 propagates the input's.
#include "cuda/device_reduce.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "core/error.h"
#include "cuda/cuda_check.h"

namespace rsdp {
namespace {

constexpr int kThreads = 256;
// Grid cap: enough resident threads per SM to keep many 16-byte loads per
// source in flight (what peer reads over NVLink need); more blocks would only
// add scheduling waves, the grid-stride loop covers any count.
constexpr int kBlocksPerSm = 4;
// Sources whose loads are issued together before they are combined, so each
// thread has several independent loads outstanding.
constexpr int kGroup = 4;
constexpr size_t kPackBytes = 16;

// The source pointers travel by value in the kernel parameters: the caller's
// array is host memory.
struct Srcs {
  const void* p[kMaxDeviceReduceSrcs];
};

template <class C>
struct Params {
  void* dst;
  Srcs srcs;
  int nsrc;
  size_t count;  // elements of S
  size_t head;   // scalar elements before the first pack
  size_t nvec;   // 16-byte packs after the head
  C div;         // AVG divisor, in the compute type (as the CPU twin converts it)
};

// ---- storage/compute traits ------------------------------------------------

template <class T>
struct Plain {  // float, double, integers: computed as themselves
  using S = T;
  using C = T;
  static __device__ __forceinline__ C ld(S v) { return v; }
  static __device__ __forceinline__ S st(C v) { return v; }
};
struct F16 {  // stored as raw bits so packs stay trivially copyable
  using S = uint16_t;
  using C = float;
  static __device__ __forceinline__ C ld(S v) { return __half2float(__ushort_as_half(v)); }
  static __device__ __forceinline__ S st(C v) { return __half_as_ushort(__float2half_rn(v)); }
};
struct BF16 {
  using S = uint16_t;
  using C = float;
  static __device__ __forceinline__ C ld(S v) {
    return __bfloat162float(__ushort_as_bfloat16(v));
  }
  static __device__ __forceinline__ S st(C v) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(v));
  }
};
struct Bool {  // any non-zero byte is true; results are always 0 or 1
  using S = uint8_t;
  using C = uint8_t;
  static __device__ __forceinline__ C ld(S v) { return v != 0; }
  static __device__ __forceinline__ S st(C v) { return v; }
};

// ---- the binary operators, on the compute type ------------------------------

__device__ __forceinline__ float add_rn(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ double add_rn(double a, double b) { return __dadd_rn(a, b); }
__device__ __forceinline__ float mul_rn(float a, float b) { return __fmul_rn(a, b); }
__device__ __forceinline__ double mul_rn(double a, double b) { return __dmul_rn(a, b); }
__device__ __forceinline__ float div_rn(float a, float b) { return __fdiv_rn(a, b); }
__device__ __forceinline__ double div_rn(double a, double b) { return __ddiv_rn(a, b); }

// Integers wrap: computed in unsigned, widened to unsigned int for bytes so the
// usual promotion to signed int cannot overflow.
template <class C>
__device__ __forceinline__ C wrap_add(C a, C b) {
  using U = typename std::make_unsigned<C>::type;
  using W = typename std::conditional<(sizeof(U) < sizeof(unsigned)), unsigned, U>::type;
  return C(U(W(U(a)) + W(U(b))));
}
template <class C>
__device__ __forceinline__ C wrap_mul(C a, C b) {
  using U = typename std::make_unsigned<C>::type;
  using W = typename std::conditional<(sizeof(U) < sizeof(unsigned)), unsigned, U>::type;
  return C(U(W(U(a)) * W(U(b))));
}

struct OpSum {
  template <class C>
  __device__ __forceinline__ C operator()(C a, C b) const {
    if constexpr (std::is_floating_point<C>::value) return add_rn(a, b);
    else return wrap_add(a, b);
  }
};
struct OpProd {
  template <class C>
  __device__ __forceinline__ C operator()(C a, C b) const {
    if constexpr (std::is_floating_point<C>::value) return mul_rn(a, b);
    else return wrap_mul(a, b);
  }
};
// Floats: NaN-propagating like torch.minimum/maximum, and the same selection
// as the CPU twin, so signed zeros come out identically too.
struct OpMin {
  template <class C>
  __device__ __forceinline__ C operator()(C a, C b) const {
    if constexpr (std::is_floating_point<C>::value) return ((a < b) | (a != a)) ? a : b;
    else return a < b ? a : b;
  }
};
struct OpMax {
  template <class C>
  __device__ __forceinline__ C operator()(C a, C b) const {
    if constexpr (std::is_floating_point<C>::value) return ((a > b) | (a != a)) ? a : b;
    else return a > b ? a : b;
  }
};
struct OpBand {
  template <class C>
  __device__ __forceinline__ C operator()(C a, C b) const { return C(a & b); }
};
struct OpBor {
  template <class C>
  __device__ __forceinline__ C operator()(C a, C b) const { return C(a | b); }
};
struct OpBxor {
  template <class C>
  __device__ __forceinline__ C operator()(C a, C b) const { return C(a ^ b); }
};

// AVG: a real division at the end so results match torch.sum(...) / n.
template <bool kDiv, class C>
__device__ __forceinline__ C fin(C x, C div) {
  if constexpr (kDiv) return div_rn(x, div);
  else return x;
}

// ---- loads and stores of W elements ---------------------------------------------
// W is either one element or a 16-byte pack. Packs go through uint4 so the
// compiler emits one 128-bit access regardless of the element type.

template <class S, int W>
struct Pack {
  S v[W];
};

template <class S, int W>
__device__ __forceinline__ Pack<S, W> load_pack(const void* base, size_t i) {
  static_assert(W == 1 || W * sizeof(S) == kPackBytes, "one element or one 16-byte pack");
  const S* p = static_cast<const S*>(base) + i;
  Pack<S, W> r;
  if constexpr (W == 1) {
    r.v[0] = *p;
  } else {
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    memcpy(&r, &u, sizeof u);
  }
  return r;
}

template <class S, int W>
__device__ __forceinline__ void store_pack(void* base, size_t i, const Pack<S, W>& r) {
  S* p = static_cast<S*>(base) + i;
  if constexpr (W == 1) {
    *p = r.v[0];
  } else {
    uint4 u;
    memcpy(&u, &r, sizeof u);
    *reinterpret_cast<uint4*>(p) = u;
  }
}

// Issues the loads of sources j0 .. j0+kGroup-1 (those below nsrc) together.
template <class S, int W, class C>
__device__ __forceinline__ void load_group(const Params<C>& p, int j0, size_t i,
                                           Pack<S, W> (&r)[kGroup]) {
#pragma unroll
  for (int q = 0; q < kGroup; ++q)
    if (j0 + q < p.nsrc) r[q] = load_pack<S, W>(p.srcs.p[j0 + q], i);
}

// Folds members kFirst.. of the group of sources j0.. into acc, in source order.
template <class Tr, class Op, int kFirst, int W>
__device__ __forceinline__ void fold_group(typename Tr::C (&acc)[W],
                                           const Pack<typename Tr::S, W> (&r)[kGroup], int j0,
                                           int nsrc) {
#pragma unroll
  for (int q = kFirst; q < kGroup; ++q) {
    if (j0 + q < nsrc) {
#pragma unroll
      for (int e = 0; e < W; ++e) acc[e] = Op()(acc[e], Tr::ld(r[q].v[e]));
    }
  }
}

// dst[i .. i+W) = fin(srcs[0] op srcs[1] op ... op srcs[nsrc-1]) at i .. i+W.
template <class Tr, class Op, bool kDiv, int W>
__device__ __forceinline__ void reduce_at(const Params<typename Tr::C>& p, size_t i) {
  using S = typename Tr::S;
  using C = typename Tr::C;
  Pack<S, W> r[kGroup];
  C acc[W];
  load_group<S, W>(p, 0, i, r);
#pragma unroll
  for (int e = 0; e < W; ++e) acc[e] = Tr::ld(r[0].v[e]);  // source 0 is the start value
  fold_group<Tr, Op, 1>(acc, r, 0, p.nsrc);
  for (int j0 = kGroup; j0 < p.nsrc; j0 += kGroup) {
    load_group<S, W>(p, j0, i, r);
    fold_group<Tr, Op, 0>(acc, r, j0, p.nsrc);
  }
  Pack<S, W> out;
#pragma unroll
  for (int e = 0; e < W; ++e) out.v[e] = Tr::st(fin<kDiv>(acc[e], p.div));
  store_pack<S, W>(p.dst, i, out);
}

template <class Tr, class Op, bool kDiv>
__global__ void __launch_bounds__(kThreads)
    reduce_kernel(const __grid_constant__ Params<typename Tr::C> p) {
  constexpr int kE = int(kPackBytes / sizeof(typename Tr::S));
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  const size_t tid = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (size_t v = tid; v < p.nvec; v += stride) reduce_at<Tr, Op, kDiv, kE>(p, p.head + v * kE);
  // Scalar elements: the head [0, head) and the tail [vend, count). Without
  // packs (head = nvec = 0) that is every element.
  const size_t vend = p.head + p.nvec * kE;
  const size_t nscalar = p.head + (p.count - vend);
  for (size_t k = tid; k < nscalar; k += stride)
    reduce_at<Tr, Op, kDiv, 1>(p, k < p.head ? k : vend + (k - p.head));
}

// ---- host side -------------------------------------------------------------------

int sm_count() {
  int dev = 0;
  RSDP_CUDA_CHECK(cudaGetDevice(&dev), "device_reduce_n");
  // Cached per device: the attribute query costs more than a launch.
  constexpr int kCached = 64;
  static std::atomic<int> cache[kCached];  // zero-initialised: 0 = not yet known
  if (dev >= 0 && dev < kCached) {
    const int n = cache[dev].load(std::memory_order_relaxed);
    if (n > 0) return n;
  }
  int n = 0;
  RSDP_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "device ",
                  dev);
  if (n < 1) n = 1;
  if (dev >= 0 && dev < kCached) cache[dev].store(n, std::memory_order_relaxed);
  return n;
}

template <class Tr, class Op, bool kDiv>
void launch(void* dst, const void* const* srcs, int nsrc, size_t count, typename Tr::C div,
            cudaStream_t stream) {
  using S = typename Tr::S;
  constexpr size_t kE = kPackBytes / sizeof(S);
  Params<typename Tr::C> p{};
  p.dst = dst;
  for (int j = 0; j < nsrc; ++j) p.srcs.p[j] = srcs[j];
  p.nsrc = nsrc;
  p.count = count;
  p.div = div;
  // Packs need every pointer at the same offset within 16 bytes; then a short
  // scalar head brings them all to a 16-byte boundary together (the aligned
  // case is head = 0). Otherwise everything goes through the scalar loop.
  const uintptr_t mis = reinterpret_cast<uintptr_t>(dst) % kPackBytes;
  bool same = true;
  for (int j = 0; j < nsrc; ++j) same &= reinterpret_cast<uintptr_t>(srcs[j]) % kPackBytes == mis;
  if (same) {
    const size_t head = ((kPackBytes - mis) % kPackBytes) / sizeof(S);
    p.head = head < count ? head : count;
    p.nvec = (count - p.head) / kE;
  }
  const size_t work = p.nvec + (count - p.nvec * kE);  // packs + scalar elements
  const size_t cap = size_t(kBlocksPerSm) * size_t(sm_count());
  const size_t want = (work + kThreads - 1) / kThreads;
  const unsigned blocks = unsigned(want < cap ? want : cap);
  reduce_kernel<Tr, Op, kDiv><<<blocks, kThreads, 0, stream>>>(p);
}

template <class Tr>
void dispatch_float(void* dst, const void* const* srcs, int nsrc, size_t count, RedOp op,
                    int divisor, cudaStream_t s) {
  using C = typename Tr::C;
  const C div = C(divisor);
  switch (op) {
    case RedOp::kSum: return launch<Tr, OpSum, false>(dst, srcs, nsrc, count, div, s);
    case RedOp::kAvg: return launch<Tr, OpSum, true>(dst, srcs, nsrc, count, div, s);
    case RedOp::kProduct: return launch<Tr, OpProd, false>(dst, srcs, nsrc, count, div, s);
    case RedOp::kMin: return launch<Tr, OpMin, false>(dst, srcs, nsrc, count, div, s);
    case RedOp::kMax: return launch<Tr, OpMax, false>(dst, srcs, nsrc, count, div, s);
    default: return;  // rejected by redop_supported
  }
}

template <class Tr>
void dispatch_int(void* dst, const void* const* srcs, int nsrc, size_t count, RedOp op,
                  cudaStream_t s) {
  using C = typename Tr::C;
  switch (op) {
    case RedOp::kSum: return launch<Tr, OpSum, false>(dst, srcs, nsrc, count, C(0), s);
    case RedOp::kProduct: return launch<Tr, OpProd, false>(dst, srcs, nsrc, count, C(0), s);
    case RedOp::kMin: return launch<Tr, OpMin, false>(dst, srcs, nsrc, count, C(0), s);
    case RedOp::kMax: return launch<Tr, OpMax, false>(dst, srcs, nsrc, count, C(0), s);
    case RedOp::kBand: return launch<Tr, OpBand, false>(dst, srcs, nsrc, count, C(0), s);
    case RedOp::kBor: return launch<Tr, OpBor, false>(dst, srcs, nsrc, count, C(0), s);
    case RedOp::kBxor: return launch<Tr, OpBxor, false>(dst, srcs, nsrc, count, C(0), s);
    default: return;  // rejected by redop_supported
  }
}

// bool: SUM/MAX are OR, PRODUCT/MIN are AND.
void dispatch_bool(void* dst, const void* const* srcs, int nsrc, size_t count, RedOp op,
                   cudaStream_t s) {
  switch (op) {
    case RedOp::kSum:
    case RedOp::kMax:
    case RedOp::kBor: return launch<Bool, OpBor, false>(dst, srcs, nsrc, count, 0, s);
    case RedOp::kProduct:
    case RedOp::kMin:
    case RedOp::kBand: return launch<Bool, OpBand, false>(dst, srcs, nsrc, count, 0, s);
    case RedOp::kBxor: return launch<Bool, OpBxor, false>(dst, srcs, nsrc, count, 0, s);
    default: return;  // rejected by redop_supported
  }
}

}  // namespace

void device_reduce_n(void* dst, const void* const* srcs, int nsrc, size_t count, DType dtype,
                     RedOp op, int divisor, cudaStream_t stream) {
  RSDP_CHECK(redop_supported(dtype, op), "reduce op ", redop_name(op), " is not defined for ",
             dtype_name(dtype));
  RSDP_CHECK(nsrc >= 1 && nsrc <= kMaxDeviceReduceSrcs, "device_reduce_n: nsrc must be in [1, ",
             kMaxDeviceReduceSrcs, "], got ", nsrc);
  RSDP_CHECK(srcs != nullptr, "device_reduce_n: srcs is null");
  RSDP_CHECK(op != RedOp::kAvg || divisor >= 1, "device_reduce_n: AVG needs divisor >= 1, got ",
             divisor);
  if (count == 0) return;

  // Complex values are reduced as pairs of reals (exact for SUM and AVG, the
  // only ops they allow), so pointers need only the component's alignment.
  const size_t scalar = dtype_is_complex(dtype) ? dtype_size(dtype) / 2 : dtype_size(dtype);
  RSDP_CHECK(dst != nullptr && reinterpret_cast<uintptr_t>(dst) % scalar == 0,
             "device_reduce_n: dst ", dst, " is null or not aligned to ", scalar, " bytes");
  for (int j = 0; j < nsrc; ++j)
    RSDP_CHECK(srcs[j] != nullptr && reinterpret_cast<uintptr_t>(srcs[j]) % scalar == 0,
               "device_reduce_n: srcs[", j, "] ", srcs[j], " is null or not aligned to ", scalar,
               " bytes");

  // A single non-AVG input is a bitwise copy, as in the CPU twin (a convert
  // round trip could alter fp16/bf16 NaN payloads); bool still gets normalised.
  if (nsrc == 1 && op != RedOp::kAvg && dtype != DType::kBool) {
    if (dst != srcs[0])
      RSDP_CUDA_CHECK(cudaMemcpyAsync(dst, srcs[0], count * dtype_size(dtype),
                                      cudaMemcpyDefault, stream),
                      "device_reduce_n copy: dtype ", dtype_name(dtype), " op ", redop_name(op),
                      " count ", count);
    return;
  }

  switch (dtype) {
    case DType::kFloat32:
      dispatch_float<Plain<float>>(dst, srcs, nsrc, count, op, divisor, stream);
      break;
    case DType::kFloat64:
      dispatch_float<Plain<double>>(dst, srcs, nsrc, count, op, divisor, stream);
      break;
    case DType::kFloat16: dispatch_float<F16>(dst, srcs, nsrc, count, op, divisor, stream); break;
    case DType::kBFloat16:
      dispatch_float<BF16>(dst, srcs, nsrc, count, op, divisor, stream);
      break;
    case DType::kComplex64:
      dispatch_float<Plain<float>>(dst, srcs, nsrc, 2 * count, op, divisor, stream);
      break;
    case DType::kComplex128:
      dispatch_float<Plain<double>>(dst, srcs, nsrc, 2 * count, op, divisor, stream);
      break;
    case DType::kInt8: dispatch_int<Plain<int8_t>>(dst, srcs, nsrc, count, op, stream); break;
    case DType::kUInt8: dispatch_int<Plain<uint8_t>>(dst, srcs, nsrc, count, op, stream); break;
    case DType::kInt32: dispatch_int<Plain<int32_t>>(dst, srcs, nsrc, count, op, stream); break;
    case DType::kInt64: dispatch_int<Plain<int64_t>>(dst, srcs, nsrc, count, op, stream); break;
    case DType::kBool: dispatch_bool(dst, srcs, nsrc, count, op, stream); break;
    default:
      RSDP_FAIL(ErrorKind::kValue, "device_reduce_n: unknown dtype ", int(dtype));
  }
  RSDP_CUDA_CHECK(cudaGetLastError(), "launching device_reduce_n: dtype ", dtype_name(dtype),
                  " op ", redop_name(op), " count ", count, " nsrc ", nsrc);
}

}  // namespace rsdp

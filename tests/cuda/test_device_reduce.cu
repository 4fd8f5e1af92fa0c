// Standalone GPU test for rsdp::device_reduce_n against the CPU twin
// rsdp::reduce_n: every legal (dtype, op), nsrc {1, 2, 3, 8}, counts
// {0, 1, 7, 1000, 100003}, and four pointer layouts:
//   aligned   every pointer 16-byte aligned (pack path from element 0)
//   offset    every pointer one element past alignment (scalar head, packs, tail)
//   mixed     only dst offset (all-scalar path)
//   inplace   dst is also one of the sources (aliasing, offset layout)
// Results must match bit for bit, except that two NaNs match whatever their
// payloads (GPU float arithmetic returns the canonical NaN). Guard elements
// around dst must stay untouched.
//   nvcc -std=c++17 -O2 -Icsrc -arch=sm_90 tests/cuda/test_device_reduce.cu
//        csrc/cuda/device_reduce.cu csrc/core/reduce_kernels.cpp csrc/core/error.cpp
// Exit status: 0 all passed, 1 a mismatch, 77 no CUDA device (skipped).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/half_convert.h"
#include "core/reduce_kernels.h"
#include "cuda/device_reduce.h"

using namespace rsdp;

namespace {

const DType kAllTypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                           DType::kInt8,    DType::kUInt8,   DType::kInt32,   DType::kInt64,
                           DType::kBool,    DType::kComplex64, DType::kComplex128};
const RedOp kAllOps[] = {RedOp::kSum, RedOp::kAvg,  RedOp::kProduct, RedOp::kMin,
                         RedOp::kMax, RedOp::kBand, RedOp::kBor,     RedOp::kBxor};
const int kNsrcs[] = {1, 2, 3, 8};
const size_t kCounts[] = {0, 1, 7, 1000, 100003};
enum Layout { kAligned, kOffset, kMixed, kInplace };
const char* const kLayoutNames[] = {"aligned", "offset", "mixed", "inplace"};

constexpr size_t kMaxCount = 100003;
constexpr size_t kGuard = 32;  // elements checked on each side of dst
constexpr int kDivisor = 3;    // AVG divisor: not a power of two, so the division rounds
constexpr uint8_t kPoison = 0xA5;

#define CUDA_OK(call)                                                                  \
  do {                                                                                 \
    cudaError_t e_ = (call);                                                           \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("%s failed: %s (line %d)\n", #call, cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

uint64_t g_state = 0x9E3779B97F4A7C15ull;
uint64_t next_u64() {  // splitmix64: deterministic, independent of the platform
  uint64_t z = (g_state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A float with a few special values mixed in (NaN, signed zeros, infinities)
// and otherwise moderate magnitudes with full mantissas, so sums round.
double random_real() {
  const uint64_t r = next_u64();
  switch (r % 64) {
    case 0: return NAN;
    case 1: return 0.0;
    case 2: return -0.0;
    case 3: return INFINITY;
    case 4: return -INFINITY;
    default: break;
  }
  const double m = double(r >> 11) / double(1ull << 53);  // [0, 1)
  return (m * 8.0 - 4.0) * std::ldexp(1.0, int((r >> 3) % 5) - 2);
}

void fill(DType dt, uint8_t* p, size_t count) {
  const size_t n = dtype_is_complex(dt) ? 2 * count : count;
  for (size_t i = 0; i < n; ++i) {
    switch (dt) {
      case DType::kFloat32:
      case DType::kComplex64: {
        const float v = float(random_real());
        std::memcpy(p + 4 * i, &v, 4);
        break;
      }
      case DType::kFloat64:
      case DType::kComplex128: {
        const double v = random_real();
        std::memcpy(p + 8 * i, &v, 8);
        break;
      }
      case DType::kFloat16: {
        const uint16_t v = f32_to_f16(float(random_real()));
        std::memcpy(p + 2 * i, &v, 2);
        break;
      }
      case DType::kBFloat16: {
        const uint16_t v = f32_to_bf16(float(random_real()));
        std::memcpy(p + 2 * i, &v, 2);
        break;
      }
      case DType::kBool: {  // mostly 0/1, some other non-zero bytes (still true)
        const uint64_t r = next_u64();
        p[i] = (r % 8 == 0) ? uint8_t(r >> 8) : uint8_t(r & 1);
        break;
      }
      default: {  // integers: full range, so SUM and PRODUCT wrap
        const uint64_t r = next_u64();
        const size_t sz = dtype_size(dt);
        // Small values half of the time, so MIN/MAX/PRODUCT see ties and small factors.
        const uint64_t v = (r & 1) ? r >> 1 : uint64_t(int64_t((r >> 1) % 7) - 3);
        std::memcpy(p + sz * i, &v, sz);
        break;
      }
    }
  }
}

bool same_scalar(DType dt, const uint8_t* a, const uint8_t* b) {
  switch (dt) {
    case DType::kFloat32:
    case DType::kComplex64: {
      float x, y;
      std::memcpy(&x, a, 4);
      std::memcpy(&y, b, 4);
      if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
      return std::memcmp(a, b, 4) == 0;
    }
    case DType::kFloat64:
    case DType::kComplex128: {
      double x, y;
      std::memcpy(&x, a, 8);
      std::memcpy(&y, b, 8);
      if (std::isnan(x) || std::isnan(y)) return std::isnan(x) && std::isnan(y);
      return std::memcmp(a, b, 8) == 0;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      uint16_t x, y;
      std::memcpy(&x, a, 2);
      std::memcpy(&y, b, 2);
      const float fx = dt == DType::kFloat16 ? f16_to_f32(x) : bf16_to_f32(x);
      const float fy = dt == DType::kFloat16 ? f16_to_f32(y) : bf16_to_f32(y);
      if (std::isnan(fx) || std::isnan(fy)) return std::isnan(fx) && std::isnan(fy);
      return x == y;
    }
    default: return std::memcmp(a, b, dtype_size(dt)) == 0;
  }
}

std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  char buf[4];
  for (size_t k = n; k-- > 0;) {  // little-endian: most significant byte first
    std::snprintf(buf, sizeof buf, "%02x", p[k]);
    s += buf;
  }
  return s;
}

// Expects `call` to throw rsdp::Error of kind kValue.
template <class F>
bool throws_value(F call) {
  try {
    call();
  } catch (const Error& e) {
    return e.kind() == ErrorKind::kValue;
  }
  return false;
}

}  // namespace

int main() {
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  CUDA_OK(cudaSetDevice(0));
  cudaStream_t stream;
  CUDA_OK(cudaStreamCreate(&stream));

  // One region per source plus dst, each with room for an offset and guards.
  constexpr int kMaxSrcs = 8;
  const size_t region = (kMaxCount + 4 * kGuard) * 16;
  uint8_t* dev_src[kMaxSrcs];
  for (auto& p : dev_src) CUDA_OK(cudaMalloc(&p, region));
  uint8_t* dev_dst;
  CUDA_OK(cudaMalloc(&dev_dst, region));

  std::vector<std::vector<uint8_t>> host_src(kMaxSrcs, std::vector<uint8_t>(region));
  std::vector<uint8_t> expect(region), got(region), poison(region, kPoison);

  long cases = 0;
  for (DType dt : kAllTypes) {
    const size_t esz = dtype_size(dt);
    for (RedOp op : kAllOps) {
      if (!redop_supported(dt, op)) {
        // Illegal pairs are rejected before anything is queued.
        const void* s0 = dev_src[0];
        if (!throws_value([&] {
              device_reduce_n(dev_dst, &s0, 1, 10, dt, op, kDivisor, stream);
            })) {
          std::printf("FAIL: %s %s was not rejected\n", dtype_name(dt), redop_name(op));
          return 1;
        }
        ++cases;
        continue;
      }
      for (int nsrc : kNsrcs) {
        for (size_t count : kCounts) {
          for (int layout = kAligned; layout <= kInplace; ++layout) {
            const bool src_off = layout == kOffset || layout == kInplace;
            const bool dst_off = layout != kAligned;
            const size_t base = kGuard * esz;  // 16-byte aligned: kGuard * esz % 16 == 0
            const size_t soff = base + (src_off ? esz : 0);
            const size_t doff = base + (dst_off ? esz : 0);
            const size_t bytes = count * esz;

            const void* hsrcs[kMaxSrcs];
            const void* dsrcs[kMaxSrcs];
            for (int j = 0; j < nsrc; ++j) {
              fill(dt, host_src[j].data() + soff, count);
              CUDA_OK(cudaMemcpy(dev_src[j] + soff, host_src[j].data() + soff, bytes,
                                 cudaMemcpyHostToDevice));
              hsrcs[j] = host_src[j].data() + soff;
              dsrcs[j] = dev_src[j] + soff;
            }
            CUDA_OK(cudaMemcpy(dev_dst, poison.data(), region, cudaMemcpyHostToDevice));
            if (layout == kInplace) {
              // dst replaces the last source: same data, and soff == doff.
              const int k = nsrc - 1;
              CUDA_OK(cudaMemcpy(dev_dst + doff, host_src[k].data() + soff, bytes,
                                 cudaMemcpyHostToDevice));
              dsrcs[k] = dev_dst + doff;
            }

            std::memcpy(expect.data(), poison.data(), region);
            reduce_n(expect.data() + doff, hsrcs, nsrc, count, dt, op, kDivisor);
            device_reduce_n(dev_dst + doff, dsrcs, nsrc, count, dt, op, kDivisor, stream);
            CUDA_OK(cudaStreamSynchronize(stream));
            CUDA_OK(cudaGetLastError());

            const size_t lo = doff - kGuard * esz, hi = doff + bytes + kGuard * esz;
            CUDA_OK(cudaMemcpy(got.data() + lo, dev_dst + lo, hi - lo, cudaMemcpyDeviceToHost));
            for (size_t at = lo; at < hi; at += esz) {
              const bool inside = at >= doff && at < doff + bytes;
              bool ok;
              if (!inside) {
                ok = std::memcmp(got.data() + at, expect.data() + at, esz) == 0;
              } else if (dtype_is_complex(dt)) {  // NaN-aware per part
                const DType part = dt == DType::kComplex64 ? DType::kFloat32 : DType::kFloat64;
                ok = same_scalar(part, got.data() + at, expect.data() + at) &&
                     same_scalar(part, got.data() + at + esz / 2, expect.data() + at + esz / 2);
              } else {
                ok = same_scalar(dt, got.data() + at, expect.data() + at);
              }
              if (!ok) {
                const long idx = (long(at) - long(doff)) / long(esz);
                std::printf(
                    "FAIL: dtype %s op %s nsrc %d count %zu layout %s: element %ld%s: got %s, "
                    "expected %s\n",
                    dtype_name(dt), redop_name(op), nsrc, count, kLayoutNames[layout], idx,
                    inside ? "" : " (guard)", hex(got.data() + at, esz).c_str(),
                    hex(expect.data() + at, esz).c_str());
                for (int j = 0; j < nsrc && inside; ++j)
                  std::printf("  src[%d] = %s\n", j,
                              hex(host_src[j].data() + soff + (at - doff), esz).c_str());
                return 1;
              }
            }
            ++cases;
          }
        }
      }
    }
  }

  // Argument checks: nsrc out of range is a value error naming the numbers.
  {
    const void* many[kMaxDeviceReduceSrcs + 1];
    for (auto& p : many) p = dev_src[0];
    const bool ok0 = throws_value([&] {
      device_reduce_n(dev_dst, many, 0, 10, DType::kFloat32, RedOp::kSum, 1, stream);
    });
    const bool ok33 = throws_value([&] {
      device_reduce_n(dev_dst, many, kMaxDeviceReduceSrcs + 1, 10, DType::kFloat32, RedOp::kSum,
                      1, stream);
    });
    if (!ok0 || !ok33) {
      std::printf("FAIL: nsrc out of range was not rejected (0: %d, %d: %d)\n", ok0,
                  kMaxDeviceReduceSrcs + 1, ok33);
      return 1;
    }
    cases += 2;
    // The maximum number of sources works (all the same buffer, in place).
    std::vector<float> ones(1000, 1.0f);
    CUDA_OK(cudaMemcpy(dev_dst, ones.data(), 1000 * sizeof(float), cudaMemcpyHostToDevice));
    for (auto& p : many) p = dev_dst;
    device_reduce_n(dev_dst, many, kMaxDeviceReduceSrcs, 1000, DType::kFloat32, RedOp::kSum, 1,
                    stream);
    CUDA_OK(cudaStreamSynchronize(stream));
    CUDA_OK(cudaMemcpy(ones.data(), dev_dst, 1000 * sizeof(float), cudaMemcpyDeviceToHost));
    for (float v : ones) {
      if (v != float(kMaxDeviceReduceSrcs)) {
        std::printf("FAIL: %d in-place sources gave %g\n", kMaxDeviceReduceSrcs, double(v));
        return 1;
      }
    }
    ++cases;
  }

  for (auto p : dev_src) CUDA_OK(cudaFree(p));
  CUDA_OK(cudaFree(dev_dst));
  CUDA_OK(cudaStreamDestroy(stream));
  std::printf("device_reduce: %ld cases passed\n", cases);
  return 0;
}

#include "cuda/stream_flag.h"

#include <cuda.h>

#include <mutex>

#include "cuda/cuda_check.h"

namespace rsdp {
namespace {

using WaitFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
using WriteFn = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

struct DriverOps {
  WaitFn wait = nullptr;
  WriteFn write = nullptr;
};

// Looked up once: the versioned entry points of CUDA 12.0 (the _v2 pair).
const DriverOps& driver_ops() {
  static DriverOps ops;
  static std::once_flag once;
  std::call_once(once, [] {
    cudaDriverEntryPointQueryResult q1, q2;
    void* w = nullptr;
    void* r = nullptr;
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &w, 12000, cudaEnableDefault,
                                         &q1) == cudaSuccess &&
        cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &r, 12000, cudaEnableDefault,
                                         &q2) == cudaSuccess &&
        q1 == cudaDriverEntryPointSuccess && q2 == cudaDriverEntryPointSuccess) {
      ops.wait = reinterpret_cast<WaitFn>(w);
      ops.write = reinterpret_cast<WriteFn>(r);
    }
    cudaGetLastError();  // a failed lookup must not poison later checks
  });
  return ops;
}

}  // namespace

StreamFlag::StreamFlag(int device) : device_(device) {
  int prev = 0;
  RSDP_CUDA_CHECK(cudaGetDevice(&prev));
  RSDP_CUDA_CHECK(cudaSetDevice(device));
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, sizeof(uint32_t));
  if (err == cudaSuccess) err = cudaMemset(p, 0, sizeof(uint32_t));
  cudaSetDevice(prev);
  RSDP_CUDA_CHECK(err, "(the completion flag of cuda:", device, ")");
  word_ = static_cast<uint32_t*>(p);
  available_ = driver_ops().wait != nullptr;
}

StreamFlag::~StreamFlag() {
  // no-throw: errors at teardown are ignored. Never after abandon() (see there).
  if (word_ && !abandoned_.load()) cudaFree(word_);
}

void StreamFlag::signal(cudaStream_t s, uint32_t value) {
  CUresult r = driver_ops().write(reinterpret_cast<CUstream>(s),
                                  reinterpret_cast<CUdeviceptr>(word_), value,
                                  CU_STREAM_WRITE_VALUE_DEFAULT);
  RSDP_CHECK_KIND(ErrorKind::kSystem, r == CUDA_SUCCESS,
                  "cuStreamWriteValue32 failed with CUresult ", static_cast<int>(r));
}

void StreamFlag::wait(cudaStream_t s, uint32_t value) {
  CUresult r = driver_ops().wait(reinterpret_cast<CUstream>(s),
                                 reinterpret_cast<CUdeviceptr>(word_), value,
                                 CU_STREAM_WAIT_VALUE_GEQ);
  RSDP_CHECK_KIND(ErrorKind::kSystem, r == CUDA_SUCCESS,
                  "cuStreamWaitValue32 failed with CUresult ", static_cast<int>(r));
}

}  // namespace rsdp

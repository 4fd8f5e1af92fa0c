// Device scratch memory for one op, allocated and freed in stream order
// (cudaMallocAsync), so it is never reused while queued work still reads it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "cuda/cuda_check.h"

namespace rsdp {

class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t s) : stream_(s) {
    if (bytes) RSDP_CUDA_CHECK(cudaMallocAsync(&p_, bytes, s), "(", bytes, " bytes of scratch)");
  }
  ~Scratch() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  char* get() const { return static_cast<char*>(p_); }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

}  // namespace rsdp

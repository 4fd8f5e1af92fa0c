// Makes a CUDA device current for a scope and restores the previous one on
// exit, so a collective never changes the caller's current device.
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"

namespace rsdp {

class CudaDeviceScope {
 public:
  explicit CudaDeviceScope(int device) : device_(device) {
    if (cudaGetDevice(&prev_) != cudaSuccess) {
      (void)cudaGetLastError();
      prev_ = -1;
    }
    if (prev_ != device_) RSDP_CUDA_CHECK(cudaSetDevice(device_), "(device ", device_, ")");
  }
  ~CudaDeviceScope() {
    if (prev_ >= 0 && prev_ != device_) (void)cudaSetDevice(prev_);  // never throws
  }
  CudaDeviceScope(const CudaDeviceScope&) = delete;
  CudaDeviceScope& operator=(const CudaDeviceScope&) = delete;

 private:
  int device_;
  int prev_ = -1;
};

}  // namespace rsdp

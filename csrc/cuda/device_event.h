// A CUDA event owned by one op: recorded on one stream, waited on by others,
// polled by the watchdog. (ATen's CUDAEvent would pull in the CUDA math
// libraries' headers; this needs only the runtime.)
#pragma once

#include <cuda_runtime_api.h>

#include "cuda/cuda_check.h"

namespace rsdp {

class DeviceEvent {
 public:
  DeviceEvent() {
    RSDP_CUDA_CHECK(cudaEventCreateWithFlags(&ev_, cudaEventDisableTiming));
  }
  ~DeviceEvent() { cudaEventDestroy(ev_); }  // safe while still pending
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  void record(cudaStream_t s) { RSDP_CUDA_CHECK(cudaEventRecord(ev_, s)); }
  // Work queued on s from now on runs after the recorded point.
  void block(cudaStream_t s) { RSDP_CUDA_CHECK(cudaStreamWaitEvent(s, ev_, 0)); }
  // True once the recorded work is done. An error (a failed kernel) counts
  // as not done; the watchdog's deadline then reports it.
  bool query() const {
    const cudaError_t e = cudaEventQuery(ev_);
    if (e != cudaSuccess && e != cudaErrorNotReady) cudaGetLastError();
    return e == cudaSuccess;
  }

 private:
  cudaEvent_t ev_ = nullptr;
};

}  // namespace rsdp

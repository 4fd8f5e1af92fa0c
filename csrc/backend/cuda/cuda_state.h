// What a process group keeps for its CUDA ops: the device it is bound to
// (one per process and group, as with ProcessGroupNCCL), the stream its ops
// run on, the completion flag Work.wait() waits on, and the watchdog.
#pragma once

#include <c10/cuda/CUDAStream.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "backend/cuda/cuda_watchdog.h"
#include "cuda/stream_flag.h"

namespace rsdp {

struct CudaState {
  CudaState(c10::Device device, std::function<void(const std::string&)> on_timeout)
      : device(device),
        stream(c10::cuda::getStreamFromPool(/*isHighPriority=*/true, device.index())),
        flag(std::make_shared<StreamFlag>(device.index())),
        // A timed-out op may leave a stream stuck on the flag: it must outlive
        // that stream (StreamFlag::abandon) rather than hang the teardown.
        watchdog([f = flag, on_timeout = std::move(on_timeout)](const std::string& why) {
          f->abandon();
          on_timeout(why);
        }) {}

  c10::Device device;
  c10::cuda::CUDAStream stream;
  std::shared_ptr<StreamFlag> flag;
  uint32_t issued = 0;  // flag values handed out, under the backend's cuda_mu_
  CudaWatchdog watchdog;
};

}  // namespace rsdp

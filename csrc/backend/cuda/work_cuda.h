// The Work of an op on CUDA tensors, with ProcessGroupNCCL's semantics:
//  - wait() makes the caller's current stream wait for the op and returns at
//    once (the host is not blocked); it raises if the op already failed;
//  - isCompleted() is true once the GPU has finished the op (the watchdog
//    notices and calls gpu_done());
//  - getFuture() is a CUDA-aware future, marked complete when the op is
//    queued, so its then()/wait() order on streams too.
#pragma once

#include "cuda/device_event.h"
#include <c10/cuda/CUDAStream.h>

#include <condition_variable>
#include <memory>
#include <mutex>

#include "backend/work_rsdp.h"
#include "cuda/stream_flag.h"

namespace rsdp {

class WorkRSDPCuda : public WorkRSDP {
 public:
  // flag/value: the backend stream sets `flag` to `value` when the op's GPU
  // work is done.
  WorkRSDPCuda(int rank, c10d::OpType type, uint64_t seq, std::vector<at::Tensor> outputs,
               const char* title, c10::Device device, std::shared_ptr<StreamFlag> flag,
               uint32_t value);

  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;
  void synchronize() override;

  // The worker has queued the op (err: it failed on the host). `done` is
  // recorded on `stream` after the op's GPU work.
  void enqueued(std::exception_ptr err, std::shared_ptr<DeviceEvent> done,
                const c10::cuda::CUDAStream& stream);
  // The GPU finished the op, or the watchdog gave up on it (err).
  void gpu_done(std::exception_ptr err);

 private:
  // Makes `s` wait for the op: on the flag where the driver has stream
  // memory operations, else on the done event (which needs the op queued,
  // so the host waits for that, up to the op's own deadline).
  void stream_wait(const c10::cuda::CUDAStream& s);
  void rethrow_if_failed();

  c10::Device device_;
  std::shared_ptr<StreamFlag> flag_;
  uint32_t value_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool queued_ = false;
  bool finished_ = false;
  std::exception_ptr error_;
  std::shared_ptr<DeviceEvent> done_;
};

}  // namespace rsdp

#include "backend/cuda/work_cuda.h"

#include <c10/cuda/CUDAGuard.h>

namespace rsdp {

WorkRSDPCuda::WorkRSDPCuda(int rank, c10d::OpType type, uint64_t seq,
                           std::vector<at::Tensor> outputs, const char* title,
                           c10::Device device, std::shared_ptr<StreamFlag> flag, uint32_t value)
    : WorkRSDP(rank, type, seq, std::move(outputs), title, {device}),
      device_(device),
      flag_(std::move(flag)),
      value_(value) {}

void WorkRSDPCuda::enqueued(std::exception_ptr err, std::shared_ptr<DeviceEvent> done,
                            const c10::cuda::CUDAStream& stream) {
  {
    std::lock_guard<std::mutex> g(mu_);
    queued_ = true;
    done_ = std::move(done);
    if (err && !error_) error_ = to_torch_exception(err);
    err = error_;
  }
  cv_.notify_all();
  if (err) {
    future_->setError(err);
    finish(err);
    return;
  }
  // Marking a CUDA future complete records an event on the current stream
  // of its device, which must be the stream that ran the op.
  c10::cuda::CUDAStreamGuard guard(stream);
  future_->markCompleted(c10::IValue(outputs_));
}

void WorkRSDPCuda::gpu_done(std::exception_ptr err) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (finished_) return;
    finished_ = true;
    if (err && !error_) error_ = to_torch_exception(err);
    err = error_;
  }
  if (err) {
    if (!future_->completed()) future_->setError(err);
    finish(err);
  } else {
    finish();
  }
}

void WorkRSDPCuda::stream_wait(const c10::cuda::CUDAStream& s) {
  if (flag_->available()) {
    flag_->wait(s.stream(), value_);
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return queued_; });
  if (done_) done_->block(s.stream());
}

void WorkRSDPCuda::rethrow_if_failed() {
  std::lock_guard<std::mutex> g(mu_);
  if (error_) std::rethrow_exception(error_);
}

bool WorkRSDPCuda::wait(std::chrono::milliseconds /*timeout*/) {
  // The op's own deadline (the watchdog) bounds it; like ProcessGroupNCCL
  // without blocking wait, the host does not wait here.
  rethrow_if_failed();
  c10::cuda::CUDAGuard guard(device_);
  stream_wait(c10::cuda::getCurrentCUDAStream(device_.index()));
  rethrow_if_failed();
  return true;
}

void WorkRSDPCuda::synchronize() {
  c10::cuda::CUDAGuard guard(device_);
  stream_wait(c10::cuda::getCurrentCUDAStream(device_.index()));
}

}  // namespace rsdp

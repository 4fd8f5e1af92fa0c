// The Work handle every rsdp op returns. Completion comes from the group's
// worker (collectives) or P2P thread; wait()/isCompleted() are the base
// class's, getFuture() completes with the op's output tensors, which is what
// DDP's communication hooks consume.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <atomic>
#include <chrono>
#include <memory>

namespace rsdp {

class OpQueue;
class WorkTracker;

class WorkRSDP : public c10d::Work {
 public:
  // devices: where the outputs live; a future on CUDA devices is
  // stream-aware (marking it complete records on the current streams).
  WorkRSDP(int rank, c10d::OpType type, uint64_t seq, std::vector<at::Tensor> outputs,
           const char* profiling_title, std::vector<c10::Device> devices = {});

  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  int sourceRank() const override;
  uint64_t getSequencenumber() const override { return seq_; }

  // Called once by the thread that ran the op. src: the sender of a recv.
  void complete(std::exception_ptr err, int src = -1);

  // The op runs as a task of `queue`: wait() without a timeout runs it (and
  // the tasks queued before it) itself if the worker has not taken it yet,
  // and polls for up to poll_us before sleeping ([Note: waiting runs the op]).
  void help_from(std::weak_ptr<OpQueue> queue, int poll_us) {
    queue_ = std::move(queue);
    poll_us_ = poll_us;
  }
  bool wait(std::chrono::milliseconds timeout = kNoTimeout) override;

  // The backend's tracker (work_tracker.h), told when this Work completes.
  void track(std::shared_ptr<WorkTracker> tracker) { tracker_ = std::move(tracker); }
  // The op's body starts now (until then it waited in the queue).
  void mark_running() { running_since_ = std::chrono::steady_clock::now(); }
  std::chrono::steady_clock::time_point issued_at() const { return issued_at_; }
  std::chrono::steady_clock::time_point running_since() const { return running_since_; }

 protected:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;

 private:
  std::atomic<int> src_{-1};
  std::atomic<bool> done_{false};  // complete() ran: what wait() polls
  std::weak_ptr<OpQueue> queue_;
  int poll_us_ = 0;
  uint64_t seq_;
  std::shared_ptr<WorkTracker> tracker_;
  std::chrono::steady_clock::time_point issued_at_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point running_since_ = issued_at_;
};

// Turns any exception into the c10 exception Python should see: rsdp value
// errors become ValueError, everything else DistBackendError (a RuntimeError).
std::exception_ptr to_torch_exception(std::exception_ptr e);

}  // namespace rsdp

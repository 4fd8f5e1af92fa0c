#include "backend/work_rsdp.h"

#include <c10/util/Exception.h>
#include <sched.h>

#include <algorithm>

#include "backend/op_queue.h"
#include "backend/work_tracker.h"
#include "core/error.h"

namespace rsdp {

WorkRSDP::WorkRSDP(int rank, c10d::OpType type, uint64_t seq, std::vector<at::Tensor> outputs,
                   const char* profiling_title, std::vector<c10::Device> devices)
    : c10d::Work(rank, type, profiling_title, outputs),
      outputs_(std::move(outputs)),
      future_(c10::make_intrusive<c10::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()), std::move(devices))),
      seq_(seq) {}

int WorkRSDP::sourceRank() const {
  int s = src_.load();
  TORCH_CHECK(s >= 0, "sourceRank() is only defined for a completed recv from any source");
  return s;
}

void WorkRSDP::complete(std::exception_ptr err, int src) {
  src_.store(src);
  const std::exception_ptr raw = err;
  // The future first, then wake wait(): code that reads get_future().value()
  // right after wait() must find it complete (gloo orders it the same way).
  // The group's error before either: getError() right after wait() raised
  // must already say what broke it.
  if (err) {
    if (tracker_) tracker_->failed(raw);
    err = to_torch_exception(err);
    future_->setError(err);
    finish(err);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
    finish();
  }
  done_.store(true, std::memory_order_release);
  if (tracker_) tracker_->completed(*this, raw);
}

// [Note: waiting runs the op]
// An async op (async_op=True, and every op FSDP2 issues) is run by the
// group's worker thread, and its waiter sleeps on the Work's condition
// variable: two thread hand-offs, each a futex wake-up through the scheduler
// (more than a small op's own work, and more again where the worker is woken
// on an idle core), against none for a blocking op, which runs on the caller's
// thread when the queue is idle. So a waiter whose op the worker has not
// taken yet runs it itself, after the ops queued before it (issue order
// holds: the queue hands out one task at a time), and a waiter whose op is
// running polls for the group's spin time before it sleeps, yielding its
// core at every poll (the worker may share it). Only a wait without a
// timeout runs the op: the op's own deadline is the group's, which would
// outlast a shorter timeout given to wait().
bool WorkRSDP::wait(std::chrono::milliseconds timeout) {
  if (!done_.load(std::memory_order_acquire)) {
    if (timeout == kNoTimeout)
      if (auto queue = queue_.lock()) queue->help(done_);
    const auto poll = std::chrono::microseconds(poll_us_);
    const auto end = std::chrono::steady_clock::now() +
                     (timeout == kNoTimeout ? poll : std::min<std::chrono::microseconds>(
                                                         poll, timeout));
    while (!done_.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < end)
      sched_yield();
  }
  return c10d::Work::wait(timeout);
}

std::exception_ptr to_torch_exception(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    try {
      if (err.kind() == ErrorKind::kValue) C10_THROW_ERROR(ValueError, err.what());
      C10_THROW_ERROR(DistBackendError, err.what());
    } catch (...) {
      return std::current_exception();
    }
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace rsdp

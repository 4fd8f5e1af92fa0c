#include "backend/work_rsdp.h"

#include <c10/util/Exception.h>

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
  if (tracker_) tracker_->completed(*this, raw);
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

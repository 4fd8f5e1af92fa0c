// BackendRSDP's contract across Works: timeout changes, pending Works, the
// completion hook, and coalescing blocks. The bookkeeping is WorkTracker's.
#include "backend/backend_rsdp.h"

namespace rsdp {

void BackendRSDP::setTimeout(std::chrono::milliseconds timeout) {
  translate_errors([&] {
    RSDP_CHECK(timeout.count() > 0, "rsdp rank ", global_rank_, ": set_timeout: timeout ",
               timeout.count(), "ms must be positive");
    // Ops issued from now on get it; ops already issued keep theirs.
    timeout_ms_ = timeout.count();
  });
}

void BackendRSDP::waitForPendingWorks() { tracker_->wait_pending(); }

void BackendRSDP::registerOnCompletionHook(
    std::function<void(std::shared_ptr<c10d::WorkInfo>)>&& hook) {
  translate_errors([&] {
    RSDP_CHECK(tracker_->set_hook(std::move(hook)), "rsdp rank ", global_rank_,
               ": register_on_completion_hook: the process group already has a hook "
               "(one per group, as ProcessGroupNCCL)");
  });
}

void BackendRSDP::startCoalescing() {
  translate_errors([&] {
    RSDP_CHECK(tracker_->start_coalescing(), "rsdp rank ", global_rank_,
               ": start_coalescing: a coalescing block is already open");
  });
}

c10::intrusive_ptr<c10d::Work> BackendRSDP::endCoalescing() {
  return translate_errors([&]() -> c10::intrusive_ptr<c10d::Work> {
    std::vector<c10::intrusive_ptr<WorkRSDP>> works;
    RSDP_CHECK(tracker_->end_coalescing(works), "rsdp rank ", global_rank_,
               ": end_coalescing without start_coalescing");
    std::vector<at::Tensor> outputs;
    for (auto& w : works) {
      auto r = w->result();
      outputs.insert(outputs.end(), r.begin(), r.end());
    }
    auto all = c10::make_intrusive<WorkRSDP>(getRank(), c10d::OpType::COALESCED, seq_.load(),
                                             std::move(outputs), "rsdp:coalesced");
    if (works.empty()) {
      all->complete(nullptr);
      return all;
    }
    // One Work for the block: complete when every op in it is, failed with
    // the first failure. The ops themselves were issued as they came (p2p
    // ones run concurrently, collectives in issue order on the worker).
    struct Left {
      std::mutex mu;
      size_t n;
      std::exception_ptr err;
    };
    auto left = std::make_shared<Left>();
    left->n = works.size();
    for (auto& w : works)
      w->getFuture()->addCallback([left, all](c10::ivalue::Future& f) {
        std::exception_ptr err;
        {
          std::lock_guard<std::mutex> g(left->mu);
          if (f.hasError() && !left->err) left->err = f.exception_ptr();
          if (--left->n) return;
          err = left->err;
        }
        all->complete(err);
      });
    return all;
  });
}

}  // namespace rsdp

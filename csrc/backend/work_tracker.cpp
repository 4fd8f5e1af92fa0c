#include "backend/work_tracker.h"

#include <algorithm>
#include <iostream>

#include "backend/torch_version.h"
#include "backend/work_rsdp.h"
#include "core/error.h"

namespace rsdp {
namespace {

using Steady = std::chrono::steady_clock;

// The clock of c10d::WorkInfo's time points: steady_clock since torch 2.10,
// system_clock before (mapped through `now`, a steady time of the same moment).
#if RSDP_TORCH_AT_LEAST(2, 10)
Steady::time_point torch_time(Steady::time_point t, Steady::time_point) { return t; }
#else
std::chrono::system_clock::time_point torch_time(Steady::time_point t, Steady::time_point now) {
  return std::chrono::system_clock::now() -
         std::chrono::duration_cast<std::chrono::system_clock::duration>(now - t);
}
#endif

}  // namespace

namespace {

// What a failure says about the group. Bad arguments and mismatched calls
// leave it usable, so they are not the group's error.
c10d::ErrorType classify(const std::exception_ptr& err) {
  try {
    std::rethrow_exception(err);
  } catch (const Error& e) {
    switch (e.kind()) {
      case ErrorKind::kValue:
      case ErrorKind::kMismatch:
        return c10d::ErrorType::SUCCESS;
      case ErrorKind::kTimeout:
        return c10d::ErrorType::TIMEOUT;
      case ErrorKind::kPeer:
        return c10d::ErrorType::REMOTE_ERROR;
      case ErrorKind::kSystem:
        return c10d::ErrorType::COMM_ERROR;
    }
  } catch (...) {
  }
  return c10d::ErrorType::COMM_ERROR;
}

}  // namespace

void WorkTracker::issued(const c10::intrusive_ptr<WorkRSDP>& work) {
  std::lock_guard<std::mutex> g(mu_);
  pending_.emplace(work.get(), work);
  if (coalescing_) coalesced_.push_back(work);
}

void WorkTracker::failed(std::exception_ptr err) {
  auto kind = classify(err);
  auto none = c10d::ErrorType::SUCCESS;
  if (kind != none) error_.compare_exchange_strong(none, kind);  // the first one stays
}

void WorkTracker::completed(WorkRSDP& work, std::exception_ptr err) {
  const auto now = std::chrono::steady_clock::now();
  Hook hook;
  if (has_hook_.load(std::memory_order_acquire)) {  // no copy per op without a hook
    std::lock_guard<std::mutex> g(mu_);
    hook = hook_;
  }
  if (hook) {
    // activeDuration: the time the op ran, not the time it queued. Taken
    // always (a clock read; NCCL needs CUDA events, hence its opt-in).
    // Rounded up to Python's timedelta resolution (1 us): a small op on
    // shared memory can finish within a fraction of it, and an op that ran
    // must not read as one that took no time.
    const std::chrono::duration<float> active =
        std::max<std::chrono::duration<float>>(now - work.running_since(),
                                               std::chrono::microseconds(1));
    try {
      hook(std::make_shared<c10d::WorkInfo>(work.retrieveOpType(), work.getSequencenumber(),
                                            torch_time(work.issued_at(), now),
                                            torch_time(now, now), active));
    } catch (const std::exception& e) {
      // The op itself succeeded or failed already; a broken hook must not
      // take the worker thread down with it.
      std::cerr << "torch_rsdp: the on-completion hook raised: " << e.what() << std::endl;
    }
  }
  // Pending until its hook has run: waitForPendingWorks then means "and
  // every hook fired", which is what torch's tests of it check.
  c10::intrusive_ptr<WorkRSDP> keep;  // `work` may be held only by pending_
  {
    std::lock_guard<std::mutex> g(mu_);
    auto it = pending_.find(&work);
    if (it != pending_.end()) {
      keep = std::move(it->second);
      pending_.erase(it);
    }
  }
  done_.notify_all();
}

void WorkTracker::wait_pending() {
  std::unique_lock<std::mutex> g(mu_);
  std::vector<const WorkRSDP*> mine;
  for (auto& kv : pending_) mine.push_back(kv.first);
  // Every op has a deadline, so each of these completes (or fails) in time.
  done_.wait(g, [&] {
    for (auto* w : mine)
      if (pending_.count(w)) return false;
    return true;
  });
}

size_t WorkTracker::pending() const {
  std::lock_guard<std::mutex> g(mu_);
  return pending_.size();
}

bool WorkTracker::set_hook(Hook hook) {
  std::lock_guard<std::mutex> g(mu_);
  if (hook_) return false;
  hook_ = std::move(hook);
  has_hook_.store(true, std::memory_order_release);
  return true;
}

bool WorkTracker::start_coalescing() {
  std::lock_guard<std::mutex> g(mu_);
  if (coalescing_) return false;
  coalescing_ = true;
  coalesced_.clear();
  return true;
}

bool WorkTracker::end_coalescing(std::vector<c10::intrusive_ptr<WorkRSDP>>& works) {
  std::lock_guard<std::mutex> g(mu_);
  if (!coalescing_) return false;
  coalescing_ = false;
  works = std::move(coalesced_);
  coalesced_.clear();
  return true;
}

void WorkTracker::clear() {
  std::unordered_map<const WorkRSDP*, c10::intrusive_ptr<WorkRSDP>> gone;
  {
    std::lock_guard<std::mutex> g(mu_);
    gone.swap(pending_);
    coalesced_.clear();
    coalescing_ = false;
  }
  done_.notify_all();
}

}  // namespace rsdp

// What a backend knows about its Works beyond each one's own state, for the
// parts of c10d::Backend's contract that look across Works:
//   waitForPendingWorks  - the Works issued and not yet complete;
//   getError             - the first failure that broke the group;
//   registerOnCompletionHook - a hook called with each Work's WorkInfo as it
//                          completes (durations always: a clock read on CPU);
//   startCoalescing / endCoalescing - the Works issued in between, which
//                          endCoalescing turns into one Work.
// Works hold it by shared_ptr: a Work may outlive its backend.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace rsdp {

class WorkRSDP;

class WorkTracker {
 public:
  using Hook = std::function<void(std::shared_ptr<c10d::WorkInfo>)>;

  // Before the Work can complete (a blocking op may complete inline).
  void issued(const c10::intrusive_ptr<WorkRSDP>& work);
  // From WorkRSDP::complete, before waiters are woken: a failure that broke
  // the group is what getError() says from then on, so a caller whose wait()
  // raised finds it there at once (torchft's errored() asks right away).
  void failed(std::exception_ptr err);
  // From WorkRSDP::complete, after waiters were woken; err as the op threw it.
  void completed(WorkRSDP& work, std::exception_ptr err);

  // Waits until every Work issued so far completed (failed ones too: their
  // Work reports that) and its hook ran.
  void wait_pending();
  size_t pending() const;

  c10d::ErrorType error() const { return error_.load(); }

  // One hook per group, as ProcessGroupNCCL; false if one is set already.
  bool set_hook(Hook hook);

  bool start_coalescing();  // false if a block is already open
  // Closes the block: `works` gets those issued since start_coalescing, in
  // issue order. False if no block was open.
  bool end_coalescing(std::vector<c10::intrusive_ptr<WorkRSDP>>& works);

  // The backend stopped: nothing it issued can still be waited for.
  void clear();

 private:
  mutable std::mutex mu_;
  std::condition_variable done_;
  std::unordered_map<const WorkRSDP*, c10::intrusive_ptr<WorkRSDP>> pending_;
  std::atomic<c10d::ErrorType> error_{c10d::ErrorType::SUCCESS};
  Hook hook_;
  std::atomic<bool> has_hook_{false};
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<WorkRSDP>> coalesced_;
};

}  // namespace rsdp

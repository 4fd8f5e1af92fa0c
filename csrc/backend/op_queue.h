// The worker thread of a process group: runs its collectives one at a time,
// in the order they were issued (which is what keeps every rank's step
// counters in lock-step). stop(drain=true) runs what is queued first, as
// gloo does on destroy; stop(drain=false) calls queued tasks with run=false
// so they fail their Work instead of leaving it pending.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace rsdp {

class OpQueue {
 public:
  using Task = std::function<void(bool run)>;

  OpQueue();
  ~OpQueue();  // stop(true)

  void push(Task task);
  // Runs task on the calling thread if nothing is queued or running (so
  // issue order is kept) and returns true; else returns false. A blocking
  // collective then costs no thread hand-off.
  bool run_inline_if_idle(const Task& task);
  // The same in two halves, for an op the caller runs in pieces on its own
  // thread (BackendRSDP::ring_step): true if the queue was idle and is now
  // held (tasks pushed meanwhile wait); release() lets them run.
  bool try_reserve();
  void release();
  // For a thread about to block until `done`: runs the queued tasks on the
  // calling thread, in order, while the worker has not taken them and `done`
  // is not set; returns `done`. An op issued with async_op=True and waited
  // for at once then costs no thread hand-off either ([Note: waiting runs
  // the op] in work_rsdp.cpp).
  bool help(const std::atomic<bool>& done);
  // Finishes the running task, then drains or cancels the rest; joins.
  void stop(bool drain);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  bool drain_ = true;
  bool busy_ = false;  // a task runs, on the worker or inline
  std::thread thread_;
};

}  // namespace rsdp

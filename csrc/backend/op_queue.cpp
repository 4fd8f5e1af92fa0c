#include "backend/op_queue.h"

#include <sched.h>

namespace rsdp {

OpQueue::OpQueue() : thread_([this] { loop(); }) {}

OpQueue::~OpQueue() { stop(true); }

void OpQueue::stop(bool drain) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_) return;
    stop_ = true;
    drain_ = drain;
  }
  cv_.notify_all();
  thread_.join();
}

void OpQueue::push(Task task) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (!stop_) {
      tasks_.push_back(std::move(task));
      cv_.notify_one();
      return;
    }
  }
  task(false);  // stopped: cancel rather than leave its Work pending forever
}

void OpQueue::loop() {
  // [Note: a worker that does not preempt]
  // A task pushed wakes this thread, and the kernel puts a woken thread ahead
  // of the one running on the core it lands on: the caller's own thread (one
  // core per rank), which was about to wait and run the task itself ([Note:
  // waiting runs the op] in work_rsdp.cpp), or a peer rank's thread in the
  // middle of the same collective. As SCHED_BATCH (the same share of the
  // core, no wake-up preemption) it runs when that thread waits, yields or
  // its slice ends, or at once on an idle core. The two go together: with
  // wake-up preemption, a waiter that runs the op is itself preempted by the
  // worker it woke, and a small async op waited at once gets slower, not
  // faster. Best effort: a refusal (a seccomp policy) leaves the thread as
  // it was.
  sched_param param{};
  param.sched_priority = 0;
  (void)sched_setscheduler(0, SCHED_BATCH, &param);
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return (stop_ || !tasks_.empty()) && !busy_; });
      if (stop_ && (!drain_ || tasks_.empty())) {
        std::deque<Task> left;
        left.swap(tasks_);
        lk.unlock();
        for (auto& t : left) t(false);
        return;
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    task(true);
    std::lock_guard<std::mutex> g(mu_);
    busy_ = false;
  }
}

bool OpQueue::run_inline_if_idle(const Task& task) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stop_ || busy_ || !tasks_.empty()) return false;
    busy_ = true;
  }
  task(true);
  bool queued;
  {
    std::lock_guard<std::mutex> g(mu_);
    busy_ = false;
    queued = !tasks_.empty() || stop_;
  }
  // Wake the worker only when it has something to do: a needless wake-up
  // costs a futex call here and, worse, puts a thread on a core that a peer
  // rank of this node is spinning on.
  if (queued) cv_.notify_all();
  return true;
}

bool OpQueue::help(const std::atomic<bool>& done) {
  for (;;) {
    Task task;
    {
      std::lock_guard<std::mutex> g(mu_);
      // Not busy and not done: the waited-for task is still queued, behind
      // the ones at the front, which must run first (issue order).
      if (done.load(std::memory_order_acquire)) return true;
      if (stop_ || busy_ || tasks_.empty()) return false;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      busy_ = true;
    }
    task(true);
    release();
  }
}

bool OpQueue::try_reserve() {
  std::lock_guard<std::mutex> g(mu_);
  if (stop_ || busy_ || !tasks_.empty()) return false;
  busy_ = true;
  return true;
}

void OpQueue::release() {
  bool queued;
  {
    std::lock_guard<std::mutex> g(mu_);
    busy_ = false;
    queued = !tasks_.empty() || stop_;
  }
  if (queued) cv_.notify_all();
}

}  // namespace rsdp

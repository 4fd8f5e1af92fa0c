#include "backend/op_queue.h"

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

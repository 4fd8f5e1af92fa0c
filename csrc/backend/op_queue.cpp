#include "backend/op_queue.h"

namespace rsdp {

OpQueue::OpQueue() : thread_([this] { loop(); }) {}

OpQueue::~OpQueue() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void OpQueue::push(Task task) {
  {
    std::lock_guard<std::mutex> g(mu_);
    tasks_.push_back(std::move(task));
  }
  cv_.notify_one();
}

void OpQueue::loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
      if (stop_) {
        std::deque<Task> left;
        left.swap(tasks_);
        lk.unlock();
        for (auto& t : left) t(false);
        return;
      }
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task(true);
  }
}

}  // namespace rsdp

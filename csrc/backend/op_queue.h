// The worker thread of a process group: runs its collectives one at a time,
// in the order they were issued (which is what keeps every rank's step
// counters in lock-step). Tasks still queued at shutdown are called with
// run=false so they can fail their Work instead of leaving it pending.
#pragma once

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
  ~OpQueue();  // cancels what is queued, finishes the running task, joins

  void push(Task task);

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace rsdp

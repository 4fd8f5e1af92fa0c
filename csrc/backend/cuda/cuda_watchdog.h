// Watches the GPU side of a group's CUDA ops.
//
// Each queued op is handed over with its done event, what must stay alive
// until the GPU is done with it (the op's body, which holds its tensors),
// and its deadline. A thread polls the events: a finished op completes its
// Work and releases its tensors; an op past its deadline fails its Work with
// a timeout and calls `on_timeout` (which aborts the group), so a GPU that
// waits forever on a dead peer becomes an error instead of a silent hang. The
// tensors of a timed-out op are kept until the watchdog goes away, since the
// GPU may still touch them.
#pragma once

#include "cuda/device_event.h"

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "backend/cuda/work_cuda.h"

namespace rsdp {

class CudaWatchdog {
 public:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    c10::intrusive_ptr<WorkRSDPCuda> work;
    std::shared_ptr<DeviceEvent> done;
    std::shared_ptr<void> keep_alive;
    Clock::time_point deadline;
    std::string what;  // for the timeout message
  };

  explicit CudaWatchdog(std::function<void(const std::string&)> on_timeout);
  // Waits for the ops still running (each up to its deadline), then stops.
  ~CudaWatchdog();

  void add(Entry e);
  // Fails every pending op at once (the group was aborted): nothing waits
  // for a GPU that may never finish. Their tensors stay until destruction.
  void abandon(const std::string& why);

 private:
  void loop();
  bool poll_once();  // true when nothing is pending

  std::function<void(const std::string&)> on_timeout_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Entry> pending_;
  std::vector<Entry> timed_out_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace rsdp

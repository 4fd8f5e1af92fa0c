#include "backend/cuda/cuda_watchdog.h"

#include <iostream>

#include "core/error.h"

namespace rsdp {

CudaWatchdog::CudaWatchdog(std::function<void(const std::string&)> on_timeout)
    : on_timeout_(std::move(on_timeout)), thread_([this] { loop(); }) {}

CudaWatchdog::~CudaWatchdog() {
  {
    std::lock_guard<std::mutex> g(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void CudaWatchdog::add(Entry e) {
  {
    std::lock_guard<std::mutex> g(mu_);
    pending_.push_back(std::move(e));
  }
  cv_.notify_all();
}

void CudaWatchdog::abandon(const std::string& why) {
  std::deque<Entry> left;
  {
    std::lock_guard<std::mutex> g(mu_);
    left.swap(pending_);
  }
  for (auto& e : left) e.work->gpu_done(std::make_exception_ptr(Error(ErrorKind::kPeer, why)));
  std::lock_guard<std::mutex> g(mu_);
  for (auto& e : left) timed_out_.push_back(std::move(e));
}

bool CudaWatchdog::poll_once() {
  // Ops finish in the order they were queued (one stream), so only the
  // oldest needs a look; a finished one lets the next be checked at once.
  for (;;) {
    Entry e;
    {
      std::lock_guard<std::mutex> g(mu_);
      if (pending_.empty()) return true;
      e = pending_.front();
    }
    if (e.done->query()) {
      e.work->gpu_done(nullptr);
    } else if (Clock::now() > e.deadline) {
      const std::string msg = e.what + " did not finish on the GPU before its deadline (timeout: "
                              "Timed out waiting for the GPU); the process group is aborted";
      std::cerr << msg << std::endl;
      e.work->gpu_done(std::make_exception_ptr(Error(ErrorKind::kTimeout, msg)));
      on_timeout_(msg);
      std::lock_guard<std::mutex> g(mu_);
      timed_out_.push_back(pending_.front());
    } else {
      return false;
    }
    std::lock_guard<std::mutex> g(mu_);
    pending_.pop_front();  // releases the op's tensors (unless kept above)
  }
}

void CudaWatchdog::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stop_ || !pending_.empty(); });
    lk.unlock();
    const bool idle = poll_once();
    lk.lock();
    if (idle && stop_ && pending_.empty()) return;
    // Polling: CUDA has no callback that may release tensors (host
    // callbacks must not call into CUDA). 200 us keeps isCompleted() fresh.
    if (!idle) cv_.wait_for(lk, std::chrono::microseconds(200));
  }
}

}  // namespace rsdp

#include "transport/emu/emu_stream.h"

namespace rsdp {

EmuStream::EmuStream(int jitter_us, uint64_t seed)
    : jitter_us_(jitter_us), rng_(seed), thread_([this] { loop(); }) {}

EmuStream::~EmuStream() {
  kill();
  if (thread_.joinable()) thread_.join();
}

void EmuStream::push(std::function<void()> op, std::string what) {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (killed_) return;
    queue_.push_back({std::move(op), std::move(what)});
    ++pushed_;
  }
  cv_.notify_one();
}

bool EmuStream::drain(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lk(mu_);
  const uint64_t want = pushed_;
  const bool done =
      idle_cv_.wait_until(lk, deadline, [&] { return done_ >= want || killed_.load(); });
  if (error_) std::rethrow_exception(error_);
  return done && done_ >= want;
}

std::string EmuStream::current() const {
  std::lock_guard<std::mutex> g(mu_);
  return current_;
}

void EmuStream::kill() {
  {
    std::lock_guard<std::mutex> g(mu_);
    killed_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  idle_cv_.notify_all();
}

void EmuStream::wait_until(const std::function<bool()>& ready) const {
  for (int spins = 0; !ready(); ++spins) {
    if (killed_.load(std::memory_order_relaxed)) return;
    if (spins < 200)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

void EmuStream::loop() {
  std::uniform_int_distribution<int> delay(0, jitter_us_ > 0 ? jitter_us_ : 0);
  for (;;) {
    Op op;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return killed_.load() || !queue_.empty(); });
      if (killed_) return;
      op = std::move(queue_.front());
      queue_.pop_front();
      current_ = op.what;
    }
    if (jitter_us_ > 0) std::this_thread::sleep_for(std::chrono::microseconds(delay(rng_)));
    bool poisoned;
    {
      std::lock_guard<std::mutex> g(mu_);
      poisoned = error_ != nullptr;
    }
    std::exception_ptr err;
    if (!poisoned) {
      try {
        op.fn();
      } catch (...) {
        err = std::current_exception();
      }
    }
    {
      std::lock_guard<std::mutex> g(mu_);
      if (err && !error_) error_ = err;
      current_.clear();
      ++done_;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace rsdp

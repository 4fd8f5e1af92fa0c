// The emulated device's stream: one thread per rank that runs queued
// operations later than the call that queued them, in queue order, each
// after a random delay of up to `jitter_us` microseconds. Like a GPU stream
// it runs behind the host, so an algorithm that reads or overwrites a buffer
// without the right wait gets a wrong result here too, and the jitter makes
// that show as a wrong result rather than depend on luck.
//
// An operation may wait (wait_until) for another rank's stream, as a GPU
// stream waits for an IPC event; like a GPU stream whose peer never records,
// it then waits forever: nothing in the stream times out. The host side
// bounds its own waits (drain()), and kill() ends the thread regardless,
// standing for the process exit that releases a GPU stuck on a dead peer.
// A failed operation (an exception) poisons the stream, as a failed kernel
// does a CUDA context: later operations are skipped and drain() reports it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <random>
#include <string>
#include <thread>

namespace rsdp {

class EmuStream {
 public:
  using Clock = std::chrono::steady_clock;
  EmuStream(int jitter_us, uint64_t seed);
  ~EmuStream();  // kill() and join
  EmuStream(const EmuStream&) = delete;
  EmuStream& operator=(const EmuStream&) = delete;

  // Queues `op`; `what` names it while it waits (for timeout messages).
  void push(std::function<void()> op, std::string what = {});
  // Waits until everything queued so far ran; false when the deadline came
  // first. Rethrows the error that poisoned the stream.
  bool drain(Clock::time_point deadline);
  // What the stream is doing now ("" when idle), for error messages.
  std::string current() const;
  // Ends the thread even while an operation waits; queued work is dropped.
  void kill();

  // For operations: spins (then sleeps briefly) until `ready()` is true or
  // the stream is killed.
  void wait_until(const std::function<bool()>& ready) const;

 private:
  struct Op {
    std::function<void()> fn;
    std::string what;
  };
  void loop();

  const int jitter_us_;
  std::mt19937_64 rng_;
  mutable std::mutex mu_;
  std::condition_variable cv_;       // work arrived, or kill
  std::condition_variable idle_cv_;  // an operation finished
  std::deque<Op> queue_;
  uint64_t pushed_ = 0, done_ = 0;
  std::string current_;
  std::exception_ptr error_;
  std::atomic<bool> killed_{false};
  std::thread thread_;
};

}  // namespace rsdp

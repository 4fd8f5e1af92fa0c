// A point in time after which a wait gives up. Every blocking wait in the
// project takes one, so nothing can hang forever.
#pragma once

#include <chrono>

namespace rsdp {

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  Deadline() : end_(Clock::time_point::max()) {}
  explicit Deadline(std::chrono::milliseconds budget)
      : start_(Clock::now()),
        end_(budget.count() <= 0 ? Clock::time_point::max() : start_ + budget),
        budget_(budget) {}

  bool expired() const { return Clock::now() >= end_; }
  std::chrono::milliseconds budget() const { return budget_; }
  double elapsed_s() const {
    return std::chrono::duration<double>(Clock::now() - start_).count();
  }

 private:
  Clock::time_point start_ = Clock::now();
  Clock::time_point end_;
  std::chrono::milliseconds budget_{0};
};

}  // namespace rsdp

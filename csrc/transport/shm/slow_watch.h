// Noticing that a group's own work got slower: the cue to probe the hand-off
// again before the periodic re-probe ([Note: a placement that changes under a
// group] in slow_watch.cpp).
#pragma once

#include <array>
#include <cstdint>

#include "core/op_desc.h"

namespace rsdp {

class SlowWatch {
 public:
  // One collective's local work: `ns` spent between its steps (the waits for
  // peers left out) on an op of `kind` over `bytes`.
  void sample(OpKind kind, uint64_t bytes, uint64_t ns);
  // At least kSlow of the last kWindow samples judged took more than kFactor
  // times the typical one of their kind and size since the last reset.
  bool slow() const { return __builtin_popcount(history_ & kWindowMask) >= kSlow; }
  // After a probe: the mode may have changed, and with it what is typical.
  void reset();

  static constexpr int kWindow = 16;      // the last samples judged
  static constexpr int kSlow = 12;        // of them slow
  static constexpr double kFactor = 1.6;  // slower than typical by this much
  static constexpr int kWarm = 15;        // samples whose median is the typical one

 private:
  static constexpr int kSizeClasses = 48;  // log2 of the bytes
  struct Baseline {
    std::array<float, kWarm> warm{};  // ns per byte of the first kWarm samples
    int n = 0;
    float typical = 0;
  };
  std::array<Baseline, kNumOpKinds * kSizeClasses> base_{};
  static constexpr uint32_t kWindowMask = (1u << kWindow) - 1;
  uint32_t history_ = 0;  // bit i: the i-th latest sample judged was slow
};

}  // namespace rsdp

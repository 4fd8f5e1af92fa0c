// Overlap for hierarchical algorithms: the network stage of one segment
// runs on a helper thread while the calling thread does the shared-memory
// stages of its neighbours. The helper is the only user of the group's
// network comm while it runs (NetComm is used by one thread at a time).
#pragma once

#include <algorithm>
#include <cstddef>
#include <future>
#include <utility>

#include "algorithms/net/net_algorithms.h"

namespace rsdp {

// Elements per pipeline segment for a block of `elems` elements: at most
// net::kPieceBytes, and small enough that a mid-sized message still splits
// into about four segments (one segment would leave nothing to overlap),
// but not below 256 KiB, where per-segment synchronisation would dominate.
inline size_t pipeline_piece(size_t elems, size_t elem_bytes) {
  const size_t lo = (256u << 10) / elem_bytes, hi = net::kPieceBytes / elem_bytes;
  return std::max<size_t>(1, std::clamp<size_t>(elems / 4, std::min(lo, hi), hi));
}

class NetStage {
 public:
  NetStage() = default;
  NetStage(const NetStage&) = delete;
  NetStage& operator=(const NetStage&) = delete;
  // Waits, so that no exit path (an error in a shared-memory stage) leaves
  // the helper writing into a buffer that is about to go away.
  ~NetStage() {
    if (f_.valid()) f_.wait();
  }
  template <typename F>
  void start(F&& f) {
    f_ = std::async(std::launch::async, std::forward<F>(f));
  }
  // Waits for the running stage and rethrows its error.
  void finish() {
    if (f_.valid()) f_.get();
  }

 private:
  std::future<void> f_;
};

}  // namespace rsdp

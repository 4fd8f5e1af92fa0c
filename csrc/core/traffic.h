// Per-process-group traffic counters: payload bytes and messages this rank
// sent to ranks on its own node and to ranks on other nodes. Tests compare
// them with each algorithm's theory; users read them through
// torch_rsdp.comm_stats(group) to see what crossed the network.
#pragma once

#include <atomic>
#include <cstdint>

namespace rsdp {

struct Traffic {
  std::atomic<uint64_t> intra_bytes{0};
  std::atomic<uint64_t> inter_bytes{0};
  std::atomic<uint64_t> intra_msgs{0};
  std::atomic<uint64_t> inter_msgs{0};
  // Collectives that read their peers' buffers in place (algorithms/direct.cpp).
  std::atomic<uint64_t> one_copy_ops{0};

  void add(bool same_node, uint64_t bytes) {
    (same_node ? intra_bytes : inter_bytes).fetch_add(bytes, std::memory_order_relaxed);
    (same_node ? intra_msgs : inter_msgs).fetch_add(1, std::memory_order_relaxed);
  }
  void reset() {
    intra_bytes = 0;
    inter_bytes = 0;
    intra_msgs = 0;
    inter_msgs = 0;
    one_copy_ops = 0;
  }
};

}  // namespace rsdp

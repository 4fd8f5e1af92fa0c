// The ring that ring_shift rotates along. Ranks of one node are adjacent, and
// nodes follow each other in order of their lowest rank, so a full rotation
// crosses each node boundary once per hop instead of once per rank.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

namespace rsdp {

// node_of[r] is rank r's node identity; returns the ring as a list of ranks.
inline std::vector<int> ring_order(const std::vector<std::string>& node_of) {
  std::vector<std::string> nodes;  // in order of first appearance
  std::unordered_map<std::string, int> index;
  for (const auto& n : node_of)
    if (index.emplace(n, static_cast<int>(nodes.size())).second) nodes.push_back(n);
  std::vector<int> order;
  for (const auto& n : nodes)
    for (int r = 0; r < static_cast<int>(node_of.size()); ++r)
      if (node_of[r] == n) order.push_back(r);
  return order;
}

// Position-based neighbours on that ring; direction +1 sends to the successor.
struct RingNeighbours {
  int send_to;
  int recv_from;
};

inline RingNeighbours ring_neighbours(const std::vector<int>& order, int rank, int direction) {
  const int n = static_cast<int>(order.size());
  int pos = 0;
  while (order[pos] != rank) ++pos;
  int step = direction >= 0 ? 1 : n - 1;
  return RingNeighbours{order[(pos + step) % n], order[(pos + n - step) % n]};
}

}  // namespace rsdp

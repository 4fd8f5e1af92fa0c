// Hierarchical all-gather: M nodes of L ranks, rails first.
//
//   1. on rail l, a network ring all-gather of the M blocks of local rank l
//      (each rank sends (M-1) blocks: (M-1)*L blocks per node link);
//   2. inside every node, M shared-memory all-gathers, one per node's set of
//      blocks, straight into the outputs.
// A flat ring over all N ranks would push (N-1) blocks through each node's
// boundary rank instead.
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/hierarchical.h"
#include "algorithms/net/net_algorithms.h"

namespace rsdp {
namespace hier {

void allgather(GroupComm& g, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout, uint32_t& step) {
  const Topology& t = g.topo;
  const int me = t.local_rank();
  const std::vector<int> rail = t.rail(me);
  std::vector<void*> rail_outs;
  std::vector<uint64_t> rail_counts;
  for (int r : rail) {
    rail_outs.push_back(outs[r]);
    rail_counts.push_back(counts[r]);
  }
  net::allgather_ring(*g.net, rail, in, rail_outs.data(), rail_counts.data(), dt, step);
  for (const auto& node : t.nodes) {
    std::vector<void*> node_outs;
    std::vector<uint64_t> node_counts;
    for (int r : node) {
      node_outs.push_back(outs[r]);
      node_counts.push_back(counts[r]);
    }
    algo::allgather(*g.shm, node_outs[me], node_outs.data(), node_counts.data(), dt, timeout);
  }
}

}  // namespace hier
}  // namespace rsdp

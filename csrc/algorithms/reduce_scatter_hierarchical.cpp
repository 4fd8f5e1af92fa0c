// Hierarchical reduce-scatter: M nodes of L ranks, inside the node first.
//
//   1. inside the node, M shared-memory reduce-scatters, one per node m:
//      local rank l gets the node's sum of the block destined to node m's
//      local rank l;
//   2. on rail l, a network ring reduce-scatter of those M partial blocks
//      delivers each rank its complete block.
// Each node link carries (M-1)*L blocks, as for the hierarchical all-gather.
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/hierarchical.h"
#include "algorithms/net/net_algorithms.h"

namespace rsdp {
namespace hier {

void reduce_scatter(GroupComm& g, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout, uint32_t& step) {
  const Topology& t = g.topo;
  const int me = t.local_rank();
  const std::vector<int> rail = t.rail(me);
  const RedOp node_op = op == RedOp::kAvg ? RedOp::kSum : op;
  const size_t es = dtype_size(dt);
  std::vector<std::vector<char>> partial(t.num_nodes());
  std::vector<const void*> rail_ins;
  std::vector<uint64_t> rail_counts;
  for (int m = 0; m < t.num_nodes(); ++m) {
    const std::vector<int>& node = t.nodes[m];
    std::vector<const void*> node_ins;
    std::vector<uint64_t> node_counts;
    for (int r : node) {
      node_ins.push_back(ins[r]);
      node_counts.push_back(counts[r]);
    }
    partial[m].resize(counts[node[me]] * es);
    algo::reduce_scatter(*g.shm, node_ins.data(), partial[m].data(), node_counts.data(), dt,
                         node_op, timeout);
    rail_ins.push_back(partial[m].data());
    rail_counts.push_back(counts[node[me]]);
  }
  net::reduce_scatter_ring(*g.net, rail, rail_ins.data(), out, rail_counts.data(), dt, op,
                           g.size(), step);
}

}  // namespace hier
}  // namespace rsdp

// Hierarchical broadcast, reduce and barrier: one representative per node
// talks over the network, the rest of the node over shared memory.
//
// The representative of the root's node is the root itself, of every other
// node its leader (local rank 0), so no extra hop inside the root's node is
// needed and nodes of any size work:
//   broadcast  root's node: shm broadcast from the root; representatives:
//              network binomial tree; other nodes: shm broadcast from the
//              leader. Each node link carries the buffer once.
//   reduce     every node: shm reduce to its representative; then a network
//              binomial tree into the root.
//   barrier    shm barrier, network barrier of the leaders, shm barrier.
//   allreduce_leaders (small messages) shm allreduce, recursive doubling of
//              the leaders, shm broadcast from the leader.
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/hierarchical.h"
#include "algorithms/net/net_algorithms.h"
#include "algorithms/select.h"

namespace rsdp {
namespace hier {
namespace {

std::vector<int> representatives(const Topology& t, int root) {
  std::vector<int> reps;
  for (int m = 0; m < t.num_nodes(); ++m)
    reps.push_back(m == t.node_of[root] ? root : t.nodes[m][0]);
  return reps;
}

}  // namespace

void broadcast(GroupComm& g, void* buf, size_t count, DType dt, int root, Millis timeout,
               uint32_t& step) {
  const Topology& t = g.topo;
  const std::vector<int> reps = representatives(t, root);
  const int root_node = t.node_of[root];
  const bool on_root_node = t.node() == root_node;
  if (on_root_node) algo::broadcast(*g.shm, buf, count, dt, t.local_rank_of[root], timeout);
  if (reps[t.node()] == g.rank())
    net::broadcast_tree(*g.net, reps, buf, count * dtype_size(dt), root_node, step);
  if (!on_root_node) algo::broadcast(*g.shm, buf, count, dt, 0, timeout);
}

void reduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout,
            uint32_t& step) {
  const Topology& t = g.topo;
  const std::vector<int> reps = representatives(t, root);
  const int root_node = t.node_of[root];
  const int rep = reps[t.node()];
  const RedOp node_op = op == RedOp::kAvg ? RedOp::kSum : op;
  // A representative other than the root reduces into a copy: only the
  // root's buffer may change.
  std::vector<char> copy;
  void* data = buf;
  if (rep == g.rank() && rep != root) {
    copy.assign(static_cast<const char*>(buf), static_cast<const char*>(buf) + count * dtype_size(dt));
    data = copy.data();
  }
  algo::reduce(*g.shm, data, count, dt, node_op, t.local_rank_of[rep], kOneshotBytes,
               timeout);
  if (rep == g.rank())
    net::reduce_tree(*g.net, reps, data, count, dt, op, root_node, g.size(), step);
}

void allreduce_leaders(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, Millis timeout,
                       uint32_t& step) {
  const RedOp node_op = op == RedOp::kAvg ? RedOp::kSum : op;
  algo::allreduce(*g.shm, buf, count, dt, node_op, kOneshotBytes, timeout);
  if (g.topo.local_rank() == 0)
    net::allreduce_recursive_doubling(*g.net, g.topo.leaders(), buf, count, dt, op, g.size(),
                                      step);
  algo::broadcast(*g.shm, buf, count, dt, 0, timeout);
}

void barrier(GroupComm& g, Millis timeout, uint32_t& step) {
  algo::barrier(*g.shm, timeout);
  const std::vector<int> leaders = g.topo.leaders();
  if (g.topo.local_rank() == 0) net::barrier(*g.net, leaders, step);
  algo::barrier(*g.shm, timeout);
}

}  // namespace hier
}  // namespace rsdp

// Hierarchical allreduce: M nodes of L ranks.
//
// Per segment of L pieces (a piece is at most net::kPieceBytes):
//   1. reduce-scatter inside the node (shared memory): local rank l ends
//      with piece l summed over its node;
//   2. allreduce of piece l on rail l (network ring over the M nodes);
//   3. all-gather inside the node (shared memory).
// Each node's link carries 2(M-1)/M of the buffer per direction, split over
// its L rails -- against 2(N-1)/N for a flat ring over all N = M*L ranks,
// and the network stage runs on L rails at once. Segments bound the
// temporary memory and keep the shared-memory stages cache-sized.
#include <algorithm>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/hierarchical.h"
#include "algorithms/net/net_algorithms.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace hier {

void allreduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, Millis timeout,
               uint32_t& step) {
  const Topology& t = g.topo;
  const int l_size = t.local_size(), me = t.local_rank();
  const std::vector<int> rail = t.rail(me);
  const RedOp node_op = op == RedOp::kAvg ? RedOp::kSum : op;
  const size_t es = dtype_size(dt);
  const size_t piece = std::max<size_t>(1, net::kPieceBytes / es);
  char* data = static_cast<char*>(buf);
  std::vector<const void*> ins(l_size);
  std::vector<void*> outs(l_size);
  std::vector<uint64_t> counts(l_size);
  size_t base = 0;
  do {
    const size_t seg = clip(count, base, piece * l_size);
    size_t off = base;
    for (int l = 0; l < l_size; ++l) {
      counts[l] = seg / l_size + (static_cast<size_t>(l) < seg % l_size);
      outs[l] = data + off * es;
      ins[l] = outs[l];
      off += counts[l];
    }
    algo::reduce_scatter(*g.shm, ins.data(), outs[me], counts.data(), dt, node_op, timeout);
    net::allreduce_ring(*g.net, rail, outs[me], counts[me], dt, op, g.size(), step);
    algo::allgather(*g.shm, outs[me], outs.data(), counts.data(), dt, timeout);
    base += piece * l_size;
  } while (base < count);
}

}  // namespace hier
}  // namespace rsdp

// Hierarchical allreduce: M nodes of L ranks.
//
// Per segment of L pieces (a piece is at most net::kPieceBytes):
//   1. reduce-scatter inside the node (shared memory): local rank l ends
//      with piece l summed over its node;
//   2. allreduce of piece l on rail l over the M nodes: a network ring, or
//      recursive halving + doubling (kHierRhd, net_recursive_halving.cpp)
//      where the ring's 2(M-1) rounds cost more than its bytes (select.cpp);
//   3. all-gather inside the node (shared memory).
// Each node's link carries 2(M-1)/M of the buffer per direction, split over
// its L rails -- against 2(N-1)/N for a flat ring over all N = M*L ranks,
// and the network stage runs on L rails at once.
//
// Compressed (bits): step 2 is a quantised all-to-all reduce-scatter and
// all-gather on the rail (net_compressed.cpp); every rank ends identical.
//
// The stages are pipelined by segment: while the network works on segment
// k (on a helper thread, the only user of the network comm meanwhile), this
// thread all-gathers segment k-1 and reduce-scatters segment k+1 through
// shared memory, so the link is busy back to back. Segments also bound the
// temporary memory and keep the shared-memory stages cache-sized.
#include <algorithm>
#include <vector>

#include "algorithms/algorithm_table.h"
#include "algorithms/algorithms.h"
#include "algorithms/hierarchical.h"
#include "algorithms/net/net_algorithms.h"
#include "algorithms/pipeline.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace hier {
namespace {

struct Segment {
  std::vector<const void*> ins;
  std::vector<void*> outs;
  std::vector<uint64_t> counts;
};

// The three stages, pipelined; net_stage(p, n) all-reduces this rank's piece
// (n elements at p) on its rail.
template <typename NetStageFn>
void allreduce_rails(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, Millis timeout,
                     NetStageFn net_stage) {
  const Topology& t = g.topo;
  const int l_size = t.local_size(), me = t.local_rank();
  const RedOp node_op = op == RedOp::kAvg ? RedOp::kSum : op;
  const size_t es = dtype_size(dt);
  const size_t piece = pipeline_piece(count / l_size, es);
  const size_t seg_elems = piece * l_size;
  const size_t nseg = std::max<size_t>(1, (count + seg_elems - 1) / seg_elems);
  char* data = static_cast<char*>(buf);

  auto segment = [&](size_t k) {
    Segment s;
    const size_t base = k * seg_elems, len = clip(count, base, seg_elems);
    size_t off = base;
    for (int l = 0; l < l_size; ++l) {
      s.counts.push_back(len / l_size + (static_cast<size_t>(l) < len % l_size));
      s.outs.push_back(data + off * es);
      s.ins.push_back(s.outs.back());
      off += s.counts.back();
    }
    return s;
  };
  if (nseg == 1) {  // nothing to overlap with
    Segment s = segment(0);
    algo::reduce_scatter(*g.shm, s.ins.data(), s.outs[me], s.counts.data(), dt, node_op, timeout);
    net_stage(s.outs[me], s.counts[me]);
    algo::allgather(*g.shm, s.outs[me], s.outs.data(), s.counts.data(), dt, timeout);
    return;
  }
  NetStage stage;
  Segment cur = segment(0), prev;
  algo::reduce_scatter(*g.shm, cur.ins.data(), cur.outs[me], cur.counts.data(), dt, node_op,
                       timeout);
  for (size_t k = 0; k < nseg; ++k) {
    stage.finish();  // segment k-1 is reduced across nodes
    stage.start([&, p = cur.outs[me], n = cur.counts[me]] { net_stage(p, n); });
    if (k > 0)
      algo::allgather(*g.shm, prev.outs[me], prev.outs.data(), prev.counts.data(), dt, timeout);
    prev = cur;
    if (k + 1 < nseg) {
      cur = segment(k + 1);
      algo::reduce_scatter(*g.shm, cur.ins.data(), cur.outs[me], cur.counts.data(), dt, node_op,
                           timeout);
    }
  }
  stage.finish();
  algo::allgather(*g.shm, prev.outs[me], prev.outs.data(), prev.counts.data(), dt, timeout);
}

}  // namespace

void allreduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, Millis timeout,
               uint32_t& step, QuantBits bits) {
  const std::vector<int> rail = g.topo.rail(g.topo.local_rank());
  // Compressed: int4 serves the reduction only; the sums travel back as int8.
  const QuantBits bits_ag = bits == QuantBits::kInt4 ? QuantBits::kInt8 : bits;
  allreduce_rails(g, buf, count, dt, op, timeout, [&](void* p, uint64_t n) {
    if (bits == QuantBits::kNone)
      net::allreduce_ring(*g.net, rail, p, n, dt, op, g.size(), step);
    else
      net::allreduce_quantized(*g.net, rail, p, n, dt, op, g.size(), bits, bits_ag,
                               g.compression.block, step);
  });
}

}  // namespace hier

namespace coll {

// kHierRhd (algorithms.def): the rails run recursive halving + doubling.
void run_hier_rhd(const CollArgs& a) {
  GroupComm& g = a.g;
  const std::vector<int> rail = g.topo.rail(g.topo.local_rank());
  uint32_t step = 0;
  hier::allreduce_rails(g, a.buf, a.count, a.dt, a.redop, a.timeout, [&](void* p, uint64_t n) {
    net::allreduce_rhd(*g.net, rail, p, n, a.dt, a.redop, g.size(), step);
  });
}

}  // namespace coll
}  // namespace rsdp

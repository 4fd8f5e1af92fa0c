// Hierarchical reduce-scatter: M nodes of L ranks, inside the node first.
//
//   1. inside the node, M shared-memory reduce-scatters, one per node m:
//      local rank l gets the node's sum of the block destined to node m's
//      local rank l;
//   2. on rail l, a network ring reduce-scatter of those M partial blocks
//      delivers each rank its complete block.
// Each node link carries (M-1)*L blocks, as for the hierarchical all-gather.
//
// Compressed (bits): the rail stage is one all-to-all of block-quantised
// partial sums instead of a ring, so each value is quantised once; sums are
// taken after dequantising.
//
// Blocks are cut into segments of net::kPieceBytes; the rail stage of
// segment k runs on the network helper thread while this thread does the
// node stage of segment k+1 into the other of two partial-sum buffers (see
// pipeline.h).
#include <algorithm>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/hierarchical.h"
#include "algorithms/net/net_algorithms.h"
#include "algorithms/pipeline.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace hier {

void reduce_scatter(GroupComm& g, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout, uint32_t& step, QuantBits bits,
                    float* const* residual) {
  const Topology& t = g.topo;
  const int me = t.local_rank(), nodes = t.num_nodes();
  const std::vector<int> rail = t.rail(me);
  const RedOp node_op = op == RedOp::kAvg ? RedOp::kSum : op;
  const size_t es = dtype_size(dt);
  uint64_t most = 0;
  for (int r = 0; r < t.size(); ++r) most = std::max(most, counts[r]);
  const size_t piece = pipeline_piece(most, es);
  const size_t nseg = std::max<size_t>(1, (most + piece - 1) / piece);
  auto len = [&](int r, size_t k) { return clip(counts[r], k * piece, piece); };
  // partial[k % 2][m]: the node's sum of segment k of the block for (node m, local rank me).
  std::vector<std::vector<char>> partial[2];
  for (auto& p : partial) p.assign(nodes, std::vector<char>(std::min<uint64_t>(piece, most) * es));

  auto node_stage = [&](size_t k) {
    for (int m = 0; m < nodes; ++m) {
      std::vector<const void*> i;
      std::vector<uint64_t> c;
      for (int r : t.nodes[m]) {
        i.push_back(static_cast<const char*>(ins[r]) + k * piece * es);
        c.push_back(len(r, k));
      }
      algo::reduce_scatter(*g.shm, i.data(), partial[k % 2][m].data(), c.data(), dt, node_op,
                           timeout);
    }
  };
  auto rail_stage = [&](size_t k) {
    std::vector<const void*> i;
    std::vector<uint64_t> c;
    for (int m = 0; m < nodes; ++m) {
      i.push_back(partial[k % 2][m].data());
      c.push_back(len(rail[m], k));
    }
    char* o = static_cast<char*>(out) + k * piece * es;
    if (bits == QuantBits::kNone)
      net::reduce_scatter_ring(*g.net, rail, i.data(), o, c.data(), dt, op, g.size(), step);
    else if (!residual)
      net::reduce_scatter_quantized(*g.net, rail, i.data(), o, c.data(), dt, op, g.size(), bits,
                                    g.compression.block, step);
    else {
      // This rank quantises its node's partial sums of the blocks of its rail:
      // it keeps their residuals, at those blocks' places.
      std::vector<float*> res;
      for (int m = 0; m < nodes; ++m) res.push_back(residual[rail[m]] + k * piece);
      net::reduce_scatter_quantized(*g.net, rail, i.data(), o, c.data(), dt, op, g.size(), bits,
                                    g.compression.block, step, res.data());
    }
  };

  NetStage stage;
  node_stage(0);
  for (size_t k = 0; k < nseg; ++k) {
    stage.start([&, k] { rail_stage(k); });
    if (k + 1 < nseg) node_stage(k + 1);
    stage.finish();
  }
}

}  // namespace hier
}  // namespace rsdp

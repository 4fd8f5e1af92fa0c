// Hierarchical all-gather: M nodes of L ranks, rails first.
//
//   1. on rail l, a network ring all-gather of the M blocks of local rank l
//      (each rank sends (M-1) blocks: (M-1)*L blocks per node link);
//   2. inside every node, M shared-memory all-gathers, one per node's set of
//      blocks, straight into the outputs.
// A flat ring over all N ranks would push (N-1) blocks through each node's
// boundary rank instead.
//
// Compressed (bits): the rail stage sends block-quantised blocks and every
// rank writes the dequantised values, its own block's included, before the
// node stage copies them exactly: all ranks end with identical outputs.
//
// Blocks are cut into segments of net::kPieceBytes; the rail stage of
// segment k runs on the network helper thread while this thread does the
// node stage of segment k-1 (see pipeline.h).
#include <algorithm>
#include <vector>

#include "algorithms/algorithms.h"
#include "algorithms/hierarchical.h"
#include "algorithms/net/net_algorithms.h"
#include "algorithms/pipeline.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace hier {

void allgather(GroupComm& g, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout, uint32_t& step, QuantBits bits) {
  const Topology& t = g.topo;
  const int me = t.local_rank();
  const std::vector<int> rail = t.rail(me);
  const size_t es = dtype_size(dt);
  uint64_t most = 0;
  for (int r = 0; r < t.size(); ++r) most = std::max(most, counts[r]);
  const size_t piece = pipeline_piece(most, es);
  const size_t nseg = std::max<size_t>(1, (most + piece - 1) / piece);
  // This rank's block goes to its place first, so every stage reads outs.
  if (counts[g.rank()] && outs[g.rank()] != in)
    std::copy_n(static_cast<const char*>(in), counts[g.rank()] * es,
                static_cast<char*>(outs[g.rank()]));
  auto at = [&](int r, size_t k) { return static_cast<char*>(outs[r]) + k * piece * es; };
  auto len = [&](int r, size_t k) { return clip(counts[r], k * piece, piece); };

  auto rail_stage = [&](size_t k) {
    std::vector<void*> o;
    std::vector<uint64_t> c;
    for (int r : rail) {
      o.push_back(at(r, k));
      c.push_back(len(r, k));
    }
    if (bits == QuantBits::kNone)
      net::allgather_ring(*g.net, rail, at(g.rank(), k), o.data(), c.data(), dt, step);
    else  // this rank's own block too becomes its dequantised value
      net::allgather_quantized(*g.net, rail, at(g.rank(), k), o.data(), c.data(), dt, bits,
                               g.compression.block, step);
  };
  auto node_stage = [&](size_t k) {
    for (const auto& node : t.nodes) {
      std::vector<void*> o;
      std::vector<uint64_t> c;
      for (int r : node) {
        o.push_back(at(r, k));
        c.push_back(len(r, k));
      }
      algo::allgather(*g.shm, o[me], o.data(), c.data(), dt, timeout);
    }
  };

  NetStage stage;
  for (size_t k = 0; k < nseg; ++k) {
    stage.start([&, k] { rail_stage(k); });
    if (k > 0) node_stage(k - 1);
    stage.finish();
  }
  node_stage(nseg - 1);
}

}  // namespace hier
}  // namespace rsdp

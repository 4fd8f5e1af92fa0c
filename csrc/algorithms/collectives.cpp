// Dispatch of every collective to its algorithm: select_algo() picks a row
// of the algorithm table (algorithm_table.h) and its entry point runs the op,
// the shared-memory algorithms on one node, hierarchical or flat network
// algorithms across nodes. An op on device tensors goes to the group's
// DeviceCollectives instead.
#include "algorithms/collectives.h"

#include <algorithm>
#include <cstring>

#include "algorithms/algorithm_table.h"
#include "algorithms/net/net_algorithms.h"
#include "algorithms/select.h"
#include "core/error.h"
#include "core/reduce_kernels.h"
#include "patterns/chunks.h"
#include "patterns/ring_order.h"
#include "primitives/ring_shift.h"

namespace rsdp {
namespace coll {
namespace {

Algo pick(GroupComm& g, OpKind op, size_t bytes) {
  const Where where = g.multi_node() ? Where::kSeveralNodes : Where::kOneNode;
  return select_algo({op, bytes, g.topo, g.opts, g.shm->half_bytes(), where, false});
}

// How an op crosses nodes under the group's compression: quantised only
// for float32/bf16/fp16, SUM/AVG reductions and nodes of equal size (the
// hierarchical algorithms); everything else exactly.
QuantBits wire_bits(const GroupComm& g, OpKind op, DType dt, RedOp rop) {
  const Compression& c = g.compression;
  if (!c.any() || !compressible(dt)) return QuantBits::kNone;
  // ring_shift: a SUM descriptor is the shift-reduce.
  if (op == OpKind::kRingShift)
    return rop == RedOp::kSum ? c.ring_shift_reduce : c.ring_shift;
  if (!g.topo.uniform()) return QuantBits::kNone;
  const bool reduces = op == OpKind::kAllreduce || op == OpKind::kReduceScatter;
  if (reduces && rop != RedOp::kSum && rop != RedOp::kAvg) return QuantBits::kNone;
  switch (op) {
    case OpKind::kAllgather: return c.all_gather;
    case OpKind::kReduceScatter: return c.reduce_scatter;
    case OpKind::kAllreduce: return c.all_reduce;
    default: return QuantBits::kNone;
  }
}

// The descriptor every rank must agree on across nodes; the algorithm and
// the wire bits are part of it because RSDP_ALGO_* and the compression are
// per-rank settings.
OpDesc net_desc(OpDesc d, Algo a, QuantBits bits) {
  d.aux = d.aux * 31 + static_cast<uint64_t>(a);
  d.wire_bits = static_cast<uint8_t>(bits);
  return d;
}

uint64_t total(const uint64_t* counts, int n) {
  uint64_t t = 0;
  for (int i = 0; i < n; ++i) t += counts[i];
  return t;
}

uint64_t payload_bytes(const CollArgs& a, int n) {
  return (a.counts ? total(a.counts, n) : a.count) * dtype_size(a.dt);
}

// Runs the op on the algorithm select_algo() picks, through its row of the
// table. Across nodes the op is first numbered on the network; the
// shared-memory algorithms begin their own op.
void dispatch(CollArgs a) {
  GroupComm& g = a.g;
  Algo algo = pick(g, a.op, payload_bytes(a, g.size()));
  if (g.multi_node()) {
    // Compressed: the hierarchical algorithm (small messages stay exact on
    // the leaders' path, where rounds cost more than bytes).
    if (algo != Algo::kLeaders) a.bits = wire_bits(g, a.op, a.dt, a.redop);
    if (a.bits != QuantBits::kNone) algo = Algo::kHier;
  }
  RSDP_CHECK(algo_info(algo).serves(a.op), "internal error: the algorithm ", algo_name(algo),
             " chosen for ", op_name(a.op), " does not serve it");
  if (g.multi_node()) {
    const OpDesc d = a.counts ? OpDesc::per_rank(a.op, a.dt, a.counts, g.size(), a.redop)
                              : OpDesc::make(a.op, a.dt, a.count, a.redop, a.root);
    g.begin_net(net_desc(d, algo, a.bits), a.timeout);
  }
  algo_entry(algo).run(a);
}

}  // namespace

void run_on_device(Staging& s, CollArgs a) {
  a.node = &s;
  const Algo algo = select_algo({a.op, payload_bytes(a, s.size()), a.g.topo, a.g.opts,
                                 s.half_bytes(), Where::kOneNode, true});
  algo_entry(algo).run(a);
}

void broadcast(GroupComm& g, void* buf, size_t count, DType dt, int root, Millis timeout) {
  if (g.device_op) return g.device->broadcast(buf, count, dt, root, timeout);
  dispatch({.g = g, .op = OpKind::kBroadcast, .timeout = timeout, .dt = dt, .count = count,
            .root = root, .buf = buf});
}

void allreduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, Millis timeout) {
  if (g.device_op) return g.device->allreduce(buf, count, dt, op, timeout);
  dispatch({.g = g, .op = OpKind::kAllreduce, .timeout = timeout, .dt = dt, .count = count,
            .redop = op, .buf = buf});
}

void reduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout) {
  if (g.device_op) return g.device->reduce(buf, count, dt, op, root, timeout);
  dispatch({.g = g, .op = OpKind::kReduce, .timeout = timeout, .dt = dt, .count = count,
            .redop = op, .root = root, .buf = buf});
}

void allgather(GroupComm& g, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout) {
  if (g.device_op) return g.device->allgather(in, outs, counts, dt, timeout);
  dispatch({.g = g, .op = OpKind::kAllgather, .timeout = timeout, .dt = dt, .counts = counts,
            .in = in, .outs = outs});
}

void gather(GroupComm& g, const void* in, void* const* outs, size_t count, DType dt, int root,
            Millis timeout) {
  if (g.device_op) return g.device->gather(in, outs, count, dt, root, timeout);
  dispatch({.g = g, .op = OpKind::kGather, .timeout = timeout, .dt = dt, .count = count,
            .root = root, .in = in, .outs = outs});
}

void scatter(GroupComm& g, const void* const* ins, void* out, size_t count, DType dt, int root,
             Millis timeout) {
  if (g.device_op) return g.device->scatter(ins, out, count, dt, root, timeout);
  dispatch({.g = g, .op = OpKind::kScatter, .timeout = timeout, .dt = dt, .count = count,
            .root = root, .ins = ins, .out = out});
}

void reduce_scatter(GroupComm& g, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout, float* const* residual) {
  if (g.device_op) return g.device->reduce_scatter(ins, out, counts, dt, op, timeout);
  dispatch({.g = g, .op = OpKind::kReduceScatter, .timeout = timeout, .dt = dt,
            .counts = counts, .redop = op, .ins = ins, .out = out, .residual = residual});
}

void alltoall(GroupComm& g, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, DType dt, Millis timeout) {
  if (g.device_op)
    return g.device->alltoall(sends, send_bytes, recvs, recv_bytes, dt, timeout);
  // Sizes differ per rank: the descriptor's count is 0, and each message's
  // size is checked instead.
  dispatch({.g = g, .op = OpKind::kAlltoall, .timeout = timeout, .dt = dt, .sends = sends,
            .send_bytes = send_bytes, .recvs = recvs, .recv_bytes = recv_bytes});
}

void barrier(GroupComm& g, Millis timeout) {
  dispatch({.g = g, .op = OpKind::kBarrier, .timeout = timeout});
}

void ring_shift(GroupComm& g, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add, Millis timeout,
                float* residual) {
  if (g.device_op)
    return g.device->ring_shift(order, send, recv, count, dt, direction, add, timeout);
  if (!g.multi_node())
    return rsdp::ring_shift(*g.shm, order, send, recv, count, dt, direction, add, timeout);
  // Across nodes every hop goes through the network (UCX takes the fastest
  // path for the hops inside a node). Pieces are received into a buffer and
  // only then written to `recv`, so recv may alias send.
  const RedOp rop = add ? RedOp::kSum : RedOp::kMax;
  const QuantBits bits = wire_bits(g, OpKind::kRingShift, dt, rop);
  // Not a row of the table: one algorithm everywhere, a ring on the network.
  const OpDesc d = OpDesc::ring_shift(dt, count, direction, add != nullptr);
  g.begin_net(net_desc(d, Algo::kRing, bits), timeout);
  const RingNeighbours nb = ring_neighbours(order, g.rank(), direction);
  uint32_t step = 0;
  if (bits != QuantBits::kNone)
    return net::ring_shift_quantized(*g.net, nb.send_to, nb.recv_from,
                                     !g.topo.same_node(g.rank(), nb.send_to),
                                     !g.topo.same_node(g.rank(), nb.recv_from), send, recv,
                                     count, dt, add, bits, g.compression.block, residual, step);
  const size_t es = dtype_size(dt), bytes = count * es;
  const size_t piece = std::max<size_t>(es, net::kPieceBytes / es * es);
  std::vector<char> tmp(std::min(piece, bytes));
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  const char* extra = static_cast<const char*>(add);
  size_t off = 0;
  do {
    const size_t n = clip(bytes, off, piece);
    g.net->isend(nb.send_to, in + off, n, step);
    g.net->irecv(nb.recv_from, tmp.data(), n, step);
    ++step;
    g.net->wait();
    if (extra) {
      const void* srcs[2] = {tmp.data(), extra + off};
      if (n) reduce_n(out + off, srcs, 2, n / es, dt, RedOp::kSum, 1);
    } else if (n) {
      std::memcpy(out + off, tmp.data(), n);
    }
    off += piece;
  } while (off < bytes);
}

}  // namespace coll
}  // namespace rsdp

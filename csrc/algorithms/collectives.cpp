// Dispatch of every collective to its algorithm (see select.h). On one node
// the shared-memory algorithms run as before; across nodes the op is
// numbered on the network and run hierarchically or flat over all ranks,
// whose network ring is node-major (ranks of a node adjacent). An op on
// device tensors goes to the group's DeviceCollectives instead.
#include "algorithms/collectives.h"

#include <algorithm>
#include <cstring>

#include "algorithms/algorithms.h"
#include "algorithms/hierarchical.h"
#include "algorithms/net/net_algorithms.h"
#include "algorithms/select.h"
#include "core/reduce_kernels.h"
#include "patterns/chunks.h"
#include "patterns/ring_order.h"
#include "primitives/ring_shift.h"

namespace rsdp {
namespace coll {
namespace {

// The descriptor every rank must agree on; the algorithm is part of it
// because RSDP_ALGO_* is a per-rank setting.
OpDesc desc(OpKind kind, DType dt, uint64_t count, Algo a, RedOp op = RedOp::kSum,
            int root = -1, uint64_t aux = 0, QuantBits bits = QuantBits::kNone) {
  OpDesc d;
  d.kind = kind;
  d.dtype = dt;
  d.count = count;
  d.redop = op;
  d.root = root;
  d.aux = aux * 31 + static_cast<uint64_t>(a);
  d.wire_bits = static_cast<uint8_t>(bits);
  return d;
}

Algo pick(GroupComm& g, OpKind op, size_t bytes) {
  return select_algo(op, bytes, g.topo, g.opts, g.shm->half_bytes());
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

// Reorders a per-group-rank array into ring positions.
template <typename T>
std::vector<T> in_ring_order(const std::vector<int>& ring, const T* by_rank) {
  std::vector<T> out;
  for (int r : ring) out.push_back(by_rank[r]);
  return out;
}

uint64_t total(const uint64_t* counts, int n) {
  uint64_t t = 0;
  for (int i = 0; i < n; ++i) t += counts[i];
  return t;
}

}  // namespace

void broadcast(GroupComm& g, void* buf, size_t count, DType dt, int root, Millis timeout) {
  if (g.device_op) return g.device->broadcast(buf, count, dt, root, timeout);
  if (!g.multi_node()) return algo::broadcast(*g.shm, buf, count, dt, root, timeout);
  const size_t bytes = count * dtype_size(dt);
  const Algo a = pick(g, OpKind::kBroadcast, bytes);
  g.begin_net(desc(OpKind::kBroadcast, dt, count, a, RedOp::kSum, root), timeout);
  uint32_t step = 0;
  if (a == Algo::kHier) return hier::broadcast(g, buf, count, dt, root, timeout, step);
  const auto ring = g.topo.node_major_order();
  net::broadcast_tree(*g.net, ring, buf, bytes, net::position(ring, root), step);
}

void allreduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, Millis timeout) {
  if (g.device_op) return g.device->allreduce(buf, count, dt, op, timeout);
  const size_t bytes = count * dtype_size(dt);
  Algo a = pick(g, OpKind::kAllreduce, bytes);
  if (!g.multi_node()) {
    // algo::allreduce picks by threshold: 0 forces rs_ag, max forces one-shot.
    const size_t threshold = a == Algo::kOneshot ? SIZE_MAX : 0;
    return algo::allreduce(*g.shm, buf, count, dt, op, threshold, timeout);
  }
  // Compressed: the hierarchical algorithm (small messages stay exact on
  // the leaders' path, where rounds cost more than bytes).
  QuantBits bits = a == Algo::kLeaders ? QuantBits::kNone
                                       : wire_bits(g, OpKind::kAllreduce, dt, op);
  if (bits != QuantBits::kNone) a = Algo::kHier;
  g.begin_net(desc(OpKind::kAllreduce, dt, count, a, op, -1, 0, bits), timeout);
  uint32_t step = 0;
  if (a == Algo::kHier) return hier::allreduce(g, buf, count, dt, op, timeout, step, bits);
  if (a == Algo::kLeaders) return hier::allreduce_leaders(g, buf, count, dt, op, timeout, step);
  const auto ring = g.topo.node_major_order();
  if (a == Algo::kRd)
    return net::allreduce_recursive_doubling(*g.net, ring, buf, count, dt, op, g.size(), step);
  net::allreduce_ring(*g.net, ring, buf, count, dt, op, g.size(), step);
}

void reduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout) {
  if (g.device_op) return g.device->reduce(buf, count, dt, op, root, timeout);
  if (!g.multi_node())
    return algo::reduce(*g.shm, buf, count, dt, op, root, g.opts.oneshot_bytes, timeout);
  const Algo a = pick(g, OpKind::kReduce, count * dtype_size(dt));
  g.begin_net(desc(OpKind::kReduce, dt, count, a, op, root), timeout);
  uint32_t step = 0;
  if (a == Algo::kHier) return hier::reduce(g, buf, count, dt, op, root, timeout, step);
  const auto ring = g.topo.node_major_order();
  net::reduce_tree(*g.net, ring, buf, count, dt, op, net::position(ring, root), g.size(), step);
}

void allgather(GroupComm& g, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout) {
  if (g.device_op) return g.device->allgather(in, outs, counts, dt, timeout);
  if (!g.multi_node()) return algo::allgather(*g.shm, in, outs, counts, dt, timeout);
  const int n = g.size();
  const uint64_t all = total(counts, n);
  Algo a = pick(g, OpKind::kAllgather, all * dtype_size(dt));
  const QuantBits bits = wire_bits(g, OpKind::kAllgather, dt, RedOp::kSum);
  if (bits != QuantBits::kNone) a = Algo::kHier;
  g.begin_net(desc(OpKind::kAllgather, dt, all, a, RedOp::kSum, -1, hash_sizes(counts, n), bits),
              timeout);
  uint32_t step = 0;
  if (a == Algo::kHier) return hier::allgather(g, in, outs, counts, dt, timeout, step, bits);
  const auto ring = g.topo.node_major_order();
  auto ring_outs = in_ring_order(ring, outs);
  auto ring_counts = in_ring_order(ring, counts);
  net::allgather_ring(*g.net, ring, in, ring_outs.data(), ring_counts.data(), dt, step);
}

void gather(GroupComm& g, const void* in, void* const* outs, size_t count, DType dt, int root,
            Millis timeout) {
  if (g.device_op) return g.device->gather(in, outs, count, dt, root, timeout);
  if (!g.multi_node()) return algo::gather(*g.shm, in, outs, count, dt, root, timeout);
  g.begin_net(desc(OpKind::kGather, dt, count, Algo::kFlat, RedOp::kSum, root), timeout);
  uint32_t step = 0;
  const auto ring = g.topo.node_major_order();
  std::vector<void*> ring_outs(ring.size(), nullptr);
  if (g.rank() == root) ring_outs = in_ring_order(ring, outs);
  net::gather_linear(*g.net, ring, in, ring_outs.data(), count * dtype_size(dt),
                     net::position(ring, root), step);
}

void scatter(GroupComm& g, const void* const* ins, void* out, size_t count, DType dt, int root,
             Millis timeout) {
  if (g.device_op) return g.device->scatter(ins, out, count, dt, root, timeout);
  if (!g.multi_node()) return algo::scatter(*g.shm, ins, out, count, dt, root, timeout);
  g.begin_net(desc(OpKind::kScatter, dt, count, Algo::kFlat, RedOp::kSum, root), timeout);
  uint32_t step = 0;
  const auto ring = g.topo.node_major_order();
  std::vector<const void*> ring_ins(ring.size(), nullptr);
  if (g.rank() == root) ring_ins = in_ring_order(ring, ins);
  net::scatter_linear(*g.net, ring, ring_ins.data(), out, count * dtype_size(dt),
                      net::position(ring, root), step);
}

void reduce_scatter(GroupComm& g, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout, float* const* residual) {
  if (g.device_op) return g.device->reduce_scatter(ins, out, counts, dt, op, timeout);
  if (!g.multi_node()) return algo::reduce_scatter(*g.shm, ins, out, counts, dt, op, timeout);
  const int n = g.size();
  const uint64_t all = total(counts, n);
  Algo a = pick(g, OpKind::kReduceScatter, all * dtype_size(dt));
  const QuantBits bits = wire_bits(g, OpKind::kReduceScatter, dt, op);
  if (bits != QuantBits::kNone) a = Algo::kHier;
  g.begin_net(desc(OpKind::kReduceScatter, dt, all, a, op, -1, hash_sizes(counts, n), bits),
              timeout);
  uint32_t step = 0;
  if (a == Algo::kHier)
    return hier::reduce_scatter(g, ins, out, counts, dt, op, timeout, step, bits,
                                bits == QuantBits::kNone ? nullptr : residual);
  const auto ring = g.topo.node_major_order();
  auto ring_ins = in_ring_order(ring, ins);
  auto ring_counts = in_ring_order(ring, counts);
  net::reduce_scatter_ring(*g.net, ring, ring_ins.data(), out, ring_counts.data(), dt, op, n,
                           step);
}

void alltoall(GroupComm& g, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, DType dt, Millis timeout) {
  if (g.device_op)
    return g.device->alltoall(sends, send_bytes, recvs, recv_bytes, dt, timeout);
  if (!g.multi_node())
    return algo::alltoall(*g.shm, sends, send_bytes, recvs, recv_bytes, dt, timeout);
  // Sizes differ per rank: the transport checks each message's size instead.
  g.begin_net(desc(OpKind::kAlltoall, dt, 0, Algo::kFlat), timeout);
  uint32_t step = 0;
  const auto ring = g.topo.node_major_order();
  auto s = in_ring_order(ring, sends);
  auto sb = in_ring_order(ring, send_bytes);
  auto r = in_ring_order(ring, recvs);
  auto rb = in_ring_order(ring, recv_bytes);
  net::alltoall_pairwise(*g.net, ring, s.data(), sb.data(), r.data(), rb.data(), step);
}

void barrier(GroupComm& g, Millis timeout) {
  if (!g.multi_node()) return algo::barrier(*g.shm, timeout);
  const Algo a = pick(g, OpKind::kBarrier, 0);
  g.begin_net(desc(OpKind::kBarrier, DType::kUInt8, 0, a), timeout);
  uint32_t step = 0;
  if (a == Algo::kHier) return hier::barrier(g, timeout, step);
  net::barrier(*g.net, g.topo.node_major_order(), step);
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
  OpDesc d = desc(OpKind::kRingShift, dt, count, Algo::kRing, rop, -1, 0, bits);
  d.direction = direction >= 0 ? 1 : -1;
  g.begin_net(d, timeout);
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

// The entry points (algorithm_table.h) of the shared-memory algorithms
// (algorithms.h), the hierarchical ones (hierarchical.h) and the flat
// network ones (net/net_algorithms.h): each adapts CollArgs to the
// algorithm's own signature. The flat network algorithms run over all ranks
// in the node-major ring (ranks of a node adjacent); every op's network
// message counter starts at 0.
#include <cstdint>
#include <vector>

#include "algorithms/algorithm_table.h"
#include "algorithms/algorithms.h"
#include "algorithms/group_comm.h"
#include "algorithms/hierarchical.h"
#include "algorithms/net/net_algorithms.h"
#include "algorithms/select.h"

namespace rsdp {
namespace coll {
namespace {

// Reorders a per-group-rank array into ring positions.
template <typename T>
std::vector<T> in_ring_order(const std::vector<int>& ring, const T* by_rank) {
  std::vector<T> out;
  for (int r : ring) out.push_back(by_rank[r]);
  return out;
}

}  // namespace

bool applies_always(const Choice&) { return true; }

bool fits_staging_half(const Choice& c) { return c.bytes <= c.half_bytes; }

// Rails pair the ranks of equal local rank, so allreduce, allgather and
// reduce_scatter need nodes of equal size; the rooted ops and the barrier
// run on any topology. Allreduces up to kOneshotBytes (select.h) run the leaders'
// variant (kLeaders) instead.
bool hier_applies(const Choice& c) {
  switch (c.op) {
    case OpKind::kAllreduce: return c.topo.uniform() && c.bytes > kOneshotBytes;
    case OpKind::kAllgather:
    case OpKind::kReduceScatter: return c.topo.uniform();
    default: return true;
  }
}

// The rails pair equal nodes; unlike kHier it runs at any size when forced.
bool hier_rhd_applies(const Choice& c) { return c.topo.uniform(); }

namespace {

// The single-node rows run on the group's shared memory, or on the device
// transport the op was handed with.
Staging& node(const CollArgs& a) { return a.node ? *a.node : *a.g.shm; }

}  // namespace

void run_shm(const CollArgs& a) {
  Staging& c = node(a);
  switch (a.op) {
    case OpKind::kBroadcast: return algo::broadcast(c, a.buf, a.count, a.dt, a.root, a.timeout);
    case OpKind::kReduce:
      return algo::reduce(c, a.buf, a.count, a.dt, a.redop, a.root,
                          oneshot_bytes(a.node != nullptr), a.timeout);
    case OpKind::kAllgather: return algo::allgather(c, a.in, a.outs, a.counts, a.dt, a.timeout);
    case OpKind::kGather: return algo::gather(c, a.in, a.outs, a.count, a.dt, a.root, a.timeout);
    case OpKind::kScatter: return algo::scatter(c, a.ins, a.out, a.count, a.dt, a.root, a.timeout);
    case OpKind::kReduceScatter:
      return algo::reduce_scatter(c, a.ins, a.out, a.counts, a.dt, a.redop, a.timeout);
    case OpKind::kAlltoall:
      return algo::alltoall(c, a.sends, a.send_bytes, a.recvs, a.recv_bytes, a.dt, a.timeout);
    case OpKind::kBarrier: return algo::barrier(c, a.timeout);
    default: return;
  }
}

// algo::allreduce picks by threshold: the largest forces one-shot, 0 rs_ag.
void run_oneshot(const CollArgs& a) {
  algo::allreduce(node(a), a.buf, a.count, a.dt, a.redop, SIZE_MAX, a.timeout);
}

void run_rs_ag(const CollArgs& a) {
  algo::allreduce(node(a), a.buf, a.count, a.dt, a.redop, 0, a.timeout);
}

void run_hier(const CollArgs& a) {
  GroupComm& g = a.g;
  uint32_t step = 0;
  switch (a.op) {
    case OpKind::kAllreduce:
      return hier::allreduce(g, a.buf, a.count, a.dt, a.redop, a.timeout, step, a.bits);
    case OpKind::kAllgather:
      return hier::allgather(g, a.in, a.outs, a.counts, a.dt, a.timeout, step, a.bits);
    case OpKind::kReduceScatter:
      return hier::reduce_scatter(g, a.ins, a.out, a.counts, a.dt, a.redop, a.timeout, step,
                                  a.bits, a.bits == QuantBits::kNone ? nullptr : a.residual);
    case OpKind::kBroadcast:
      return hier::broadcast(g, a.buf, a.count, a.dt, a.root, a.timeout, step);
    case OpKind::kReduce:
      return hier::reduce(g, a.buf, a.count, a.dt, a.redop, a.root, a.timeout, step);
    case OpKind::kBarrier: return hier::barrier(g, a.timeout, step);
    default: return;
  }
}

void run_leaders(const CollArgs& a) {
  uint32_t step = 0;
  hier::allreduce_leaders(a.g, a.buf, a.count, a.dt, a.redop, a.timeout, step);
}

void run_ring(const CollArgs& a) {
  GroupComm& g = a.g;
  const int n = g.size();
  const auto ring = g.topo.node_major_order();
  uint32_t step = 0;
  switch (a.op) {
    case OpKind::kAllreduce:
      return net::allreduce_ring(*g.net, ring, a.buf, a.count, a.dt, a.redop, n, step);
    case OpKind::kAllgather: {
      auto outs = in_ring_order(ring, a.outs);
      auto counts = in_ring_order(ring, a.counts);
      return net::allgather_ring(*g.net, ring, a.in, outs.data(), counts.data(), a.dt, step);
    }
    case OpKind::kReduceScatter: {
      auto ins = in_ring_order(ring, a.ins);
      auto counts = in_ring_order(ring, a.counts);
      return net::reduce_scatter_ring(*g.net, ring, ins.data(), a.out, counts.data(), a.dt,
                                      a.redop, n, step);
    }
    default: return;
  }
}

void run_rd(const CollArgs& a) {
  GroupComm& g = a.g;
  uint32_t step = 0;
  net::allreduce_recursive_doubling(*g.net, g.topo.node_major_order(), a.buf, a.count, a.dt,
                                    a.redop, g.size(), step);
}

void run_rhd(const CollArgs& a) {
  GroupComm& g = a.g;
  uint32_t step = 0;
  net::allreduce_rhd(*g.net, g.topo.node_major_order(), a.buf, a.count, a.dt, a.redop, g.size(),
                     step);
}

void run_tree(const CollArgs& a) {
  GroupComm& g = a.g;
  const auto ring = g.topo.node_major_order();
  const int root = net::position(ring, a.root);
  uint32_t step = 0;
  switch (a.op) {
    case OpKind::kBroadcast:
      return net::broadcast_tree(*g.net, ring, a.buf, a.count * dtype_size(a.dt), root, step);
    case OpKind::kReduce:
      return net::reduce_tree(*g.net, ring, a.buf, a.count, a.dt, a.redop, root, g.size(), step);
    default: return;
  }
}

void run_flat(const CollArgs& a) {
  GroupComm& g = a.g;
  const auto ring = g.topo.node_major_order();
  uint32_t step = 0;
  switch (a.op) {
    case OpKind::kGather: {
      std::vector<void*> outs(ring.size(), nullptr);
      if (g.rank() == a.root) outs = in_ring_order(ring, a.outs);
      return net::gather_linear(*g.net, ring, a.in, outs.data(), a.count * dtype_size(a.dt),
                                net::position(ring, a.root), step);
    }
    case OpKind::kScatter: {
      std::vector<const void*> ins(ring.size(), nullptr);
      if (g.rank() == a.root) ins = in_ring_order(ring, a.ins);
      return net::scatter_linear(*g.net, ring, ins.data(), a.out, a.count * dtype_size(a.dt),
                                 net::position(ring, a.root), step);
    }
    case OpKind::kAlltoall: {
      // Sizes differ per rank: the transport checks each message's size.
      auto s = in_ring_order(ring, a.sends);
      auto sb = in_ring_order(ring, a.send_bytes);
      auto r = in_ring_order(ring, a.recvs);
      auto rb = in_ring_order(ring, a.recv_bytes);
      return net::alltoall_pairwise(*g.net, ring, s.data(), sb.data(), r.data(), rb.data(), step);
    }
    case OpKind::kBarrier: return net::barrier(*g.net, ring, step);
    default: return;
  }
}

}  // namespace coll
}  // namespace rsdp

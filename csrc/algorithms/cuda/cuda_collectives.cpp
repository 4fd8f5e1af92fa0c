#include "algorithms/cuda/cuda_collectives.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <sstream>

#include "algorithms/collectives.h"
#include "algorithms/cuda/host_staged.h"
#include "algorithms/cuda/nccl_node.h"
#include "algorithms/cuda/scratch.h"
#include "core/store_records.h"
#include "cuda/cuda_check.h"
#include "primitives/ring_shift.h"
#include "transport/cuda_ipc/device_scope.h"
#include "transport/cuda_ipc/ipc_comm.h"
#include "transport/nccl/nccl_comm.h"

namespace rsdp {
namespace {

using Millis = std::chrono::milliseconds;

bool all_equal(const uint64_t* v, int n) {
  return std::all_of(v, v + n, [&](uint64_t x) { return x == v[0]; });
}

// [off, off + count) of slice l when `count` elements are split over n.
std::pair<size_t, size_t> slice(size_t count, int n, int l) {
  const size_t base = count / n, rem = count % n;
  const size_t off = l * base + std::min<size_t>(l, rem);
  return {off, base + (static_cast<size_t>(l) < rem ? 1 : 0)};
}

class CudaCollectives final : public DeviceCollectives {
 public:
  CudaCollectives(GroupComm& g, Bootstrap& store, int device);

  int device() const override { return device_; }
  void set_stream(void* stream) override { stream_ = static_cast<cudaStream_t>(stream); }
  std::string describe() const override { return describe_; }

  void broadcast(void* buf, size_t count, DType dt, int root, Millis timeout) override;
  void allreduce(void* buf, size_t count, DType dt, RedOp op, Millis timeout) override;
  void reduce(void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout) override;
  void allgather(const void* in, void* const* outs, const uint64_t* counts, DType dt,
                 Millis timeout) override;
  void gather(const void* in, void* const* outs, size_t count, DType dt, int root,
              Millis timeout) override;
  void scatter(const void* const* ins, void* out, size_t count, DType dt, int root,
               Millis timeout) override;
  void reduce_scatter(const void* const* ins, void* out, const uint64_t* counts, DType dt,
                      RedOp op, Millis timeout) override;
  void alltoall(const void* const* sends, const uint64_t* send_bytes, void* const* recvs,
                const uint64_t* recv_bytes, DType dt, Millis timeout) override;
  void ring_shift(const std::vector<int>& order, const void* send, void* recv, size_t count,
                  DType dt, int direction, const void* add, Millis timeout) override;

  void abort(const std::string& why) override;

 private:
  bool multi_node() const { return g_.multi_node(); }
  // The node stage, over whichever transport serves the node (arrays by
  // local rank).
  void node_reduce_scatter(const void* const* ins, void* out, const uint64_t* counts, DType dt,
                           RedOp op, Millis timeout);
  void node_allgather(const void* in, void* const* outs, const uint64_t* counts, DType dt,
                      Millis timeout);
  void node_broadcast(void* buf, size_t count, DType dt, int root, Millis timeout);
  void node_reduce(void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout);
  // Across nodes, the hierarchical algorithms need equal nodes (rails) and
  // a (dtype, op) that NCCL reduces (which the NCCL node stage then does too).
  bool rails_serve(DType dt, RedOp op) const { return rail_ && nccl_supports(dt, op); }
  HostStaged host() { return HostStaged(g_, stream_); }
  // The single-node algorithms over CUDA IPC (algorithms/algorithms.h,
  // chosen by the algorithm table), on the op's stream and device.
  void ipc_run(CollArgs a) {
    CudaDeviceScope scope(device_);
    ipc_->set_stream(stream_);
    coll::run_on_device(*ipc_, a);
  }
  CollArgs args(OpKind op, Millis timeout, DType dt) const {
    return CollArgs{.g = g_, .op = op, .timeout = timeout, .dt = dt};
  }

  GroupComm& g_;
  int device_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<IpcComm> ipc_;    // the node's ranks, when some share a GPU (or forced)
  std::unique_ptr<NcclComm> node_;  // the node's ranks, each on its own GPU
  std::unique_ptr<NcclComm> rail_;  // this rank's rail, across equal nodes
  std::string describe_;
};

CudaCollectives::CudaCollectives(GroupComm& g, Bootstrap& store, int device)
    : g_(g), device_(device) {
  const Group& grp = g.group;
  const Topology& t = g.topo;
  // Which GPU every rank drives: ranks of a node on one GPU cannot use NCCL.
  char bus[64] = {0};
  RSDP_CUDA_CHECK(cudaDeviceGetPCIBusId(bus, sizeof(bus), device), "(cuda:", device, ")");
  store.set(grp.key("cuda/gpu/" + std::to_string(grp.rank)),
            records::encode_gpu(grp.rank, bus));
  std::vector<std::string> keys;
  for (int r = 0; r < grp.size; ++r) keys.push_back(grp.key("cuda/gpu/" + std::to_string(r)));
  RSDP_CHECK_KIND(ErrorKind::kTimeout, store.wait(keys, grp.timeout), grp.me(),
                  ": the group's first CUDA op: not every rank reached it within the timeout");
  std::vector<std::string> gpu_of(grp.size);
  for (int r = 0; r < grp.size; ++r) {
    const std::string err =
        records::decode_gpu(store.get(keys[r]), {keys[r], r, grp.who(r)}, gpu_of[r]);
    RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), grp.me(), ": the group's first CUDA op: ",
                    err);
  }
  const std::vector<int>& mine = t.nodes[t.node()];
  std::vector<std::string> node_gpus;
  for (int r : mine) node_gpus.push_back(gpu_of[r]);
  std::sort(node_gpus.begin(), node_gpus.end());
  const int distinct =
      static_cast<int>(std::unique(node_gpus.begin(), node_gpus.end()) - node_gpus.begin());
  const bool shared = distinct < static_cast<int>(mine.size());

  const std::string& want = g.opts.cuda_intra;
  RSDP_CHECK(!(want == "nccl" && shared), grp.me(), ": RSDP_CUDA_INTRA=nccl, but ",
             mine.size(), " ranks of this node drive only ", distinct,
             " GPU(s) and NCCL refuses two ranks on one GPU; use RSDP_CUDA_INTRA=ipc or auto");
  const bool use_ipc = want == "ipc" || (want == "auto" && shared);
  std::ostringstream d;
  if (use_ipc) {
    ipc_ = std::make_unique<IpcComm>(*g.shm, store, device, g.opts.cuda_staging_bytes);
    d << "intra-node: cuda-ipc (" << mine.size() << " ranks on " << distinct << " GPU"
      << (distinct > 1 ? "s" : "") << ")";
  } else {
    node_ = std::make_unique<NcclComm>(grp, store, mine, "node" + std::to_string(t.node()),
                                       device, grp.timeout);
    d << "intra-node: nccl (" << mine.size() << " rank" << (mine.size() > 1 ? "s" : "") << ")";
  }
  if (t.num_nodes() > 1) {
    if (t.uniform()) {
      rail_ = std::make_unique<NcclComm>(grp, store, t.rail(t.local_rank()),
                                         "rail" + std::to_string(t.local_rank()), device,
                                         grp.timeout);
      d << "; inter-node: nccl rails (" << t.num_nodes() << " nodes)";
    } else {
      d << "; inter-node: host-staged over UCX (nodes of different sizes)";
    }
  }
  describe_ = d.str();
}

void CudaCollectives::abort(const std::string& why) {
  if (ipc_) ipc_->abort(why);
  if (node_) node_->abort();
  if (rail_) rail_->abort();
}

// ---- the node stage -------------------------------------------------------

void CudaCollectives::node_reduce_scatter(const void* const* ins, void* out,
                                          const uint64_t* counts, DType dt, RedOp op,
                                          Millis timeout) {
  if (ipc_) {
    CollArgs a = args(OpKind::kReduceScatter, timeout, dt);
    a.counts = counts, a.redop = op, a.ins = ins, a.out = out;
    return ipc_run(a);
  }
  nccl_node::reduce_scatter(*node_, ins, out, counts, dt, op, stream_);
}

void CudaCollectives::node_allgather(const void* in, void* const* outs, const uint64_t* counts,
                                     DType dt, Millis timeout) {
  if (ipc_) {
    CollArgs a = args(OpKind::kAllgather, timeout, dt);
    a.counts = counts, a.in = in, a.outs = outs;
    return ipc_run(a);
  }
  nccl_node::allgather(*node_, in, outs, counts, dt, stream_);
}

void CudaCollectives::node_broadcast(void* buf, size_t count, DType dt, int root,
                                     Millis timeout) {
  if (ipc_) {
    CollArgs a = args(OpKind::kBroadcast, timeout, dt);
    a.count = count, a.root = root, a.buf = buf;
    return ipc_run(a);
  }
  node_->broadcast(buf, buf, count, dt, root, stream_);
}

void CudaCollectives::node_reduce(void* buf, size_t count, DType dt, RedOp op, int root,
                                  Millis timeout) {
  if (ipc_) {
    CollArgs a = args(OpKind::kReduce, timeout, dt);
    a.count = count, a.redop = op, a.root = root, a.buf = buf;
    return ipc_run(a);
  }
  node_->reduce(buf, buf, count, dt, op, root, stream_);
}

// ---- collectives ------------------------------------------------------------

void CudaCollectives::allreduce(void* buf, size_t count, DType dt, RedOp op, Millis timeout) {
  if (!multi_node()) {
    if (ipc_) {
      CollArgs a = args(OpKind::kAllreduce, timeout, dt);
      a.count = count, a.redop = op, a.buf = buf;
      return ipc_run(a);
    }
    if (nccl_supports(dt, op)) return node_->allreduce(buf, buf, count, dt, op, stream_);
    return host().allreduce(buf, count, dt, op, timeout);
  }
  if (!rails_serve(dt, op)) return host().allreduce(buf, count, dt, op, timeout);
  // Node reduce-scatter, rail allreduce of this rank's slice, node all-gather.
  const int L = g_.topo.local_size(), me = g_.topo.local_rank();
  const size_t es = dtype_size(dt);
  std::vector<const void*> ins(L);
  std::vector<void*> outs(L);
  std::vector<uint64_t> counts(L);
  for (int l = 0; l < L; ++l) {
    auto [off, n] = slice(count, L, l);
    ins[l] = outs[l] = static_cast<char*>(buf) + off * es;
    counts[l] = n;
  }
  Scratch part(counts[me] * es, stream_);
  node_reduce_scatter(ins.data(), part.get(), counts.data(), dt, op, timeout);
  rail_->allreduce(part.get(), part.get(), counts[me], dt, op, stream_);
  node_allgather(part.get(), outs.data(), counts.data(), dt, timeout);
}

void CudaCollectives::broadcast(void* buf, size_t count, DType dt, int root, Millis timeout) {
  if (!multi_node()) return node_broadcast(buf, count, dt, root, timeout);
  if (!rail_) return host().broadcast(buf, count, dt, root, timeout);
  // Down the root's rail to its peer on every node, then inside each node.
  const Topology& t = g_.topo;
  const int root_local = t.local_rank_of[root];
  if (t.local_rank() == root_local)
    rail_->broadcast(buf, buf, count, dt, t.node_of[root], stream_);
  node_broadcast(buf, count, dt, root_local, timeout);
}

void CudaCollectives::reduce(void* buf, size_t count, DType dt, RedOp op, int root,
                             Millis timeout) {
  if (!multi_node()) {
    if (ipc_ || nccl_supports(dt, op)) return node_reduce(buf, count, dt, op, root, timeout);
    return host().reduce(buf, count, dt, op, root, timeout);
  }
  if (!rails_serve(dt, op)) return host().reduce(buf, count, dt, op, root, timeout);
  // Inside each node to the root's local rank, then along the root's rail.
  // A non-root buffer must stay as it was, so the node stage reduces a copy.
  const Topology& t = g_.topo;
  const int root_local = t.local_rank_of[root];
  const size_t bytes = count * dtype_size(dt);
  Scratch copy(g_.rank() == root ? 0 : bytes, stream_);
  void* work = buf;
  if (g_.rank() != root) {
    RSDP_CUDA_CHECK(cudaMemcpyAsync(copy.get(), buf, bytes, cudaMemcpyDeviceToDevice, stream_));
    work = copy.get();
  }
  node_reduce(work, count, dt, op, root_local, timeout);
  if (t.local_rank() == root_local)
    rail_->reduce(work, work, count, dt, op, t.node_of[root], stream_);
}

void CudaCollectives::allgather(const void* in, void* const* outs, const uint64_t* counts,
                                DType dt, Millis timeout) {
  const int n = g_.size();
  if (!multi_node()) return node_allgather(in, outs, counts, dt, timeout);
  if (!rail_ || !all_equal(counts, n)) return host().allgather(in, outs, counts, dt, timeout);
  // Rails first (rail[k] = the input of local rank `me` on node k), then the
  // node (packed[l][k] = the input of local rank l on node k), then unpack.
  const Topology& t = g_.topo;
  const int N = t.num_nodes(), L = t.local_size();
  const size_t bytes = counts[0] * dtype_size(dt);
  Scratch rail(N * bytes, stream_), packed(static_cast<size_t>(L) * N * bytes, stream_);
  rail_->allgather(in, rail.get(), counts[0], dt, stream_);
  std::vector<void*> louts(L);
  std::vector<uint64_t> lcounts(L, counts[0] * N);
  for (int l = 0; l < L; ++l) louts[l] = packed.get() + l * N * bytes;
  node_allgather(rail.get(), louts.data(), lcounts.data(), dt, timeout);
  for (int r = 0; r < n; ++r)
    if (bytes)
      RSDP_CUDA_CHECK(cudaMemcpyAsync(
          outs[r], packed.get() + (t.local_rank_of[r] * N + t.node_of[r]) * bytes, bytes,
          cudaMemcpyDeviceToDevice, stream_));
}

void CudaCollectives::reduce_scatter(const void* const* ins, void* out, const uint64_t* counts,
                                     DType dt, RedOp op, Millis timeout) {
  const int n = g_.size();
  if (!multi_node()) {
    if (ipc_ || nccl_supports(dt, op))
      return node_reduce_scatter(ins, out, counts, dt, op, timeout);
    return host().reduce_scatter(ins, out, counts, dt, op, timeout);
  }
  if (!rails_serve(dt, op) || !all_equal(counts, n))
    return host().reduce_scatter(ins, out, counts, dt, op, timeout);
  // Pack packed[l][k] = the piece for local rank l on node k; the node stage
  // leaves this rank the node's sum of the pieces of its rail, node-major,
  // and the rail stage reduces across nodes.
  const Topology& t = g_.topo;
  const int N = t.num_nodes(), L = t.local_size();
  const size_t bytes = counts[0] * dtype_size(dt);
  Scratch packed(static_cast<size_t>(L) * N * bytes, stream_), mine(N * bytes, stream_);
  for (int r = 0; r < n; ++r)
    if (bytes)
      RSDP_CUDA_CHECK(cudaMemcpyAsync(
          packed.get() + (t.local_rank_of[r] * N + t.node_of[r]) * bytes, ins[r], bytes,
          cudaMemcpyDeviceToDevice, stream_));
  std::vector<const void*> lins(L);
  std::vector<uint64_t> lcounts(L, counts[0] * N);
  for (int l = 0; l < L; ++l) lins[l] = packed.get() + l * N * bytes;
  node_reduce_scatter(lins.data(), mine.get(), lcounts.data(), dt, op, timeout);
  rail_->reduce_scatter(mine.get(), out, counts[0], dt, op, stream_);
}

void CudaCollectives::gather(const void* in, void* const* outs, size_t count, DType dt, int root,
                             Millis timeout) {
  if (multi_node()) return host().gather(in, outs, count, dt, root, timeout);
  if (ipc_) {
    CollArgs a = args(OpKind::kGather, timeout, dt);
    a.count = count, a.root = root, a.in = in, a.outs = outs;
    return ipc_run(a);
  }
  nccl_node::gather(*node_, in, outs, count * dtype_size(dt), root, stream_);
}

void CudaCollectives::scatter(const void* const* ins, void* out, size_t count, DType dt,
                              int root, Millis timeout) {
  if (multi_node()) return host().scatter(ins, out, count, dt, root, timeout);
  if (ipc_) {
    CollArgs a = args(OpKind::kScatter, timeout, dt);
    a.count = count, a.root = root, a.ins = ins, a.out = out;
    return ipc_run(a);
  }
  nccl_node::scatter(*node_, ins, out, count * dtype_size(dt), root, stream_);
}

void CudaCollectives::alltoall(const void* const* sends, const uint64_t* send_bytes,
                               void* const* recvs, const uint64_t* recv_bytes, DType dt,
                               Millis timeout) {
  if (multi_node()) return host().alltoall(sends, send_bytes, recvs, recv_bytes, dt, timeout);
  if (ipc_) {
    CollArgs a = args(OpKind::kAlltoall, timeout, dt);
    a.sends = sends, a.send_bytes = send_bytes, a.recvs = recvs, a.recv_bytes = recv_bytes;
    return ipc_run(a);
  }
  nccl_node::alltoall(*node_, sends, send_bytes, recvs, recv_bytes, stream_);
}

void CudaCollectives::ring_shift(const std::vector<int>& order, const void* send, void* recv,
                                 size_t count, DType dt, int direction, const void* add,
                                 Millis timeout) {
  if (multi_node())
    return host().ring_shift(order, send, recv, count, dt, direction, add, timeout);
  if (ipc_) {
    // Not a row of the table: one algorithm everywhere (primitives/ring_shift.h).
    CudaDeviceScope scope(device_);
    ipc_->set_stream(stream_);
    return rsdp::ring_shift(*ipc_, order, send, recv, count, dt, direction, add, timeout);
  }
  nccl_node::ring_shift(*node_, order, send, recv, count, dt, direction, add, stream_);
}

}  // namespace

std::unique_ptr<DeviceCollectives> make_cuda_collectives(GroupComm& g, Bootstrap& store,
                                                         int device) {
  return std::make_unique<CudaCollectives>(g, store, device);
}

}  // namespace rsdp

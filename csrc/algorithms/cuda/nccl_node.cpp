#include "algorithms/cuda/nccl_node.h"

#include "algorithms/cuda/scratch.h"
#include "cuda/cuda_check.h"
#include "cuda/device_reduce.h"
#include "patterns/ring_order.h"

namespace rsdp {
namespace nccl_node {
namespace {

bool all_equal(const uint64_t* v, int n) {
  for (int i = 1; i < n; ++i)
    if (v[i] != v[0]) return false;
  return true;
}

// Buffers p * stride apart, in rank order: NCCL's one-buffer form applies.
template <typename P>
bool packed(P const* ptrs, int n, size_t stride) {
  for (int p = 1; p < n; ++p)
    if (static_cast<const char*>(ptrs[p]) != static_cast<const char*>(ptrs[0]) + p * stride)
      return false;
  return true;
}

void copy(void* dst, const void* src, size_t bytes, cudaStream_t s) {
  if (bytes && dst != src)
    RSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s));
}

// Batches NCCL calls into one group; ends it on every path (NCCL requires
// ncclGroupEnd even after a failed call inside the group).
class Batch {
 public:
  explicit Batch(NcclComm& c) : c_(c) { c_.group_start(); }
  ~Batch() noexcept(false) {
    if (std::uncaught_exceptions()) {
      try {
        c_.group_end();
      } catch (...) {
      }
    } else {
      c_.group_end();
    }
  }

 private:
  NcclComm& c_;
};

}  // namespace

void allgather(NcclComm& c, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               cudaStream_t s) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt);
  if (all_equal(counts, n) && packed(outs, n, counts[0] * es))
    return c.allgather(in, outs[0], counts[0], dt, s);
  {
    Batch b(c);
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      if (counts[me]) c.send(in, counts[me] * es, p, s);
      if (counts[p]) c.recv(outs[p], counts[p] * es, p, s);
    }
  }
  copy(outs[me], in, counts[me] * es, s);
}

void reduce_scatter(NcclComm& c, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, cudaStream_t s) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt);
  if (all_equal(counts, n) && packed(ins, n, counts[0] * es))
    return c.reduce_scatter(ins[0], out, counts[0], dt, op, s);
  // One reduce per destination; NCCL writes `out` only on the root.
  Batch b(c);
  for (int p = 0; p < n; ++p)
    if (counts[p]) c.reduce(ins[p], p == me ? out : nullptr, counts[p], dt, op, p, s);
}

void gather(NcclComm& c, const void* in, void* const* outs, size_t bytes, int root,
            cudaStream_t s) {
  const int n = c.size(), me = c.rank();
  if (!bytes) return;
  {
    Batch b(c);
    if (me != root) {
      c.send(in, bytes, root, s);
    } else {
      for (int p = 0; p < n; ++p)
        if (p != me) c.recv(outs[p], bytes, p, s);
    }
  }
  if (me == root) copy(outs[me], in, bytes, s);
}

void scatter(NcclComm& c, const void* const* ins, void* out, size_t bytes, int root,
             cudaStream_t s) {
  const int n = c.size(), me = c.rank();
  if (!bytes) return;
  {
    Batch b(c);
    if (me != root) {
      c.recv(out, bytes, root, s);
    } else {
      for (int p = 0; p < n; ++p)
        if (p != me) c.send(ins[p], bytes, p, s);
    }
  }
  if (me == root) copy(out, ins[me], bytes, s);
}

void alltoall(NcclComm& c, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, cudaStream_t s) {
  const int n = c.size(), me = c.rank();
  {
    Batch b(c);
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      if (send_bytes[p]) c.send(sends[p], send_bytes[p], p, s);
      if (recv_bytes[p]) c.recv(recvs[p], recv_bytes[p], p, s);
    }
  }
  RSDP_CHECK(send_bytes[me] == recv_bytes[me], "all_to_all: this rank sends itself ",
             send_bytes[me], " bytes but expects ", recv_bytes[me]);
  copy(recvs[me], sends[me], send_bytes[me], s);
}

void ring_shift(NcclComm& c, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add, cudaStream_t s) {
  const size_t bytes = count * dtype_size(dt);
  if (!bytes) return;
  if (c.size() == 1) {  // one rank: its own buffer comes back
    copy(recv, send, bytes, s);
  } else {
    const RingNeighbours nb = ring_neighbours(order, c.rank(), direction);
    // recv may alias send: receive into scratch first.
    Scratch tmp(send == recv ? bytes : 0, s);
    void* into = send == recv ? tmp.get() : recv;
    {
      Batch b(c);
      c.send(send, bytes, nb.send_to, s);
      c.recv(into, bytes, nb.recv_from, s);
    }
    copy(recv, into, bytes, s);
  }
  if (add) {
    const void* srcs[2] = {recv, add};
    device_reduce_n(recv, srcs, 2, count, dt, RedOp::kSum, 1, s);
  }
}

}  // namespace nccl_node
}  // namespace rsdp

// Allreduce and reduce over CUDA IPC.
//
// One-shot (small messages): one step; every rank stages its whole buffer and
// every rank (for reduce: the root) reduces all n staged copies, in rank
// order, straight from the peers' halves into its buffer.
//
// Two-shot (large messages), as the CPU allreduce_rs_ag: the buffer is cut
// into segments of n slots; chunk p of a segment is the part rank p reduces.
//   step A  every rank stages the chunks of the others in their slots;
//   reduce  rank p reduces its own chunk and the n-1 staged copies, in rank
//           order, into its slot of the next half, and copies it home;
//   step B  every rank copies the other n-1 reduced chunks (for reduce: only
//           the root does, and the root's own chunk needs no staging).
// Each rank moves (n-1)/n*S in, reduces S/n and moves (n-1)/n*S out, with 2
// synchronisations per segment.
#include <algorithm>
#include <vector>

#include "algorithms/cuda/ipc_algorithms.h"
#include "algorithms/cuda/ipc_common.h"
#include "patterns/chunks.h"
#include "transport/cuda_ipc/device_scope.h"

namespace rsdp {
namespace ipc {

void allreduce_oneshot(IpcComm& c, void* buf, size_t count, DType dt, RedOp op) {
  const int n = c.size();
  const size_t bytes = count * dtype_size(dt);
  impl::copy(c, c.stage(), buf, bytes);
  c.exchange(bytes);
  std::vector<const void*> srcs(n);
  for (int p = 0; p < n; ++p) srcs[p] = c.peer(p);
  impl::reduce_ordered(c, buf, srcs.data(), n, count, dt, op, n, nullptr);
}

void allreduce_rs_ag(IpcComm& c, void* buf, size_t count, DType dt, RedOp op) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt);
  const size_t sub = slot_elems(c.half_bytes(), n, es);
  char* data = static_cast<char*>(buf);
  std::vector<const void*> srcs(n);
  size_t base = 0;
  do {
    const size_t seg = clip(count, base, sub * n);
    auto len = [&](int p) { return clip(seg, p * sub, sub); };
    auto at = [&](int p) { return data + (base + p * sub) * es; };

    char* st = c.stage();
    for (int p = 0; p < n; ++p)
      if (p != me) impl::copy(c, st + p * sub * es, at(p), len(p) * es);
    c.exchange((seg - len(me)) * es);

    for (int q = 0; q < n; ++q) srcs[q] = q == me ? at(me) : c.peer(q) + me * sub * es;
    char* mine = c.stage() + me * sub * es;
    impl::reduce_ordered(c, mine, srcs.data(), n, len(me), dt, op, n, nullptr);
    impl::copy(c, at(me), mine, len(me) * es);
    c.exchange(len(me) * es);

    for (int p = 0; p < n; ++p)
      if (p != me) impl::copy(c, at(p), c.peer(p) + p * sub * es, len(p) * es);
    base += sub * n;
  } while (base < count);
}

void allreduce(IpcComm& c, void* buf, size_t count, DType dt, RedOp op, size_t oneshot_bytes,
               Millis timeout, cudaStream_t stream) {
  impl::check_redop(c, dt, op, OpKind::kAllreduce);
  CudaDeviceScope scope(c.device());
  const size_t bytes = count * dtype_size(dt);
  const bool oneshot = bytes <= oneshot_bytes && bytes <= c.half_bytes();
  // The choice depends on a per-rank setting, so it is part of what ranks must agree on.
  c.begin(OpDesc::make(OpKind::kAllreduce, dt, count, op, -1, oneshot ? 1 : 2), timeout, stream);
  if (c.size() == 1) {  // every op over one rank is the identity
    c.exchange();
    return;
  }
  if (oneshot)
    allreduce_oneshot(c, buf, count, dt, op);
  else
    allreduce_rs_ag(c, buf, count, dt, op);
}

void reduce(IpcComm& c, void* buf, size_t count, DType dt, RedOp op, int root,
            size_t oneshot_bytes, Millis timeout, cudaStream_t stream) {
  impl::check_root(c, root, OpKind::kReduce);
  impl::check_redop(c, dt, op, OpKind::kReduce);
  CudaDeviceScope scope(c.device());
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt);
  const bool oneshot = count * es <= std::min(oneshot_bytes, c.half_bytes());
  // A per-rank setting: part of what ranks must agree on.
  c.begin(OpDesc::make(OpKind::kReduce, dt, count, op, root, oneshot ? 1 : 2), timeout, stream);
  char* data = static_cast<char*>(buf);
  std::vector<const void*> srcs(n);

  if (n == 1) {  // the root's buffer already holds the result
    c.exchange();
    return;
  }
  if (oneshot) {
    impl::copy(c, c.stage(), data, count * es);
    c.exchange(me == root ? 0 : count * es);
    if (me == root) {
      for (int p = 0; p < n; ++p) srcs[p] = c.peer(p);
      impl::reduce_ordered(c, data, srcs.data(), n, count, dt, op, n, nullptr);
    }
    return;
  }

  const size_t sub = slot_elems(c.half_bytes(), n, es);
  size_t base = 0;
  do {
    const size_t seg = clip(count, base, sub * n);
    auto len = [&](int p) { return clip(seg, p * sub, sub); };
    auto at = [&](int p) { return data + (base + p * sub) * es; };

    char* st = c.stage();
    for (int p = 0; p < n; ++p)
      if (p != me) impl::copy(c, st + p * sub * es, at(p), len(p) * es);
    c.exchange((seg - len(me)) * es);

    for (int q = 0; q < n; ++q) srcs[q] = q == me ? at(me) : c.peer(q) + me * sub * es;
    // The next half's own slot: staged for the root by the others, scratch
    // for the root (whose result aliases its own source at(me)).
    char* mine = c.stage() + me * sub * es;
    void* dst = me == root ? static_cast<void*>(at(me)) : mine;
    impl::reduce_ordered(c, dst, srcs.data(), n, len(me), dt, op, n, mine);
    c.exchange(me == root ? 0 : len(me) * es);

    if (me == root)
      for (int p = 0; p < n; ++p)
        if (p != me) impl::copy(c, at(p), c.peer(p) + p * sub * es, len(p) * es);
    base += sub * n;
  } while (base < count);
}

}  // namespace ipc
}  // namespace rsdp

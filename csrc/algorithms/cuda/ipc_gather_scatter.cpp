// Broadcast, all-gather, gather, scatter and barrier over CUDA IPC.
//
// broadcast  per step the root copies up to `half` bytes of the buffer into
//            its half; after the exchange every other rank copies them out.
// allgather  per step every rank stages up to `half` bytes of its own input;
//            after the exchange each receiver copies every peer's piece to
//            its place. A rank whose input is used up stages nothing; the op
//            runs until the largest input is done, a number every rank
//            computes from the same size list (whose hash is in the
//            descriptor, so ranks that disagree fail at the first step).
// gather     as allgather, only the root receives and the root stages nothing.
// scatter    the root's half is cut into n slots; per step the root stages
//            the next slot-sized piece of every other rank's input and rank p
//            copies slot p out.
// All of them take at least one step, so even empty ops check descriptors.
#include <algorithm>
#include <vector>

#include "algorithms/cuda/ipc_algorithms.h"
#include "algorithms/cuda/ipc_common.h"
#include "patterns/chunks.h"
#include "transport/cuda_ipc/device_scope.h"

namespace rsdp {
namespace ipc {
namespace {

// stage_own: whether anyone reads this rank's pieces (false for the root of a
// gather). receive: whether this rank collects the others' pieces.
void gather_steps(IpcComm& c, const void* in, void* const* outs, const uint64_t* counts,
                  DType dt, bool stage_own, bool receive) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt), seg = c.half_bytes();
  const char* src = static_cast<const char*>(in);
  size_t most = 0;
  for (int p = 0; p < n; ++p) most = std::max<size_t>(most, counts[p] * es);
  if (receive && outs[me] != in) impl::copy(c, outs[me], in, counts[me] * es);
  size_t off = 0;
  do {
    const size_t mine = stage_own && n > 1 ? clip(counts[me] * es, off, seg) : 0;
    impl::copy(c, c.stage(), src + off, mine);
    c.exchange(mine);
    if (receive)
      for (int p = 0; p < n; ++p)
        if (p != me)
          impl::copy(c, static_cast<char*>(outs[p]) + off, c.peer(p),
                     clip(counts[p] * es, off, seg));
    off += seg;
  } while (off < most);
}

}  // namespace

void broadcast(IpcComm& c, void* buf, size_t count, DType dt, int root, Millis timeout,
               cudaStream_t stream) {
  impl::check_root(c, root, OpKind::kBroadcast);
  CudaDeviceScope scope(c.device());
  c.begin(OpDesc::make(OpKind::kBroadcast, dt, count, RedOp::kSum, root), timeout, stream);
  const bool is_root = c.rank() == root, others = c.size() > 1;
  char* p = static_cast<char*>(buf);
  const size_t bytes = count * dtype_size(dt);
  const size_t seg = c.half_bytes();
  size_t off = 0;
  do {
    const size_t len = clip(bytes, off, seg);
    if (is_root && others) impl::copy(c, c.stage(), p + off, len);
    c.exchange(is_root ? len : 0);
    if (!is_root) impl::copy(c, p + off, c.peer(root), len);
    off += seg;
  } while (off < bytes);
}

void barrier(IpcComm& c, Millis timeout, cudaStream_t stream) {
  CudaDeviceScope scope(c.device());
  c.begin(OpDesc::make(OpKind::kBarrier, DType::kUInt8, 0), timeout, stream);
  c.exchange();
}

void allgather(IpcComm& c, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout, cudaStream_t stream) {
  CudaDeviceScope scope(c.device());
  c.begin(OpDesc::per_rank(OpKind::kAllgather, dt, counts, c.size()), timeout, stream);
  gather_steps(c, in, outs, counts, dt, true, true);
}

void gather(IpcComm& c, const void* in, void* const* outs, size_t count, DType dt, int root,
            Millis timeout, cudaStream_t stream) {
  impl::check_root(c, root, OpKind::kGather);
  CudaDeviceScope scope(c.device());
  c.begin(OpDesc::make(OpKind::kGather, dt, count, RedOp::kSum, root), timeout, stream);
  std::vector<uint64_t> counts(c.size(), count);
  const bool is_root = c.rank() == root;
  gather_steps(c, in, outs, counts.data(), dt, !is_root, is_root);
}

void scatter(IpcComm& c, const void* const* ins, void* out, size_t count, DType dt, int root,
             Millis timeout, cudaStream_t stream) {
  impl::check_root(c, root, OpKind::kScatter);
  CudaDeviceScope scope(c.device());
  c.begin(OpDesc::make(OpKind::kScatter, dt, count, RedOp::kSum, root), timeout, stream);
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt), bytes = count * es;
  const size_t slot = slot_elems(c.half_bytes(), n, 1);  // bytes
  char* dst = static_cast<char*>(out);
  if (me == root && ins[me] != out) impl::copy(c, dst, ins[me], bytes);
  size_t off = 0;
  do {
    const size_t len = clip(bytes, off, slot);
    if (me == root) {
      char* st = c.stage();
      for (int p = 0; p < n; ++p)
        if (p != me) impl::copy(c, st + p * slot, static_cast<const char*>(ins[p]) + off, len);
    }
    c.exchange(me == root ? len * (n - 1) : 0);
    if (me != root) impl::copy(c, dst + off, c.peer(root) + me * slot, len);
    off += slot;
  } while (off < bytes);
}

}  // namespace ipc
}  // namespace rsdp

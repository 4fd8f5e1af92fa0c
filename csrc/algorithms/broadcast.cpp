// Broadcast through the root's staging half, and the barrier.
//
// Per step the root copies up to `half` bytes of the buffer into its half;
// after the exchange every other rank copies them out. Bytes moved per step:
// root writes S once, each of the n-1 others reads S. Large buffers stream in
// segments of `half` bytes; the double-buffered halves let the root fill the
// next segment while slower ranks still read the last one.
#include "algorithms/algorithms.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {

void broadcast(Staging& c, void* buf, size_t count, DType dt, int root, Millis timeout) {
  c.begin(OpDesc::make(OpKind::kBroadcast, dt, count, RedOp::kSum, root), timeout);
  char* p = static_cast<char*>(buf);
  const size_t bytes = count * dtype_size(dt);
  if (ShmComm* shm = c.shared_memory(); shm && direct_broadcast(*shm, buf, bytes, root)) return;
  const bool is_root = c.rank() == root, others = c.size() > 1;
  const size_t seg = c.half_bytes();
  size_t off = 0;
  do {  // at least one step, so even empty broadcasts check descriptors
    const size_t len = clip(bytes, off, seg);
    if (is_root && others) c.copy(c.stage(), p + off, len);
    c.exchange(is_root ? len : 0);
    if (!is_root) c.copy(p + off, c.peer(root), len);
    off += seg;
  } while (off < bytes);
}

void barrier(Staging& c, Millis timeout) {
  c.begin(OpDesc::make(OpKind::kBarrier, DType::kUInt8, 0), timeout);
  c.exchange();
}

}  // namespace algo
}  // namespace rsdp

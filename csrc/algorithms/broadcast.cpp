// Broadcast through the root's staging half.
//
// Per step the root copies up to `half` bytes of the buffer into its half;
// after the exchange every other rank copies them out. Bytes moved per step:
// root writes S once, each of the n-1 others reads S. Large buffers stream in
// segments of `half` bytes; the double-buffered halves let the root fill the
// next segment while slower ranks still read the last one.
#include <cstring>

#include "algorithms/algorithms.h"
#include "core/op_desc.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {

void broadcast(ShmComm& c, void* buf, size_t count, DType dt, int root, Millis timeout) {
  c.begin(OpDesc::make(OpKind::kBroadcast, dt, count, RedOp::kSum, root), timeout);
  char* p = static_cast<char*>(buf);
  const size_t bytes = count * dtype_size(dt);
  if (direct_broadcast(c, buf, bytes, root)) return;
  const size_t seg = c.half_bytes();
  size_t off = 0;
  do {  // at least one step, so even empty broadcasts check descriptors
    size_t n = clip(bytes, off, seg);
    if (c.rank() == root) std::memcpy(c.stage(), p + off, n);
    c.exchange(c.rank() == root ? n : 0);
    if (c.rank() != root) std::memcpy(p + off, c.peer(root), n);
    off += seg;
  } while (off < bytes);
}

void barrier(ShmComm& c, Millis timeout) {
  c.begin(OpDesc::make(OpKind::kBarrier, DType::kUInt8, 0), timeout);
  c.exchange();
}

}  // namespace algo
}  // namespace rsdp

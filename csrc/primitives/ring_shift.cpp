// ring_shift over one node's shared memory.
//
// Per step each rank stages up to `half` bytes of its send buffer; after the
// exchange it copies (or, for ring_shift_reduce, adds into) its receive buffer
// from the neighbour's half. Every rank writes S and reads S per rotation: the
// minimum for moving S bytes between processes through shared memory.
#include "primitives/ring_shift.h"

#include <cstring>

#include "core/reduce_kernels.h"
#include "patterns/chunks.h"
#include "patterns/ring_order.h"

namespace rsdp {

void ring_shift(ShmComm& c, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add,
                std::chrono::milliseconds timeout) {
  OpDesc d;
  d.kind = OpKind::kRingShift;
  d.dtype = dt;
  d.count = count;
  d.direction = direction >= 0 ? 1 : -1;
  d.redop = add ? RedOp::kSum : RedOp::kMax;  // tells shift and shift_reduce apart
  c.begin(d, timeout);
  const RingNeighbours nb = ring_neighbours(order, c.rank(), direction);
  const size_t es = dtype_size(dt), bytes = count * es;
  const size_t seg = c.half_bytes() / es * es;
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  const char* extra = static_cast<const char*>(add);
  size_t off = 0;
  do {
    const size_t n = clip(bytes, off, seg);
    std::memcpy(c.stage(), in + off, n);
    c.exchange(n);
    const char* theirs = c.peer(nb.recv_from);
    if (extra) {
      const void* srcs[2] = {theirs, extra + off};
      reduce_n(out + off, srcs, 2, n / es, dt, RedOp::kSum, 1);
    } else {
      std::memcpy(out + off, theirs, n);
    }
    off += seg;
  } while (off < bytes);
}

}  // namespace rsdp

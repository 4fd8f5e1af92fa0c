// ring_shift over CUDA IPC.
//
// Per step each rank stages up to `half` bytes of its send buffer; after the
// exchange it copies (or, for ring_shift_reduce, adds into) its receive
// buffer from the neighbour's half. A step stages its piece of `send` before
// anything of that piece is received, so recv may alias send.
#include <algorithm>
#include <vector>

#include "algorithms/cuda/ipc_algorithms.h"
#include "algorithms/cuda/ipc_common.h"
#include "core/error.h"
#include "patterns/chunks.h"
#include "patterns/ring_order.h"
#include "transport/cuda_ipc/device_scope.h"

namespace rsdp {
namespace ipc {

void ring_shift(IpcComm& c, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add, Millis timeout,
                cudaStream_t stream) {
  const int me = c.rank();
  RSDP_CHECK(static_cast<int>(order.size()) == c.size() &&
                 std::find(order.begin(), order.end(), me) != order.end(),
             c.group().me(), ": ring_shift: the ring has ", order.size(),
             " entries but must list each of the node's ", c.size(), " ranks once");
  CudaDeviceScope scope(c.device());
  c.begin(OpDesc::ring_shift(dt, count, direction, add != nullptr), timeout, stream);
  const RingNeighbours nb = ring_neighbours(order, me, direction);
  const size_t es = dtype_size(dt), bytes = count * es;
  const size_t seg = c.half_bytes() / es * es;
  const char* in = static_cast<const char*>(send);
  char* out = static_cast<char*>(recv);
  const char* extra = static_cast<const char*>(add);
  size_t off = 0;
  do {
    const size_t len = clip(bytes, off, seg);
    impl::copy(c, c.stage(), in + off, len);
    c.exchange(len);
    const char* theirs = c.peer(nb.recv_from);
    if (extra) {
      const void* srcs[2] = {theirs, extra + off};
      impl::reduce_ordered(c, out + off, srcs, 2, len / es, dt, RedOp::kSum, 1, nullptr);
    } else {
      impl::copy(c, out + off, theirs, len);
    }
    off += seg;
  } while (off < bytes);
}

}  // namespace ipc
}  // namespace rsdp

// ring_shift over one node's staging transport (transport/staging.h).
//
// Per step each rank stages up to `half` bytes of its send buffer and posts
// it; once its ring predecessor (in the shift's direction) has posted the same
// step, it copies (or, for ring_shift_reduce, adds into) its receive buffer
// from that neighbour's half. Every rank writes S and reads S per rotation: the
// minimum for moving S bytes between processes through staging memory. On
// shared memory a step waits for the two neighbours only (shm_comm.h).
#include "primitives/ring_shift.h"

#include "patterns/chunks.h"

namespace rsdp {
namespace {

void stage_segment(RingShiftOp& op) {
  const size_t n = clip(op.bytes, op.off, op.seg);
  char* stage = op.c->ring_stage();
  op.c->copy(stage, op.in + op.off, n);
  op.c->ring_post(n, op.nb.send_to);
}

}  // namespace

void ring_shift_start(Staging& c, RingShiftOp& op, const std::vector<int>& order,
                      const void* send, void* recv, size_t count, DType dt, int direction,
                      const void* add, std::chrono::milliseconds timeout) {
  c.begin(OpDesc::ring_shift(dt, count, direction, add != nullptr), timeout);
  op.c = &c;
  op.nb = ring_neighbours(order, c.rank(), direction);
  op.es = dtype_size(dt);
  op.dt = dt;
  op.bytes = count * op.es;
  op.seg = c.half_bytes() / op.es * op.es;
  op.in = static_cast<const char*>(send);
  op.out = static_cast<char*>(recv);
  op.extra = static_cast<const char*>(add);
  op.off = 0;
  stage_segment(op);
}

void ring_shift_finish(RingShiftOp& op) {
  Staging& c = *op.c;
  for (;;) {
    const size_t n = clip(op.bytes, op.off, op.seg);
    c.ring_wait(op.nb.recv_from);
    const char* theirs = c.peer(op.nb.recv_from);
    if (op.extra) {
      const void* srcs[2] = {theirs, op.extra + op.off};
      c.reduce(op.out + op.off, srcs, 2, n / op.es, op.dt, RedOp::kSum, 1, nullptr);
    } else {
      c.copy(op.out + op.off, theirs, n);
    }
    op.off += op.seg;
    if (op.off >= op.bytes) return;
    stage_segment(op);
  }
}

void ring_shift(Staging& c, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add,
                std::chrono::milliseconds timeout) {
  RingShiftOp op;
  ring_shift_start(c, op, order, send, recv, count, dt, direction, add, timeout);
  ring_shift_finish(op);
}

}  // namespace rsdp

// Ring redistribution: every rank passes a buffer to its ring successor (or
// predecessor, direction -1) while receiving its neighbour's, optionally adding
// a local contribution to what it receives (ring_shift_reduce). This is the
// primitive RSDP rotates weight shards and carries gradients home with.
#pragma once

#include <chrono>
#include <cstddef>
#include <vector>

#include "core/dtype.h"
#include "patterns/ring_order.h"
#include "transport/staging.h"

namespace rsdp {

// recv <- neighbour's send; with `add`, recv <- neighbour's send + add
// (element-wise SUM, float16/bfloat16 accumulated in float32). `send` is staged
// before anything is received, so recv may alias send (an in-place rotation
// needs no second buffer). All ranks must pass the same count, dtype and
// direction. `order` is the ring (see patterns/ring_order.h). On shared memory
// every step waits only for the two ring neighbours ([Note: ring steps wait
// for neighbours only] in shm_comm.h); device transports run collective steps.
void ring_shift(Staging& c, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add,
                std::chrono::milliseconds timeout);

// The same in two halves, for a caller that computes in between:
// ring_shift_start() stages and posts the first segment without waiting;
// ring_shift_finish() waits for the neighbour, copies (or adds) what it sent,
// and runs any further segments. Nothing else may use `c` in between; `send`
// and `add` must stay unchanged and `recv` unread until the finish.
struct RingShiftOp {
  Staging* c = nullptr;
  const char* in = nullptr;
  char* out = nullptr;
  const char* extra = nullptr;
  size_t bytes = 0, seg = 0, off = 0, es = 1;
  DType dt{};
  RingNeighbours nb{0, 0};
};
void ring_shift_start(Staging& c, RingShiftOp& op, const std::vector<int>& order,
                      const void* send, void* recv, size_t count, DType dt, int direction,
                      const void* add, std::chrono::milliseconds timeout);
void ring_shift_finish(RingShiftOp& op);

}  // namespace rsdp

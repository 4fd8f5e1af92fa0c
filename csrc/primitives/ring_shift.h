// Ring redistribution: every rank passes a buffer to its ring successor (or
// predecessor, direction -1) while receiving its neighbour's, optionally adding
// a local contribution to what it receives (ring_shift_reduce). This is the
// primitive RSDP rotates weight shards and carries gradients home with.
#pragma once

#include <chrono>
#include <cstddef>

#include "core/dtype.h"
#include "transport/shm/shm_comm.h"

namespace rsdp {

// recv <- neighbour's send; with `add`, recv <- neighbour's send + add
// (element-wise SUM, float16/bfloat16 accumulated in float32). `send` is staged
// before anything is received, so recv may alias send (an in-place rotation
// needs no second buffer). All ranks must pass the same count, dtype and
// direction. `order` is the ring (see patterns/ring_order.h).
void ring_shift(ShmComm& c, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add,
                std::chrono::milliseconds timeout);

}  // namespace rsdp

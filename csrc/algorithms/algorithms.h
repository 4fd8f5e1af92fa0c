// The collective algorithms over one node's shared memory. Each call runs one
// whole collective on the calling thread: it begins the op on the comm (which
// numbers it and arms its deadline), then runs steps until done. Pointers are
// raw host memory; sizes are element counts unless named *_bytes.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/reduce_op.h"
#include "transport/shm/shm_comm.h"

namespace rsdp {
namespace algo {

using Millis = std::chrono::milliseconds;

void broadcast(ShmComm& c, void* buf, size_t count, DType dt, int root, Millis timeout);

// Chooses one-shot below Options::oneshot_bytes, reduce-scatter + all-gather above.
void allreduce(ShmComm& c, void* buf, size_t count, DType dt, RedOp op, size_t oneshot_bytes,
               Millis timeout);
void allreduce_oneshot(ShmComm& c, void* buf, size_t count, DType dt, RedOp op);
void allreduce_rs_ag(ShmComm& c, void* buf, size_t count, DType dt, RedOp op);

// Only root's buffer is written.
void reduce(ShmComm& c, void* buf, size_t count, DType dt, RedOp op, int root,
            size_t oneshot_bytes, Millis timeout);

// outs[p] receives counts[p] elements from rank p (allgather_v). outs[me] may
// alias in.
void allgather(ShmComm& c, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout);

// outs (length size) only on root; every rank sends `count` elements.
void gather(ShmComm& c, const void* in, void* const* outs, size_t count, DType dt, int root,
            Millis timeout);

// ins (length size) only on root; every rank receives `count` elements.
void scatter(ShmComm& c, const void* const* ins, void* out, size_t count, DType dt, int root,
             Millis timeout);

// ins[p] (counts[p] elements) is this rank's contribution to rank p's result;
// out receives counts[me] reduced elements (reduce_scatter_v).
void reduce_scatter(ShmComm& c, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout);

// sends[p] (send_bytes[p]) goes to rank p; recvs[p] (recv_bytes[p]) comes from
// rank p. Sizes may differ per pair; they are checked against the peers'.
void alltoall(ShmComm& c, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, DType dt, Millis timeout);

void barrier(ShmComm& c, Millis timeout);

// One-copy variants over the pool (direct.cpp), called after begin(): each
// returns false, having agreed so with every peer, when some buffer it needs
// lies outside the pools; the caller then runs its staging algorithm.
bool direct_allgather(ShmComm& c, const void* in, void* const* outs, const uint64_t* counts,
                      DType dt);
bool direct_broadcast(ShmComm& c, void* buf, size_t bytes, int root);
bool direct_reduce_scatter(ShmComm& c, const void* const* ins, void* out, const uint64_t* counts,
                           DType dt, RedOp op);
bool direct_allreduce(ShmComm& c, void* buf, size_t count, DType dt, RedOp op);

}  // namespace algo
}  // namespace rsdp

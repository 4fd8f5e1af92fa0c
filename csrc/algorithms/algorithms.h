// The single-node collective algorithms, written once over the staging
// interface (transport/staging.h): shared memory runs them with memcpy and
// the CPU kernels on the calling thread, CUDA IPC queues the same steps on
// the op's stream, and the emulated device on its stream thread. Each call
// runs one whole collective: it begins the op on the staging transport
// (which numbers it and arms its deadline), then runs steps until done.
// Pointers are in the transport's memory (host, or device); sizes are
// element counts unless named *_bytes. Reductions run over the ranks'
// contributions in rank order 0..n-1, so every rank gets bit-identical
// results.
//
// Staging layouts (a "half" is Staging::half_bytes(); a "slot" is half / n,
// rounded down to a multiple of 64 bytes):
//   broadcast       root's half: the next half-sized piece of the buffer
//   allreduce       one-shot: the whole buffer; two-shot: slot p holds this
//                   rank's copy of chunk p (step A), then the reduced own
//                   chunk in the own slot of the next half (step B)
//   reduce          as allreduce; only the root reads the reduced chunks
//   allgather       the next half-sized piece of this rank's input
//   gather          as allgather; the root stages nothing
//   scatter         root's half: slot p holds the next piece for rank p
//   reduce_scatter  slot p: the next piece of this rank's input for rank p
//   alltoall        the size matrix in the host side channel (step 0), then
//                   slot p: the next piece of this rank's data for rank p
//   ring_shift      the next half-sized piece of `send` (primitives/)
//   barrier         nothing
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "core/reduce_op.h"
#include "transport/shm/shm_comm.h"
#include "transport/staging.h"

namespace rsdp {
namespace algo {

using Millis = std::chrono::milliseconds;

void broadcast(Staging& c, void* buf, size_t count, DType dt, int root, Millis timeout);

// Chooses one-shot when count * dtype size <= min(oneshot_bytes, half),
// reduce-scatter + all-gather above.
void allreduce(Staging& c, void* buf, size_t count, DType dt, RedOp op, size_t oneshot_bytes,
               Millis timeout);
// The two bodies, for an op already begun (group size > 1).
void allreduce_oneshot(Staging& c, void* buf, size_t count, DType dt, RedOp op);
void allreduce_rs_ag(Staging& c, void* buf, size_t count, DType dt, RedOp op);
// The reduce-scatter + gather both use: every rank reduces its chunk of each
// segment; the reduced chunks reach every rank (root < 0) or only root, whose
// buffer alone is then written.
void reduce_scatter_gather(Staging& c, void* buf, size_t count, DType dt, RedOp op, int root);

// Only root's buffer is written.
void reduce(Staging& c, void* buf, size_t count, DType dt, RedOp op, int root,
            size_t oneshot_bytes, Millis timeout);

// outs[p] receives counts[p] elements from rank p (allgather_v). outs[me] may
// alias in.
void allgather(Staging& c, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout);

// outs (length size) only on root; every rank sends `count` elements.
void gather(Staging& c, const void* in, void* const* outs, size_t count, DType dt, int root,
            Millis timeout);

// ins (length size) only on root; every rank receives `count` elements.
void scatter(Staging& c, const void* const* ins, void* out, size_t count, DType dt, int root,
             Millis timeout);

// ins[p] (counts[p] elements) is this rank's contribution to rank p's result;
// out receives counts[me] reduced elements (reduce_scatter_v). out may alias
// ins[me].
void reduce_scatter(Staging& c, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout);

// sends[p] (send_bytes[p]) goes to rank p; recvs[p] (recv_bytes[p]) comes from
// rank p. Sizes may differ per pair; they are checked against the peers'
// (every rank sees the whole matrix, so all ranks raise together).
void alltoall(Staging& c, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, DType dt, Millis timeout);

// One exchange: on return every peer reached the barrier (on a device: work
// queued afterwards runs after every peer's earlier work).
void barrier(Staging& c, Millis timeout);

// One-copy variants over the shared-memory pool (direct.cpp), called after
// begin(): each returns false, having agreed so with every peer, when some
// buffer it needs lies outside the pools; the caller then runs its staging
// algorithm.
bool direct_allgather(ShmComm& c, const void* in, void* const* outs, const uint64_t* counts,
                      DType dt);
bool direct_broadcast(ShmComm& c, void* buf, size_t bytes, int root);
bool direct_reduce_scatter(ShmComm& c, const void* const* ins, void* out, const uint64_t* counts,
                           DType dt, RedOp op);
bool direct_allreduce(ShmComm& c, void* buf, size_t count, DType dt, RedOp op);

}  // namespace algo
}  // namespace rsdp

// The collective algorithms over one node's CUDA-IPC staging buffers: the
// device twins of algorithms/algorithms.h, with the same contracts (counts,
// aliasing, descriptors, number of steps for one rank). Pointers are device
// pointers on the comm's GPU; sizes are element counts unless named *_bytes.
//
// Each call begins the op on the comm with `stream` (which numbers it and
// arms its deadline), queues its copies and reductions on that stream and
// returns: the host waits only until every peer has queued the same steps.
// Reductions run over the ranks' contributions in rank order 0..n-1, so every
// rank gets bit-identical results.
//
// Staging layouts (a "half" is IpcComm::half_bytes(); a "slot" is half / n,
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
//   alltoall        slot p: the next piece of this rank's data for rank p;
//                   the size matrix travels in the host side channel of the
//                   first step
//   ring_shift      the next half-sized piece of `send`
//   barrier         nothing
#pragma once

#include <cuda_runtime_api.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/reduce_op.h"
#include "transport/cuda_ipc/ipc_comm.h"

namespace rsdp {
namespace ipc {

using Millis = std::chrono::milliseconds;

void broadcast(IpcComm& c, void* buf, size_t count, DType dt, int root, Millis timeout,
               cudaStream_t stream);

// One-shot when count * dtype size <= min(oneshot_bytes, half), else
// reduce-scatter + all-gather.
void allreduce(IpcComm& c, void* buf, size_t count, DType dt, RedOp op, size_t oneshot_bytes,
               Millis timeout, cudaStream_t stream);
// The two bodies, for an op already begun (group size > 1).
void allreduce_oneshot(IpcComm& c, void* buf, size_t count, DType dt, RedOp op);
void allreduce_rs_ag(IpcComm& c, void* buf, size_t count, DType dt, RedOp op);

// Only root's buffer is written.
void reduce(IpcComm& c, void* buf, size_t count, DType dt, RedOp op, int root,
            size_t oneshot_bytes, Millis timeout, cudaStream_t stream);

// outs[p] receives counts[p] elements from rank p (allgather_v). outs[me] may
// alias in.
void allgather(IpcComm& c, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout, cudaStream_t stream);

// outs (length size) only on root; every rank sends `count` elements.
void gather(IpcComm& c, const void* in, void* const* outs, size_t count, DType dt, int root,
            Millis timeout, cudaStream_t stream);

// ins (length size) only on root; every rank receives `count` elements.
void scatter(IpcComm& c, const void* const* ins, void* out, size_t count, DType dt, int root,
             Millis timeout, cudaStream_t stream);

// ins[p] (counts[p] elements) is this rank's contribution to rank p's result;
// out receives counts[me] reduced elements (reduce_scatter_v). out may alias
// ins[me].
void reduce_scatter(IpcComm& c, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout, cudaStream_t stream);

// sends[p] (send_bytes[p]) goes to rank p; recvs[p] (recv_bytes[p]) comes from
// rank p. Sizes may differ per pair; they are checked against the peers'
// (every rank sees the whole matrix, so all ranks raise together).
void alltoall(IpcComm& c, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, DType dt, Millis timeout,
              cudaStream_t stream);

// One exchange: on return the host has seen every peer reach the barrier, and
// work queued on `stream` afterwards runs after every peer's earlier work on
// its own stream.
void barrier(IpcComm& c, Millis timeout, cudaStream_t stream);

// recv <- neighbour's send; with `add`, recv <- neighbour's send + add
// (element-wise SUM). recv may alias send. `order` is the ring over the comm's
// ranks (see patterns/ring_order.h); direction +1 receives from the
// predecessor.
void ring_shift(IpcComm& c, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add, Millis timeout,
                cudaStream_t stream);

}  // namespace ipc
}  // namespace rsdp

// The collectives as the backend calls them: one entry per op over a whole
// process group (GroupComm). Each picks its algorithm with select_algo() and
// runs it: the shared-memory algorithms on one node; hierarchical or flat
// network algorithms across nodes. Signatures follow algorithms.h; arrays
// are indexed by group rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "algorithms/algorithm_table.h"
#include "algorithms/group_comm.h"

namespace rsdp {
namespace coll {

using Millis = std::chrono::milliseconds;

void broadcast(GroupComm& g, void* buf, size_t count, DType dt, int root, Millis timeout);
void allreduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, Millis timeout);
void reduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout);
void allgather(GroupComm& g, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout);
void gather(GroupComm& g, const void* in, void* const* outs, size_t count, DType dt, int root,
            Millis timeout);
void scatter(GroupComm& g, const void* const* ins, void* out, size_t count, DType dt, int root,
             Millis timeout);
// residual: error feedback of a compressed reduce-scatter (hierarchical.h);
// untouched when the op is not compressed.
void reduce_scatter(GroupComm& g, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout, float* const* residual = nullptr);
void alltoall(GroupComm& g, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, DType dt, Millis timeout);
void barrier(GroupComm& g, Millis timeout);
// Ring redistribution along `order` (primitives/ring_shift.h for the contract).
// Under the group's ring_shift / ring_shift_reduce compression the hops
// between nodes carry block-quantised values; `residual` (float32, count
// elements, or null) then receives what quantising this rank's send lost and
// is added to the next send (error feedback). Hops inside a node stay exact.
void ring_shift(GroupComm& g, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add, Millis timeout,
                float* residual = nullptr);

// A node stage on device buffers (CUDA IPC, the emulated device): the
// single-node rows of the table over `s`, chosen by the same selection
// (its device column and RSDP_ALGO_<OP>). `a` names the op as the entries
// above would (a.g supplies the options); arrays are indexed by s's ranks.
void run_on_device(Staging& s, CollArgs a);

}  // namespace coll
}  // namespace rsdp

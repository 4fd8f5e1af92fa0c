// Collectives over one NCCL communicator whose arrays are indexed by NCCL
// rank: the node stage when each rank of a node has its own GPU. NCCL has
// the equal-size, contiguous forms; the rest (per-rank sizes, separate
// buffers, rooted ops, all-to-all, the ring shift) are batches of
// send/recv or reduce calls in one NCCL group.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "transport/nccl/nccl_comm.h"

namespace rsdp {
namespace nccl_node {

void allgather(NcclComm& c, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               cudaStream_t s);
void reduce_scatter(NcclComm& c, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, cudaStream_t s);
void gather(NcclComm& c, const void* in, void* const* outs, size_t bytes, int root,
            cudaStream_t s);
void scatter(NcclComm& c, const void* const* ins, void* out, size_t bytes, int root,
             cudaStream_t s);
void alltoall(NcclComm& c, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, cudaStream_t s);
// order: the ring as NCCL ranks (primitives/ring_shift.h for the contract).
void ring_shift(NcclComm& c, const std::vector<int>& order, const void* send, void* recv,
                size_t count, DType dt, int direction, const void* add, cudaStream_t s);

}  // namespace nccl_node
}  // namespace rsdp

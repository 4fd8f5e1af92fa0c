// The CUDA implementation of DeviceCollectives: which transport serves which
// part of a group, and the composition of the hierarchical ops.
//
// Inside a node: an NCCL communicator of the node's ranks when each has its
// own GPU (NCCL refuses two ranks on one GPU), else the CUDA-IPC comm
// (transport/cuda_ipc), which also serves ranks sharing a GPU;
// RSDP_CUDA_INTRA forces either. Across nodes: NCCL on rails (the ranks of
// equal local rank), composed with the node stage: allreduce = node
// reduce-scatter, rail allreduce, node all-gather; broadcast and reduce go
// through the root's rail; all-gather and reduce-scatter of equal sizes run
// rail and node stages on packed scratch buffers. What has no device
// algorithm (uneven sizes across nodes, nodes of different sizes, a (dtype,
// op) NCCL lacks) runs the CPU algorithm on host copies, correct but slower.
#pragma once

#include <memory>

#include "algorithms/device_collectives.h"
#include "algorithms/group_comm.h"
#include "core/bootstrap.h"

namespace rsdp {

// Collective over the group (every rank calls it at its first CUDA op):
// publishes this rank's GPU, opens the transports.
std::unique_ptr<DeviceCollectives> make_cuda_collectives(GroupComm& g, Bootstrap& store,
                                                         int device);

}  // namespace rsdp

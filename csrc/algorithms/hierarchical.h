// Hierarchical collectives for groups that span nodes: a stage inside each
// node over shared memory (the flat algorithms of algorithms.h on the node's
// ShmComm), and a stage between nodes over the network, on rails (ranks with
// the same local rank) or between one representative per node (the flat
// network algorithms of net/net_algorithms.h). Only what must cross a node
// boundary crosses it, and each node's ranks share the network work.
//
// The caller has started the op with GroupComm::begin_net(); `step` is the
// op's network message counter. allreduce, allgather and reduce_scatter
// need nodes of equal size (select.cpp checks); the rooted ones and the
// barrier work on any topology.
#pragma once

#include <chrono>
#include <cstdint>

#include "algorithms/group_comm.h"

namespace rsdp {
namespace hier {

using Millis = std::chrono::milliseconds;

// bits != kNone: the network stage sends block-quantised values
// (net_compressed.cpp; g.compression.block elements per scale), the node
// stages stay exact.
void allreduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, Millis timeout,
               uint32_t& step, QuantBits bits = QuantBits::kNone);
// For small messages, on any topology: node allreduce, recursive doubling
// between the leaders, node broadcast.
void allreduce_leaders(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, Millis timeout,
                       uint32_t& step);
// outs and counts are indexed by group rank.
void allgather(GroupComm& g, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout, uint32_t& step, QuantBits bits = QuantBits::kNone);
// residual (compressed only; may be null): error feedback, float32, laid
// out as the input (per group rank r at residual[r], counts[r] elements).
void reduce_scatter(GroupComm& g, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout, uint32_t& step,
                    QuantBits bits = QuantBits::kNone, float* const* residual = nullptr);
void broadcast(GroupComm& g, void* buf, size_t count, DType dt, int root, Millis timeout,
               uint32_t& step);
void reduce(GroupComm& g, void* buf, size_t count, DType dt, RedOp op, int root, Millis timeout,
            uint32_t& step);
void barrier(GroupComm& g, Millis timeout, uint32_t& step);

}  // namespace hier
}  // namespace rsdp

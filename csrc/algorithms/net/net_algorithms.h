// Flat collective algorithms over the network transport (NetComm), for any
// subset of a group's ranks: the whole group (flat algorithms across nodes)
// or one rail / the node leaders (the inter-node stage of the hierarchical
// ones, algorithms/*_hierarchical.cpp).
//
// Conventions shared by every function here:
//  * `members` lists the participating group ranks in ring order; arrays
//    with one entry per member (outs, ins, counts) are indexed by position in
//    `members`, not by group rank. This rank must be a member.
//  * The caller has started the op with GroupComm::begin_net(); `step` is the
//    op's message counter: each call consumes the same steps on every member
//    and advances it.
//  * Counts are elements. For RedOp::kAvg the steps sum and the result is
//    divided by `divisor` once at the end (so hierarchical stages can divide
//    by the whole group's size).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/quantize.h"
#include "core/reduce_op.h"
#include "transport/ucx/net_comm.h"

namespace rsdp {
namespace net {

// Largest piece of one chunk moved per ring step: bounds temporary memory.
constexpr size_t kPieceBytes = 4u << 20;

// Ring: reduce-scatter then all-gather, each chunk reduced by one rank (so
// every rank ends bit-identical). Sends 2(K-1)/K of the buffer per rank.
void allreduce_ring(NetComm& c, const std::vector<int>& members, void* buf, size_t count,
                    DType dt, RedOp op, int divisor, uint32_t& step);

// Recursive doubling: ceil(log2 K) rounds (+2 when K is not a power of two),
// each sending the whole buffer. For small messages, where rounds cost more
// than bytes.
void allreduce_recursive_doubling(NetComm& c, const std::vector<int>& members, void* buf,
                                  size_t count, DType dt, RedOp op, int divisor, uint32_t& step);

// Recursive halving then doubling (Rabenseifner's; net_recursive_halving.cpp):
// 2 log2(K) rounds (+2 when K is not a power of two), sending 2(K-1)/K of the
// buffer per rank like the ring; each block is reduced by one member (so
// every member ends bit-identical). For mid-sized messages on many members.
void allreduce_rhd(NetComm& c, const std::vector<int>& members, void* buf, size_t count,
                   DType dt, RedOp op, int divisor, uint32_t& step);

// Ring all-gather with per-member sizes: K-1 steps, each forwarding the
// block received in the last one. outs[me] may alias in.
void allgather_ring(NetComm& c, const std::vector<int>& members, const void* in,
                    void* const* outs, const uint64_t* counts, DType dt, uint32_t& step);

// Ring reduce-scatter with per-member sizes: a partial sum for block b
// travels K-1 hops, picking up each member's contribution, and ends at b.
void reduce_scatter_ring(NetComm& c, const std::vector<int>& members, const void* const* ins,
                         void* out, const uint64_t* counts, DType dt, RedOp op, int divisor,
                         uint32_t& step);

// Binomial tree from members[root]: log2(K) rounds.
void broadcast_tree(NetComm& c, const std::vector<int>& members, void* buf, size_t bytes,
                    int root, uint32_t& step);

// Binomial tree into members[root]; only the root's buf is written (others'
// buf is read only).
void reduce_tree(NetComm& c, const std::vector<int>& members, void* buf, size_t count, DType dt,
                 RedOp op, int root, int divisor, uint32_t& step);

// Dissemination barrier: ceil(log2 K) rounds of empty messages.
void barrier(NetComm& c, const std::vector<int>& members, uint32_t& step);

// Root posts one receive (gather) or send (scatter) per member.
void gather_linear(NetComm& c, const std::vector<int>& members, const void* in,
                   void* const* outs, size_t bytes, int root, uint32_t& step);
void scatter_linear(NetComm& c, const std::vector<int>& members, const void* const* ins,
                    void* out, size_t bytes, int root, uint32_t& step);

// Every pair at once; sizes are checked by the transport (a size that does
// not match the peer's raises a mismatch).
void alltoall_pairwise(NetComm& c, const std::vector<int>& members, const void* const* sends,
                       const uint64_t* send_bytes, void* const* recvs, const uint64_t* recv_bytes,
                       uint32_t& step);

// ---- Compressed (net_compressed.cpp): block-quantised values on the wire,
// float32/bfloat16/float16 only, SUM/AVG for the reductions; every sum is
// taken after dequantising (in float32), never over codes.

// All-gather of quantised blocks: outs[i] = dequantize(quantize(block of
// member i)) on every member, this one's own block included, so all members
// end bit-identical.
void allgather_quantized(NetComm& c, const std::vector<int>& members, const void* in,
                         void* const* outs, const uint64_t* counts, DType dt, QuantBits bits,
                         size_t block, uint32_t& step);

// Reduce-scatter by one all-to-all of quantised blocks: each member sends
// every other member its (quantised) contribution to that member's block
// and sums what it receives, dequantised, with its own (exact) in member
// order. One quantisation per contribution: no error builds up along a ring.
// residuals (optional, one per member, float32, counts[i] elements; the
// own member's unused): error feedback. What quantising member i's block
// lost last time is added to it before quantising, and what is lost now is
// stored back, so nothing is lost for good, only delayed.
void reduce_scatter_quantized(NetComm& c, const std::vector<int>& members,
                              const void* const* ins, void* out, const uint64_t* counts, DType dt,
                              RedOp op, int divisor, QuantBits bits, size_t block,
                              uint32_t& step, float* const* residuals = nullptr);

// reduce_scatter_quantized (bits_rs) of the buffer's chunks, then
// allgather_quantized (bits_ag): every member ends with the same values.
void allreduce_quantized(NetComm& c, const std::vector<int>& members, void* buf, size_t count,
                         DType dt, RedOp op, int divisor, QuantBits bits_rs, QuantBits bits_ag,
                         size_t block, uint32_t& step);

// One ring_shift hop (algorithms/collectives.h) with quantised values
// between nodes: this rank sends to `send_to` (quantised when `send_remote`)
// and receives from `recv_from` (dequantised when `recv_remote`), then
// recv = received, or received + add (in float32). residual (float32, count
// elements, or null; used only when send_remote): error feedback of what
// this rank quantises. recv may alias send and add.
void ring_shift_quantized(NetComm& c, int send_to, int recv_from, bool send_remote,
                          bool recv_remote, const void* send, void* recv, size_t count, DType dt,
                          const void* add, QuantBits bits, size_t block, float* residual,
                          uint32_t& step);

// Position of group rank `rank` in `members`.
int position(const std::vector<int>& members, int rank);

}  // namespace net
}  // namespace rsdp

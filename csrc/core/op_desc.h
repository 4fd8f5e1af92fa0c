// What every rank must agree on for one collective. Each rank posts its
// descriptor with every step; a peer whose descriptor differs raises a
// mismatch error on every rank instead of reading past a buffer.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype.h"
#include "core/reduce_op.h"

namespace rsdp {

enum class OpKind : uint8_t {
  kBroadcast,
  kAllreduce,
  kReduce,
  kAllgather,
  kGather,
  kScatter,
  kReduceScatter,
  kAlltoall,
  kBarrier,
  kRingShift,
};
inline constexpr int kNumOpKinds = static_cast<int>(OpKind::kRingShift) + 1;

const char* op_name(OpKind k);

// Made with make() or the named makers below, never field by field, so that
// no op leaves out a field its peers compare; seq and on_device are the
// comm's to fill in.
// `aux` of the barrier that carries a shared-memory group's hand-off probe
// (transport/shm/adaptation.h): "probe" in ASCII. The probe takes the
// number of the user's collective it runs before, and errors name it so.
constexpr uint64_t kHandoffProbeTag = 0x70726f6265;

struct OpDesc {
  uint64_t seq = 0;    // per-group collective counter, filled in by the comm
  uint64_t count = 0;  // elements (op-specific meaning, identical on all ranks)
  uint64_t aux = 0;    // hash of per-rank size lists, or the algorithm chosen; else 0
  int32_t root = -1;
  OpKind kind = OpKind::kBarrier;
  DType dtype = DType::kUInt8;
  RedOp redop = RedOp::kSum;
  int8_t direction = 0;  // ring_shift: +1 forward, -1 backward
  // The op runs on device (GPU) buffers; the node's host comm carries both
  // kinds, so a rank with CPU tensors facing one with CUDA tensors raises.
  bool on_device = false;
  // Bits per value between nodes under the group's compression (0: exact);
  // ranks that disagree would read each other's payloads wrongly.
  uint8_t wire_bits = 0;

  bool operator==(const OpDesc& o) const {
    return seq == o.seq && count == o.count && aux == o.aux && root == o.root &&
           kind == o.kind && dtype == o.dtype && redop == o.redop && direction == o.direction &&
           on_device == o.on_device && wire_bits == o.wire_bits;
  }
  // e.g. "allreduce(float32 SUM, 1000 elements) as collective #5"
  std::string describe() const;

  // `root` for rooted ops (broadcast, reduce, gather, scatter), else -1;
  // `aux` as above.
  static OpDesc make(OpKind kind, DType dt, uint64_t count, RedOp redop = RedOp::kSum,
                     int root = -1, uint64_t aux = 0);
  // The ops with a size per rank (allgather, reduce_scatter): `count` is the
  // total of counts[0..n), `aux` the hash of the list.
  static OpDesc per_rank(OpKind kind, DType dt, const uint64_t* counts, int n,
                         RedOp redop = RedOp::kSum);
  // A ring shift by one position (direction >= 0: forward); `reduce`: the
  // shift-reduce, told apart by its redop (SUM, else MAX).
  static OpDesc ring_shift(DType dt, uint64_t count, int direction, bool reduce);
};

// Order-sensitive hash of a list of sizes (FNV-1a over the 64-bit values).
uint64_t hash_sizes(const uint64_t* sizes, int n);

}  // namespace rsdp

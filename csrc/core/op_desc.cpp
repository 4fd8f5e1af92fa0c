#include "core/op_desc.h"

#include <sstream>

namespace rsdp {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kBroadcast: return "broadcast";
    case OpKind::kAllreduce: return "allreduce";
    case OpKind::kReduce: return "reduce";
    case OpKind::kAllgather: return "allgather";
    case OpKind::kGather: return "gather";
    case OpKind::kScatter: return "scatter";
    case OpKind::kReduceScatter: return "reduce_scatter";
    case OpKind::kAlltoall: return "alltoall";
    case OpKind::kBarrier: return "barrier";
    case OpKind::kRingShift: return "ring_shift";
  }
  return "?";
}

std::string OpDesc::describe() const {
  std::ostringstream os;
  if (kind == OpKind::kBarrier && aux == kHandoffProbeTag) {
    os << "the hand-off probe before collective #" << seq;
    return os.str();
  }
  os << op_name(kind) << "(";
  if (kind != OpKind::kBarrier) {
    os << dtype_name(dtype);
    if (kind == OpKind::kAllreduce || kind == OpKind::kReduce || kind == OpKind::kReduceScatter)
      os << " " << redop_name(redop);
    if (kind == OpKind::kRingShift)
      os << (redop == RedOp::kSum ? " with reduce" : "") << (direction > 0 ? ", forward" : ", backward");
    os << ", " << count << " elements";
    if ((kind == OpKind::kAllreduce || kind == OpKind::kReduce) && aux)
      os << (aux == 1 ? ", one-shot" : ", reduce-scatter+all-gather");
    else if (aux)
      os << ", per-rank sizes #" << std::hex << (aux & 0xffff) << std::dec;
    if (root >= 0) os << ", root " << root;
    if (wire_bits) os << ", int" << int(wire_bits) << " across nodes";
  }
  os << ")" << (on_device ? " on GPU buffers" : "") << " as collective #" << seq;
  return os.str();
}

OpDesc OpDesc::make(OpKind kind, DType dt, uint64_t count, RedOp redop, int root, uint64_t aux) {
  OpDesc d;
  d.kind = kind;
  d.dtype = dt;
  d.count = count;
  d.redop = redop;
  d.root = root;
  d.aux = aux;
  return d;
}

OpDesc OpDesc::per_rank(OpKind kind, DType dt, const uint64_t* counts, int n, RedOp redop) {
  uint64_t total = 0;
  for (int p = 0; p < n; ++p) total += counts[p];
  return make(kind, dt, total, redop, -1, hash_sizes(counts, n));
}

OpDesc OpDesc::ring_shift(DType dt, uint64_t count, int direction, bool reduce) {
  OpDesc d = make(OpKind::kRingShift, dt, count, reduce ? RedOp::kSum : RedOp::kMax);
  d.direction = direction >= 0 ? 1 : -1;
  return d;
}

uint64_t hash_sizes(const uint64_t* sizes, int n) {
  uint64_t h = 1469598103934665603ull;
  for (int i = 0; i < n; ++i) {
    uint64_t v = sizes[i];
    for (int b = 0; b < 8; ++b) {
      h ^= (v >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h | 1;  // never 0, which means "no list"
}

}  // namespace rsdp

// Recursive-doubling allreduce over the network, for small messages.
//
// With K a power of two, in round r every member exchanges its whole buffer
// with the member whose position differs in bit r and reduces: log2(K)
// rounds, each one message per rank, against 2(K-1) for a ring. Other K:
// the first 2*rem members (rem = K - largest power of two) pair up first,
// the even one handing its buffer to the odd one and sitting out until the
// odd one hands the result back (MPICH's scheme).
//
// Every member combines the same partial results in the same tree, and the
// ops are commutative, so all end bit-identical.
#include <cstring>
#include <vector>

#include "algorithms/net/net_algorithms.h"
#include "core/reduce_kernels.h"

namespace rsdp {
namespace net {

void allreduce_recursive_doubling(NetComm& c, const std::vector<int>& members, void* buf,
                                  size_t count, DType dt, RedOp op, int divisor, uint32_t& step) {
  const int k = static_cast<int>(members.size()), i = position(members, c.rank());
  const bool avg = op == RedOp::kAvg;
  const RedOp step_op = avg ? RedOp::kSum : op;
  const size_t bytes = count * dtype_size(dt);
  std::vector<char> tmp(bytes);
  auto combine = [&] {
    const void* srcs[2] = {buf, tmp.data()};
    if (count) reduce_n(buf, srcs, 2, count, dt, step_op, 1);
  };
  int p2 = 1;
  while (p2 * 2 <= k) p2 *= 2;
  const int rem = k - p2;
  // Fold the extra members in: even positions below 2*rem sit out.
  int me = i >= 2 * rem ? i - rem : (i % 2 ? i / 2 : -1);
  if (i < 2 * rem) {
    if (i % 2 == 0) {
      c.isend(members[i + 1], buf, bytes, step);
    } else {
      c.irecv(members[i - 1], tmp.data(), bytes, step);
    }
    c.wait();
    if (i % 2) combine();
  }
  ++step;
  auto real = [&](int v) { return v < rem ? 2 * v + 1 : v + rem; };
  for (int mask = 1; mask < p2; mask <<= 1, ++step) {
    if (me < 0) continue;  // keeps `step` in line with the active members
    const int peer = members[real(me ^ mask)];
    c.isend(peer, buf, bytes, step);
    c.irecv(peer, tmp.data(), bytes, step);
    c.wait();
    combine();
  }
  if (avg && me >= 0 && count) {
    const void* srcs[1] = {buf};
    reduce_n(buf, srcs, 1, count, dt, RedOp::kAvg, divisor);
  }
  // Hand the result back to the members that sat out.
  if (i < 2 * rem) {
    if (i % 2)
      c.isend(members[i - 1], buf, bytes, step);
    else
      c.irecv(members[i + 1], buf, bytes, step);
    c.wait();
  }
  ++step;
}

}  // namespace net
}  // namespace rsdp

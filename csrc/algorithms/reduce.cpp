// Reduce to a root.
//
// Small messages: one step; every rank stages its buffer and the root reduces
// all n copies (rank order) into its buffer.
// Large messages: reduce_scatter_gather with a root (allreduce_rs_ag.cpp):
// rank p reduces chunk p of each segment into its staging half, then the root
// copies the n-1 reduced chunks of the others (its own needs no staging). The work
// is spread over all ranks instead of the root reading n*S bytes alone.
// Non-root buffers are never written.
#include <algorithm>
#include <vector>

#include "algorithms/algorithms.h"

namespace rsdp {
namespace algo {

void reduce(Staging& c, void* buf, size_t count, DType dt, RedOp op, int root,
            size_t oneshot_bytes, Millis timeout) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt);
  const bool oneshot = count * es <= std::min(oneshot_bytes, c.half_bytes());
  // A per-rank setting: part of what ranks must agree on.
  c.begin(OpDesc::make(OpKind::kReduce, dt, count, op, root, oneshot ? 1 : 2), timeout);
  if (n == 1) {  // the root's buffer already holds the result
    c.exchange();
    return;
  }
  if (oneshot) {
    char* data = static_cast<char*>(buf);
    c.copy(c.stage(), data, count * es);
    c.exchange(me == root ? 0 : count * es);
    if (me == root) {
      std::vector<const void*> srcs(n);
      for (int p = 0; p < n; ++p) srcs[p] = c.peer(p);
      c.reduce(data, srcs.data(), n, count, dt, op, n, nullptr);
    }
    return;
  }
  reduce_scatter_gather(c, buf, count, dt, op, root);
}

}  // namespace algo
}  // namespace rsdp

// One-shot allreduce, for small messages.
//
// One step: every rank stages its whole buffer, then every rank reduces all n
// staged copies (in rank order 0..n-1, so all results are bit-identical)
// straight from the peers' halves into its own buffer. Latency is a single
// exchange; each rank reads n*S bytes, so it only pays off while S is small.
#include <vector>

#include "algorithms/algorithms.h"

namespace rsdp {
namespace algo {

void allreduce_oneshot(Staging& c, void* buf, size_t count, DType dt, RedOp op) {
  const int n = c.size();
  const size_t bytes = count * dtype_size(dt);
  c.copy(c.stage(), buf, bytes);
  c.exchange(bytes);
  std::vector<const void*> srcs(n);
  for (int p = 0; p < n; ++p) srcs[p] = c.peer(p);
  c.reduce(buf, srcs.data(), n, count, dt, op, n, nullptr);
}

void allreduce(Staging& c, void* buf, size_t count, DType dt, RedOp op, size_t oneshot_bytes,
               Millis timeout) {
  const size_t bytes = count * dtype_size(dt);
  const bool oneshot = bytes <= oneshot_bytes && bytes <= c.half_bytes();
  // The choice depends on a per-rank setting, so it is part of what ranks must agree on.
  c.begin(OpDesc::make(OpKind::kAllreduce, dt, count, op, -1, oneshot ? 1 : 2), timeout);
  if (c.size() == 1) {  // every op over one rank is the identity
    c.exchange();
    return;
  }
  if (ShmComm* shm = c.shared_memory(); shm && direct_allreduce(*shm, buf, count, dt, op)) return;
  if (oneshot)
    allreduce_oneshot(c, buf, count, dt, op);
  else
    allreduce_rs_ag(c, buf, count, dt, op);
}

}  // namespace algo
}  // namespace rsdp

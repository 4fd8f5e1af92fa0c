// Reduce to a root.
//
// Small messages: one step; every rank stages its buffer and the root reduces
// all n copies (rank order) into its buffer.
// Large messages: the reduce-scatter half of allreduce_rs_ag (rank p reduces
// chunk p of each segment into its staging half), then the root copies the
// n-1 reduced chunks of the others (its own chunk needs no staging). The work
// is spread over all ranks instead of the root reading n*S bytes alone.
// Non-root buffers are never written.
#include <algorithm>
#include <vector>

#include "algorithms/algorithms.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {

void reduce(Staging& c, void* buf, size_t count, DType dt, RedOp op, int root,
            size_t oneshot_bytes, Millis timeout) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt);
  const bool oneshot = count * es <= std::min(oneshot_bytes, c.half_bytes());
  // A per-rank setting: part of what ranks must agree on.
  c.begin(OpDesc::make(OpKind::kReduce, dt, count, op, root, oneshot ? 1 : 2), timeout);
  char* data = static_cast<char*>(buf);
  std::vector<const void*> srcs(n);

  if (n == 1) {  // the root's buffer already holds the result
    c.exchange();
    return;
  }
  if (oneshot) {
    c.copy(c.stage(), data, count * es);
    c.exchange(me == root ? 0 : count * es);
    if (me == root) {
      for (int p = 0; p < n; ++p) srcs[p] = c.peer(p);
      c.reduce(data, srcs.data(), n, count, dt, op, n, nullptr);
    }
    return;
  }

  const size_t sub = slot_elems(c.half_bytes(), n, es);
  size_t base = 0;
  do {
    const size_t seg = clip(count, base, sub * n);
    const size_t chunk = chunk_elems(seg, n, sub, es);
    auto len = [&](int p) { return clip(seg, p * chunk, chunk); };
    auto at = [&](int p) { return data + (base + p * chunk) * es; };

    char* st = c.stage();
    for (int p = 0; p < n; ++p)
      if (p != me) c.copy(st + p * sub * es, at(p), len(p) * es);
    c.exchange((seg - len(me)) * es);

    for (int q = 0; q < n; ++q) srcs[q] = q == me ? at(me) : c.peer(q) + me * sub * es;
    // The next half's own slot: staged for the root by the others, scratch
    // for the root (whose result aliases its own source at(me)).
    char* mine = c.stage() + me * sub * es;
    void* dst = me == root ? static_cast<void*>(at(me)) : mine;
    c.reduce(dst, srcs.data(), n, len(me), dt, op, n, mine);
    c.exchange(me == root ? 0 : len(me) * es);

    if (me == root)
      for (int p = 0; p < n; ++p)
        if (p != me) c.copy(at(p), c.peer(p) + p * sub * es, len(p) * es);
    base += seg;
  } while (base < count);
}

}  // namespace algo
}  // namespace rsdp

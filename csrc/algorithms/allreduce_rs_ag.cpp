// Allreduce as reduce-scatter + all-gather through the staging halves, for
// large messages.
//
// The buffer is cut into segments of n slots (a slot is half/n bytes); in a
// segment, chunk p is the part rank p reduces. Per segment:
//   step A  every rank stages the chunks of the others (its chunk stays put);
//   reduce  rank p reduces chunk p from its own buffer and the n-1 staged
//           copies into its slot of the next half, and copies the result home;
//   step B  after the exchange every rank copies the other n-1 reduced chunks.
// Each rank moves (n-1)/n*S in, reduces S/n, moves (n-1)/n*S out: the same
// bytes as a ring, with 2 synchronisations per segment instead of 2(n-1). On
// the host the staging halves are small enough to stay in the shared L3
// cache, so main memory sees roughly one read and one write of the buffer.
#include <vector>

#include "algorithms/algorithms.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {

void reduce_scatter_gather(Staging& c, void* buf, size_t count, DType dt, RedOp op, int root) {
  const int n = c.size(), me = c.rank();
  const bool every = root < 0, gets = every || me == root;
  const size_t es = dtype_size(dt);
  const size_t sub = slot_elems(c.half_bytes(), n, es);
  char* data = static_cast<char*>(buf);
  std::vector<const void*> srcs(n);
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
    char* mine = c.stage() + me * sub * es;  // this rank's slot of the next half
    if (every)  // the result goes home and to the half
      c.reduce_and_stage(at(me), mine, srcs.data(), n, len(me), dt, op, n);
    else  // staged for the root by the others; scratch for the root, whose result aliases at(me)
      c.reduce(me == root ? static_cast<void*>(at(me)) : mine, srcs.data(), n, len(me), dt, op,
               n, mine);
    c.exchange(me == root ? 0 : len(me) * es);

    if (gets)
      for (int p = 0; p < n; ++p)
        if (p != me) c.copy(at(p), c.peer(p) + p * sub * es, len(p) * es);
    base += seg;
  } while (base < count);
}

void allreduce_rs_ag(Staging& c, void* buf, size_t count, DType dt, RedOp op) {
  reduce_scatter_gather(c, buf, count, dt, op, -1);
}

}  // namespace algo
}  // namespace rsdp

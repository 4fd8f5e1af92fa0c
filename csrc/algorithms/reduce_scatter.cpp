// Reduce-scatter with per-rank sizes, through the staging halves.
//
// Every staging half is split into n slots. Per step each rank stages, in
// slot p, the next piece of its contribution to rank p (all p but itself);
// after the exchange rank p reduces slot p of every peer together with its own
// contribution, in rank order, straight into its output. Each rank writes
// (n-1)/n of its input once and reads n pieces of its result: one exchange per
// step, and no rank ever holds more than its own result. The op runs until
// the largest result is done (the size list's hash is in the descriptor, so
// ranks that disagree fail at the first step).
#include <algorithm>
#include <vector>

#include "algorithms/algorithms.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {

void reduce_scatter(Staging& c, const void* const* ins, void* out, const uint64_t* counts,
                    DType dt, RedOp op, Millis timeout) {
  const int n = c.size(), me = c.rank();
  c.begin(OpDesc::per_rank(OpKind::kReduceScatter, dt, counts, n, op), timeout);
  if (ShmComm* shm = c.shared_memory();
      shm && direct_reduce_scatter(*shm, ins, out, counts, dt, op))
    return;
  const size_t es = dtype_size(dt);
  const size_t sub = slot_elems(c.half_bytes(), n, es);
  size_t most = 0;
  for (int p = 0; p < n; ++p) most = std::max<size_t>(most, counts[p]);
  std::vector<const void*> srcs(n);
  auto piece = [&](int p, size_t off) { return static_cast<const char*>(ins[p]) + off * es; };
  char* result = static_cast<char*>(out);
  size_t off = 0;
  do {
    char* st = c.stage();
    size_t staged = 0;
    for (int p = 0; p < n; ++p)
      if (p != me) {
        const size_t len = clip(counts[p], off, sub) * es;
        c.copy(st + p * sub * es, piece(p, off), len);
        staged += len;
      }
    c.exchange(staged);
    for (int q = 0; q < n; ++q) srcs[q] = q == me ? piece(me, off) : c.peer(q) + me * sub * es;
    // Scratch for reductions in rounds when out aliases ins[me]: the own slot
    // of the next half, which no peer reads and the next step does not
    // stage into.
    c.reduce(result + off * es, srcs.data(), n, clip(counts[me], off, sub), dt, op, n,
             c.stage() + me * sub * es);
    off += sub;
  } while (off < most);
}

}  // namespace algo
}  // namespace rsdp

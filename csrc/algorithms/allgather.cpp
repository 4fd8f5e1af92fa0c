// All-gather (and gather) with per-rank sizes.
//
// Per step every rank stages up to `half` bytes of its own input; after the
// exchange each receiver copies every peer's piece to its place in the output
// (for gather only the root does). A rank whose input is used up stages
// nothing; the op runs until the largest input is done, a number every rank
// computes from the same size list (the list's hash is in the descriptor, so
// ranks that disagree about it fail at the first step instead).
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {
namespace {

void gather_steps(ShmComm& c, const void* in, void* const* outs, const uint64_t* counts,
                  DType dt, bool receive) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt), seg = c.half_bytes();
  const char* src = static_cast<const char*>(in);
  size_t most = 0;
  for (int p = 0; p < n; ++p) most = std::max<size_t>(most, counts[p] * es);
  if (receive && outs[me] != in && counts[me]) std::memcpy(outs[me], in, counts[me] * es);
  size_t off = 0;
  do {
    const size_t mine = clip(counts[me] * es, off, seg);
    std::memcpy(c.stage(), src + off, mine);
    c.exchange(mine);
    if (receive)
      for (int p = 0; p < n; ++p)
        if (p != me)
          std::memcpy(static_cast<char*>(outs[p]) + off, c.peer(p), clip(counts[p] * es, off, seg));
    off += seg;
  } while (off < most);
}

}  // namespace

void allgather(ShmComm& c, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout) {
  c.begin(OpDesc::per_rank(OpKind::kAllgather, dt, counts, c.size()), timeout);
  if (direct_allgather(c, in, outs, counts, dt)) return;
  gather_steps(c, in, outs, counts, dt, true);
}

void gather(ShmComm& c, const void* in, void* const* outs, size_t count, DType dt, int root,
            Millis timeout) {
  c.begin(OpDesc::make(OpKind::kGather, dt, count, RedOp::kSum, root), timeout);
  std::vector<uint64_t> counts(c.size(), count);
  gather_steps(c, in, outs, counts.data(), dt, c.rank() == root);
}

}  // namespace algo
}  // namespace rsdp

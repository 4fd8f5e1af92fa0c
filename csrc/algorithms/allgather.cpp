// All-gather (and gather) with per-rank sizes.
//
// Per step every rank stages up to `half` bytes of its own input; after the
// exchange each receiver copies every peer's piece to its place in the output
// (for gather only the root receives, and the root stages nothing). A rank
// whose input is used up stages nothing; the op runs until the largest input
// is done, a number every rank computes from the same size list (the list's
// hash is in the descriptor, so ranks that disagree about it fail at the
// first step instead). Every op takes at least one step, so even empty ones
// check descriptors.
#include <algorithm>
#include <vector>

#include "algorithms/algorithms.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {
namespace {

// stage_own: whether anyone reads this rank's pieces. receive: whether this
// rank collects the others' pieces.
void gather_steps(Staging& c, const void* in, void* const* outs, const uint64_t* counts,
                  DType dt, bool stage_own, bool receive) {
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt), seg = c.half_bytes();
  const char* src = static_cast<const char*>(in);
  size_t most = 0;
  for (int p = 0; p < n; ++p) most = std::max<size_t>(most, counts[p] * es);
  if (receive) c.copy(outs[me], in, counts[me] * es);
  size_t off = 0;
  do {
    const size_t mine = stage_own && n > 1 ? clip(counts[me] * es, off, seg) : 0;
    c.copy(c.stage(), src + off, mine);
    c.exchange(mine);
    if (receive)
      for (int p = 0; p < n; ++p)
        if (p != me)
          c.copy(static_cast<char*>(outs[p]) + off, c.peer(p), clip(counts[p] * es, off, seg));
    off += seg;
  } while (off < most);
}

}  // namespace

void allgather(Staging& c, const void* in, void* const* outs, const uint64_t* counts, DType dt,
               Millis timeout) {
  c.begin(OpDesc::per_rank(OpKind::kAllgather, dt, counts, c.size()), timeout);
  if (ShmComm* shm = c.shared_memory(); shm && direct_allgather(*shm, in, outs, counts, dt))
    return;
  gather_steps(c, in, outs, counts, dt, true, true);
}

void gather(Staging& c, const void* in, void* const* outs, size_t count, DType dt, int root,
            Millis timeout) {
  c.begin(OpDesc::make(OpKind::kGather, dt, count, RedOp::kSum, root), timeout);
  std::vector<uint64_t> counts(c.size(), count);
  const bool is_root = c.rank() == root;
  gather_steps(c, in, outs, counts.data(), dt, !is_root, is_root);
}

}  // namespace algo
}  // namespace rsdp

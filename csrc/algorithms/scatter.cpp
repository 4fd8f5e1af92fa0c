// Scatter from a root.
//
// The root's staging half is split into n slots; per step the root stages the
// next slot-sized piece of every other rank's input, and rank p copies slot p
// out. The root writes (n-1)/n of its input once; each rank reads its piece.
#include "algorithms/algorithms.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {

void scatter(Staging& c, const void* const* ins, void* out, size_t count, DType dt, int root,
             Millis timeout) {
  c.begin(OpDesc::make(OpKind::kScatter, dt, count, RedOp::kSum, root), timeout);
  const int n = c.size(), me = c.rank();
  const size_t es = dtype_size(dt), bytes = count * es;
  const size_t slot = slot_elems(c.half_bytes(), n, 1);  // bytes
  char* dst = static_cast<char*>(out);
  if (me == root) c.copy(dst, ins[me], bytes);
  size_t off = 0;
  do {
    const size_t len = clip(bytes, off, slot);
    if (me == root) {
      char* st = c.stage();
      for (int p = 0; p < n; ++p)
        if (p != me) c.copy(st + p * slot, static_cast<const char*>(ins[p]) + off, len);
    }
    c.exchange(me == root ? len * (n - 1) : 0);
    if (me != root) c.copy(dst + off, c.peer(root) + me * slot, len);
    off += slot;
  } while (off < bytes);
}

}  // namespace algo
}  // namespace rsdp

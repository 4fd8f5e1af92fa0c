// Broadcast through the root's staging half, and the barrier.
//
// Per step the root copies a segment of the buffer into its half; after the
// exchange every other rank copies it out. Bytes moved: the root writes S
// once, each of the n-1 others reads S. The halves alternate, so the root
// fills segment k+1 while the others still read segment k.
#include <algorithm>

#include "algorithms/algorithms.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {
namespace {

// A broadcast in one piece is two copies in series (the root's in, the
// others' out); in segments they overlap and it tends to one copy plus one
// segment. Eight segments, none below 8 KiB, from 64 KiB up: below that the
// extra exchanges cost more than the overlap saves. Only while every rank
// has a core: time-sliced ranks pay a switch of the scheduler per exchange,
// which costs more than the overlap gains.
size_t segment_bytes(const Staging& c, size_t bytes) {
  constexpr size_t kMinPipelined = 64u << 10, kSegments = 8, kMinSegment = 8u << 10;
  if (!c.rank_per_core() || bytes < kMinPipelined) return c.half_bytes();
  // Whole 64-byte lines: a multiple of every element size.
  const size_t seg = (bytes / kSegments + 63) / 64 * 64;
  return std::min(c.half_bytes(), std::max(kMinSegment, seg));
}

}  // namespace

void broadcast(Staging& c, void* buf, size_t count, DType dt, int root, Millis timeout) {
  c.begin(OpDesc::make(OpKind::kBroadcast, dt, count, RedOp::kSum, root), timeout);
  char* p = static_cast<char*>(buf);
  const size_t bytes = count * dtype_size(dt);
  if (ShmComm* shm = c.shared_memory(); shm && direct_broadcast(*shm, buf, bytes, root)) return;
  const bool is_root = c.rank() == root, others = c.size() > 1;
  const size_t seg = segment_bytes(c, bytes);
  size_t off = 0;
  do {  // at least one step, so even empty broadcasts check descriptors
    const size_t len = clip(bytes, off, seg);
    if (is_root && others) c.copy(c.stage(), p + off, len);
    c.exchange(is_root ? len : 0);
    if (!is_root) c.copy(p + off, c.peer(root), len);
    off += seg;
  } while (off < bytes);
}

void barrier(Staging& c, Millis timeout) {
  c.begin(OpDesc::make(OpKind::kBarrier, DType::kUInt8, 0), timeout);
  c.exchange();
}

}  // namespace algo
}  // namespace rsdp

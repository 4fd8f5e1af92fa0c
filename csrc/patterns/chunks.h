// Index arithmetic shared by the algorithms: how a staging half is divided
// into per-rank slots, and which part of a segment is whose chunk. Pure
// functions, no I/O.
#pragma once

#include <algorithm>
#include <cstddef>

namespace rsdp {

// Elements of one rank's slot when a staging half of `half` bytes is split
// into `n` slots, each a multiple of 64 bytes (cache line) and of the element.
inline size_t slot_elems(size_t half, int n, size_t esize) {
  size_t bytes = half / static_cast<size_t>(n) / 64 * 64;
  return bytes / esize;
}

// Elements of each rank's chunk in a segment of `seg` elements cut into n
// chunks of at most a slot (`slot` elements). Slot-sized chunks leave a
// segment shorter than n slots (the last one, or a whole small message) to
// the first ranks: a message up to a slot is reduced by rank 0 alone. With
// `balanced`, such a segment is cut into n near-equal chunks of whole 64-byte
// lines instead, so every rank reduces its share: the faster way while each
// rank has a core (2 ranks: 256 KiB all-reduce 45 -> 33 us); ranks that take
// turns on fewer cores are faster with one rank doing the work (4 ranks on 2
// cores, 16-64 KiB: 130-150 us balanced against 110-120 one-rank).
inline size_t chunk_elems(size_t seg, int n, size_t slot, size_t esize, bool balanced) {
  if (!balanced) return slot;
  const size_t line = std::max<size_t>(1, 64 / esize);
  const size_t share = (seg + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
  return std::min(slot, (share + line - 1) / line * line);
}

// Length of [off, off + step) clipped to [0, total).
inline size_t clip(size_t total, size_t off, size_t step) {
  return off >= total ? 0 : std::min(step, total - off);
}

}  // namespace rsdp

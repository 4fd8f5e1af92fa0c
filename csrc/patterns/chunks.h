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
// chunks of at most a slot (`slot` elements). Slot-sized chunks would leave a
// segment shorter than n slots (the last one, or a whole small message) to
// the first ranks - a message up to a slot reduced by rank 0 alone - so such
// a segment is cut into n near-equal chunks of whole 64-byte lines, and every
// rank reduces its share: the work of a short segment is spread over every
// rank instead of waiting on the first ones.
inline size_t chunk_elems(size_t seg, int n, size_t slot, size_t esize) {
  const size_t line = std::max<size_t>(1, 64 / esize);
  const size_t share = (seg + static_cast<size_t>(n) - 1) / static_cast<size_t>(n);
  return std::min(slot, (share + line - 1) / line * line);
}

// Length of [off, off + step) clipped to [0, total).
inline size_t clip(size_t total, size_t off, size_t step) {
  return off >= total ? 0 : std::min(step, total - off);
}

}  // namespace rsdp

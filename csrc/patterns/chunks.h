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

// Length of [off, off + step) clipped to [0, total).
inline size_t clip(size_t total, size_t off, size_t step) {
  return off >= total ? 0 : std::min(step, total - off);
}

}  // namespace rsdp

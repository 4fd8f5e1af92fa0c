// All-to-all with per-pair sizes, through the staging halves.
//
// Step 0 exchanges every rank's send and receive byte counts through the
// host side channel (the host must check them, and on a device it cannot
// read staged bytes), so each rank sees the whole n x n matrix and checks
// that what a sends to b is what b expects from a (all ranks see the same
// matrix, so all raise together, before any data moves). Then, per step,
// rank a stages in slot b the next slot-sized piece of its data for b, and
// every rank b copies slot b from each peer. Steps run until the largest
// pair is done.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/algorithms.h"
#include "core/error.h"
#include "patterns/chunks.h"

namespace rsdp {
namespace algo {

void alltoall(Staging& c, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, DType dt, Millis timeout) {
  const int n = c.size(), me = c.rank();
  const size_t meta_bytes = 2 * static_cast<size_t>(n) * sizeof(uint64_t);
  RSDP_CHECK_KIND(ErrorKind::kSystem, meta_bytes <= c.host_half_bytes(), c.group().me(),
                  ": alltoall: the host staging half (", c.host_half_bytes(),
                  " bytes) cannot hold the size matrix of ", n, " ranks");
  // Sizes differ per pair: they are checked against the peers' below.
  c.begin(OpDesc::make(OpKind::kAlltoall, dt, 0), timeout);

  auto* meta = reinterpret_cast<uint64_t*>(c.host_stage());
  std::copy(send_bytes, send_bytes + n, meta);
  std::copy(recv_bytes, recv_bytes + n, meta + n);
  c.exchange();
  uint64_t most = 0;
  for (int a = 0; a < n; ++a) {
    auto* ma = reinterpret_cast<const uint64_t*>(c.host_peer(a));
    for (int b = 0; b < n; ++b) {
      auto* mb = reinterpret_cast<const uint64_t*>(c.host_peer(b));
      RSDP_CHECK_KIND(ErrorKind::kMismatch, ma[b] == mb[n + a], c.group().me(),
                      ": alltoall size mismatch: ", c.group().who(a), " sends ", ma[b],
                      " bytes to ", c.group().who(b), ", which expects ", mb[n + a],
                      " bytes from it");
      most = std::max(most, ma[b]);
    }
  }

  c.copy(recvs[me], sends[me], send_bytes[me]);
  const size_t slot = slot_elems(c.half_bytes(), n, 1);
  for (size_t off = 0; off < most; off += slot) {
    char* st = c.stage();
    size_t staged = 0;
    for (int p = 0; p < n; ++p)
      if (p != me) {
        const size_t len = clip(send_bytes[p], off, slot);
        c.copy(st + p * slot, static_cast<const char*>(sends[p]) + off, len);
        staged += len;
      }
    c.exchange(staged);
    for (int p = 0; p < n; ++p)
      if (p != me)
        c.copy(static_cast<char*>(recvs[p]) + off, c.peer(p) + me * slot,
               clip(recv_bytes[p], off, slot));
  }
}

}  // namespace algo
}  // namespace rsdp

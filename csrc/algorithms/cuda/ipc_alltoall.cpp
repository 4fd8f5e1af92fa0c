// All-to-all with per-pair sizes over CUDA IPC.
//
// The staging half is cut into n slots; per step rank a stages in slot b the
// next slot-sized piece of its data for b, and every rank b copies slot b out
// of each peer's half. Steps run until the largest pair is done.
//
// The sizes must be checked by the host, which cannot read device halves, so
// each rank's send and receive byte counts travel in the host side channel of
// the first step (IpcComm::host_stage). After it every rank sees the whole
// n x n matrix and checks that what a sends to b is what b expects from a;
// all ranks see the same matrix, so all raise together, and no received byte
// is copied before the check. The first step already carries data: what a
// rank stages depends only on its own send sizes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "algorithms/cuda/ipc_algorithms.h"
#include "algorithms/cuda/ipc_common.h"
#include "core/error.h"
#include "patterns/chunks.h"
#include "transport/cuda_ipc/device_scope.h"

namespace rsdp {
namespace ipc {

void alltoall(IpcComm& c, const void* const* sends, const uint64_t* send_bytes,
              void* const* recvs, const uint64_t* recv_bytes, DType dt, Millis timeout,
              cudaStream_t stream) {
  CudaDeviceScope scope(c.device());
  const int n = c.size(), me = c.rank();
  const size_t meta_bytes = 2 * static_cast<size_t>(n) * sizeof(uint64_t);
  RSDP_CHECK_KIND(ErrorKind::kSystem, meta_bytes <= c.host_half_bytes(), c.group().me(),
                  ": alltoall: the host staging half (", c.host_half_bytes(),
                  " bytes) cannot hold the size matrix of ", n, " ranks");
  // Sizes differ per pair: they are checked against the peers' below.
  c.begin(OpDesc::make(OpKind::kAlltoall, dt, 0), timeout, stream);

  auto* meta = reinterpret_cast<uint64_t*>(c.host_stage());
  std::copy(send_bytes, send_bytes + n, meta);
  std::copy(recv_bytes, recv_bytes + n, meta + n);

  const size_t slot = slot_elems(c.half_bytes(), n, 1);  // bytes
  uint64_t most = 0;
  size_t off = 0;
  do {
    char* st = c.stage();
    size_t staged = 0;
    for (int p = 0; p < n; ++p)
      if (p != me) {
        const size_t len = clip(send_bytes[p], off, slot);
        impl::copy(c, st + p * slot, static_cast<const char*>(sends[p]) + off, len);
        staged += len;
      }
    c.exchange(staged);
    if (off == 0) {
      // Copy the matrix out of the side channel: it is only valid until the
      // next exchange.
      std::vector<uint64_t> matrix(2 * static_cast<size_t>(n) * n);
      for (int a = 0; a < n; ++a)
        std::memcpy(&matrix[2 * static_cast<size_t>(n) * a], c.host_peer(a), meta_bytes);
      auto sent = [&](int a, int b) { return matrix[2 * static_cast<size_t>(n) * a + b]; };
      auto expected = [&](int b, int a) { return matrix[2 * static_cast<size_t>(n) * b + n + a]; };
      for (int a = 0; a < n; ++a)
        for (int b = 0; b < n; ++b) {
          RSDP_CHECK_KIND(ErrorKind::kMismatch, sent(a, b) == expected(b, a), c.group().me(),
                          ": alltoall size mismatch: ", c.group().who(a), " sends ", sent(a, b),
                          " bytes to ", c.group().who(b), ", which expects ", expected(b, a),
                          " bytes from it");
          most = std::max(most, sent(a, b));
        }
      if (recvs[me] != sends[me]) impl::copy(c, recvs[me], sends[me], send_bytes[me]);
    }
    for (int p = 0; p < n; ++p)
      if (p != me)
        impl::copy(c, static_cast<char*>(recvs[p]) + off, c.peer(p) + me * slot,
                   clip(recv_bytes[p], off, slot));
    off += slot;
  } while (off < most);
}

}  // namespace ipc
}  // namespace rsdp

// Picks a collective's algorithm (a row of algorithm_table.h) from (op,
// bytes, where it runs, host or device memory) and the RSDP_ALGO_<OP>
// overrides, for host and device buffers alike. A forced name that does not
// apply (a single-node algorithm on several nodes, a hierarchical one on
// nodes of unequal size, a host-only row for device buffers; the row's
// `where`, `memory` and `applies`) falls back to the automatic choice, as UCC
// does for unsupported algorithms.
#pragma once

#include <cstddef>

#include "algorithms/algorithm_table.h"
#include "core/op_desc.h"
#include "core/options.h"
#include "core/topology.h"

namespace rsdp {

Algo select_algo(const Choice& c);

// Checks the forced names of `opts` (RSDP_ALGO_<OP>) against the table when the backend
// starts: a name the op does not take raises, naming the variable and the choices; an op
// with no choice of algorithm ignores its variable (the entry is cleared).
void check_forced_algorithms(Options& opts);

// The one-shot bounds: the largest messages for which one exchange in which every rank reduces
// every copy is chosen over two exchanges in which each reduces its share (select.cpp,
// [Note: one-shot bound]). They follow from what each costs, not from the user's job, so they
// are constants of the selection; RSDP_ALGO_ALLREDUCE forces either all-reduce algorithm.
//   kOneshotBytes: reduce on host memory; across nodes the all-reduce's leaders' path (and
//     its node stage).
//   kNodeAllreduceOneshotBytes: a single-node all-reduce on host memory.
//   kDeviceOneshotBytes: reduce and all-reduce on device buffers (CUDA IPC, the emulated
//     device): reading every peer's copy costs a GPU less than a second exchange.
constexpr size_t kOneshotBytes = 32u << 10;
constexpr size_t kNodeAllreduceOneshotBytes = 8u << 10;
constexpr size_t kDeviceOneshotBytes = 256u << 10;

// [Note: rails' all-reduce model]
// The network all-reduce between M nodes (on each rail of the hierarchical
// one, or over all ranks at one rank per node) is a ring or recursive
// halving + doubling (rhd), chosen by an alpha-beta model of one node's link:
// a message costs kNetMessageSeconds, a byte 1/kNetLinkBytesPerSecond, and a
// node's B bytes (summed over its rails, which share the link) cross it as
//   ring: 2(M-1) messages,            2(M-1)/M * B bytes per direction;
//   rhd:  2 log2(P) (+2) messages,    2(P-1)/P * B (+2B) bytes, P the largest
//         power of two <= M; the +2 and +2B fold the M-P extra nodes in.
// So at M a power of two rhd wins at any size; otherwise rhd wins below a
// size that grows with M (none at M = 3: the fold costs as many messages as
// the ring saves). Only the product alpha*W matters: the crossover in bytes
// is a multiple of it. Pipeline segments repeat both latency terms; the
// model ignores them, which leans towards the ring.
//   kNetMessageSeconds: one message across a data-centre network, end to end
//     through the software stack (a few microseconds of wire and switch, the
//     rest the transport's send and completion).
//   kNetLinkBytesPerSecond: one node's network link, 100 Gbit/s.
constexpr double kNetMessageSeconds = 10e-6;
constexpr double kNetLinkBytesPerSecond = 100e9 / 8;

constexpr int floor_pow2(int m) {
  int p = 1;
  while (p * 2 <= m) p *= 2;
  return p;
}
constexpr int log2_exact(int p) { return p > 1 ? 1 + log2_exact(p / 2) : 0; }

// Modelled seconds of the ring and of rhd for `bytes` per node across m nodes.
constexpr double ring_allreduce_seconds(double bytes, int m) {
  return 2.0 * (m - 1) * kNetMessageSeconds + 2.0 * (m - 1) / m * bytes / kNetLinkBytesPerSecond;
}
constexpr double rhd_allreduce_seconds(double bytes, int m) {
  const int p = floor_pow2(m), fold = m > p ? 2 : 0;
  return (2.0 * log2_exact(p) + fold) * kNetMessageSeconds +
         (2.0 * (p - 1) / p + fold) * bytes / kNetLinkBytesPerSecond;
}

// Whether the network all-reduce of `bytes` per node across m nodes runs rhd
// rather than the ring. At m <= 2 the two send the same messages: the ring.
constexpr bool net_allreduce_prefers_rhd(size_t bytes, int m) {
  return m > 2 && rhd_allreduce_seconds(static_cast<double>(bytes), m) <
                      ring_allreduce_seconds(static_cast<double>(bytes), m);
}

// The one-shot bound of reduce for host or device buffers.
constexpr size_t oneshot_bytes(bool device) {
  return device ? kDeviceOneshotBytes : kOneshotBytes;
}

// The largest single-node all-reduce that runs one-shot rather than reduce-scatter +
// all-gather, for host or device buffers.
constexpr size_t allreduce_oneshot_bytes(bool device) {
  return device ? kDeviceOneshotBytes : kNodeAllreduceOneshotBytes;
}

}  // namespace rsdp

// Tunables read from RSDP_* environment variables once per process group.
// Every variable is documented in docs/configuration.md.
#pragma once

#include <array>
#include <cstddef>
#include <string>

#include "core/op_desc.h"

namespace rsdp {

struct Options {
  // Staging bytes per rank per group (two halves, used alternately).
  size_t shm_bytes = 2u << 20;
  // Reduce and allreduce messages up to this size use the one-shot algorithm
  // (across nodes, all-reduce's leaders' path). Unset, a single-node
  // all-reduce has a bound of its own (algorithms/select.h).
  size_t oneshot_bytes = 32u << 10;
  // RSDP_ONESHOT_BYTES was given: every op uses it as it is.
  bool oneshot_set = false;
  // Ring-buffer bytes per ordered pair of ranks for send/recv (0 = automatic).
  size_t p2p_bytes = 0;
  // Communication memory per rank per single-node group, handed out by
  // torch's allocateTensor (FSDP2 asks for it): collectives whose buffers lie
  // there copy once, straight from the peer's buffer. Virtual until used;
  // 0 turns it off.
  size_t pool_bytes = 4ull << 30;
  // How long a waiter spins before sleeping on a futex (microseconds).
  int spin_us = 50;
  // How copies into the staging halves store: "cached", "streaming"
  // (non-temporal, core/stream_copy.h) or "auto" (streaming when the group's
  // ranks do not share a cache, transport/shm/handoff_probe.h).
  std::string shm_stores = "auto";
  // How often (milliseconds) a node's group measures its hand-off again while
  // collectives run (transport/shm/handoff_probe.h); 0: only when it is made.
  // Group rank 0's setting decides for the node's group.
  int reprobe_ms = 1000;
  // With more ranks than CPUs, how often (milliseconds) a rank looks whether
  // the kernel stacked the node's ranks and moves itself off a crowded CPU
  // (transport/shm/rank_spread.h); 0: never.
  int spread_ms = 2;
  // Print init and per-op traces to stderr.
  bool debug = false;
  // Explicit node identity (empty: host name + boot id).
  std::string node_id;
  // Forced algorithms by op, from RSDP_ALGO_<OP> (empty when unset or
  // "auto"); the names each op accepts are in algorithms/algorithms.def, and
  // check_forced_algorithms (algorithms/select.h) refuses any other.
  std::array<std::string, kNumOpKinds> algo;
  const std::string& forced_algo(OpKind op) const { return algo[static_cast<size_t>(op)]; }

  // CUDA ops: device staging bytes per rank for the CUDA-IPC path (two
  // halves), and which transport serves ranks of one node: "auto" (NCCL when
  // every rank of the node has its own GPU, else CUDA IPC), "ipc" or "nccl".
  size_t cuda_staging_bytes = 64u << 20;
  std::string cuda_intra = "auto";
  // Device allreduce messages up to this size use the one-shot algorithm
  // (reading every peer's copy costs less on a GPU than a second exchange).
  size_t cuda_oneshot_bytes = 256u << 10;
  // Test fixture: collectives on CPU tensors of a single-node group run the
  // device path over the emulated device (transport/emu) instead of shared
  // memory, with this much random delay (microseconds) before each queued
  // operation of its stream. Off (-1) by default.
  int emulate_device_jitter_us = -1;
  bool emulate_device() const { return emulate_device_jitter_us >= 0; }
  // Test hook of the emulated device: the stream of group rank `stall_rank`
  // hangs at the op numbered `stall_seq` (a kernel that never ends), to
  // prove that a stuck stream ends in an error on every rank.
  int emulate_device_stall_rank = -1;
  uint64_t emulate_device_stall_seq = 0;
  // Test hook of the UCX transport (tests/backend/test_hostile_peer.py): this
  // rank's collective headers lie about one field (bytes, step, dtype, op,
  // bits or count) while the payload stays as it is, to prove that the honest
  // peer refuses them. Empty (off) unless RSDP_TEST_WIRE_LIE is set.
  std::string test_wire_lie;
  // Test hook of the shared-memory transport's adaptation
  // (RSDP_TEST_PLACEMENT; tests/backend/test_handoff_reprobe.py,
  // test_rank_spread.py): a placement the test states instead of the one the
  // host happens to give, so that what the group does about it is checked
  // without depending on the host's scheduler or CPU model.
  //   on_cpu: this rank reports running on that CPU (to the other ranks
  //     spreading the node's ranks) until it first moves; -1: off.
  //   slow_from: group rank 0 times its collectives as 1 ns a byte before
  //     collective #slow_from and 4 ns a byte from it on (for the early
  //     probe), instead of by its clock; 0: off.
  int test_on_cpu = -1;
  uint64_t test_slow_from = 0;

  static Options from_env();
};

// The variable that forces op's algorithm: "RSDP_ALGO_" + its name in capitals.
std::string algo_env_var(OpKind op);

}  // namespace rsdp

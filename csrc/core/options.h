// The user's settings, read from RSDP_* environment variables once per
// process group, and the project's test hooks (core/test_hooks.h). Every
// variable is documented in docs/configuration.md; the one-shot thresholds
// and other tuning that follows from measurements are constants of the
// algorithm selection (algorithms/select.h), not settings.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/op_desc.h"
#include "core/test_hooks.h"

namespace rsdp {

// How much of shared memory's adaptation to the placement runs
// (transport/shm/adaptation.h). Stored in shared memory: values fixed.
enum class AdaptMode : int32_t { kOff = 1, kOnce = 2, kContinuous = 3 };
const char* adapt_mode_name(AdaptMode m);

struct Options {
  // Staging bytes per rank per group (two halves, used alternately).
  size_t shm_bytes = 2u << 20;
  // Ring-buffer bytes per ordered pair of ranks for send/recv (0 = automatic).
  size_t p2p_bytes = 0;
  // Communication memory per rank per single-node group, handed out by
  // torch's allocateTensor (FSDP2 asks for it): collectives whose buffers lie
  // there copy once, straight from the peer's buffer. Virtual until used;
  // 0 turns it off.
  size_t pool_bytes = 4ull << 30;
  // How long a waiter spins before sleeping on a futex (microseconds).
  int spin_us = 50;
  // How much of shared memory's adaptation to the placement runs
  // (RSDP_SHM_ADAPT, transport/shm/adaptation.h): off, once (a probe when the
  // group is made) or continuous (and again while collectives run). Group
  // rank 0's setting decides for the node's group.
  AdaptMode shm_adapt = AdaptMode::kContinuous;
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
  // The project's test hooks (RSDP_TEST_*; off unless a test sets them).
  TestHooks test;

  static Options from_env();
};

// The variable that forces op's algorithm: "RSDP_ALGO_" + its name in capitals.
std::string algo_env_var(OpKind op);

}  // namespace rsdp

// Hooks for the project's own tests, not for users: faults and fixtures that
// let a test make the backend do what no healthy group does, so that what it
// does about it can be checked. Every C++ read of a hook's environment
// variable is here (TestHooks::from_env, once per process group, with the
// user's settings in Options::from_env), every one is named RSDP_TEST_*, and
// docs/configuration.md lists them apart from the user's settings ("For the
// project's own tests and scripts"). Unset, each hook is off and the backend
// behaves as if it did not exist.
#pragma once

#include <cstdint>
#include <string>

namespace rsdp {

struct TestHooks {
  // RSDP_TEST_EMULATE_DEVICE (tests/cuda/test_emulated_device.py): "1", or
  // comma-separated "jitter=<us>" and "stall=<group rank>@<op number>".
  // Collectives on CPU tensors of a single-node group run the device path
  // over the emulated device (transport/emu) instead of shared memory, with
  // up to this much random delay (microseconds) before each queued operation
  // of its stream, so that the CUDA-IPC algorithms' stream ordering is
  // checked in CPU CI. Off (-1) by default.
  int emulate_device_jitter_us = -1;
  bool emulate_device() const { return emulate_device_jitter_us >= 0; }
  // The stream of group rank `stall_rank` hangs at the op numbered
  // `stall_seq` (a kernel that never ends), to prove that a stuck stream ends
  // in an error on every rank. -1: none.
  int emulate_device_stall_rank = -1;
  uint64_t emulate_device_stall_seq = 0;

  // RSDP_TEST_SHM_STORES (tests/backend/test_shm_stores.py,
  // test_shm_adaptation.py): "cached" or "streaming" forces this rank's
  // stores into the shared-memory staging halves whatever the hand-off probe
  // finds (transport/shm/adaptation.h), so both paths are checked on any
  // machine. Empty: the adaptation chooses.
  std::string shm_stores;

  // RSDP_TEST_WIRE_LIE (tests/backend/test_hostile_peer.py): this rank's UCX
  // collective headers lie about one field (bytes, step, dtype, op, bits or
  // count) while the payload stays as it is, to prove that the honest peer
  // refuses them (transport/ucx/wire_lie.h). Empty: off.
  std::string wire_lie;

  // Reads the RSDP_TEST_* variables; a malformed value raises a ValueError
  // naming the variable, as a user setting's does.
  static TestHooks from_env();
};

}  // namespace rsdp

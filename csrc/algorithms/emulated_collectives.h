// The emulated device's DeviceCollectives (a test fixture, RSDP_TEST_EMULATE_DEVICE):
// the single-node algorithms over transport/emu's EmuComm, chosen by the
// same table and selection as CUDA IPC (coll::run_on_device), on CPU tensors.
//
// Unlike CUDA, the host waits for the emulated stream at the end of each op
// (bounded by the op's deadline): the backend's bodies read and write their
// tensors on the host around the collective, and torch has no stream for
// CPU tensors to order those accesses. Inside an op, and between the ranks'
// streams across ops, everything runs as asynchronously as on a GPU.
#pragma once

#include <memory>

#include "algorithms/device_collectives.h"
#include "algorithms/group_comm.h"
#include "core/bootstrap.h"

namespace rsdp {

// Collective over a single-node group (every rank calls it at its first op).
std::unique_ptr<DeviceCollectives> make_emulated_collectives(GroupComm& g, Bootstrap& store);

}  // namespace rsdp

// BackendRSDP's communication memory: torch's allocateTensor served from this
// rank's pool of the group's shared segment (transport/shm/shm_pool.h).
//
// Only single-node groups have a pool; elsewhere, for non-CPU tensors, or
// when the pool is full, allocateTensor returns ordinary memory, which every
// collective accepts too (at one more copy). A tensor keeps its pool, and so
// the mapping, alive: it may outlive the process group.
#include "algorithms/group_comm.h"
#include "backend/backend_rsdp.h"

namespace rsdp {
namespace {

std::shared_ptr<ShmPool> pool_of(const std::unique_ptr<GroupComm>& comm) {
  if (!comm || comm->multi_node()) return nullptr;
  return comm->shm->pool();
}

}  // namespace

bool BackendRSDP::supportsTensorAlloc(c10::DeviceIndex device_index) {
  // torch passes the device's index: -1 for the CPU, a GPU's index for CUDA,
  // whose buffers stay with the CUDA caching allocator.
  return device_index < 0 && !shut_down_ && pool_of(comm_) != nullptr;
}

at::Tensor BackendRSDP::allocateTensor(long size, at::TensorOptions options) {
  return translate_errors([&] {
    RSDP_CHECK(size >= 0, "rsdp rank ", global_rank_, ": allocate_tensor: size ", size,
               " is negative");
    const auto dev = options.device_opt().value_or(c10::Device(c10::kCPU));
    auto pool = dev.is_cpu() && !shut_down_ ? pool_of(comm_) : nullptr;
    const size_t bytes = static_cast<size_t>(size) * options.dtype().itemsize();
    void* p = pool ? pool->alloc(bytes) : nullptr;
    if (!p) return at::empty({size}, options);
    return at::from_blob(
        p, {size}, [pool](void* q) { pool->free(q); },
        options.device(c10::Device(c10::kCPU)));
  });
}

std::unordered_map<std::string, uint64_t> BackendRSDP::getMemoryStats() {
  // Zeros where the group has no pool (multi-node, or shut down).
  ShmPool::Stats s{};
  if (auto pool = shut_down_ ? nullptr : pool_of(comm_)) s = pool->stats();
  return {{"pool_capacity_bytes", s.capacity},   {"pool_in_use_bytes", s.in_use},
          {"pool_peak_in_use_bytes", s.peak_in_use}, {"pool_committed_bytes", s.committed},
          {"pool_live_blocks", s.blocks},        {"pool_allocations", s.allocs},
          {"pool_fallbacks", s.misses}};
}

size_t BackendRSDP::pool_bytes_in_use() const {
  auto pool = pool_of(comm_);
  return pool ? pool->in_use() : 0;
}

}  // namespace rsdp

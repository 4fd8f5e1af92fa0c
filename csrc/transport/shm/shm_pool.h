// This rank's communication memory: its pool region of the group's shared
// segment, handed out by torch's allocateTensor (FSDP2 allocates its
// all-gather and reduce-scatter buffers there when asked to).
//
// Why: a buffer in the pool is readable by every rank of the node where it
// lies, so a collective over such buffers copies once, from the peer's buffer
// straight into the destination, instead of twice through the staging halves
// (algorithms/direct.cpp). Linux's cross-memory attach (process_vm_readv)
// would give one copy for any buffer, but its kernel copy runs at a fraction
// of memcpy's speed, slower than two pipelined user-space copies.
//
// A first-fit allocator over the region with coalescing free lists. Pages are
// committed (MADV_POPULATE_WRITE) as the high-water mark grows, so running out
// of memory is an allocation that fails (the caller falls back to ordinary
// memory), not a SIGBUS later. Freed blocks stay committed for reuse, as in
// torch's caching allocators. Thread-safe: tensors die on any thread.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

namespace rsdp {

class ShmSegment;

class ShmPool {
 public:
  // region: [base, base + bytes) of `segment`, which the pool keeps mapped
  // for as long as it (or a block it handed out) lives.
  ShmPool(std::shared_ptr<ShmSegment> segment, char* base, size_t bytes);

  // nullptr when the region is full or the memory cannot be committed.
  void* alloc(size_t bytes);
  void free(void* p);

  bool owns(const void* p, size_t bytes) const {
    auto c = static_cast<const char*>(p);
    return bytes_ && c >= base_ && c + bytes <= base_ + bytes_;
  }
  size_t capacity() const { return bytes_; }
  size_t in_use() const;

  struct Stats {
    size_t capacity, in_use, peak_in_use, committed, blocks;
    uint64_t allocs, misses;  // misses: requests it could not serve
  };
  Stats stats() const;

 private:
  std::shared_ptr<ShmSegment> segment_;
  char* base_;
  size_t bytes_;
  mutable std::mutex mu_;
  std::map<size_t, size_t> free_;  // offset -> length, disjoint and coalesced
  std::map<size_t, size_t> used_;  // offset -> length
  size_t committed_ = 0;           // bytes from base_ known to be backed
  size_t in_use_ = 0;
  size_t peak_in_use_ = 0;
  uint64_t allocs_ = 0;
  uint64_t misses_ = 0;
};

}  // namespace rsdp

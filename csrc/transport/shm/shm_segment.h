// One POSIX shared-memory segment, mapped into this process.
//
// Hygiene (docs/architecture.md, Shared-memory segments): names are random,
// creation is O_CREAT|O_EXCL with mode 0600, the reserved size is allocated
// with posix_fallocate so a full /dev/shm fails at init instead of with
// SIGBUS later, and the fd is closed right after mmap (the mapping keeps the
// memory alive).
#pragma once

#include <cstddef>
#include <string>

namespace rsdp {

class ShmSegment {
 public:
  ShmSegment() = default;
  ~ShmSegment();
  ShmSegment(ShmSegment&& o) noexcept;
  ShmSegment& operator=(ShmSegment&& o) noexcept;
  ShmSegment(const ShmSegment&) = delete;
  ShmSegment& operator=(const ShmSegment&) = delete;

  // Only the first `reserve` bytes (all when 0) are allocated up front; the
  // rest stays sparse until committed (ShmPool commits what it hands out).
  static ShmSegment create(const std::string& name, size_t bytes, size_t reserve = 0);
  static ShmSegment open(const std::string& name, size_t bytes);
  // Private memory with the same interface, for groups of one rank.
  static ShmSegment anonymous(size_t bytes);
  // Removes the name; mappings stay valid. Missing names are ignored.
  static void unlink(const std::string& name);
  // "/rsdp-<16 hex digits>" from the kernel's random source.
  static std::string random_name();

  char* data() const { return static_cast<char*>(addr_); }
  size_t size() const { return bytes_; }

 private:
  void* addr_ = nullptr;
  size_t bytes_ = 0;
};

}  // namespace rsdp

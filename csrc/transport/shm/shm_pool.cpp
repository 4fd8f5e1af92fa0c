#include "transport/shm/shm_pool.h"

#include <sys/mman.h>

#include <algorithm>
#include <cerrno>

#include "transport/shm/shm_segment.h"

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace rsdp {
namespace {

// Blocks are page-aligned: a tensor never shares a page with another, and
// large blocks start where the kernel can map huge pages.
constexpr size_t kGrain = 4096;

size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

}  // namespace

ShmPool::ShmPool(std::shared_ptr<ShmSegment> segment, char* base, size_t bytes)
    : segment_(std::move(segment)), base_(base), bytes_(bytes) {
  if (bytes_) free_[0] = bytes_;
}

size_t ShmPool::in_use() const {
  std::lock_guard<std::mutex> g(mu_);
  return in_use_;
}

ShmPool::Stats ShmPool::stats() const {
  std::lock_guard<std::mutex> g(mu_);
  return Stats{bytes_, in_use_, peak_in_use_, committed_, used_.size(), allocs_, misses_};
}

void* ShmPool::alloc(size_t bytes) {
  const size_t len = round_up(bytes ? bytes : 1, kGrain);
  std::lock_guard<std::mutex> g(mu_);
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < len) continue;
    const size_t off = it->first;
    if (off + len > committed_) {
      // Commit now, where a failure can be answered with ordinary memory.
      // A kernel without MADV_POPULATE_WRITE (EINVAL) commits on first touch.
      char* from = base_ + committed_;
      const size_t span = off + len - committed_;
      if (madvise(from, span, MADV_POPULATE_WRITE) != 0 && errno != EINVAL) {
        ++misses_;
        return nullptr;
      }
      committed_ = off + len;
    }
    const size_t rest = it->second - len;
    free_.erase(it);
    if (rest) free_[off + len] = rest;
    used_[off] = len;
    in_use_ += len;
    peak_in_use_ = std::max(peak_in_use_, in_use_);
    ++allocs_;
    return base_ + off;
  }
  ++misses_;
  return nullptr;
}

void ShmPool::free(void* p) {
  const size_t off = static_cast<size_t>(static_cast<char*>(p) - base_);
  std::lock_guard<std::mutex> g(mu_);
  auto u = used_.find(off);
  if (u == used_.end()) return;  // not ours: nothing to give back
  size_t start = off, len = u->second;
  in_use_ -= len;
  used_.erase(u);
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = len;
}

}  // namespace rsdp

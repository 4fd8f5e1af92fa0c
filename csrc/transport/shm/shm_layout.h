// Byte layout of a group's shared-memory segment (one per group, created by
// group rank 0):
//
//   SegmentHeader                         4 KiB, with the group's NoticeBlock
//                                         (core/notice.h) at kNoticeOffset
//   RankCtl[size]                         256 B each: step counter, futex words,
//                                         pid, step descriptors
//   staging[size][2][half]                each rank's two staging halves; a
//                                         step of number s uses half s % 2
//   channel[size*size]: ChannelCtl + ring send/recv byte stream src -> dst
//   pool[size][pool]                      each rank's communication memory
//                                         (torch's allocateTensor); sparse,
//                                         committed page by page as the owner
//                                         allocates from it
//
// Everything is 4 KiB- or cache-line aligned so ranks never share a line they
// both write.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/notice.h"
#include "core/op_desc.h"
#include "core/store_records.h"

namespace rsdp {

// The header is a record a peer reads: defined and checked with the others.
using records::kShmMagic;
using records::SegmentHeader;

struct alignas(128) RankCtl {
  std::atomic<uint32_t> step;            // last step this rank posted (futex word)
  std::atomic<uint32_t> step_sleepers;   // ranks asleep on `step`
  std::atomic<uint32_t> doorbell;        // bumped when a p2p channel of this rank moves
  std::atomic<uint32_t> doorbell_sleepers;
  int32_t pid;
  // Rank 0's only: its adaptation mode (AdaptMode), the group's
  // ([Note: adapting to the placement] in adaptation.h).
  std::atomic<int32_t> adapt_mode;
  // Rank 0's only: the number of the collective before which every rank
  // probes again ([Note: re-probing on rank 0's clock] in adaptation.h).
  std::atomic<uint64_t> probe_at;
  OpDesc desc[2];  // descriptor posted with the step of the same parity
  // Where this rank's buffer lies in its pool region, posted with the step of
  // the same parity (segment offset; kNotInPool when it is elsewhere).
  uint64_t buf_off[2];
};
static_assert(sizeof(RankCtl) <= 256, "RankCtl grew");

struct alignas(64) ChannelCtl {
  std::atomic<uint64_t> head;  // bytes ever written by the sender
  char pad0[56];
  std::atomic<uint64_t> tail;  // bytes ever consumed by the receiver
  char pad1[56];
};

// The notice shares the header page: written once, when the group breaks.
constexpr size_t kNoticeOffset = 1024;
static_assert(sizeof(SegmentHeader) <= kNoticeOffset &&
                  kNoticeOffset + sizeof(NoticeBlock) <= 4096,
              "the notice must fit in the header page");

constexpr size_t kCtlStride = 256;
constexpr uint64_t kNotInPool = ~0ull;
// Pool regions start on a huge-page boundary, so the kernel may back them
// with huge pages.
constexpr size_t kPoolAlign = 2u << 20;
constexpr size_t kChanCtlBytes = sizeof(ChannelCtl);

inline size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

struct ShmLayout {
  size_t size = 0;
  size_t half = 0;  // bytes of one staging half
  size_t ring = 0;  // bytes of one p2p ring
  size_t pool = 0;  // bytes of one rank's pool region (0: no pool)

  size_t ctl_offset(int r) const { return 4096 + kCtlStride * r; }
  size_t stage_base() const { return round_up(4096 + kCtlStride * size, 4096); }
  size_t stage_offset(int r, uint32_t step) const {
    return stage_base() + (2 * r + (step & 1)) * half;
  }
  size_t chan_base() const { return stage_base() + 2 * size * half; }
  size_t chan_offset(int src, int dst) const {
    return chan_base() + (static_cast<size_t>(src) * size + dst) * (kChanCtlBytes + ring);
  }
  // Everything before the pools: reserved up front when the segment is made.
  size_t head() const { return chan_base() + size * size * (kChanCtlBytes + ring); }
  size_t pool_base() const { return round_up(head(), kPoolAlign); }
  size_t pool_offset(int r) const { return pool_base() + static_cast<size_t>(r) * pool; }
  size_t total() const { return pool ? pool_offset(size) : head(); }
};

}  // namespace rsdp

// A broken group tells everyone: the first failure that made the group
// unusable, written where every member on this node can see it.
//
// Without it, a rank that gave up leaves its peers waiting for it until their
// own timeout (30 minutes by torch's default): alive, but gone from the
// collective. So the rank that finds the group broken (a dead peer, a
// transport error, a timeout, an abort) posts the failure here; every wait of
// every local member polls the block alongside its own condition, and the
// network transport carries it to the other nodes (ucx_coll.h), whose
// members post it on their node's block in turn. Each survivor then raises
// the original failure, naming the rank that reported it.
//
// The block lives in the node's shared-memory segment (shm_layout.h); this
// file only knows a pointer to it. The first post wins; later ones leave it.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "core/error.h"

namespace rsdp {

constexpr size_t kNoticeTextBytes = 1000;

struct NoticeBlock {
  std::atomic<uint32_t> state;  // 0 none, 1 being written, 2 posted
  int32_t origin;               // global rank that reported the failure
  uint32_t kind;                // its ErrorKind
  uint32_t len;                 // bytes of text
  char text[kNoticeTextBytes];  // the failure, without the reporter's "rsdp rank N: "
};

// A failure as it travels: who reported it, what kind, what happened.
struct Failure {
  int origin = -1;
  ErrorKind kind = ErrorKind::kPeer;
  std::string text;
};

class Notice {
 public:
  explicit Notice(NoticeBlock* block) : block_(block) {}

  // One atomic load: cheap enough for every wait loop.
  bool posted() const { return block_->state.load(std::memory_order_acquire) == 2; }

  // Posts `msg` (as thrown by rank `origin`; its "rsdp rank N: " prefix is
  // dropped) unless a failure is posted already. True if this call posted.
  bool post(int origin, ErrorKind kind, const std::string& msg);
  bool post(const Failure& f) { return post(f.origin, f.kind, f.text); }

  // The posted failure; waits a moment for a post still being written.
  // origin -1 when none is posted.
  Failure read() const;

  // What a member raises on hearing of it: "<me>: <doing>: the group broke:
  // <failure> (reported by rank N)".
  static std::string heard(const std::string& me, const std::string& doing, const Failure& f);

 private:
  NoticeBlock* block_;
};

// "rsdp rank 3: x" -> "x".
std::string without_rank_prefix(const std::string& msg);

}  // namespace rsdp

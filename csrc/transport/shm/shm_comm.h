// The shared-memory communicator of one process group on one node.
//
// Collectives run as a sequence of *steps*. In a step every rank writes into
// its staging half (stage()), then exchange() publishes it together with the
// op descriptor and waits until every peer has published the same step; after
// that the peers' halves of that step are readable (peer(p)).
//
// [Note: why two halves are enough]
// Step s uses half s % 2. A rank writes half s % 2 again only at step s + 2,
// after its exchange of step s + 1 returned, i.e. after every peer posted step
// s + 1 -- and a peer posts s + 1 only once it has finished reading step s.
// So no trailing barrier is needed: the next step's wait is the release.
//
// [Note: ring steps wait for neighbours only]
// A ring step (ring_shift, primitives/ring_shift.h) has one reader of each
// rank's half: the ring successor. ring_post() publishes the step without
// waiting; ring_wait(src) waits only for the rank whose half this rank reads.
// The two-halves argument above then needs one more check, made when the half
// is written again (ring_stage()): the rank(s) that read its previous use,
// two steps back, have posted the step after it. A collective's first step
// after ring steps first waits for every peer to reach the last step (begin()),
// so collectives keep the all-peers guarantee. Ranks may then drift apart by
// up to one step per hop of ring distance; a rank reads a descriptor only of
// the peer it waits for, which cannot have moved on two steps (it would need
// this rank to post the next step first). A slow rank thus stalls its two
// neighbours at once and the rest of the ring only as the delay travels.
//
// Waiting spins for RSDP_SPIN_US, then sleeps on a futex in the peer's control
// block. While asleep it checks the op's deadline, the peer's liveness and the
// group's notice (core/notice.h), so a dead or missing peer, or a member that
// gave up, turns into an error, never a hang. A failure that breaks the group
// is posted on the notice, so the other members stop waiting too.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "core/bootstrap.h"
#include "core/deadline.h"
#include "core/error.h"
#include "core/group.h"
#include "core/notice.h"
#include "core/op_desc.h"
#include "core/options.h"
#include "core/traffic.h"
#include "transport/shm/adaptation.h"
#include "transport/shm/p2p_wire.h"  // RingView
#include "transport/shm/peer_watch.h"
#include "transport/shm/shm_layout.h"
#include "transport/shm/shm_pool.h"
#include "transport/shm/shm_segment.h"
#include "transport/staging.h"

namespace rsdp {

// The staging interface (transport/staging.h) over host shared memory: copies
// are memcpy and reductions the CPU kernels, on the calling thread.
class ShmComm final : public Staging {
 public:
  // traffic (optional) counts the bytes this rank stages for its peers.
  ShmComm(const Group& group, Bootstrap& store, const Options& opts, Traffic* traffic = nullptr);
  ~ShmComm();

  const Group& group() const override { return group_; }
  int rank() const { return group_.rank; }
  int size() const { return group_.size; }
  size_t half_bytes() const override { return layout_.half; }

  // --- collective steps (one thread at a time) ---
  // Starts a collective: assigns its sequence number, arms its deadline.
  // Throws if an earlier timeout/peer failure made the group unusable.
  void begin(OpDesc desc, std::chrono::milliseconds timeout) override;
  const OpDesc& desc() const override { return desc_; }
  char* stage() override;         // this rank's half for the next step
  // Publish the step and wait for every peer; `staged` is how many bytes of
  // the half this rank filled for its peers (for the traffic counters).
  // `buf_off` posts where this rank's buffer lies in its pool (pool_offset()).
  void exchange(size_t staged = 0) override { exchange(staged, kNotInPool); }
  void exchange(size_t staged, uint64_t buf_off);
  const char* peer(int p) const override;  // p's half of the last exchanged step
  // The host side channel is the staging half itself.
  char* host_stage() override { return stage(); }
  const char* host_peer(int p) const override { return peer(p); }
  size_t host_half_bytes() const override { return half_bytes(); }
  void copy(void* dst, const void* src, size_t bytes) override;
  ShmComm* shared_memory() override { return this; }
  bool rank_per_core() const override { return rank_per_core_; }
  void reduce_and_stage(void* own, void* staged, const void* const* srcs, int nsrc, size_t count,
                        DType dt, RedOp op, int divisor) override;

  // --- ring steps ([Note: ring steps wait for neighbours only]) ---
  // This rank's half for the next step, once whoever read its previous use
  // has moved on.
  char* ring_stage() override;
  // Publishes the next step (`staged` bytes for `reader`, the one rank that
  // reads this half) without waiting for anyone.
  void ring_post(size_t staged, int reader) override;
  // Waits until `src` has posted the step just posted by this rank and
  // checks its descriptor; then peer(src) is readable.
  void ring_wait(int src) override;

  // --- communication memory (shm_pool.h) ---
  // This rank's pool; null for a group of one rank or with RSDP_POOL_BYTES=0.
  const std::shared_ptr<ShmPool>& pool() const { return pool_; }
  // The segment offset of [p, p + bytes) when it lies in this rank's pool.
  uint64_t pool_offset(const void* p, size_t bytes) const;
  // The buffer peer p posted with the last exchanged step, if it posted one
  // that holds `bytes`; else null.
  const char* posted(int p, size_t bytes) const;

  // --- point-to-point channels (used by the P2P engine) ---
  RingView ring(int src, int dst) const;
  void ring_doorbell(int r);  // wake r's P2P engine
  std::atomic<uint32_t>& doorbell(int r);
  std::atomic<uint32_t>& doorbell_sleepers(int r);
  bool peer_alive(int p) const { return watch_->alive(p); }
  void count_one_copy() {
    if (traffic_) traffic_->one_copy_ops.fetch_add(1, std::memory_order_relaxed);
  }

  // Makes every current and future wait fail with `why`, and tells the
  // other members (the notice).
  void abort(const std::string& why);
  bool broken() const { return !broken_.empty(); }
  // How this node's group adapts to where its ranks run (adaptation.h): the
  // latest probe's findings, the stores it chose (any thread).
  const Adaptation& adaptation() const { return *adapt_; }
  // The group's notice on this node: the first failure that broke it.
  Notice& notice() const { return *notice_; }

 protected:
  void reduce_pass(void* dst, const void* const* srcs, int nsrc, size_t count, DType dt,
                   RedOp op, int divisor) override;

 private:
  RankCtl& ctl(int r) const {
    return *reinterpret_cast<RankCtl*>(seg_->data() + layout_.ctl_offset(r));
  }
  void wait_step(int p, uint32_t step);
  // Publishes the next step (its descriptor, the posted buffer's offset) and
  // wakes the peers sleeping on it; returns the step.
  uint32_t post(size_t staged, uint64_t buf_off);
  [[noreturn]] void fail(ErrorKind kind, const std::string& msg);
  void attach(Bootstrap& store);
  // Runs the adaptation's probe; the group's collective numbering is left as
  // it was (the probe is no collective of the user's).
  void probe(std::chrono::milliseconds timeout);

  Group group_;
  Options opts_;
  Traffic* traffic_;
  ShmLayout layout_;
  // Shared with the pool: tensors from the pool keep the mapping alive after
  // the group is gone.
  std::shared_ptr<ShmSegment> seg_;
  std::shared_ptr<ShmPool> pool_;
  std::unique_ptr<PeerWatch> watch_;
  std::unique_ptr<Notice> notice_;
  std::unique_ptr<Adaptation> adapt_;
  bool rank_per_core_ = false;  // no more ranks than CPUs
  uint32_t step_ = 0;
  uint64_t seq_ = 0;
  // Who read this rank's half of the last step of each parity: a group rank,
  // or kAllPeers after a collective step.
  static constexpr int kAllPeers = -1;
  int reader_[2] = {kAllPeers, kAllPeers};
  bool lazy_ = false;  // the last step was a ring step: peers may not have reached it
  void check_desc(int p, uint32_t s);
  OpDesc desc_;
  Deadline deadline_;
  std::string broken_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;
};

}  // namespace rsdp

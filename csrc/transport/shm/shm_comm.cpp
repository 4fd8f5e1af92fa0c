#include "transport/shm/shm_comm.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>

#include "core/error.h"
#include "core/futex.h"
#include "core/reduce_kernels.h"
#include "core/stream_copy.h"
#include "core/store_records.h"

namespace rsdp {
namespace {

using Clock = std::chrono::steady_clock;

bool reached(uint32_t have, uint32_t want) { return static_cast<int32_t>(have - want) >= 0; }

// Ring bytes per ordered pair: 1 MiB for small groups, shrinking so that a
// node with many ranks does not reserve size^2 MiB.
size_t auto_ring_bytes(int size) {
  size_t pairs = static_cast<size_t>(size) * size;
  size_t v = (64u << 20) / std::max<size_t>(pairs, 1);
  return std::clamp<size_t>(v, 16u << 10, 1u << 20);
}

constexpr int kSleepSliceUs = 20000;  // futex slice between deadline/liveness checks

// [Note: waiting with more ranks than cores]
// A waiter polls for RSDP_SPIN_US before it sleeps on the futex; how it polls
// depends on whether its peer can be running. With a core per rank it spins
// (yielding now and then). Ranks that outnumber the cores take turns on them,
// and a spinning waiter holds a core its peer needs, while a sleep costs a
// wake-up through the scheduler at every step; so there every poll yields the
// core, letting the rank sharing it run at once, and the waiter sees the
// peer's step as soon as it is back (Open MPI polls so when oversubscribed).

// ShmSegment's errors start with "rsdp: "; inside a sentence that already
// names this rank, the prefix goes.
std::string strip_prefix(const char* what) {
  const std::string s(what);
  return s.rfind("rsdp: ", 0) == 0 ? s.substr(6) : s;
}

}  // namespace

ShmComm::ShmComm(const Group& group, Bootstrap& store, const Options& opts, Traffic* traffic)
    : group_(group), opts_(opts), traffic_(traffic) {
  layout_.size = group_.size;
  // Slotted algorithms need at least one 64-byte slot per rank in a half.
  layout_.half = round_up(std::max<size_t>(opts.shm_bytes / 2, 64u * group_.size), 4096);
  layout_.ring = round_up(opts.p2p_bytes ? opts.p2p_bytes : auto_ring_bytes(group_.size), 4096);
  // A group of one rank has no peer to share memory with.
  layout_.pool = group_.size > 1 ? round_up(opts.pool_bytes, kPoolAlign) : 0;
  // With more ranks than cores a waiter yields its core between polls instead
  // of spinning on it ([Note: waiting with more ranks than cores]).
  // The machine's CPUs: a rank pinned to one core of its own still has one.
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  rank_per_core_ = cpus > 0 && group_.size <= cpus;
  attach(store);
  // Group rank 0's mode, written before any peer attached.
  adapt_ = std::make_unique<Adaptation>(
      static_cast<AdaptMode>(ctl(0).adapt_mode.load(std::memory_order_relaxed)), group_.rank,
      group_.size, &ctl(0).probe_at, opts.test.shm_stores);
  if (layout_.pool)
    pool_ = std::make_shared<ShmPool>(seg_, seg_->data() + layout_.pool_offset(group_.rank),
                                      layout_.pool);
  std::vector<int> pids;
  for (const auto& p : group_.peers) pids.push_back(p.pid);
  watch_ = std::make_unique<PeerWatch>(pids, group_.rank);
  notice_ = std::make_unique<Notice>(reinterpret_cast<NoticeBlock*>(seg_->data() + kNoticeOffset));
  probe(group_.timeout);
  if (opts_.debug)
    std::cerr << group_.me() << ": group '" << group_.name << "' size " << group_.size
              << ", shared memory " << layout_.total() << " bytes (staging 2x" << layout_.half
              << ", p2p ring " << layout_.ring << ", pool " << layout_.pool << " per rank)"
              << "; adaptation " << adapt_mode_name(adapt_->mode()) << ", hand-off "
              << adapt_->handoff().mode() << " (step " << adapt_->handoff().step_ns
              << " ns, pull " << adapt_->handoff().pull_gbps << " GB/s)" << std::endl;
}

ShmComm::~ShmComm() = default;

void ShmComm::attach(Bootstrap& store) {
  const size_t bytes = layout_.total();
  const int n = group_.size;
  // Group rank 0's adaptation mode decides for the group (adaptation.h): it is
  // in its control block before any peer can attach.
  auto own_mode = [&] {
    ctl(0).adapt_mode.store(static_cast<int32_t>(opts_.shm_adapt), std::memory_order_relaxed);
  };
  if (n == 1) {
    // Nothing to share: an anonymous private mapping keeps /dev/shm clean.
    seg_ = std::make_shared<ShmSegment>(ShmSegment::anonymous(bytes));
    own_mode();
  } else if (group_.rank == 0) {
    std::string name = ShmSegment::random_name();
    // The pools stay sparse: each owner commits what it hands out.
    seg_ = std::make_shared<ShmSegment>(ShmSegment::create(name, bytes, layout_.head()));
    auto* h = reinterpret_cast<SegmentHeader*>(seg_->data());
    *h = SegmentHeader{kShmMagic, static_cast<uint64_t>(n), layout_.half, layout_.ring,
                       layout_.pool};
    own_mode();
    std::vector<std::string> keys;
    for (int r = 1; r < n; ++r) keys.push_back(group_.key("shm/attached/" + std::to_string(r)));
    bool all = false;
    try {
      store.set(group_.key("shm/name"), records::encode_shm_name(name));
      all = store.wait(keys, group_.timeout);
    } catch (...) {
      ShmSegment::unlink(name);  // a store failure must not leave the name behind
      throw;
    }
    // Unlink as soon as every peer holds a mapping (or gave up): from here on
    // no crash can leave the name behind.
    ShmSegment::unlink(name);
    if (!all) {
      std::string missing;
      for (int r = 1; r < n; ++r)
        if (!store.check(keys[r - 1])) missing += (missing.empty() ? "" : ", ") + group_.who(r);
      RSDP_FAIL(ErrorKind::kTimeout, group_.me(), ": ",
                timed_out_waiting(group_.timeout.count()), " for ", missing,
                " to attach the shared memory of group '", group_.name, "'");
    }
  } else {
    std::string key = group_.key("shm/name");
    RSDP_CHECK_KIND(ErrorKind::kTimeout, store.wait({key}, group_.timeout), group_.me(),
                    ": ", timed_out_waiting(group_.timeout.count()), " for ", group_.who(0),
                    " to create the shared memory of group '", group_.name, "'");
    const std::string doing = detail::cat(group_.me(), ": attaching the shared memory of group '",
                                          group_.name, "': ");
    std::string name;
    std::string err = records::decode_shm_name(store.get(key), {key, 0, group_.who(0)}, name);
    RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), doing, err);
    try {
      seg_ = std::make_shared<ShmSegment>(ShmSegment::open(name, bytes));
    } catch (const Error& e) {
      // A name that is not there (its creator died, or it was never made), or
      // a segment of another size: say whose it was.
      RSDP_FAIL(e.kind(), doing, "the segment ", name, " that ", group_.who(0),
                " published: ", strip_prefix(e.what()));
    }
    const SegmentHeader want{kShmMagic, static_cast<uint64_t>(n), layout_.half, layout_.ring,
                             layout_.pool};
    err = records::check_segment_header(seg_->data(), seg_->size(), want,
                                        {name, 0, group_.who(0)});
    if (!err.empty()) {
      seg_.reset();  // unmap now: the group is not made
      RSDP_FAIL(ErrorKind::kSystem, doing, err);
    }
    store.set(group_.key("shm/attached/" + std::to_string(group_.rank)), "1");
  }
  ctl(group_.rank).pid = group_.peers[group_.rank].pid;
}

void ShmComm::probe(std::chrono::milliseconds timeout) {
  // The probe is no collective of the user's: errors and test hooks name
  // collectives by number, the first of the user's being #1. Every rank
  // restores alike.
  const uint64_t seq = seq_;
  try {
    adapt_->probe(*this, timeout);
  } catch (...) {
    seq_ = seq;
    throw;
  }
  seq_ = seq;
}

void ShmComm::begin(OpDesc desc, std::chrono::milliseconds timeout) {
  if (!broken_.empty())
    RSDP_FAIL(ErrorKind::kPeer, group_.me(), ": ", op_name(desc.kind),
              " refused: the group is unusable after an earlier failure (", broken_,
              "); destroy it and create a new one");
  // The placement may change while a group lives: probe again when the
  // adaptation says so ([Note: re-probing on rank 0's clock]). Not before a
  // ring step (its neighbours may still be a step behind).
  if (desc.kind != OpKind::kRingShift && adapt_->due(seq_ + 1)) probe(timeout);
  desc.seq = ++seq_;
  desc_ = desc;
  deadline_ = Deadline(timeout);
  if (notice_->posted()) fail(ErrorKind::kPeer, "");  // another member gave up
  if (lazy_ && desc.kind != OpKind::kRingShift) {
    // After ring steps: every peer reaches the last one before a collective
    // writes its halves ([Note: ring steps wait for neighbours only]).
    for (int i = 1; i < group_.size; ++i) wait_step((group_.rank + i) % group_.size, step_);
    lazy_ = false;
  }
}

void ShmComm::copy(void* dst, const void* src, size_t bytes) {
  if (!bytes || dst == src) return;
  // Only what a peer reads next streams: a copy into this rank's own buffer
  // is read by this core (the caller), so it stays in its cache.
  char* d = static_cast<char*>(dst);
  const char* stage_begin = seg_->data() + layout_.stage_offset(group_.rank, 0);
  if (adapt_->streaming() && bytes >= Adaptation::kStreamMinBytes && d >= stage_begin &&
      d + bytes <= stage_begin + 2 * layout_.half)
    stream_copy(dst, src, bytes);
  else
    std::memcpy(dst, src, bytes);
}

void ShmComm::reduce_and_stage(void* own, void* staged, const void* const* srcs, int nsrc,
                               size_t count, DType dt, RedOp op, int divisor) {
  if (!adapt_->streaming()) return Staging::reduce_and_stage(own, staged, srcs, nsrc, count, dt,
                                                             op, divisor);
  // Reduced into this rank's own buffer, then streamed to the half: the peers
  // read the chunk from memory, not from this core's cache (core/stream_copy.h).
  // Same sources, same order, so the same bits.
  reduce(own, srcs, nsrc, count, dt, op, divisor, nullptr);
  copy(staged, own, count * dtype_size(dt));
}

void ShmComm::reduce_pass(void* dst, const void* const* srcs, int nsrc, size_t count, DType dt,
                          RedOp op, int divisor) {
  reduce_n(dst, srcs, nsrc, count, dt, op, divisor);
}

char* ShmComm::stage() { return seg_->data() + layout_.stage_offset(group_.rank, step_ + 1); }

const char* ShmComm::peer(int p) const { return seg_->data() + layout_.stage_offset(p, step_); }

uint64_t ShmComm::pool_offset(const void* p, size_t bytes) const {
  if (!pool_ || !pool_->owns(p, bytes)) return kNotInPool;
  return static_cast<uint64_t>(static_cast<const char*>(p) - seg_->data());
}

const char* ShmComm::posted(int p, size_t bytes) const {
  const uint64_t off = ctl(p).buf_off[step_ & 1];
  // Only an offset inside p's own region counts, whatever p wrote there.
  if (!layout_.pool || off == kNotInPool || off < layout_.pool_offset(p) ||
      off + bytes > layout_.pool_offset(p + 1) || off + bytes < off)
    return nullptr;
  return seg_->data() + off;
}

uint32_t ShmComm::post(size_t staged, uint64_t buf_off) {
  if (traffic_ && staged && group_.size > 1) traffic_->add(true, staged);
  const uint32_t s = ++step_;
  RankCtl& me = ctl(group_.rank);
  me.desc[s & 1] = desc_;
  me.buf_off[s & 1] = buf_off;
  me.step.store(s, std::memory_order_seq_cst);
  if (me.step_sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&me.step);
  return s;
}

void ShmComm::exchange(size_t staged, uint64_t buf_off) {
  const uint32_t s = post(staged, buf_off);
  const int n = group_.size;
  for (int i = 1; i < n; ++i) wait_step((group_.rank + i) % n, s);
  for (int p = 0; p < n; ++p)
    if (p != group_.rank) check_desc(p, s);
  reader_[s & 1] = kAllPeers;
  lazy_ = false;
}

void ShmComm::check_desc(int p, uint32_t s) {
  const OpDesc& theirs = ctl(p).desc[s & 1];
  // Same step but a different collective number: the step counters have
  // diverged (e.g. different algorithms were chosen); nothing can realign them.
  if (theirs.seq != desc_.seq)
    fail(ErrorKind::kMismatch,
         detail::cat(group_.me(), ": collective mismatch: this rank is at ", desc_.describe(),
                     " but ", group_.who(p), " is at ", theirs.describe(),
                     " in the same step; the ranks ran different numbers of steps (do all "
                     "ranks use the same RSDP_* settings?)"));
  if (!(theirs == desc_))
    RSDP_FAIL(ErrorKind::kMismatch, group_.me(), ": collective mismatch: this rank called ",
              desc_.describe(), " but ", group_.who(p), " called ", theirs.describe(),
              ". All ranks must issue the same collectives, in the same order, with the same "
              "sizes and dtypes");
}

char* ShmComm::ring_stage() {
  // The half of step s = step_ + 1 was last used at step s - 2; its readers
  // have finished with it once they posted s - 1.
  const uint32_t s = step_ + 1;
  const int r = reader_[s & 1];
  if (r == kAllPeers) {
    for (int i = 1; i < group_.size; ++i) wait_step((group_.rank + i) % group_.size, s - 1);
  } else if (r != group_.rank) {
    wait_step(r, s - 1);
  }
  return stage();
}

void ShmComm::ring_post(size_t staged, int reader) {
  const uint32_t s = post(staged, kNotInPool);
  reader_[s & 1] = reader;
  lazy_ = true;
}

void ShmComm::ring_wait(int src) {
  if (src == group_.rank) return;
  wait_step(src, step_);
  check_desc(src, step_);
}

void ShmComm::wait_step(int p, uint32_t s) {
  RankCtl& peer = ctl(p);
  if (reached(peer.step.load(std::memory_order_acquire), s)) return;
  // Poll for spin_us, then sleep: cheap while the peer is about to arrive.
  // With a core per rank the poll spins (yielding now and then); with more
  // ranks than cores every poll yields the core, so the rank sharing it runs
  // ([Note: waiting with more ranks than cores]).
  const auto spin_end = Clock::now() + std::chrono::microseconds(opts_.spin_us);
  const int yield_every = rank_per_core_ ? 64 : 1;
  for (int i = 1;; ++i) {
    if (rank_per_core_) cpu_relax();
    if (reached(peer.step.load(std::memory_order_acquire), s)) return;
    if (i % yield_every == 0) sched_yield();
    if ((i & 15) == 0 && Clock::now() >= spin_end) break;
  }
  for (;;) {
    peer.step_sleepers.fetch_add(1, std::memory_order_seq_cst);
    uint32_t v = peer.step.load(std::memory_order_seq_cst);
    if (!reached(v, s)) futex_wait(&peer.step, v, kSleepSliceUs);
    peer.step_sleepers.fetch_sub(1, std::memory_order_seq_cst);
    if (reached(peer.step.load(std::memory_order_acquire), s)) return;
    if (aborted_.load()) fail(ErrorKind::kPeer, abort_reason_);
    if (notice_->posted()) fail(ErrorKind::kPeer, "");
    if (!watch_->alive(p))
      fail(ErrorKind::kPeer, detail::cat(group_.me(), ": ", group_.who(p), " (pid ",
                                         group_.peers[p].pid, ") exited during ",
                                         desc_.describe()));
    if (deadline_.expired())
      fail(ErrorKind::kTimeout,
           detail::cat(group_.me(), ": ", desc_.describe(), ": ",
                       timed_out_waiting(deadline_.budget().count()), " for ", group_.who(p)));
  }
}

void ShmComm::fail(ErrorKind kind, const std::string& msg) {
  // The step counters of the group no longer agree: nothing after this can
  // be trusted, so every later collective refuses to run. The first failure
  // posted is the group's (an empty msg: only heard of); a member that failed
  // on its own account after that raises that one too, naming its reporter.
  const int me = group_.global(group_.rank);
  std::string why = msg;
  if (msg.empty() || !notice_->post(me, kind, msg)) {
    Failure f = notice_->read();
    if (f.origin >= 0 && (f.origin != me || msg.empty())) {
      kind = f.kind;
      why = Notice::heard(group_.me(), desc_.describe(), f);
    }
  }
  if (why.empty())
    why = group_.me() + ": " + desc_.describe() +
          ": another member gave up (its report could not be read)";
  broken_ = why;
  throw Error(kind, why + "; the group is unusable from now on");
}

void ShmComm::abort(const std::string& why) {
  abort_reason_ = why;
  aborted_.store(true);
  notice_->post(group_.global(group_.rank), ErrorKind::kPeer, why);
  // Sleepers (ours and the peers') wait on other words; the slice bounds it.
}

RingView ShmComm::ring(int src, int dst) const {
  char* base = seg_->data() + layout_.chan_offset(src, dst);
  return RingView{reinterpret_cast<ChannelCtl*>(base), base + kChanCtlBytes, layout_.ring};
}

std::atomic<uint32_t>& ShmComm::doorbell(int r) { return ctl(r).doorbell; }
std::atomic<uint32_t>& ShmComm::doorbell_sleepers(int r) { return ctl(r).doorbell_sleepers; }

void ShmComm::ring_doorbell(int r) {
  RankCtl& c = ctl(r);
  c.doorbell.fetch_add(1, std::memory_order_seq_cst);
  if (c.doorbell_sleepers.load(std::memory_order_seq_cst) != 0) futex_wake_all(&c.doorbell);
}

}  // namespace rsdp

#include "transport/emu/emu_comm.h"

#include <algorithm>
#include <cstring>
#include <new>

#include "core/error.h"
#include "core/reduce_kernels.h"
#include "core/store_records.h"

namespace rsdp {
namespace {

constexpr size_t kHalfAlign = 256;

std::string name_key(const Group& g, int r) { return g.key("emu/segment/" + std::to_string(r)); }
std::string mapped_key(const Group& g, int r) { return g.key("emu/mapped/" + std::to_string(r)); }

}  // namespace

EmuComm::EmuComm(ShmComm& shm, Bootstrap& store, const Options& opts)
    : shm_(shm),
      half_(opts.cuda_staging_bytes / 2 / kHalfAlign * kHalfAlign),
      stall_(opts.test.emulate_device_stall_rank == shm.rank()),
      stall_seq_(opts.test.emulate_device_stall_seq) {
  const size_t staging_bytes = opts.cuda_staging_bytes;
  const int n = size();
  const size_t least = std::max<size_t>(kHalfAlign, 64u * static_cast<size_t>(n));
  RSDP_CHECK(half_ >= least, group().me(), ": emulated-device staging of ", staging_bytes,
             " bytes is too small for ", n, " ranks: each of its two halves needs at least ",
             least, " bytes");
  map_peers(store);
  stream_ = std::make_unique<EmuStream>(opts.test.emulate_device_jitter_us,
                                        0x5eed0000u + group().global(rank()));
}

EmuComm::~EmuComm() {
  // [Note: releasing the staging buffer] (ipc_comm.cpp), emulated: wait,
  // bounded, for the stream; a stream stuck on a peer that will never
  // record is ended (the process exit a GPU would need) instead of waited for.
  const auto bound = std::min<std::chrono::milliseconds>(
      group().timeout.count() > 0 ? group().timeout : std::chrono::milliseconds(10000),
      std::chrono::milliseconds(10000));
  try {
    (void)stream_->drain(EmuStream::Clock::now() + bound);
  } catch (...) {
    // A poisoned stream has nothing left to run.
  }
  stream_.reset();  // kills and joins: nothing of ours touches the segments after this
}

void EmuComm::map_peers(Bootstrap& store) {
  const Group& g = group();
  const int n = size(), me = rank();
  const size_t bytes = kHalvesOffset + 2 * half_;
  static_assert(sizeof(Events) <= kHalvesOffset, "the events fit before the halves");
  segs_.resize(n);
  if (n == 1) {
    segs_[0] = ShmSegment::anonymous(bytes);
    new (segs_[0].data()) Events{};
    return;
  }
  // Export: a segment of our own under a fresh name, as an IPC handle.
  const std::string name = ShmSegment::random_name();
  segs_[me] = ShmSegment::create(name, bytes);
  new (segs_[me].data()) Events{};
  // Until every peer has mapped it, a failure of any kind (a timeout, the
  // store, a peer's bad record) must not leave the name behind.
  try {
    store.set(name_key(g, me), records::encode_emu_name(me, name));
    std::vector<std::string> keys;
    for (int p = 0; p < n; ++p)
      if (p != me) keys.push_back(name_key(g, p));
    auto fail_waiting = [&](const char* what) {
      RSDP_FAIL(ErrorKind::kTimeout, g.me(), ": ", timed_out_waiting(g.timeout.count()),
                " for the other ranks to ", what, " their emulated-device staging buffers");
    };
    if (!store.wait(keys, g.timeout)) fail_waiting("publish");
    // Import: map every peer's segment, as cudaIpcOpenMemHandle does.
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      const std::string key = name_key(g, p);
      std::string peer_name;
      const std::string err = records::decode_emu_name(store.get(key), {key, p, g.who(p)},
                                                       peer_name);
      RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), g.me(),
                      ": mapping the emulated-device staging buffers: ", err);
      segs_[p] = ShmSegment::open(peer_name, bytes);
    }
    store.set(mapped_key(g, me), "1");
    keys.clear();
    for (int p = 0; p < n; ++p)
      if (p != me) keys.push_back(mapped_key(g, p));
    if (!store.wait(keys, g.timeout)) fail_waiting("map");
  } catch (...) {
    ShmSegment::unlink(name);
    throw;
  }
  ShmSegment::unlink(name);  // every peer holds a mapping: the name is no longer needed
}

void EmuComm::begin(OpDesc desc, std::chrono::milliseconds timeout) {
  desc.on_device = true;
  shm_.begin(desc, timeout);
  if (stall_ && shm_.desc().seq == stall_seq_) {
    EmuStream* s = stream_.get();
    s->push([s] { s->wait_until([] { return false; }); }, "a planted kernel that never ends");
  }
}

char* EmuComm::stage() { return halves(rank()) + (step_ % 2) * half_; }

const char* EmuComm::peer(int p) const { return halves(p) + ((step_ + 1) % 2) * half_; }

void EmuComm::exchange(size_t staged) {
  const int n = size(), me = rank();
  const uint32_t h = step_ % 2;
  if (n > 1) {
    // cudaEventRecord: the host counts the record, the stream completes it.
    Events& mine = events(me);
    const uint64_t ticket = mine.recorded[h].fetch_add(1) + 1;
    stream_->push([&mine, h, ticket] { mine.completed[h].store(ticket); });
  }
  shm_.exchange(staged);
  ++step_;
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    // cudaStreamWaitEvent: waits for the record the peer made before this call.
    Events& theirs = events(p);
    const uint64_t want = theirs.recorded[h].load();
    EmuStream* s = stream_.get();
    stream_->push(
        [s, &theirs, h, want] { s->wait_until([&] { return theirs.completed[h].load() >= want; }); },
        detail::cat("waiting for ", group().who(p), "'s step ", step_, " of ",
                    desc().describe()));
  }
}

void EmuComm::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  stream_->push([dst, src, bytes] { std::memcpy(dst, src, bytes); });
}

void EmuComm::reduce_pass(void* dst, const void* const* srcs, int nsrc, size_t count, DType dt,
                          RedOp op, int divisor) {
  std::vector<const void*> in(srcs, srcs + nsrc);
  stream_->push([dst, in = std::move(in), count, dt, op, divisor] {
    reduce_n(dst, in.data(), static_cast<int>(in.size()), count, dt, op, divisor);
  });
}

}  // namespace rsdp

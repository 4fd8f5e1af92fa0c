#include "transport/cuda_ipc/ipc_comm.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <type_traits>

#include "core/error.h"
#include "core/store_records.h"
#include "cuda/cuda_check.h"
#include "cuda/device_reduce.h"
#include "transport/cuda_ipc/device_scope.h"

namespace rsdp {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kHalfAlign = records::kIpcHalfAlign;
// Longest the destructor waits for the stream to drain and for the peers to
// unmap this rank's buffer (bounded by the group's timeout as well).
constexpr std::chrono::milliseconds kReleaseWait{10000};

// What each rank publishes (records::IpcRecord, core/store_records.h): enough
// for a peer to map its staging buffer and open its events. The handles
// travel as their bytes.
using records::IpcRecord;
static_assert(sizeof(cudaIpcMemHandle_t) == records::kIpcHandleBytes &&
                  sizeof(cudaIpcEventHandle_t) == records::kIpcHandleBytes &&
                  std::is_trivially_copyable<cudaIpcMemHandle_t>::value &&
                  std::is_trivially_copyable<cudaIpcEventHandle_t>::value,
              "CUDA's IPC handles fit the record's byte fields");

std::string record_key(const Group& g, int r) { return g.key("cuda-ipc/" + std::to_string(r)); }
std::string closed_key(const Group& g, int r) {
  return g.key("cuda-ipc-closed/" + std::to_string(r));
}

std::chrono::milliseconds release_wait(const Group& g) {
  return g.timeout.count() > 0 ? std::min(g.timeout, kReleaseWait) : kReleaseWait;
}

}  // namespace

IpcComm::IpcComm(ShmComm& shm, Bootstrap& store, int device, size_t staging_bytes)
    : shm_(shm), store_(store), device_(device), half_(staging_bytes / 2 / kHalfAlign * kHalfAlign) {
  const int n = size();
  const size_t least = std::max<size_t>(kHalfAlign, 64u * static_cast<size_t>(n));
  RSDP_CHECK(half_ >= least, group().me(), ": CUDA-IPC staging of ", staging_bytes,
             " bytes is too small for ", n, " ranks on the node: each of its two halves needs at "
             "least ", least, " bytes (64 per rank, rounded down to a multiple of 256)");
  peers_.assign(n, nullptr);
  ready_.assign(2 * static_cast<size_t>(n), nullptr);
  devices_.assign(n, -1);
  bus_ids_.assign(n, std::string());
  try {
    setup();
  } catch (...) {
    release();
    throw;
  }
}

void IpcComm::setup() {
  const Group& g = group();
  const int n = size(), me = rank();
  CudaDeviceScope scope(device_);
  const std::string where = detail::cat("(", g.me(), ": CUDA-IPC setup on device ", device_, ")");

  RSDP_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&mine_), 2 * half_), "for the staging buffer of ",
                  2 * half_, " bytes ", where);
  peers_[me] = mine_;
  for (int h = 0; h < 2; ++h)
    RSDP_CUDA_CHECK(cudaEventCreateWithFlags(&ready_[me * 2 + h],
                                             cudaEventDisableTiming | cudaEventInterprocess),
                    where);
  RSDP_CUDA_CHECK(cudaEventCreateWithFlags(&switch_, cudaEventDisableTiming), where);

  IpcRecord rec;
  std::memset(&rec, 0, sizeof(rec));
  rec.magic = records::kIpcMagic;
  rec.version = records::kIpcVersion;
  rec.rank = me;
  rec.device = device_;
  rec.half = half_;
  RSDP_CUDA_CHECK(cudaDeviceGetPCIBusId(rec.bus_id, static_cast<int>(sizeof(rec.bus_id) - 1), device_),
                  where);
  cudaIpcMemHandle_t mem;
  RSDP_CUDA_CHECK(cudaIpcGetMemHandle(&mem, mine_), where);
  std::memcpy(rec.mem, &mem, sizeof(mem));
  for (int h = 0; h < 2; ++h) {
    cudaIpcEventHandle_t ev;
    RSDP_CUDA_CHECK(cudaIpcGetEventHandle(&ev, ready_[me * 2 + h]), where);
    std::memcpy(rec.events[h], &ev, sizeof(ev));
  }
  devices_[me] = device_;
  bus_ids_[me] = std::string(rec.bus_id, strnlen(rec.bus_id, sizeof(rec.bus_id)));
  if (n == 1) return;

  store_.set(record_key(g, me), records::encode_ipc(rec));
  published_ = true;
  std::vector<std::string> keys;
  for (int p = 0; p < n; ++p)
    if (p != me) keys.push_back(record_key(g, p));
  if (!store_.wait(keys, g.timeout)) {
    std::string missing;
    for (int p = 0; p < n; ++p)
      if (p != me && !store_.check(record_key(g, p)))
        missing += (missing.empty() ? "" : ", ") + g.who(p);
    RSDP_FAIL(ErrorKind::kTimeout, g.me(), ": ", timed_out_waiting(g.timeout.count()), " for ",
              missing, " to publish its CUDA-IPC staging buffer for group '",
              g.name, "' (did every rank of the node issue the same first collective on CUDA "
              "tensors?)");
  }

  std::vector<IpcRecord> recs(n);
  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    const std::string key = record_key(g, p);
    const std::string err = records::decode_ipc(store_.get(key), {key, p, g.who(p)}, recs[p]);
    RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), g.me(), ": CUDA-IPC setup of group '",
                    g.name, "': ", err);
    const IpcRecord& r = recs[p];
    RSDP_CHECK_KIND(ErrorKind::kSystem, r.half == half_, g.me(), ": ", g.who(p),
                    " has CUDA-IPC staging halves of ", r.half, " bytes, this rank ", half_,
                    " (do all ranks use the same RSDP_* settings?)");
    devices_[p] = r.device;
    bus_ids_[p] = std::string(r.bus_id, strnlen(r.bus_id, sizeof(r.bus_id)));
  }

  // Reachability first: a node whose GPUs cannot reach each other fails with
  // one clear message before anything is mapped.
  for (int p = 0; p < n; ++p) {
    if (p == me || bus_ids_[p] == bus_ids_[me]) continue;
    int dev = -1;
    if (cudaDeviceGetByPCIBusId(&dev, bus_ids_[p].c_str()) != cudaSuccess) {
      (void)cudaGetLastError();
      RSDP_FAIL(ErrorKind::kSystem, g.me(), ": ", g.who(p), " uses the GPU at PCI ", bus_ids_[p],
                " (its device ", devices_[p], "), which this process cannot see (is "
                "CUDA_VISIBLE_DEVICES restricted per process?). CUDA IPC needs every rank to see "
                "the GPUs of the node's other ranks; use the NCCL path for this group instead");
    }
    int can = 0;
    RSDP_CUDA_CHECK(cudaDeviceCanAccessPeer(&can, device_, dev), where);
    if (!can)
      RSDP_FAIL(ErrorKind::kSystem, g.me(), ": the GPU of this rank (device ", device_, ", PCI ",
                bus_ids_[me], ") and the GPU of ", g.who(p), " (PCI ", bus_ids_[p],
                ") cannot reach each other (no CUDA peer access between them), so CUDA IPC "
                "cannot serve this group; use the NCCL path instead");
    const cudaError_t e = cudaDeviceEnablePeerAccess(dev, 0);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      if (e != cudaErrorPeerAccessAlreadyEnabled)
        RSDP_FAIL(ErrorKind::kSystem, g.me(), ": cudaDeviceEnablePeerAccess(", dev,
                  ") failed: ", cudaGetErrorString(e), " (peer access from device ", device_,
                  " to the GPU of ", g.who(p), ", PCI ", bus_ids_[p], ")");
    }
  }

  for (int p = 0; p < n; ++p) {
    if (p == me) continue;
    void* ptr = nullptr;
    cudaIpcMemHandle_t mem;
    std::memcpy(&mem, recs[p].mem, sizeof(mem));
    RSDP_CUDA_CHECK(cudaIpcOpenMemHandle(&ptr, mem, cudaIpcMemLazyEnablePeerAccess),
                    "mapping the staging buffer of ", g.who(p), " (PCI ", bus_ids_[p], ") ",
                    where);
    peers_[p] = static_cast<char*>(ptr);
    for (int h = 0; h < 2; ++h) {
      cudaIpcEventHandle_t ev;
      std::memcpy(&ev, recs[p].events[h], sizeof(ev));
      RSDP_CUDA_CHECK(cudaIpcOpenEventHandle(&ready_[p * 2 + h], ev),
                      "opening an event of ", g.who(p), " ", where);
    }
  }
}

// [Note: releasing the staging buffer]
// A peer maps this rank's buffer; freeing it while a peer still has it mapped
// (or while a peer's queued kernel reads it) is undefined behaviour. So the
// release runs in this order:
//   1. wait (bounded) for the last stream to drain: our own queued work reads
//      the peers' buffers and writes ours;
//   2. unmap the peers' buffers and destroy all events, then tell the peers
//      through the store ("cuda-ipc-closed/<rank>");
//   3. wait (bounded) until every peer that could have mapped ours said the
//      same, then free ours.
// Every wait is bounded by min(group timeout, 10 s), so a dead peer delays
// teardown but never hangs it. If our stream does not drain (a peer died in
// the middle of an op and our stream waits for its event forever), nothing is
// unmapped or freed: cudaFree and cudaIpcCloseMemHandle may synchronise with
// that stream and block for good; the memory goes with the process.
void IpcComm::release() noexcept {
  const int n = size(), me = rank();
  int prev = -1;
  if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
  if (prev != device_) (void)cudaSetDevice(device_);
  (void)cudaGetLastError();
  const auto bound = release_wait(group());

  bool drained = true;
  if (has_stream_) {
    const auto end = Clock::now() + bound;
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e != cudaErrorNotReady) break;  // done, or an error nothing will fix
      if (Clock::now() >= end) {
        drained = false;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    (void)cudaGetLastError();
  }

  if (drained)
    for (int p = 0; p < n; ++p)
      if (p != me && peers_[p]) {
        (void)cudaIpcCloseMemHandle(peers_[p]);
        peers_[p] = nullptr;
      }
  for (auto& e : ready_)
    if (e) {
      (void)cudaEventDestroy(e);  // deferred by CUDA while a record is pending
      e = nullptr;
    }
  if (switch_) {
    (void)cudaEventDestroy(switch_);
    switch_ = nullptr;
  }

  if (drained && n > 1) {
    try {
      const Group& g = group();
      store_.set(closed_key(g, me), "1");
      if (published_) {
        // Only ranks that published a record can have mapped ours.
        std::vector<std::string> keys;
        for (int p = 0; p < n; ++p)
          if (p != me && store_.check(record_key(g, p))) keys.push_back(closed_key(g, p));
        if (!keys.empty()) (void)store_.wait(keys, bound);  // on timeout: free anyway
      }
    } catch (...) {
      // The store may already be gone at shutdown; free anyway.
    }
  }
  if (drained && mine_) (void)cudaFree(mine_);
  mine_ = nullptr;
  (void)cudaGetLastError();
  if (prev >= 0 && prev != device_) (void)cudaSetDevice(prev);
}

IpcComm::~IpcComm() { release(); }

int IpcComm::ranks_on_my_gpu() const {
  return static_cast<int>(std::count(bus_ids_.begin(), bus_ids_.end(), bus_ids_[rank()]));
}

void IpcComm::set_stream(cudaStream_t stream) {
  if (has_stream_ && stream != stream_) {
    // The halves' reuse argument needs one stream; order the new stream after
    // everything queued on the previous one.
    CudaDeviceScope scope(device_);
    const cudaError_t e = cudaEventRecord(switch_, stream_);
    if (e == cudaSuccess) {
      RSDP_CUDA_CHECK(cudaStreamWaitEvent(stream, switch_, 0), "(", group().me(),
                      ": a CUDA op on a new stream)");
    } else {
      // The previous stream is gone (destroyed by its owner): whatever it
      // still had queued finishes with the device.
      (void)cudaGetLastError();
      RSDP_CUDA_CHECK(cudaDeviceSynchronize(), "(", group().me(),
                      ": a CUDA op on a new stream after the previous one was destroyed)");
    }
  }
  stream_ = stream;
  has_stream_ = true;
}

void IpcComm::begin(OpDesc desc, std::chrono::milliseconds timeout) {
  RSDP_CHECK_KIND(ErrorKind::kSystem, has_stream_, group().me(), ": ", op_name(desc.kind),
                  ": internal error: CUDA-IPC op begun before set_stream()");
  desc.on_device = true;
  shm_.begin(desc, timeout);
}

void IpcComm::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  RSDP_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_), "(",
                  group().me(), ": ", desc().describe(), ", copying ", bytes, " bytes)");
}

void IpcComm::reduce_pass(void* dst, const void* const* srcs, int nsrc, size_t count, DType dt,
                          RedOp op, int divisor) {
  device_reduce_n(dst, srcs, nsrc, count, dt, op, divisor, stream_);
}

int IpcComm::max_reduce_srcs() const { return kMaxDeviceReduceSrcs; }

char* IpcComm::stage() { return mine_ + (step_ % 2) * half_; }

const char* IpcComm::peer(int p) const { return peers_[p] + ((step_ + 1) % 2) * half_; }

void IpcComm::exchange(size_t staged) {
  const int n = size(), me = rank();
  const uint32_t h = step_ % 2;
  if (n > 1)
    RSDP_CUDA_CHECK(cudaEventRecord(ready_[me * 2 + h], stream_), "(", group().me(), ": ",
                    shm_.desc().describe(), ")");
  shm_.exchange(staged);
  ++step_;
  for (int p = 0; p < n; ++p)
    if (p != me)
      RSDP_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_[p * 2 + h], 0), "(", group().me(),
                      ": ", shm_.desc().describe(), ", waiting for ", group().who(p), ")");
}

}  // namespace rsdp

// NcclComm: an NCCL communicator created through the group's store.
//
// [Note: why the communicator is non-blocking]
// A blocking communicator can keep the host inside NCCL with no way out:
// ncclCommInitRank waits for every rank, and the first collectives of a kind
// set up their connections lazily, waiting for the peers. A non-blocking one
// (config.blocking = 0) returns ncclInProgress from such calls instead; we
// poll ncclCommGetAsyncError until the state settles and abort the
// communicator once the timeout passes, so no call waits forever. NCCL fixes
// the mode at init, so "poll during init, block afterwards" is not possible.
// The price: NCCL launches every ungrouped call, and every group, from a
// helper thread, which costs a thread hand-off per call; small next to the
// large transfers this transport is for.
//
// Every NCCL failure poisons a non-blocking communicator (NCCL records it as
// the communicator's async error), and NCCL's documented recovery is
// ncclCommAbort, so any failure aborts it here and later calls are refused.
#include "transport/nccl/nccl_comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include "core/deadline.h"
#include "core/error.h"
#include "core/store_records.h"
#include "transport/nccl/nccl_redop_rule.h"

namespace rsdp {

static_assert(NCCL_UNIQUE_ID_BYTES == records::kNcclIdBytes,
              "the NCCL id record (core/store_records.h) carries a whole ncclUniqueId");

namespace {

ncclComm_t as_comm(void* p) { return static_cast<ncclComm_t>(p); }

// How a dtype travels: NCCL type and NCCL elements per rsdp element.
struct Wire {
  ncclDataType_t type;
  size_t per_elem;
};

Wire wire_of(DType dt) {
  switch (dt) {
    case DType::kFloat32: return {ncclFloat32, 1};
    case DType::kFloat64: return {ncclFloat64, 1};
    case DType::kFloat16: return {ncclFloat16, 1};
    case DType::kBFloat16: return {ncclBfloat16, 1};
    case DType::kInt8: return {ncclInt8, 1};
    case DType::kUInt8: return {ncclUint8, 1};
    case DType::kInt32: return {ncclInt32, 1};
    case DType::kInt64: return {ncclInt64, 1};
    case DType::kBool: return {ncclUint8, 1};  // torch bools are 0 or 1
    case DType::kComplex64: return {ncclFloat32, 2};
    case DType::kComplex128: return {ncclFloat64, 2};
  }
  return {ncclUint8, dtype_size(dt)};  // unreachable: bytes move any type
}

// The NCCL operator for (dt, op) on the wire type of dt; false if none.
// nccl_supports() is exactly this, so it agrees with what the calls accept.
bool op_of(DType dt, RedOp op, ncclRedOp_t* out) {
  if (!redop_supported(dt, op)) return false;
  if (dt == DType::kBool) {
    // On 0/1 bytes, MAX is OR and MIN is AND. XOR has no NCCL counterpart.
    switch (op) {
      case RedOp::kSum: case RedOp::kBor: case RedOp::kMax: *out = ncclMax; return true;
      case RedOp::kProduct: case RedOp::kBand: case RedOp::kMin: *out = ncclMin; return true;
      default: return false;
    }
  }
  if (dtype_is_complex(dt)) {
    // Component-wise on (re, im) pairs; redop_supported() allows only these.
    if (op == RedOp::kSum) { *out = ncclSum; return true; }
    if (op == RedOp::kAvg) { *out = ncclAvg; return true; }
    return false;
  }
  switch (op) {
    case RedOp::kSum: *out = ncclSum; return true;
    case RedOp::kAvg: *out = ncclAvg; return true;  // floating only (redop_supported)
    case RedOp::kProduct: *out = ncclProd; return true;
    case RedOp::kMin: *out = ncclMin; return true;
    case RedOp::kMax: *out = ncclMax; return true;
    case RedOp::kBand: case RedOp::kBor: case RedOp::kBxor: return false;  // NCCL has no bitwise ops
  }
  return false;
}

// The NCCL operator for (dt, op) on a communicator of `ranks` ranks: op_of()
// of the operator nccl_redop_for() picks (see [Note: no ncclAvg on a one-rank
// communicator] in nccl_redop_rule.h). Whether the pair is supported is asked
// of `op` itself, so every size accepts exactly what nccl_supports() does.
bool comm_op_of(DType dt, RedOp op, int ranks, ncclRedOp_t* out) {
  return op_of(dt, op, out) && op_of(dt, nccl_redop_for(op, ranks), out);
}

ErrorKind kind_of(ncclResult_t r) {
  return r == ncclRemoteError ? ErrorKind::kPeer : ErrorKind::kSystem;
}

// "unhandled system error (NCCL: <last error text>)". The last-error text is
// process-wide, so it is read right away, before anything else can replace it.
std::string describe(ncclResult_t r, ncclComm_t comm) {
  std::string s = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) s += std::string(" (NCCL: ") + last + ")";
  return s;
}

// Polls briefly at first (an ungrouped launch settles within microseconds),
// then backs off to 1 ms so a long wait does not burn a core.
class Backoff {
 public:
  void pause() {
    if (spins_ < 64) {
      ++spins_;
      std::this_thread::yield();
      return;
    }
    std::this_thread::sleep_for(sleep_);
    sleep_ = std::min(sleep_ * 2, std::chrono::microseconds(1000));
  }

 private:
  int spins_ = 0;
  std::chrono::microseconds sleep_{20};
};

// Current device set to `device` for a scope, restored afterwards.
class DeviceGuard {
 public:
  DeviceGuard(int device, const std::string& who) {
    cudaError_t e = cudaGetDevice(&prev_);
    if (e != cudaSuccess)
      RSDP_FAIL(ErrorKind::kSystem, who, ": cudaGetDevice failed: ", cudaGetErrorString(e));
    if (prev_ == device) return;
    e = cudaSetDevice(device);
    if (e != cudaSuccess)
      RSDP_FAIL(ErrorKind::kSystem, who, ": cudaSetDevice(", device,
                ") failed: ", cudaGetErrorString(e));
    restore_ = true;
  }
  ~DeviceGuard() {
    if (restore_) (void)cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool restore_ = false;
};

// Time left until `end`, at least 1 ms (a zero timeout may mean "forever" to
// the store).
std::chrono::milliseconds left_until(std::chrono::steady_clock::time_point end) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
      end - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

}  // namespace

bool nccl_supports(DType dt, RedOp op) {
  ncclRedOp_t unused;
  return op_of(dt, op, &unused);
}

std::string nccl_version() {
  int code = 0;
  ncclResult_t r = ncclGetVersion(&code);
  if (r != ncclSuccess)
    RSDP_FAIL(ErrorKind::kSystem, "ncclGetVersion failed: ", ncclGetErrorString(r));
  // NCCL_VERSION(): X*1000+Y*100+Z up to 2.8, X*10000+Y*100+Z from 2.9 on.
  int major, minor, patch = code % 100;
  if (code >= 10000) {
    major = code / 10000;
    minor = code / 100 % 100;
  } else {
    major = code / 1000;
    minor = code / 100 % 10;
  }
  return detail::cat(major, ".", minor, ".", patch);
}

NcclComm::NcclComm(const Group& g, Bootstrap& store, const std::vector<int>& ranks,
                   const std::string& tag, int device, std::chrono::milliseconds timeout)
    : ranks_(ranks), device_(device), group_me_(g.me()), tag_(tag), timeout_(timeout) {
  const auto start = std::chrono::steady_clock::now();
  const Deadline deadline(timeout);

  RSDP_CHECK(!ranks_.empty(), group_me_, ": NCCL communicator '", tag_, "' has no ranks");
  std::vector<bool> seen(static_cast<size_t>(std::max(g.size, 0)), false);
  for (size_t i = 0; i < ranks_.size(); ++i) {
    int r = ranks_[i];
    RSDP_CHECK(r >= 0 && r < g.size, group_me_, ": NCCL communicator '", tag_,
               "' names rank ", r, ", outside the group of size ", g.size);
    RSDP_CHECK(!seen[r], group_me_, ": NCCL communicator '", tag_, "' names ", g.who(r),
               " twice");
    seen[r] = true;
    if (r == g.rank) rank_ = static_cast<int>(i);
  }
  RSDP_CHECK(rank_ >= 0, group_me_, ": not among the ranks of NCCL communicator '", tag_, "'");
  comm_name_ = "rsdp:" + g.name + ":" + tag_;
  // NCCL binds the communicator to the current device. Set it first, so a
  // bad device fails before the root publishes an id the others would use.
  DeviceGuard on_device(device_, who());

  // NCCL rank 0 makes the id (its process then hosts NCCL's bootstrap root);
  // the others read it from the store.
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  const std::string key = g.key("nccl/" + tag_ + "/id");
  if (rank_ == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess)
      RSDP_FAIL(kind_of(r), who(), ": ncclGetUniqueId failed: ", describe(r, nullptr));
    if (size() > 1) {
      records::NcclId bytes;
      std::memcpy(bytes.data(), id.internal, bytes.size());
      store.set(key, records::encode_nccl_id(ranks_[0], bytes));
    }
  } else {
    auto wait_for = timeout.count() > 0 ? left_until(start + timeout) : timeout;
    RSDP_CHECK_KIND(ErrorKind::kTimeout, store.wait({key}, wait_for), who(),
                    ": ", timed_out_waiting(timeout.count()), " for ",
                    g.who(ranks_[0]), " to publish the unique id of NCCL communicator '",
                    tag_, "'");
    records::NcclId bytes;
    const std::string err =
        records::decode_nccl_id(store.get(key), {key, ranks_[0], g.who(ranks_[0])}, bytes);
    RSDP_CHECK_KIND(ErrorKind::kSystem, err.empty(), who(), ": creating NCCL communicator '",
                    tag_, "': ", err);
    std::memcpy(id.internal, bytes.data(), bytes.size());
  }

  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // see [Note: why the communicator is non-blocking]
  config.commName = comm_name_.c_str();
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size(), id, rank_, &config);
  Backoff backoff;
  while (r == ncclInProgress) {
    backoff.pause();
    ncclResult_t state = ncclInProgress;
    ncclResult_t q = ncclCommGetAsyncError(comm, &state);
    r = q != ncclSuccess ? q : state;
    if (r == ncclInProgress && deadline.expired()) {
      (void)ncclCommAbort(comm);  // stops NCCL's init thread
      std::string members;
      const size_t shown = std::min<size_t>(ranks_.size(), 8);
      for (size_t i = 0; i < shown; ++i) members += (i ? ", " : "") + g.who(ranks_[i]);
      if (shown < ranks_.size()) members += ", ...";
      RSDP_FAIL(ErrorKind::kTimeout, who(), ": NCCL initialization: ",
                timed_out_waiting(timeout.count()), "; is every one of its ", size(), " ranks (",
                members, ") creating communicator '", tag_, "'?");
    }
  }
  if (r != ncclSuccess) {
    std::string msg = describe(r, comm);
    if (comm) (void)ncclCommAbort(comm);
    RSDP_FAIL(kind_of(r), who(), ": NCCL initialization failed: ", msg);
  }
  comm_ = comm;
}

NcclComm::~NcclComm() {
  try {
    std::lock_guard<std::mutex> lk(mu_);
    if (!comm_ || aborted_) return;
    if (group_depth_ > 0 || abort_requested_) {
      // A half-built batch cannot be finalized cleanly.
      close_group();
      group_depth_ = 0;  // abort now rather than leak the communicator
      abort_locked(ErrorKind::kPeer, who() + ": destroyed inside an open group");
      return;
    }
    int prev = -1;
    bool restore = cudaGetDevice(&prev) == cudaSuccess && prev != device_ &&
                   cudaSetDevice(device_) == cudaSuccess;
    // Finalize (flush outstanding work) under the deadline; only then is
    // ncclCommDestroy a purely local, non-blocking free. Anything else aborts.
    ncclComm_t comm = as_comm(comm_);
    ncclResult_t r = ncclCommFinalize(comm);
    const Deadline deadline(timeout_);
    Backoff backoff;
    while (r == ncclInProgress && !deadline.expired()) {
      backoff.pause();
      ncclResult_t state = ncclInProgress;
      ncclResult_t q = ncclCommGetAsyncError(comm, &state);
      r = q != ncclSuccess ? q : state;
    }
    if (r == ncclSuccess)
      (void)ncclCommDestroy(comm);
    else
      (void)ncclCommAbort(comm);
    comm_ = nullptr;
    if (restore) (void)cudaSetDevice(prev);
  } catch (...) {
  }
}

std::string NcclComm::who() const {
  return detail::cat(group_me_, " [NCCL communicator '", tag_, "', NCCL rank ", rank_, " of ",
                     size(), ", cuda:", device_, "]");
}

std::string NcclComm::refused(const char* call) const {
  return detail::cat(who(), ": ", call, " refused: the communicator was aborted (", broken_,
                     "); create a new one");
}

std::unique_lock<std::mutex> NcclComm::enter(const char* call) {
  std::unique_lock<std::mutex> lk(mu_);
  if (abort_requested_) {
    // abort() came from another thread while this thread's group was open.
    close_group();
    abort_locked(broken_kind_, broken_);
  }
  if (aborted_) throw Error(broken_kind_, refused(call));
  return lk;
}

// Completes a call that returned `result`: waits out ncclInProgress (not
// inside a group: there ncclGroupEnd launches the batch and is waited for),
// and turns a failure into an error.
void NcclComm::settle(std::unique_lock<std::mutex>& lk, int result, const char* call) {
  auto r = static_cast<ncclResult_t>(result);
  if (r == ncclInProgress && group_depth_ == 0) {
    const Deadline deadline(timeout_);
    Backoff backoff;
    for (;;) {
      ncclResult_t state = ncclInProgress;
      ncclResult_t q = ncclCommGetAsyncError(as_comm(comm_), &state);
      if (q != ncclSuccess) {
        r = q;
        call = "ncclCommGetAsyncError";
        break;
      }
      if (state != ncclInProgress) {
        r = state;
        break;
      }
      if (deadline.expired()) {
        std::string msg = detail::cat(
            who(), ": ", call, " did not complete on the host: ",
            timed_out_waiting(timeout_.count()),
            " (NCCL was still setting up; a peer may be missing, hung or dead)");
        abort_locked(ErrorKind::kTimeout, msg);
        throw Error(ErrorKind::kTimeout, msg + "; the communicator was aborted");
      }
      // Let a watchdog's abort() or check_async() in while we wait.
      lk.unlock();
      backoff.pause();
      lk.lock();
      if (aborted_) throw Error(broken_kind_, refused(call));
    }
  }
  if (r != ncclSuccess && r != ncclInProgress) fail(r, call);
}

void NcclComm::fail(int result, const char* call) {
  auto r = static_cast<ncclResult_t>(result);
  std::string msg = detail::cat(who(), ": ", call, " failed: ", describe(r, as_comm(comm_)));
  close_group();
  abort_locked(kind_of(r), msg);
  throw Error(kind_of(r), msg + "; the communicator was aborted");
}

void NcclComm::reject(ErrorKind kind, const std::string& msg) {
  if (group_depth_ > 0) {
    // Earlier calls of the batch are queued and cannot be taken back; the
    // peers would wait for the missing ones.
    close_group();
    abort_locked(kind, msg);
    throw Error(kind, msg + " (inside an NCCL group that cannot be completed: the "
                            "communicator was aborted)");
  }
  throw Error(kind, msg);
}

// Closes the groups this thread opened (NCCL's group state is per thread).
// NCCL drops a batch whose calls failed, and launches one that did not;
// the abort that always follows stops it.
void NcclComm::close_group() {
  if (group_depth_ > 0 && std::this_thread::get_id() != group_thread_) return;
  while (group_depth_ > 0) {
    --group_depth_;
    (void)ncclGroupEnd();
  }
}

void NcclComm::abort_locked(ErrorKind kind, const std::string& why) {
  if (broken_.empty()) {
    broken_ = why;
    broken_kind_ = kind;
  }
  if (!comm_ || aborted_) return;
  if (group_depth_ > 0) {
    abort_requested_ = true;  // the group's thread aborts at its next call
    return;
  }
  abort_requested_ = false;
  (void)ncclCommAbort(as_comm(comm_));
  aborted_ = true;
}

void NcclComm::abort() {
  std::lock_guard<std::mutex> lk(mu_);
  if (group_depth_ > 0 && std::this_thread::get_id() == group_thread_) close_group();
  abort_locked(ErrorKind::kPeer, who() + ": abort() was called");
}

void NcclComm::check_async() {
  std::lock_guard<std::mutex> lk(mu_);
  if (aborted_ || abort_requested_) throw Error(broken_kind_, refused("check_async"));
  // Mid-group nothing has been launched; this may also be a watchdog thread,
  // which must not touch the group.
  if (group_depth_ > 0) return;
  ncclResult_t state = ncclSuccess;
  ncclResult_t q = ncclCommGetAsyncError(as_comm(comm_), &state);
  if (q != ncclSuccess) fail(q, "ncclCommGetAsyncError");
  if (state != ncclSuccess && state != ncclInProgress)
    fail(state, "an earlier NCCL operation (reported asynchronously)");
}

namespace {

// Element count on the wire; complex types double it.
bool wire_count(size_t count, const Wire& w, size_t* out) {
  if (w.per_elem > 1 && count > std::numeric_limits<size_t>::max() / w.per_elem) return false;
  *out = count * w.per_elem;
  return true;
}

}  // namespace

#define RSDP_NCCL_ARG(cond, ...) \
  do {                           \
    if (!(cond)) reject(ErrorKind::kValue, detail::cat(who(), ": ", __VA_ARGS__)); \
  } while (0)

void NcclComm::allreduce(const void* in, void* out, size_t count, DType dt, RedOp op,
                         cudaStream_t s) {
  auto lk = enter("allreduce");
  ncclRedOp_t nop = ncclSum;
  RSDP_NCCL_ARG(comm_op_of(dt, op, size(), &nop), "allreduce: NCCL cannot reduce ",
                dtype_name(dt), " with ", redop_name(op));
  const Wire w = wire_of(dt);
  size_t n = 0;
  RSDP_NCCL_ARG(wire_count(count, w, &n), "allreduce: count ", count, " is too large");
  RSDP_NCCL_ARG(count == 0 || (in && out), "allreduce: null buffer");
  settle(lk, ncclAllReduce(in, out, n, w.type, nop, as_comm(comm_), s), "ncclAllReduce");
}

void NcclComm::broadcast(const void* in, void* out, size_t count, DType dt, int root,
                         cudaStream_t s) {
  auto lk = enter("broadcast");
  RSDP_NCCL_ARG(root >= 0 && root < size(), "broadcast: root ", root, " is not an NCCL rank of ",
                size());
  const Wire w = wire_of(dt);
  size_t n = 0;
  RSDP_NCCL_ARG(wire_count(count, w, &n), "broadcast: count ", count, " is too large");
  // The input matters only on the root.
  RSDP_NCCL_ARG(count == 0 || ((in || rank_ != root) && out), "broadcast: null buffer");
  settle(lk, ncclBroadcast(in, out, n, w.type, root, as_comm(comm_), s), "ncclBroadcast");
}

void NcclComm::reduce(const void* in, void* out, size_t count, DType dt, RedOp op, int root,
                      cudaStream_t s) {
  auto lk = enter("reduce");
  ncclRedOp_t nop = ncclSum;
  RSDP_NCCL_ARG(comm_op_of(dt, op, size(), &nop), "reduce: NCCL cannot reduce ",
                dtype_name(dt), " with ", redop_name(op));
  RSDP_NCCL_ARG(root >= 0 && root < size(), "reduce: root ", root, " is not an NCCL rank of ",
                size());
  const Wire w = wire_of(dt);
  size_t n = 0;
  RSDP_NCCL_ARG(wire_count(count, w, &n), "reduce: count ", count, " is too large");
  // The output matters only on the root.
  RSDP_NCCL_ARG(count == 0 || (in && (out || rank_ != root)), "reduce: null buffer");
  settle(lk, ncclReduce(in, out, n, w.type, nop, root, as_comm(comm_), s), "ncclReduce");
}

void NcclComm::allgather(const void* in, void* out, size_t count, DType dt, cudaStream_t s) {
  auto lk = enter("allgather");
  const Wire w = wire_of(dt);
  size_t n = 0;
  RSDP_NCCL_ARG(wire_count(count, w, &n), "allgather: count ", count, " is too large");
  RSDP_NCCL_ARG(count == 0 || (in && out), "allgather: null buffer");
  // Rank-major blocks of count elements are rank-major blocks of n wire elements.
  settle(lk, ncclAllGather(in, out, n, w.type, as_comm(comm_), s), "ncclAllGather");
}

void NcclComm::reduce_scatter(const void* in, void* out, size_t count, DType dt, RedOp op,
                              cudaStream_t s) {
  auto lk = enter("reduce_scatter");
  ncclRedOp_t nop = ncclSum;
  RSDP_NCCL_ARG(comm_op_of(dt, op, size(), &nop), "reduce_scatter: NCCL cannot reduce ",
                dtype_name(dt), " with ", redop_name(op));
  const Wire w = wire_of(dt);
  size_t n = 0;
  RSDP_NCCL_ARG(wire_count(count, w, &n), "reduce_scatter: count ", count, " is too large");
  RSDP_NCCL_ARG(count == 0 || (in && out), "reduce_scatter: null buffer");
  settle(lk, ncclReduceScatter(in, out, n, w.type, nop, as_comm(comm_), s),
         "ncclReduceScatter");
}

void NcclComm::send(const void* buf, size_t bytes, int peer, cudaStream_t s) {
  auto lk = enter("send");
  RSDP_NCCL_ARG(peer >= 0 && peer < size(), "send: peer ", peer, " is not an NCCL rank of ",
                size());
  RSDP_NCCL_ARG(bytes == 0 || buf, "send: null buffer");
  settle(lk, ncclSend(buf, bytes, ncclUint8, peer, as_comm(comm_), s), "ncclSend");
}

void NcclComm::recv(void* buf, size_t bytes, int peer, cudaStream_t s) {
  auto lk = enter("recv");
  RSDP_NCCL_ARG(peer >= 0 && peer < size(), "recv: peer ", peer, " is not an NCCL rank of ",
                size());
  RSDP_NCCL_ARG(bytes == 0 || buf, "recv: null buffer");
  settle(lk, ncclRecv(buf, bytes, ncclUint8, peer, as_comm(comm_), s), "ncclRecv");
}

#undef RSDP_NCCL_ARG

void NcclComm::group_start() {
  auto lk = enter("group_start");
  RSDP_CHECK(group_depth_ == 0 || std::this_thread::get_id() == group_thread_, who(),
             ": group_start() while another thread has a group open");
  ncclResult_t r = ncclGroupStart();
  if (r != ncclSuccess) fail(r, "ncclGroupStart");
  if (group_depth_++ == 0) group_thread_ = std::this_thread::get_id();
}

void NcclComm::group_end() {
  // Not enter(): the group must be closed even when an abort is pending.
  std::unique_lock<std::mutex> lk(mu_);
  if (group_depth_ == 0) {
    if (aborted_) throw Error(broken_kind_, refused("group_end"));
    RSDP_FAIL(ErrorKind::kValue, who(), ": group_end() without group_start()");
  }
  RSDP_CHECK(std::this_thread::get_id() == group_thread_, who(),
             ": group_end() from a thread other than the one that called group_start()");
  --group_depth_;
  ncclResult_t r = ncclGroupEnd();
  if (abort_requested_ && group_depth_ == 0) {
    abort_locked(broken_kind_, broken_);
    throw Error(broken_kind_, refused("group_end"));
  }
  settle(lk, r, "ncclGroupEnd");
}

}  // namespace rsdp

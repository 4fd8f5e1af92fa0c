// See ucx_worker.h.
#include "transport/ucx/ucx_worker.h"

#include <poll.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "core/deadline.h"
#include "core/error.h"

namespace rsdp {

std::string ucx_status_text(ucs_status_t s) {
  return detail::cat(ucs_status_string(s), " (UCX status ", static_cast<int>(s), ")");
}

namespace {

// True when UCX_TLS allows only TCP besides same-host transports.
bool tcp_only_tls() {
  const char* tls = getenv("UCX_TLS");
  if (!tls || !*tls) return false;
  static const char* kHostOnly[] = {"self", "sm", "shm", "posix", "sysv", "cma", "knem", "xpmem"};
  bool tcp = false;
  std::string list(tls);
  size_t start = 0;
  while (start <= list.size()) {
    size_t end = list.find(',', start);
    std::string t = list.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (t == "tcp") {
      tcp = true;
    } else if (std::none_of(std::begin(kHostOnly), std::end(kHostOnly),
                            [&](const char* h) { return t == h; })) {
      return false;
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return tcp;
}

}  // namespace

UcxContext::UcxContext(const std::string& who, int estimated_eps) {
  // Nagle's algorithm on a TCP link makes a header followed by its payload
  // wait for the peer's delayed ACK, so it must be off. The tcp transport
  // reads it from UCX_TCP_NODELAY (its config table, prefix TCP_): that works
  // in every UCX version. ucp_config_modify(config, "TCP_NODELAY", ...) does
  // not: UCX 1.13 (Debian's) matches transport keys without their prefix and
  // printed "UCX WARN invalid configuration: TCP_NODELAY=y" at every start.
  // Set before the first UCX config read; a user's own value wins.
  setenv("UCX_TCP_NODELAY", "y", /*overwrite=*/0);
  // UCX 1.13 (Debian's) aborts the process in uct_tcp_iface_handle_events
  // ("Assertion `ep->conn_state != UCT_TCP_EP_CONN_STATE_CLOSED' failed")
  // when it meets an event of an endpoint already closed (later UCX releases
  // check it in debug builds only): seen, now and then under load, on a rank
  // telling the other nodes of a failure while their connections closed. An
  // earlier event of the same epoll batch can close that endpoint; with one
  // event per poll none can, and UcxWorker::progress() polls until nothing is
  // left, so nothing waits longer and the bandwidth is the same.
  setenv("UCX_TCP_MAX_POLL", "1", /*overwrite=*/0);
  ucp_config_t* config = nullptr;
  ucs_status_t s = ucp_config_read(nullptr, nullptr, &config);
  RSDP_CHECK_KIND(ErrorKind::kSystem, s == UCS_OK, who,
                  ": cannot read the UCX configuration (check the UCX_* environment "
                  "variables): ",
                  ucx_status_text(s));
  // Over TCP, UCX's rendezvous protocol fetches large messages in request /
  // response fragments, which stall whenever queueing delay on the link
  // grows: concurrent rails on one link then move well under the link rate,
  // while eager sends keep up with a plain TCP stream. So on TCP-only
  // transports every size goes eager, unless the user chose a threshold.
  if (tcp_only_tls() && !getenv("UCX_RNDV_THRESH")) ucp_config_modify(config, "RNDV_THRESH", "inf");
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED |
                      UCP_PARAM_FIELD_ESTIMATED_NUM_EPS | UCP_PARAM_FIELD_NAME;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  // Two workers, each driven by its own thread, share the context.
  params.mt_workers_shared = 1;
  params.estimated_num_eps = static_cast<size_t>(estimated_eps > 0 ? estimated_eps : 1);
  params.name = "torch_rsdp";
  s = ucp_init(&params, config, &ctx_);
  ucp_config_release(config);
  RSDP_CHECK_KIND(ErrorKind::kSystem, s == UCS_OK, who,
                  ": cannot initialise UCX (is a transport available? UCX_TLS='",
                  getenv("UCX_TLS") ? getenv("UCX_TLS") : "", "'): ", ucx_status_text(s));
}

UcxContext::~UcxContext() {
  if (ctx_) ucp_cleanup(ctx_);
}

UcxWorker::UcxWorker(const UcxContext& ctx, const std::string& who) : who_(who) {
  ucp_worker_params_t wp{};
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // One thread at a time, but not always the same OS thread (collectives run
  // on whichever thread calls them), which SINGLE would not allow.
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t s = ucp_worker_create(ctx.get(), &wp, &worker_);
  RSDP_CHECK_KIND(ErrorKind::kSystem, s == UCS_OK, who, ": cannot create a UCX worker: ",
                  ucx_status_text(s));
  s = ucp_worker_get_efd(worker_, &efd_);
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  if (s == UCS_OK) s = ucp_worker_get_address(worker_, &addr, &len);
  if (s != UCS_OK) {
    ucp_worker_destroy(worker_);
    RSDP_FAIL(ErrorKind::kSystem, who, ": cannot set up a UCX worker: ", ucx_status_text(s));
  }
  address_.assign(reinterpret_cast<const char*>(addr), len);
  ucp_worker_release_address(worker_, addr);
}

UcxWorker::~UcxWorker() {
  if (worker_) ucp_worker_destroy(worker_);  // also closes efd_, which UCX owns
}

bool UcxWorker::progress() {
  bool any = false;
  while (ucp_worker_progress(worker_) != 0) any = true;
  return any;
}

void UcxWorker::sleep(int ms) {
  // arm() says BUSY when events arrived since the last progress: then the fd
  // may never fire for them, so return and let the caller progress.
  ucs_status_t s = ucp_worker_arm(worker_);
  if (s == UCS_ERR_BUSY) return;
  if (s != UCS_OK) {
    // Cannot arm (should not happen): fall back to a short nap.
    struct timespec ts {0, 1000000};
    nanosleep(&ts, nullptr);
    return;
  }
  struct pollfd p {efd_, POLLIN, 0};
  int r = poll(&p, 1, ms);
  (void)r;  // EINTR or timeout: the caller re-checks its conditions anyway
}

void UcxWorker::signal() { ucp_worker_signal(worker_); }

ucp_ep_h UcxWorker::connect(const std::string& remote_address, ucp_err_handler_cb_t on_error,
                            void* arg) {
  ucp_ep_params_t ep{};
  ep.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                  UCP_EP_PARAM_FIELD_ERR_HANDLER;
  ep.address = reinterpret_cast<const ucp_address_t*>(remote_address.data());
  ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  ep.err_handler.cb = on_error;
  ep.err_handler.arg = arg;
  ucp_ep_h h = nullptr;
  ucs_status_t s = ucp_ep_create(worker_, &ep, &h);
  RSDP_CHECK_KIND(ErrorKind::kPeer, s == UCS_OK, who_, ": ", ucx_status_text(s));
  return h;
}

namespace {

// Progress until `req` (a status pointer) completed or `dl` expired; frees it.
void finish_request(UcxWorker& w, ucs_status_ptr_t req, const Deadline& dl) {
  if (!UCS_PTR_IS_PTR(req)) return;
  while (ucp_request_check_status(req) == UCS_INPROGRESS && !dl.expired())
    if (!w.progress()) w.sleep(5);
  ucp_request_free(req);  // if still running, UCX finishes it on its own
}

}  // namespace

void UcxWorker::close_endpoints(const std::vector<Closing>& eps,
                                std::chrono::milliseconds bound) {
  Deadline dl(bound);
  std::vector<ucs_status_ptr_t> reqs;
  for (const Closing& c : eps) {
    if (!*c.ep || !c.flush) continue;
    ucp_request_param_t fp{};
    ucs_status_ptr_t r = ucp_ep_flush_nbx(*c.ep, &fp);
    if (UCS_PTR_IS_PTR(r)) reqs.push_back(r);
  }
  if (!reqs.empty()) {
    Deadline flush_dl(std::max(std::chrono::milliseconds(1),
                               std::min(bound / 4, std::chrono::milliseconds(200))));
    for (auto r : reqs) finish_request(*this, r, flush_dl);
    reqs.clear();
  }
  for (const Closing& c : eps) {
    if (!*c.ep) continue;
    ucp_request_param_t cp{};
    cp.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    cp.flags = UCP_EP_CLOSE_FLAG_FORCE;
    reqs.push_back(ucp_ep_close_nbx(*c.ep, &cp));
    *c.ep = nullptr;
  }
  for (auto r : reqs) finish_request(*this, r, dl);
}

}  // namespace rsdp

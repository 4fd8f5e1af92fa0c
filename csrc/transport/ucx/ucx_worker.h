// Thin RAII owners of the UCX objects NetComm needs (context, worker,
// endpoints), plus the two ways of waiting on a worker. They exist so that the
// collective and point-to-point engines share one careful implementation of
// the awkward parts: sleeping on the worker's event fd without losing a
// wake-up, and closing endpoints without hanging on a dead peer.
//
// None of this is thread-safe except UcxWorker::signal(): a worker belongs to
// one thread at a time.
#pragma once

#include <ucp/api/ucp.h>

#include <chrono>
#include <string>
#include <vector>

namespace rsdp {

// "Connection reset by remote peer" etc.
std::string ucx_status_text(ucs_status_t s);

class UcxContext {
 public:
  // `who` prefixes error messages (group.me()). Reads UCX_* from the
  // environment (UCX_TLS, UCX_NET_DEVICES, ...).
  UcxContext(const std::string& who, int estimated_eps);
  ~UcxContext();
  UcxContext(const UcxContext&) = delete;
  UcxContext& operator=(const UcxContext&) = delete;
  ucp_context_h get() const { return ctx_; }

 private:
  ucp_context_h ctx_ = nullptr;
};

class UcxWorker {
 public:
  UcxWorker(const UcxContext& ctx, const std::string& who);
  ~UcxWorker();  // endpoints must have been closed (close_endpoints)
  UcxWorker(const UcxWorker&) = delete;
  UcxWorker& operator=(const UcxWorker&) = delete;

  ucp_worker_h get() const { return worker_; }
  const std::string& address() const { return address_; }

  // Runs ucp_worker_progress until it has nothing more to do; true if it
  // did anything.
  bool progress();
  // Sleeps until the worker has an event, signal() is called, or `ms`
  // passed. Call only after progress() returned false.
  void sleep(int ms);
  // Wakes a sleep() from any thread.
  void signal();

  // Endpoint to a remote worker address with peer error handling: `on_error`
  // runs (inside progress()) when UCX gives up on the peer.
  ucp_ep_h connect(const std::string& remote_address, ucp_err_handler_cb_t on_error, void* arg);
  // Force-closes every non-null endpoint (a dead peer cannot delay it), sets
  // them to null and progresses until the closes finished, all within
  // `bound`. Outstanding sends on them complete with an error. Endpoints
  // marked `flush` first get a short, bounded chance to send what is already
  // queued (e.g. the last rendezvous messages); only those that carried
  // traffic should be: flushing an endpoint still being wired up would make
  // UCX connect to a peer that may be gone already.
  struct Closing {
    ucp_ep_h* ep;
    bool flush;
  };
  void close_endpoints(const std::vector<Closing>& eps, std::chrono::milliseconds bound);

 private:
  std::string who_;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::string address_;
};

}  // namespace rsdp

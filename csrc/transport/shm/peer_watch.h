// Tells whether peer processes are still alive, so a rank waiting on a peer
// that was SIGKILLed raises at once instead of at the deadline. Uses pidfds,
// which (unlike kill(pid, 0)) also report a zombie that its parent has not
// reaped yet as dead.
#pragma once

#include <vector>

namespace rsdp {

class PeerWatch {
 public:
  explicit PeerWatch(const std::vector<int>& pids, int self);
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  bool alive(int peer) const;

 private:
  std::vector<int> pids_;
  std::vector<int> fds_;  // -1 where no pidfd could be opened
};

}  // namespace rsdp

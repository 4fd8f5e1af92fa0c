#include "transport/shm/peer_watch.h"

#include <poll.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <fstream>
#include <string>

namespace rsdp {
namespace {

int pidfd_open_compat(int pid) {
#ifdef SYS_pidfd_open
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#else
  (void)pid;
  errno = ENOSYS;
  return -1;
#endif
}

// Fallback without pidfds: the process exists and is not a zombie.
bool alive_by_proc(int pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(f, line)) return true;  // other pid namespace: cannot tell
  auto close_paren = line.rfind(')');
  return close_paren == std::string::npos || close_paren + 2 >= line.size() ||
         line[close_paren + 2] != 'Z';
}

}  // namespace

PeerWatch::PeerWatch(const std::vector<int>& pids, int self) : pids_(pids) {
  fds_.assign(pids.size(), -1);
  for (size_t i = 0; i < pids.size(); ++i)
    if (static_cast<int>(i) != self && pids[i] != getpid()) fds_[i] = pidfd_open_compat(pids[i]);
}

PeerWatch::~PeerWatch() {
  for (int fd : fds_)
    if (fd >= 0) close(fd);
}

bool PeerWatch::alive(int peer) const {
  if (pids_[peer] == getpid()) return true;
  int fd = fds_[peer];
  if (fd < 0) return alive_by_proc(pids_[peer]);
  pollfd p{fd, POLLIN, 0};
  int r = poll(&p, 1, 0);
  return !(r > 0 && (p.revents & POLLIN));  // readable pidfd = process exited
}

}  // namespace rsdp

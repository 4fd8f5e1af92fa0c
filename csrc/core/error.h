// The project's one error type. Code below csrc/backend throws rsdp::Error; the
// c10d glue turns it into the matching c10 exception (ValueError, DistBackendError,
// ...) so Python sees an ordinary RuntimeError/ValueError with the message intact.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace rsdp {

enum class ErrorKind {
  kValue,     // bad argument; raised before any communication
  kMismatch,  // ranks disagree about an op; the group stays usable
  kTimeout,   // a deadline passed; the group is unusable afterwards
  kPeer,      // a peer process died; the group is unusable afterwards
  kSystem,    // an OS call failed (shm, mmap, ...)
};

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, const std::string& msg) : std::runtime_error(msg), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

namespace detail {
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
}  // namespace detail

[[noreturn]] inline void throw_error(ErrorKind kind, const std::string& msg) {
  throw Error(kind, msg);
}

// The words of a timeout, as gloo and NCCL put them ("Timed out waiting
// 1000ms"): torch's own tests and users' scripts match "Timed out" / "timeout".
// e.g. "barrier() as collective #1: timeout: Timed out waiting 1000ms for rank 2".
inline std::string timed_out_waiting(long long ms) {
  return detail::cat("timeout: Timed out waiting ", ms, "ms");
}

// errno text for a failed system call, e.g. sys_error("shm_open /rsdp-..").
std::string errno_text(int err);

}  // namespace rsdp

#define RSDP_CHECK_KIND(kind, cond, ...)                                   \
  do {                                                                     \
    if (!(cond)) ::rsdp::throw_error(kind, ::rsdp::detail::cat(__VA_ARGS__)); \
  } while (0)

// A bad argument: ValueError in Python.
#define RSDP_CHECK(cond, ...) RSDP_CHECK_KIND(::rsdp::ErrorKind::kValue, cond, __VA_ARGS__)

#define RSDP_FAIL(kind, ...) ::rsdp::throw_error(kind, ::rsdp::detail::cat(__VA_ARGS__))

// A failed system call: appends strerror(errno).
#define RSDP_SYSCHECK(cond, ...)                                                  \
  do {                                                                            \
    if (!(cond)) {                                                                \
      int rsdp_errno_ = errno;                                                    \
      ::rsdp::throw_error(::rsdp::ErrorKind::kSystem,                             \
                          ::rsdp::detail::cat(__VA_ARGS__, ": ",                  \
                                              ::rsdp::errno_text(rsdp_errno_)));  \
    }                                                                             \
  } while (0)

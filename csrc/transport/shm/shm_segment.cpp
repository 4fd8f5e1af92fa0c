#include "transport/shm/shm_segment.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <utility>

#include "core/error.h"

namespace rsdp {
namespace {

void* map_fd(int fd, size_t bytes, const std::string& name) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    close(fd);
    RSDP_FAIL(ErrorKind::kSystem, "rsdp: mmap of shared memory ", name, " (", bytes,
              " bytes) failed: ", errno_text(err));
  }
  close(fd);
  return p;
}

}  // namespace

ShmSegment::~ShmSegment() {
  if (addr_) munmap(addr_, bytes_);
}

ShmSegment::ShmSegment(ShmSegment&& o) noexcept
    : addr_(std::exchange(o.addr_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}

ShmSegment& ShmSegment::operator=(ShmSegment&& o) noexcept {
  if (this != &o) {
    if (addr_) munmap(addr_, bytes_);
    addr_ = std::exchange(o.addr_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

ShmSegment ShmSegment::create(const std::string& name, size_t bytes, size_t reserve) {
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  RSDP_SYSCHECK(fd >= 0, "rsdp: shm_open(", name, ", O_CREAT|O_EXCL) failed");
  int err = ftruncate(fd, static_cast<off_t>(bytes)) == 0
                ? posix_fallocate(fd, 0, static_cast<off_t>(reserve ? reserve : bytes))
                : errno;
  if (err != 0) {
    close(fd);
    shm_unlink(name.c_str());
    RSDP_FAIL(ErrorKind::kSystem, "rsdp: cannot reserve ", bytes, " bytes of shared memory for ",
              name, ": ", errno_text(err),
              ". /dev/shm is too small: enlarge it (e.g. docker --shm-size) or lower "
              "RSDP_SHM_BYTES");
  }
  ShmSegment s;
  try {
    s.addr_ = map_fd(fd, bytes, name);
  } catch (...) {
    shm_unlink(name.c_str());
    throw;
  }
  s.bytes_ = bytes;
  return s;
}

ShmSegment ShmSegment::open(const std::string& name, size_t bytes) {
  int fd = shm_open(name.c_str(), O_RDWR, 0600);
  RSDP_SYSCHECK(fd >= 0, "rsdp: shm_open(", name, ") failed");
  struct stat st;
  if (fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) != bytes) {
    close(fd);
    RSDP_FAIL(ErrorKind::kSystem, "rsdp: shared memory ", name, " has ",
              static_cast<long long>(st.st_size), " bytes, expected ", bytes,
              " (do all ranks use the same RSDP_SHM_BYTES / RSDP_P2P_BYTES?)");
  }
  ShmSegment s;
  s.addr_ = map_fd(fd, bytes, name);
  s.bytes_ = bytes;
  return s;
}

ShmSegment ShmSegment::anonymous(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  RSDP_SYSCHECK(p != MAP_FAILED, "rsdp: mmap of ", bytes, " private bytes failed");
  ShmSegment s;
  s.addr_ = p;
  s.bytes_ = bytes;
  return s;
}

void ShmSegment::unlink(const std::string& name) { shm_unlink(name.c_str()); }

std::string ShmSegment::random_name() {
  unsigned long long nonce = 0;
  ssize_t got = getrandom(&nonce, sizeof(nonce), 0);
  RSDP_SYSCHECK(got == static_cast<ssize_t>(sizeof(nonce)), "rsdp: getrandom failed");
  char buf[40];
  std::snprintf(buf, sizeof(buf), "/rsdp-%016llx", nonce);
  return buf;
}

}  // namespace rsdp

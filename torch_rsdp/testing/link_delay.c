/* The delaying half of an emulated node link: frames read from one TAP device are written
 * to its partner after a fixed delay, in both directions, for every link of an EmulatedNodes
 * instance (torch_rsdp/testing/netns.py builds this file and starts it when a delay is asked
 * for).
 *
 *     link_delay DELAY_NS MTU FD_A0 FD_B0 [FD_A1 FD_B1 ...]
 *
 * Each pair is one node link: A is the TAP inside the node's namespace, B its partner on the
 * switch's bridge. A frame read from A leaves on B DELAY_NS later, and one read from B leaves
 * on A, so a message between two nodes crosses the delay twice, as it would cross two cables.
 *
 * Why a program and not the kernel's netem: netem is a build option that some kernels leave
 * out, and a delay that exists on one host and not another is not a test. Why C: a frame
 * costs two system calls here and nothing more, so at the emulated link rates the relay stays
 * far from being the bottleneck, and its own latency is a few microseconds against delays of
 * hundreds.
 *
 * The delay is the same for every frame, so each direction is a FIFO: a frame's departure is
 * its arrival plus the delay, and departures come out in arrival order. One timerfd is armed
 * at the earliest departure over all directions. A full queue drops the frame, as a NIC's
 * full queue would (TCP recovers); the tbf on each TAP keeps the queue short in practice.
 * The relay ends when its parent does (PR_SET_PDEATHSIG) or on SIGTERM; closing the TAP file
 * descriptors removes the devices.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/timerfd.h>
#include <time.h>
#include <unistd.h>

enum { kSlots = 2048, kFrameMax = 65536 + 64 };

typedef struct {
  int from, to;           /* file descriptors: read from `from`, write to `to` */
  uint64_t *due;          /* departure times, ns on CLOCK_MONOTONIC */
  uint32_t *len;
  unsigned char *frames;  /* kSlots frames of up to `frame_max` bytes */
  size_t frame_max;
  unsigned head, count;
  unsigned long dropped;
} Direction;

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what) {
  fprintf(stderr, "link_delay: %s: %s\n", what, strerror(errno));
  exit(1);
}

/* Reads every frame waiting on d->from into the queue. */
static void take(Direction *d, uint64_t delay) {
  static unsigned char scratch[kFrameMax];
  for (;;) {
    unsigned char *slot = scratch;
    size_t cap = sizeof scratch;
    if (d->count < kSlots) {
      slot = d->frames + (size_t)((d->head + d->count) % kSlots) * d->frame_max;
      cap = d->frame_max;
    }
    ssize_t n = read(d->from, slot, cap);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      if (errno == EBADFD || errno == EIO) return; /* device going away at teardown */
      die("read");
    }
    if (n == 0) return;
    if (slot == scratch) { /* queue full: the frame is dropped, as by a full NIC queue */
      d->dropped++;
      continue;
    }
    unsigned i = (d->head + d->count) % kSlots;
    d->due[i] = now_ns() + delay;
    d->len[i] = (uint32_t)n;
    d->count++;
  }
}

/* Writes every frame whose departure has come; returns the next departure (0: none). */
static uint64_t give(Direction *d, uint64_t now) {
  while (d->count && d->due[d->head] <= now) {
    unsigned i = d->head;
    ssize_t n = write(d->to, d->frames + (size_t)i * d->frame_max, d->len[i]);
    if (n < 0 && errno != EAGAIN && errno != EINTR && errno != EIO && errno != EBADFD)
      die("write");
    d->head = (d->head + 1) % kSlots;
    d->count--;
  }
  return d->count ? d->due[d->head] : 0;
}

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
  if (argc < 5 || (argc - 3) % 2) {
    fprintf(stderr, "usage: link_delay DELAY_NS MTU FD_A FD_B [FD_A FD_B ...]\n");
    return 2;
  }
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() == 1) return 0; /* the parent is already gone */
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  uint64_t delay = strtoull(argv[1], NULL, 10);
  /* a TAP without a virtio header hands over one Ethernet frame at a time: the MTU plus
   * its header and a VLAN tag at most */
  size_t frame_max = strtoull(argv[2], NULL, 10) + 18;
  if (frame_max > kFrameMax) frame_max = kFrameMax;
  int links = (argc - 3) / 2, dirs = 2 * links;
  Direction *d = calloc((size_t)dirs, sizeof *d);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (!d || ep < 0 || tfd < 0) die("set-up");
  for (int k = 0; k < dirs; k++) {
    int a = atoi(argv[3 + 2 * (k / 2)]), b = atoi(argv[4 + 2 * (k / 2)]);
    d[k].from = (k % 2) ? b : a;
    d[k].to = (k % 2) ? a : b;
    d[k].frame_max = frame_max;
    d[k].due = calloc(kSlots, sizeof *d[k].due);
    d[k].len = calloc(kSlots, sizeof *d[k].len);
    d[k].frames = malloc((size_t)kSlots * d[k].frame_max);
    if (!d[k].due || !d[k].len || !d[k].frames) die("malloc");
    struct epoll_event ev = {.events = EPOLLIN, .data.u32 = (uint32_t)k};
    if (epoll_ctl(ep, EPOLL_CTL_ADD, d[k].from, &ev) < 0) die("epoll_ctl");
  }
  struct epoll_event tev = {.events = EPOLLIN, .data.u32 = UINT32_MAX};
  if (epoll_ctl(ep, EPOLL_CTL_ADD, tfd, &tev) < 0) die("epoll_ctl timer");
  fprintf(stdout, "ready\n");
  fflush(stdout);

  struct epoll_event evs[64];
  while (!stop) {
    int n = epoll_wait(ep, evs, 64, 1000);
    if (n < 0 && errno != EINTR) die("epoll_wait");
    for (int i = 0; i < n; i++) {
      if (evs[i].data.u32 == UINT32_MAX) {
        uint64_t ticks;
        (void)!read(tfd, &ticks, sizeof ticks);
      } else {
        take(&d[evs[i].data.u32], delay);
      }
    }
    uint64_t now = now_ns(), next = 0;
    for (int k = 0; k < dirs; k++) {
      uint64_t due = give(&d[k], now);
      if (due && (!next || due < next)) next = due;
    }
    struct itimerspec its = {0};
    if (next) {
      its.it_value.tv_sec = (time_t)(next / 1000000000ull);
      its.it_value.tv_nsec = (long)(next % 1000000000ull);
    }
    if (timerfd_settime(tfd, TFD_TIMER_ABSTIME, &its, NULL) < 0) die("timerfd_settime");
  }
  unsigned long dropped = 0;
  for (int k = 0; k < dirs; k++) dropped += d[k].dropped;
  if (dropped) fprintf(stderr, "link_delay: %lu frames dropped on full queues\n", dropped);
  return 0;
}

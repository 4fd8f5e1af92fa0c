/* The delaying half of an emulated node link: frames read from one TAP device are written
 * to its partner after a fixed delay, in both directions, for every link of an EmulatedNodes
 * instance (torch_rsdp/testing/netns.py builds this file and starts it when a delay is asked
 * for).
 *
 *     link_delay DELAY_NS FD_A0 FD_B0 [FD_A1 FD_B1 ...]
 *
 * Each pair is one node link: A is the TAP inside the node's namespace, B its partner on the
 * switch's bridge. A frame read from A leaves on B DELAY_NS later, and one read from B leaves
 * on A, so a message between two nodes crosses the delay twice, as it would cross two cables.
 *
 * Why a program and not the kernel's netem: netem is a build option that some kernels leave
 * out, and a delay that exists on one host and not another is not a test.
 *
 * The TAP devices carry a virtio-net header and TCP segmentation offload (netns.py opens them
 * so), as a virtual machine's do: a frame is a segment of up to 64 KiB that the kernel cuts
 * into packets on its way out, not a 1.5 KB packet. The relay copies each frame once, header
 * included, so its work per message is a few system calls, not one pair per packet: on a
 * machine whose cores the emulated nodes share, per-packet work would be a switch that slows
 * down as the nodes send more, which no real switch does.
 *
 * The delay is the same for every frame, so each direction is a FIFO: a frame's departure is
 * its arrival plus the delay, and departures come out in arrival order. One timerfd is armed
 * at the earliest departure over all directions. Frames queue in a byte ring per direction;
 * a full ring drops the frame, as a NIC's full queue would (TCP recovers), and the tbf on each
 * TAP keeps the queue far below that in practice. The relay ends when its parent does
 * (PR_SET_PDEATHSIG) or on SIGTERM; closing the TAP file descriptors removes the devices.
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

enum {
  kRingBytes = 4 << 20,         /* queued bytes per direction: 32 ms at 1 Gbit/s */
  kRecords = 4096,              /* queued frames per direction */
  kFrameMax = 65536 + 64 + 128, /* a TSO segment, its Ethernet and virtio-net headers */
};

typedef struct {
  int from, to;           /* file descriptors: read from `from`, write to `to` */
  unsigned char *ring;    /* kRingBytes of queued frames */
  uint64_t due[kRecords]; /* departure, ns on CLOCK_MONOTONIC */
  uint32_t off[kRecords], len[kRecords];
  unsigned head, count;   /* records */
  size_t tail;            /* where the next frame's bytes go */
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

/* Where `len` contiguous bytes fit after the newest frame without reaching the oldest, or
 * -1 when the ring is full. */
static long place(const Direction *d, size_t len) {
  if (d->count == 0) return len <= kRingBytes ? 0 : -1;
  size_t start = d->off[d->head], end = d->tail;
  if (end > start) { /* used: [start, end) */
    if (len <= kRingBytes - end) return (long)end;
    return len < start ? 0 : -1;
  }
  return len < start - end ? (long)end : -1; /* used: [start, cap) and [0, end) */
}

/* Reads every frame waiting on d->from into the queue. */
static void take(Direction *d, uint64_t delay) {
  static unsigned char frame[kFrameMax];
  for (;;) {
    ssize_t n = read(d->from, frame, sizeof frame);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) return;
      if (errno == EBADFD || errno == EIO) return; /* device going away at teardown */
      die("read");
    }
    if (n == 0) return;
    long at = d->count < kRecords ? place(d, (size_t)n) : -1;
    if (at < 0) { /* queue full: dropped, as by a full NIC queue */
      d->dropped++;
      continue;
    }
    memcpy(d->ring + at, frame, (size_t)n);
    unsigned i = (d->head + d->count) % kRecords;
    d->due[i] = now_ns() + delay;
    d->off[i] = (uint32_t)at;
    d->len[i] = (uint32_t)n;
    d->tail = (size_t)at + (size_t)n;
    d->count++;
  }
}

/* Writes every frame whose departure has come; returns the next departure (0: none). */
static uint64_t give(Direction *d, uint64_t now) {
  while (d->count && d->due[d->head] <= now) {
    unsigned i = d->head;
    ssize_t n = write(d->to, d->ring + d->off[i], d->len[i]);
    if (n < 0 && errno != EAGAIN && errno != EINTR && errno != EIO && errno != EBADFD &&
        errno != EINVAL)
      die("write");
    d->head = (d->head + 1) % kRecords;
    d->count--;
  }
  return d->count ? d->due[d->head] : 0;
}

static volatile sig_atomic_t stop;
static void on_term(int sig) { (void)sig; stop = 1; }

int main(int argc, char **argv) {
  if (argc < 4 || (argc - 2) % 2) {
    fprintf(stderr, "usage: link_delay DELAY_NS FD_A FD_B [FD_A FD_B ...]\n");
    return 2;
  }
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() == 1) return 0; /* the parent is already gone */
  signal(SIGTERM, on_term);
  signal(SIGINT, on_term);
  uint64_t delay = strtoull(argv[1], NULL, 10);
  int links = (argc - 2) / 2, dirs = 2 * links;
  Direction *d = calloc((size_t)dirs, sizeof *d);
  int ep = epoll_create1(EPOLL_CLOEXEC);
  int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
  if (!d || ep < 0 || tfd < 0) die("set-up");
  for (int k = 0; k < dirs; k++) {
    int a = atoi(argv[2 + 2 * (k / 2)]), b = atoi(argv[3 + 2 * (k / 2)]);
    d[k].from = (k % 2) ? b : a;
    d[k].to = (k % 2) ? a : b;
    d[k].ring = malloc(kRingBytes);
    if (!d[k].ring) die("malloc");
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

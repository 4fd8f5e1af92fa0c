// The launch-mode evidence of docs/benchmarks.md ("Launch modes"), without torch or the
// backend: two processes pinned to CPUs 0 and 1 share an anonymous mapping and measure
//   1. a cache-line ping-pong: the median of 2000 round trips (after 1000 warm-up ones),
//      each side spinning on a line the other writes;
//   2. a 2-rank all-reduce of --bytes float32 written like the backend's reduce-scatter +
//      all-gather through two staging halves, once with memcpy and once with streaming
//      stores into the halves: the median of 200 ops.
// Logged next to each other over time, slow round trips and slow cached all-reduces come
// and go together (the host's placement of the two vCPUs).
//
//   g++ -O2 -mavx2 -o build/handoff_pingpong benchmarks/handoff_pingpong.cpp
//   while true; do echo "$(date +%T) $(build/handoff_pingpong)"; sleep 20; done
#include <immintrin.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

struct alignas(64) Line {
  std::atomic<uint32_t> v;
};
struct Ctl {
  Line step[2];
  Line ping;
  Line pong;
};

double now_ns() {
  using C = std::chrono::steady_clock;
  return std::chrono::duration<double, std::nano>(C::now().time_since_epoch()).count();
}

void spin_until(const Line& l, uint32_t want) {
  while (l.v.load(std::memory_order_acquire) != want) _mm_pause();
}

void stream_copy(void* d, const void* s, size_t n) {
  auto* dd = static_cast<char*>(d);
  auto* ss = static_cast<const char*>(s);
  for (size_t i = 0; i < n; i += 32)
    _mm256_stream_si256(reinterpret_cast<__m256i*>(dd + i),
                        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ss + i)));
  _mm_sfence();
}

void add(float* dst, const float* a, const float* b, size_t n, bool streaming) {
  if (!streaming) {
    for (size_t i = 0; i < n; ++i) dst[i] = a[i] + b[i];
    return;
  }
  for (size_t i = 0; i < n; i += 8)
    _mm256_stream_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i)));
  _mm_sfence();
}

}  // namespace

int main(int argc, char** argv) {
  const size_t bytes = argc > 1 ? std::strtoul(argv[1], nullptr, 10) : (1u << 20);
  const size_t half = std::max<size_t>(bytes, 4096);
  char* seg = static_cast<char*>(mmap(nullptr, 4096 + 4 * half, PROT_READ | PROT_WRITE,
                                      MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::memset(seg, 0, 4096 + 4 * half);
  Ctl* ctl = reinterpret_cast<Ctl*>(seg);
  auto stage = [&](int r, uint32_t s) { return seg + 4096 + (r * 2 + (s & 1)) * half; };
  const int me = fork() == 0 ? 1 : 0, peer = 1 - me;
  cpu_set_t cs;
  CPU_ZERO(&cs);
  CPU_SET(me, &cs);
  sched_setaffinity(0, sizeof cs, &cs);

  std::vector<double> rtt;
  for (uint32_t i = 1; i <= 3000; ++i) {
    const double t0 = now_ns();
    if (me == 0) {
      ctl->ping.v.store(i, std::memory_order_release);
      spin_until(ctl->pong, i);
    } else {
      spin_until(ctl->ping, i);
      ctl->pong.v.store(i, std::memory_order_release);
    }
    rtt.push_back(now_ns() - t0);
  }
  std::sort(rtt.begin() + 1000, rtt.end());

  const size_t count = bytes / 4, sub = count / 2;
  std::vector<float> buf(count);
  uint32_t step = 0;
  auto exchange = [&] {
    ++step;
    ctl->step[me].v.store(step, std::memory_order_seq_cst);
    while (static_cast<int32_t>(ctl->step[peer].v.load(std::memory_order_acquire) - step) < 0)
      _mm_pause();
  };
  double median_us[2];
  for (int streaming = 0; streaming < 2; ++streaming) {
    std::vector<double> ts;
    for (int it = 0; it < 220; ++it) {
      std::fill(buf.begin(), buf.end(), 1.0f + me);
      exchange();  // the barrier before a timed op
      const double t0 = now_ns();
      float* mine = buf.data() + me * sub;
      float* other = buf.data() + peer * sub;
      char* st = stage(me, step + 1);
      if (streaming)
        stream_copy(st, other, sub * 4);
      else
        std::memcpy(st, other, sub * 4);
      exchange();
      auto* in = reinterpret_cast<const float*>(stage(peer, step));
      auto* out = reinterpret_cast<float*>(stage(me, step + 1));
      add(out, mine, in, sub, streaming);
      std::memcpy(mine, out, sub * 4);
      exchange();
      std::memcpy(other, stage(peer, step), sub * 4);
      if (it >= 20) ts.push_back(now_ns() - t0);
    }
    std::sort(ts.begin(), ts.end());
    median_us[streaming] = ts[ts.size() / 2] / 1000;
  }
  if (me == 0) {
    std::printf("pingpong_rtt_ns %.0f allreduce_us memcpy %.1f streaming %.1f\n", rtt[2000],
                median_us[0], median_us[1]);
    wait(nullptr);
  }
  return 0;
}

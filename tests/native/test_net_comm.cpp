// Standalone multi-process test of rsdp::NetComm, the UCX transport (no torch,
// no gtest). Forks 3 ranks that rendezvous through a directory of files
// (FileBootstrap below) and checks: ring exchange of many sizes (eager and
// rendezvous), descriptor/size mismatches, timeouts, point-to-point with any
// source and tags, abort, a peer that exits, traffic counters, and that
// destroying a comm gives back every fd and thread.
//   g++ -O1 -std=c++17 -I csrc tests/native/test_net_comm.cpp csrc/core/{group,op_desc,error,options}.cpp
//       csrc/transport/ucx/*.cpp $(pkg-config --cflags --libs ucx) -lpthread
//   UCX_TLS=tcp ./a.out      last line "N passed, M failed"; exit code != 0 on failure
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/error.h"
#include "core/group.h"
#include "transport/ucx/net_comm.h"

using namespace rsdp;
using namespace std::chrono;
using Clock = steady_clock;

constexpr int kRanks = 3;
static int g_rank = -1;
static std::atomic<int> g_pass{0}, g_fail{0};
static int* g_counts = nullptr;  // shared with the parent: pass, fail per rank
static void report() {
  g_counts[2 * g_rank] = g_pass;
  g_counts[2 * g_rank + 1] = g_fail;
  std::fflush(stdout);
  std::fflush(stderr);
}
#define CHECK(cond, ...)                                                               \
  do {                                                                                 \
    if (cond) ++g_pass;                                                                \
    else if (++g_fail <= 40)                                                           \
      std::fprintf(stderr, "[rank %d] FAIL line %d: %s -- ", g_rank, __LINE__, #cond), \
          std::fprintf(stderr, __VA_ARGS__), std::fputc('\n', stderr);                \
  } while (0)

// ---- a key-value store in a directory --------------------------------------
class FileBootstrap : public Bootstrap {
 public:
  explicit FileBootstrap(std::string dir) : dir_(std::move(dir)) {}
  void set(const std::string& key, const std::string& value) override {
    std::string tmp = path(key) + ".tmp." + std::to_string(getpid());
    { std::ofstream(tmp, std::ios::binary) << value; }
    if (rename(tmp.c_str(), path(key).c_str()) != 0) throw std::runtime_error("rename");
  }
  std::string get(const std::string& key) override {
    std::ifstream f(path(key), std::ios::binary);
    std::stringstream ss;
    ss << f.rdbuf();
    return ss.str();
  }
  bool wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    auto end = Clock::now() + (timeout.count() > 0 ? timeout : hours(1));
    for (;;) {
      bool all = true;
      for (auto& k : keys) all = all && check(k);
      if (all) return true;
      if (Clock::now() >= end) return false;
      std::this_thread::sleep_for(milliseconds(2));
    }
  }
  bool check(const std::string& key) override { return access(path(key).c_str(), F_OK) == 0; }
  int64_t add(const std::string& key, int64_t delta) override {
    int fd = open((path(key) + ".lock").c_str(), O_CREAT | O_RDWR, 0600);
    flock(fd, LOCK_EX);
    int64_t v = check(key) ? std::stoll(get(key)) : 0;
    v += delta;
    set(key, std::to_string(v));
    flock(fd, LOCK_UN);
    close(fd);
    return v;
  }
  void barrier(const std::string& name) {
    add("barrier/" + name, 1);
    while (add("barrier/" + name, 0) < kRanks) std::this_thread::sleep_for(milliseconds(2));
  }

 private:
  std::string path(const std::string& key) const {
    std::string p = dir_ + "/";
    for (char c : key) p += std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
    return p;
  }
  std::string dir_;
};

// ---- helpers ----------------------------------------------------------------
static int count_dir(const char* path) {
  int n = 0;
  if (DIR* d = opendir(path)) {
    while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
    closedir(d);
  }
  return n;
}

// The threads this process runs now, by name (for a leak report).
static std::string thread_names() {
  std::string names;
  if (DIR* d = opendir("/proc/self/task")) {
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
      std::string name;
      std::getline(comm, name);
      names += (names.empty() ? "" : ", ") + name;
    }
    closedir(d);
  }
  return names;
}

// UCX's async thread is stopped by the last context that uses it, but when that happens on
// the async thread itself (an endpoint error handled there) it detaches and exits a moment
// later. A leaked thread stays; one on its way out is gone within this deadline.
static int threads_after_teardown(int expected) {
  auto deadline = Clock::now() + seconds(2);
  int n = count_dir("/proc/self/task");
  while (n != expected && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    n = count_dir("/proc/self/task");
  }
  return n;
}

static uint8_t pattern(int src, uint64_t seq, uint32_t step, size_t i) {
  return static_cast<uint8_t>(src * 131 + seq * 17 + step * 7 + i * 13);
}

static bool matches(const std::vector<uint8_t>& b, int src, uint64_t seq, uint32_t step) {
  for (size_t i = 0; i < b.size(); ++i)
    if (b[i] != pattern(src, seq, step, i)) return false;
  return true;
}

static OpDesc make_desc(uint64_t seq, uint64_t count) {
  OpDesc d;
  d.seq = seq;
  d.count = count;
  d.kind = OpKind::kAllreduce;
  d.dtype = DType::kUInt8;
  return d;
}

static double since(Clock::time_point t) { return duration<double>(Clock::now() - t).count(); }

// Runs `fn`, returns the rsdp::Error it threw (kind, message) or kind -1.
struct Caught {
  int kind = -1;
  std::string msg;
};
static Caught catch_error(const std::function<void()>& fn) {
  Caught c;
  try {
    fn();
  } catch (const Error& e) {
    c.kind = static_cast<int>(e.kind());
    c.msg = e.what();
  } catch (const std::exception& e) {
    c.kind = 99;
    c.msg = e.what();
  }
  return c;
}
static bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}
#define KIND(k) static_cast<int>(ErrorKind::k)

// One ring step: send to both neighbours, receive from both (step ids 2s, 2s+1).
struct RingResult {
  uint64_t intra = 0, inter = 0, intra_msgs = 0, inter_msgs = 0;
};
static void ring_op(NetComm& c, uint64_t seq, size_t bytes, int steps, const std::vector<int>& node_of,
                    RingResult* acc, size_t send_bytes = SIZE_MAX, uint64_t count = 0) {
  const int me = c.rank(), next = (me + 1) % kRanks, prev = (me + kRanks - 1) % kRanks;
  if (send_bytes == SIZE_MAX) send_bytes = bytes;
  c.begin(make_desc(seq, count ? count : bytes), Deadline(milliseconds(10000)));
  std::vector<std::vector<uint8_t>> out, in;
  for (int s = 0; s < steps; ++s) {
    for (int d = 0; d < 2; ++d) {
      uint32_t step = 2 * s + d;
      out.emplace_back(send_bytes);
      for (size_t i = 0; i < send_bytes; ++i) out.back()[i] = pattern(me, seq, step, i);
      in.emplace_back(bytes, 0xEE);
    }
  }
  // Post receives first on even ranks and sends first on odd ones: both orders work.
  for (int pass = 0; pass < 2; ++pass) {
    bool sends = (pass == 0) == (me % 2 == 1);
    for (int s = 0, k = 0; s < steps; ++s)
      for (int d = 0; d < 2; ++d, ++k) {
        uint32_t step = 2 * s + d;
        int to = d == 0 ? next : prev, from = d == 0 ? prev : next;
        if (sends) {
          c.isend(to, out[k].data(), send_bytes, step);
          if (acc) {
            bool same = node_of[to] == node_of[me];
            (same ? acc->intra : acc->inter) += send_bytes;
            ++(same ? acc->intra_msgs : acc->inter_msgs);
          }
        } else {
          c.irecv(from, in[k].data(), bytes, step);
        }
      }
  }
  c.wait();
  for (int s = 0, k = 0; s < steps; ++s)
    for (int d = 0; d < 2; ++d, ++k) {
      uint32_t step = 2 * s + d;
      int from = d == 0 ? prev : next;
      CHECK(matches(in[k], from, seq, step), "ring data from rank %d seq %lu step %u (%zu bytes)",
            from, (unsigned long)seq, step, bytes);
    }
}

// ---- scenarios ----------------------------------------------------------------
static void test_ring_and_traffic(NetComm& c, const std::vector<int>& node_of, Traffic& t,
                                  uint64_t& seq) {
  RingResult want;
  const size_t sizes[] = {0, 1, 7, 100000, 8u << 20};
  const int ops[] = {40, 40, 40, 8, 3}, steps[] = {3, 3, 3, 2, 1};
  auto t0 = Clock::now();
  for (int k = 0; k < 5; ++k)
    for (int i = 0; i < ops[k]; ++i) {
      auto e = catch_error([&] { ring_op(c, ++seq, sizes[k], steps[k], node_of, &want); });
      CHECK(e.kind == -1, "ring %zu bytes: %s", sizes[k], e.msg.c_str());
    }
  if (g_rank == 0) std::printf("ring exchange: %.2f s\n", since(t0));
  CHECK(t.intra_bytes == want.intra && t.inter_bytes == want.inter,
        "traffic bytes intra %lu inter %lu, expected %lu %lu", (unsigned long)t.intra_bytes.load(),
        (unsigned long)t.inter_bytes.load(), (unsigned long)want.intra, (unsigned long)want.inter);
  CHECK(t.intra_msgs == want.intra_msgs && t.inter_msgs == want.inter_msgs,
        "traffic msgs intra %lu inter %lu, expected %lu %lu", (unsigned long)t.intra_msgs.load(),
        (unsigned long)t.inter_msgs.load(), (unsigned long)want.intra_msgs,
        (unsigned long)want.inter_msgs);
  // Rank 2 is alone on its node: everything it sends crosses nodes.
  if (g_rank == 2) CHECK(t.intra_bytes == 0 && t.inter_bytes > 0, "rank 2 traffic");
  auto self = catch_error([&] {
    char b = 0;
    c.begin(make_desc(++seq, 1), Deadline(milliseconds(1000)));
    c.isend(c.rank(), &b, 1, 0);
  });
  CHECK(self.kind == KIND(kValue), "send to self: kind %d %s", self.kind, self.msg.c_str());
  c.wait();  // nothing was posted
}

// Rank 1 runs a different op (count, and in some cases bytes) than ranks 0 and 2.
static void test_mismatch(NetComm& c, const std::vector<int>& node_of, uint64_t& seq) {
  struct Case {
    size_t bytes, odd_bytes;
  } cases[] = {{100, 100}, {100, 100000}, {1u << 20, 2u << 20}, {200000, 50}};
  for (auto& k : cases) {
    ++seq;
    const bool odd = g_rank == 1;
    const size_t mine = odd ? k.odd_bytes : k.bytes;
    const uint64_t count = odd ? k.odd_bytes + 1 : k.bytes;
    auto t0 = Clock::now();
    auto e = catch_error([&] { ring_op(c, seq, mine, 1, node_of, nullptr, mine, count); });
    std::string normal = make_desc(seq, k.bytes).describe();
    std::string other = make_desc(seq, k.odd_bytes + 1).describe();
    CHECK(e.kind == KIND(kMismatch), "mismatch %zu/%zu: kind %d: %s", k.bytes, k.odd_bytes, e.kind,
          e.msg.c_str());
    CHECK(has(e.msg, normal) && has(e.msg, other), "mismatch message lacks '%s' or '%s': %s",
          normal.c_str(), other.c_str(), e.msg.c_str());
    CHECK(has(e.msg, odd ? "is running" : "rank 1 is running"), "names the peer: %s",
          e.msg.c_str());
    if (k.bytes != k.odd_bytes)
      CHECK(has(e.msg, std::to_string(k.bytes) + " bytes") &&
                has(e.msg, std::to_string(k.odd_bytes) + " bytes"),
            "both sizes: %s", e.msg.c_str());
    CHECK(since(t0) < 1.5, "mismatch took %.2f s", since(t0));
    // The group stays usable.
    auto ok = catch_error([&] { ring_op(c, ++seq, 1000, 1, node_of, nullptr); });
    CHECK(ok.kind == -1, "ring after mismatch: %s", ok.msg.c_str());
  }
}

struct P2PWaiter {
  std::mutex mu;
  std::condition_variable cv;
  int done = 0, calls = 0;
  std::vector<std::pair<int, int>> results;  // (kind or -1, src) in completion order
  std::vector<std::string> msgs;
  // `src_out` (optional) gets the reported source, or -3 on error.
  NetComm::Done cb(int* src_out = nullptr) {
    return [this, src_out](std::exception_ptr e, int src) {
      Caught c;
      if (e) c = catch_error([&] { std::rethrow_exception(e); });
      std::lock_guard<std::mutex> g(mu);
      if (src_out) *src_out = e ? -3 : src;
      results.push_back({c.kind, src});
      msgs.push_back(c.msg);
      ++calls;
      cv.notify_all();
    };
  }
  bool wait_for(int n, double seconds) {
    std::unique_lock<std::mutex> g(mu);
    return cv.wait_for(g, duration<double>(seconds), [&] { return calls >= n; });
  }
};

// Rank 0 waits for a message nobody sends.
static void test_timeout(NetComm& c, FileBootstrap& store, uint64_t& seq) {
  store.barrier("timeout-start");
  if (g_rank == 0) {
    OpDesc d = make_desc(++seq, 4);
    char buf[4];
    auto t0 = Clock::now();
    auto e = catch_error([&] {
      c.begin(d, Deadline(milliseconds(1000)));
      c.irecv(2, buf, 4, 999);
      c.wait();
    });
    double dt = since(t0);
    CHECK(e.kind == KIND(kTimeout), "timeout kind %d: %s", e.kind, e.msg.c_str());
    CHECK(dt >= 0.9 && dt < 2.0, "timeout after %.2f s", dt);
    CHECK(has(e.msg, d.describe()) && has(e.msg, "rank 2 (step 999, recv)") &&
              has(e.msg, "Timed out waiting 1000ms"),
          "timeout message: %s", e.msg.c_str());
    auto later = catch_error([&] { c.begin(make_desc(++seq, 1), Deadline()); });
    CHECK(later.kind == KIND(kPeer) && has(later.msg, "unusable"), "begin after timeout: %s",
          later.msg.c_str());
  } else if (g_rank == 1) {
    // abort() from another thread ends a wait that would last 10 s.
    char buf[4];
    // A pending p2p recv fails with the abort too.
    P2PWaiter pw;
    char pbuf[4];
    c.p2p_recv(pbuf, 4, 2, 123, milliseconds(10000), pw.cb());
    auto t0 = Clock::now();
    std::thread killer([&] {
      std::this_thread::sleep_for(milliseconds(200));
      c.abort("rank 1: test abort");
    });
    auto e = catch_error([&] {
      c.begin(make_desc(++seq, 4), Deadline(milliseconds(10000)));
      c.irecv(2, buf, 4, 777);
      c.wait();
    });
    killer.join();
    CHECK(e.kind == KIND(kPeer) && has(e.msg, "test abort"), "abort: kind %d %s", e.kind,
          e.msg.c_str());
    CHECK(since(t0) < 1.0, "abort took %.2f s", since(t0));
    CHECK(pw.wait_for(1, 1.0), "p2p recv not failed by abort");
    if (pw.calls == 1)
      CHECK(pw.results[0].first == KIND(kPeer) && has(pw.msgs[0], "test abort"), "p2p abort: %s",
            pw.msgs[0].c_str());
    auto after = catch_error([&] { c.p2p_send(buf, 4, 2, 1, milliseconds(1000), pw.cb()); });
    CHECK(pw.wait_for(2, 1.0) && pw.results[1].first == KIND(kPeer), "p2p send after abort");
  } else {
    seq += 1;
  }
  store.barrier("timeout-end");
}

static void test_p2p(NetComm& c, FileBootstrap& store, Traffic& t) {
  const milliseconds to(10000);
  std::vector<uint8_t> a(1000), b(100000), big(8u << 20), seven(7), e0(64), e2(64), sixteen(16);
  for (size_t i = 0; i < a.size(); ++i) a[i] = pattern(0, 5, 0, i);
  for (size_t i = 0; i < b.size(); ++i) b[i] = pattern(0, 6, 0, i);
  for (size_t i = 0; i < big.size(); ++i) big[i] = pattern(1, 9, 0, i);
  for (size_t i = 0; i < seven.size(); ++i) seven[i] = pattern(2, 7, 0, i);
  P2PWaiter w;
  uint64_t sent = 0;
  if (g_rank == 0) {
    for (auto& x : e0) x = 0xA0;
    c.p2p_send(a.data(), a.size(), 1, 5, to, w.cb());
    c.p2p_send(b.data(), b.size(), 1, 6, to, w.cb());
    c.p2p_send(e0.data(), e0.size(), 1, 8, to, w.cb());
    c.p2p_send(sixteen.data(), 16, 2, 10, to, w.cb());
    std::vector<uint8_t> got(big.size());
    int big_src = -2;
    c.p2p_recv(got.data(), got.size(), 1, 9, to, w.cb(&big_src));
    CHECK(w.wait_for(5, 15), "rank 0 p2p completions: %d", w.calls);
    for (auto& r : w.results) CHECK(r.first == -1, "rank 0 p2p error %d", r.first);
    CHECK(got == big, "8 MiB p2p data");
    CHECK(big_src == 1, "8 MiB p2p src %d", big_src);
    sent = a.size() + b.size() + e0.size() + 16;
  } else if (g_rank == 1) {
    std::vector<uint8_t> ra(a.size()), rb(b.size()), r7(7), x1(64), x2(64);
    int src7 = -2, src_x1 = -2, src_x2 = -2;
    // Tags keep streams apart: tag 6 is posted first but gets the tag-6 message.
    c.p2p_recv(rb.data(), rb.size(), 0, 6, to, w.cb());
    c.p2p_recv(ra.data(), ra.size(), 0, 5, to, w.cb());
    c.p2p_recv(r7.data(), 7, -1, 7, to, w.cb(&src7));
    c.p2p_recv(x1.data(), 64, -1, 8, to, w.cb(&src_x1));
    c.p2p_recv(x2.data(), 64, -1, 8, to, w.cb(&src_x2));
    c.p2p_send(big.data(), big.size(), 0, 9, to, w.cb());
    CHECK(w.wait_for(6, 15), "rank 1 p2p completions: %d", w.calls);
    for (auto& r : w.results) CHECK(r.first == -1, "rank 1 p2p error %d", r.first);
    CHECK(ra == a && rb == b && r7 == seven, "p2p data by tag");
    CHECK(src7 == 2, "any-source src %d", src7);
    CHECK((src_x1 == 0 && src_x2 == 2) || (src_x1 == 2 && src_x2 == 0), "any-source srcs %d %d",
          src_x1, src_x2);
    CHECK(x1[0] == (src_x1 == 0 ? 0xA0 : 0xA2) && x2[0] == (src_x2 == 0 ? 0xA0 : 0xA2),
          "any-source data matches src");
    sent = big.size();
  } else {
    for (auto& x : e2) x = 0xA2;
    c.p2p_send(seven.data(), 7, 1, 7, to, w.cb());
    c.p2p_send(e2.data(), e2.size(), 1, 8, to, w.cb());
    // A recv nobody serves times out, naming source and tag.
    std::vector<uint8_t> never(10), small(8);
    auto t0 = Clock::now();
    double t_timeout = -1;
    c.p2p_recv(never.data(), 10, 0, 99, milliseconds(500),
               [&](std::exception_ptr e, int src) {
                 t_timeout = since(t0);
                 w.cb()(e, src);
               });
    // The wrong size is a ValueError.
    c.p2p_recv(small.data(), 8, 0, 10, to, w.cb());
    CHECK(w.wait_for(4, 15), "rank 2 p2p completions: %d", w.calls);
    std::lock_guard<std::mutex> g(w.mu);
    int timeouts = 0, values = 0;
    for (size_t i = 0; i < w.results.size(); ++i) {
      if (w.results[i].first == KIND(kTimeout)) {
        ++timeouts;
        CHECK(has(w.msgs[i], "rank 0") && has(w.msgs[i], "tag 99"), "p2p timeout: %s",
              w.msgs[i].c_str());
      }
      if (w.results[i].first == KIND(kValue)) {
        ++values;
        CHECK(has(w.msgs[i], "16") || has(w.msgs[i], "larger"), "p2p size: %s", w.msgs[i].c_str());
      }
    }
    CHECK(timeouts == 1 && values == 1, "p2p timeouts %d values %d", timeouts, values);
    CHECK(t_timeout >= 0.45 && t_timeout < 1.5, "p2p timeout after %.2f s", t_timeout);
    sent = 7 + e2.size();
  }
  store.barrier("p2p-send-timeout");
  if (g_rank == 0) {
    // Nobody receives this rendezvous-sized send: it times out, and as UCX
    // cannot take a send back, the pair's stream is closed for good.
    P2PWaiter st;
    auto t0 = Clock::now();
    c.p2p_send(big.data(), big.size(), 2, 77, milliseconds(500), st.cb());
    CHECK(st.wait_for(1, 5), "p2p send timeout never reported");
    CHECK(since(t0) >= 0.45 && since(t0) < 1.5, "p2p send timeout after %.2f s", since(t0));
    c.p2p_send(a.data(), a.size(), 2, 78, to, st.cb());
    CHECK(st.wait_for(2, 5), "send after a timed-out send never completed");
    std::lock_guard<std::mutex> g(st.mu);
    if (st.calls == 2) {
      CHECK(st.results[0].first == KIND(kTimeout) && has(st.msgs[0], "rank 2") &&
                has(st.msgs[0], "tag 77"),
            "p2p send timeout: %s", st.msgs[0].c_str());
      CHECK(st.results[1].first == KIND(kPeer) && has(st.msgs[1], "timed out"),
            "send after timeout: %s", st.msgs[1].c_str());
    }
    sent += big.size();  // counted when posted
  }
  std::this_thread::sleep_for(milliseconds(50));
  CHECK(w.calls == static_cast<int>(w.results.size()), "done called once per op");
  CHECK(t.intra_bytes == sent && t.inter_bytes == 0, "p2p traffic %lu, expected %lu",
        (unsigned long)t.intra_bytes.load(), (unsigned long)sent);
  store.barrier("p2p-end");
}

// Rank 2 exits while rank 0 (collective) and rank 1 (p2p) wait for it.
static void test_peer_exit(NetComm& c, FileBootstrap& store, uint64_t& seq,
                           const std::vector<int>& node_of) {
  auto warm = catch_error([&] { ring_op(c, ++seq, 100000, 1, node_of, nullptr); });
  CHECK(warm.kind == -1, "ring before exit: %s", warm.msg.c_str());
  store.barrier("exit-start");
  if (g_rank == 2) {
    std::this_thread::sleep_for(milliseconds(300));
    report();
    _exit(g_fail ? 1 : 0);
  }
  const double budget = 8.0;
  auto t0 = Clock::now();
  Caught e;
  if (g_rank == 0) {
    char buf[100];
    e = catch_error([&] {
      c.begin(make_desc(++seq, 100), Deadline(milliseconds(8000)));
      c.irecv(2, buf, 100, 0);
      c.wait();
    });
  } else {
    P2PWaiter w;
    char buf[100];
    c.p2p_recv(buf, 100, 2, 50, milliseconds(8000), w.cb());
    CHECK(w.wait_for(1, budget + 2), "p2p recv from dead peer never completed");
    std::lock_guard<std::mutex> g(w.mu);
    if (!w.results.empty()) e = Caught{w.results[0].first, w.msgs[0]};
  }
  double dt = since(t0);
  CHECK(e.kind == KIND(kPeer) || e.kind == KIND(kTimeout), "peer exit: kind %d %s", e.kind,
        e.msg.c_str());
  CHECK(has(e.msg, "rank 2"), "peer exit names rank 2: %s", e.msg.c_str());
  CHECK(dt < budget + 0.5, "peer exit noticed after %.2f s", dt);
  std::printf("[rank %d] peer exit noticed after %.2f s: %s\n", g_rank, dt, e.msg.c_str());
}

static int run_rank(int rank, const std::string& dir) {
  g_rank = rank;
  FileBootstrap store(dir);
  Options opts = Options::from_env();
  // One thread started and joined first: ThreadSanitizer starts a background thread of its own
  // with the process's first thread, which must not count as one the comm left behind.
  std::thread([] {}).join();
  const int fds0 = count_dir("/proc/self/fd"), threads0 = count_dir("/proc/self/task");
  uint64_t seq = 0;
  {
    // Ranks 0 and 1 share node 0; rank 2 is on node 1.
    std::vector<int> node_of{0, 0, 1};
    Group g = join_group(store, rank, kRanks, {}, "A", seconds(10), opts);
    Traffic t;
    auto t0 = Clock::now();
    auto c_a = std::make_unique<NetComm>(g, node_of, store, opts, &t);
    NetComm& c = *c_a;
    if (rank == 0) std::printf("NetComm setup: %.3f s\n", since(t0));
    test_ring_and_traffic(c, node_of, t, seq);
    test_mismatch(c, node_of, seq);
    test_timeout(c, store, seq);
    t0 = Clock::now();
    c_a.reset();
    if (rank == 2) std::printf("NetComm destroy: %.3f s\n", since(t0));
    CHECK(since(t0) < 1.5, "destroy took %.2f s", since(t0));
  }
  store.barrier("A-destroyed");
  CHECK(count_dir("/proc/self/fd") == fds0, "fds %d -> %d", fds0, count_dir("/proc/self/fd"));
  CHECK(threads_after_teardown(threads0) == threads0, "threads %d -> %d (%s)", threads0,
        count_dir("/proc/self/task"), thread_names().c_str());
  seq = 0;  // a new comm counts afresh (the timeout test left the ranks apart)
  {
    std::vector<int> node_of{0, 0, 0};
    Group g = join_group(store, rank, kRanks, {}, "B", seconds(10), opts);
    Traffic t;
    auto c = std::make_unique<NetComm>(g, node_of, store, opts, &t);
    test_p2p(*c, store, t);
    test_peer_exit(*c, store, seq, node_of);
    auto t0 = Clock::now();
    c.reset();  // with a dead peer: must not hang
    CHECK(since(t0) < 3.0, "destroy with a dead peer took %.2f s", since(t0));
  }
  CHECK(count_dir("/proc/self/fd") == fds0, "fds %d -> %d", fds0, count_dir("/proc/self/fd"));
  CHECK(threads_after_teardown(threads0) == threads0, "threads %d -> %d (%s)", threads0,
        count_dir("/proc/self/task"), thread_names().c_str());
  return g_fail ? 1 : 0;
}

int main() {
  char tmpl[] = "/tmp/rsdp-netcomm-XXXXXX";
  if (!mkdtemp(tmpl)) return 2;
  const std::string dir = tmpl;
  // Per-rank pass/fail counts, written by the children.
  int* counts = g_counts = static_cast<int*>(
      mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
  std::fflush(stdout);
  std::vector<pid_t> pids;
  for (int r = 0; r < kRanks; ++r) {
    pid_t pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = run_rank(r, dir);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "[rank %d] uncaught: %s\n", r, e.what());
        ++g_fail;
      }
      report();
      _exit(rc);
    }
    pids.push_back(pid);
  }
  // Rank 2 reports its counts before it exits on purpose.
  auto deadline = Clock::now() + seconds(55);
  int bad = 0, left = kRanks;
  while (left > 0) {
    int status = 0;
    pid_t p = waitpid(-1, &status, WNOHANG);
    if (p > 0) {
      --left;
      if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        ++bad;
        std::fprintf(stderr, "child %d ended with status 0x%x\n", (int)p, status);
      }
      continue;
    }
    if (Clock::now() > deadline) {
      std::fprintf(stderr, "HANG: killing the ranks after 55 s\n");
      for (pid_t q : pids) kill(q, SIGKILL);
      while (waitpid(-1, nullptr, 0) > 0) {
      }
      bad += left;
      break;
    }
    std::this_thread::sleep_for(milliseconds(10));
  }
  system(("rm -rf " + dir).c_str());
  int pass = 0, fail = bad;
  for (int r = 0; r < kRanks; ++r) pass += counts[2 * r], fail += counts[2 * r + 1];
  std::printf("%d passed, %d failed\n", pass, fail);
  return fail ? 1 : 0;
}

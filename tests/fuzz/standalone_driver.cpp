// A driver for the fuzz targets where libFuzzer is not available (g++ has no
// -fsanitize=fuzzer): linked with a target's LLVMFuzzerTestOneInput and built
// with -fsanitize=address,undefined, it runs every input it is given (files,
// or every file of a folder), then random mutations of them until a time or
// run limit. It has no coverage feedback, so it finds less than libFuzzer in
// the same time; it keeps the same command line and output where they
// matter to scripts/run_fuzz.sh:
//
//   driver [-max_total_time=S] [-runs=N] [-timeout=S] [-seed=N]
//          [-max_len=N] [-artifact_prefix=P] [other -flags, ignored] inputs...
//
// -runs=0 runs the given inputs once and stops. Each input is run from a heap
// block of exactly its size (reads past it are reports). When a sanitizer
// stops the process, or an input runs past -timeout, the input is written to
// <artifact_prefix>crash-<hash> (timeout-<hash>) and its path printed, as
// libFuzzer does. The last lines are libFuzzer's stat:: lines.
#include <sanitizer/common_interface_defs.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <random>
#include <string>
#include <thread>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {

using Bytes = std::vector<uint8_t>;
using Clock = std::chrono::steady_clock;

// The input being run, for the death callback and the watchdog.
const uint8_t* g_data = nullptr;
size_t g_size = 0;
std::string g_prefix = "./";
std::atomic<uint64_t> g_runs{0};

uint64_t fnv(const uint8_t* d, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ d[i]) * 1099511628211ull;
  return h;
}

void save(const char* kind) {
  char name[64];
  std::snprintf(name, sizeof name, "%s-%016llx", kind,
                static_cast<unsigned long long>(fnv(g_data, g_size)));
  const std::string path = g_prefix + name;
  if (FILE* f = std::fopen(path.c_str(), "wb")) {
    if (g_size) std::fwrite(g_data, 1, g_size, f);
    std::fclose(f);
  }
  std::fprintf(stderr, "artifact_prefix='%s'; Test unit written to %s\n", g_prefix.c_str(),
               path.c_str());
}

void on_death() {
  if (g_data) save("crash");
}

bool read_file(const std::string& path, Bytes* out) {
  FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return false;
  out->clear();
  uint8_t buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) out->insert(out->end(), buf, buf + n);
  std::fclose(f);
  return true;
}

void collect(const std::string& path, std::vector<Bytes>* corpus) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    std::fprintf(stderr, "standalone driver: cannot read %s\n", path.c_str());
    std::exit(2);
  }
  if (!S_ISDIR(st.st_mode)) {
    Bytes b;
    if (read_file(path, &b)) corpus->push_back(std::move(b));
    return;
  }
  DIR* d = opendir(path.c_str());
  std::vector<std::string> names;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') names.push_back(e->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  for (const auto& n : names) collect(path + "/" + n, corpus);
}

void run(const Bytes& b) {
  // An exact-size copy: the last byte is the last byte of the allocation.
  uint8_t* copy = static_cast<uint8_t*>(std::malloc(b.size() ? b.size() : 1));
  if (!b.empty()) std::memcpy(copy, b.data(), b.size());
  g_data = copy;
  g_size = b.size();
  LLVMFuzzerTestOneInput(copy, b.size());
  g_data = nullptr;
  g_size = 0;
  std::free(copy);
  g_runs.fetch_add(1, std::memory_order_relaxed);
}

// Byte values and integers that decoders trip over.
const uint64_t kInteresting[] = {0,          1,          2,          7,           8,
                                 16,         24,         55,         56,          57,
                                 63,         64,         127,        128,         255,
                                 256,        4095,       4096,       8191,        8192,
                                 8193,       65535,      65536,      0x7fffffff,  0x80000000,
                                 0xffffffff, 1ull << 32, 1ull << 40, ~0ull >> 1,  ~0ull};

void mutate(Bytes* b, const std::vector<Bytes>& corpus, size_t max_len, std::mt19937_64& rng) {
  auto pick = [&](size_t n) { return n ? static_cast<size_t>(rng() % n) : 0; };
  const int rounds = 1 + static_cast<int>(rng() % 4);
  for (int r = 0; r < rounds; ++r) {
    switch (rng() % 9) {
      case 0:  // flip a bit
        if (!b->empty()) (*b)[pick(b->size())] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:  // a random byte
        if (!b->empty()) (*b)[pick(b->size())] = static_cast<uint8_t>(rng());
        break;
      case 2: {  // an interesting integer, 1, 2, 4 or 8 bytes wide, little-endian
        const uint64_t v = kInteresting[pick(sizeof kInteresting / sizeof kInteresting[0])];
        const size_t w = size_t{1} << (rng() % 4);
        if (b->size() >= w) std::memcpy(b->data() + pick(b->size() - w + 1), &v, w);
        break;
      }
      case 3:  // insert bytes
        if (b->size() < max_len) {
          const size_t n = 1 + pick(std::min<size_t>(16, max_len - b->size()));
          b->insert(b->begin() + pick(b->size() + 1), n, static_cast<uint8_t>(rng()));
        }
        break;
      case 4:  // erase a range
        if (!b->empty()) {
          const size_t at = pick(b->size()), n = 1 + pick(std::min<size_t>(64, b->size() - at));
          b->erase(b->begin() + at, b->begin() + at + n);
        }
        break;
      case 5:  // truncate
        b->resize(pick(b->size() + 1));
        break;
      case 6: {  // splice in a piece of another input
        const Bytes& o = corpus[pick(corpus.size())];
        if (o.empty() || b->empty()) break;
        const size_t from = pick(o.size()), n = 1 + pick(std::min<size_t>(64, o.size() - from));
        const size_t at = pick(b->size());
        for (size_t i = 0; i < n && at + i < b->size(); ++i) (*b)[at + i] = o[from + i];
        break;
      }
      case 7:  // add or subtract a small number from a byte
        if (!b->empty()) (*b)[pick(b->size())] += static_cast<uint8_t>(rng() % 33) - 16;
        break;
      default:  // duplicate a range
        if (!b->empty() && b->size() < max_len) {
          const size_t at = pick(b->size()), n = 1 + pick(std::min<size_t>(32, b->size() - at));
          Bytes piece(b->begin() + at, b->begin() + at + n);
          b->insert(b->begin() + pick(b->size() + 1), piece.begin(), piece.end());
        }
        break;
    }
  }
  if (b->size() > max_len) b->resize(max_len);
}

long flag(const std::string& arg, const char* name, long fallback) {
  const std::string p = std::string("-") + name + "=";
  return arg.compare(0, p.size(), p) == 0 ? std::atol(arg.c_str() + p.size()) : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  long max_time = 0, runs = -1, timeout = 0, seed = 0, max_len = 4096;
  std::vector<std::string> paths;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a[0] != '-') {
      paths.push_back(a);
      continue;
    }
    max_time = flag(a, "max_total_time", max_time);
    runs = flag(a, "runs", runs);
    timeout = flag(a, "timeout", timeout);
    seed = flag(a, "seed", seed);
    max_len = flag(a, "max_len", max_len);
    if (a.rfind("-artifact_prefix=", 0) == 0) g_prefix = a.substr(17);
  }
  __sanitizer_set_death_callback(on_death);
  std::vector<Bytes> corpus;
  for (const auto& p : paths) collect(p, &corpus);
  if (corpus.empty()) corpus.push_back(Bytes{});
  for (const auto& b : corpus) max_len = std::max<long>(max_len, static_cast<long>(b.size()));

  const auto start = Clock::now();
  std::atomic<bool> done{false};
  std::thread watchdog;
  if (timeout > 0) {
    // One input running longer than -timeout: written out, as a hang.
    watchdog = std::thread([&] {
      uint64_t last = ~0ull;
      auto since = Clock::now();
      while (!done.load()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        const uint64_t now_runs = g_runs.load();
        if (now_runs != last || !g_data) {
          last = now_runs;
          since = Clock::now();
        } else if (Clock::now() - since > std::chrono::seconds(timeout)) {
          std::fprintf(stderr, "==%d== ERROR: libFuzzer-like timeout after %ld seconds\n",
                       getpid(), timeout);
          save("timeout");
          std::_Exit(70);
        }
      }
    });
  }
  std::fprintf(stderr, "standalone driver: %zu inputs, max_len %ld\n", corpus.size(), max_len);
  for (const auto& b : corpus) run(b);
  std::fprintf(stderr, "#%llu INITED corp: %zu\n",
               static_cast<unsigned long long>(g_runs.load()), corpus.size());

  std::mt19937_64 rng(seed ? seed : std::random_device{}());
  const auto end = start + std::chrono::seconds(max_time);
  while (runs != 0 && (runs < 0 ? max_time > 0 && Clock::now() < end
                                : static_cast<long>(g_runs.load()) < runs)) {
    for (int k = 0; k < 256; ++k) {  // the clock only every 256 runs
      Bytes b = corpus[rng() % corpus.size()];
      mutate(&b, corpus, static_cast<size_t>(max_len), rng);
      run(b);
    }
  }
  done.store(true);
  if (watchdog.joinable()) watchdog.join();
  const double secs = std::chrono::duration<double>(Clock::now() - start).count();
  const unsigned long long n = g_runs.load();
  std::fprintf(stderr, "Done %llu runs in %.0f second(s)\n", n, secs);
  std::fprintf(stderr, "stat::number_of_executed_units: %llu\n", n);
  std::fprintf(stderr, "stat::average_exec_per_sec:     %.0f\n", secs > 0 ? n / secs : 0.0);
  return 0;
}

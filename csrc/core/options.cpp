#include "core/options.h"

#include <sched.h>

#include <cctype>
#include <cstdlib>
#include <cstring>
#include <string>

#include "core/error.h"

namespace rsdp {
namespace {

// The largest byte count any setting takes: far above any machine's memory,
// and far enough below 2^64 that the layouts built from it (a segment of
// ranks^2 rings, say) cannot overflow.
constexpr unsigned long long kMaxBytes = 1ull << 40;

// The decimal digits at the start of a value. Digits only (strtoull would take
// a sign and leading blanks, and turn "-1" into 2^64-1; atoi and sscanf's %d
// are undefined past INT_MAX), checked against `max` as they are read.
struct Decimal {
  unsigned long long value = 0;
  const char* end = nullptr;  // the first character after the digits
  bool digits = false;        // at least one
  bool too_big = false;       // more than max
};

Decimal parse_decimal(const char* text, unsigned long long max) {
  Decimal d;
  const char* p = text;
  for (; *p >= '0' && *p <= '9'; ++p) {
    const unsigned digit = static_cast<unsigned>(*p - '0');
    if (d.too_big || d.value > (max - digit) / 10) d.too_big = true;
    else d.value = d.value * 10 + digit;
  }
  d.end = p;
  d.digits = p != text;
  return d;
}

// Accepts plain byte counts and K/M/G suffixes (powers of two): "64K", "2M",
// "1GiB"; at most 1024G.
size_t parse_bytes(const char* name, const char* text) {
  const Decimal d = parse_decimal(text, kMaxBytes);
  const char* end = d.end;
  int shift = 0;
  switch (*end) {
    case 'k': case 'K': shift = 10; ++end; break;
    case 'm': case 'M': shift = 20; ++end; break;
    case 'g': case 'G': shift = 30; ++end; break;
    default: break;
  }
  if (*end == 'i' || *end == 'B' || *end == 'b') ++end;
  if (*end == 'B') ++end;
  RSDP_CHECK(d.digits && *end == '\0', "environment variable ", name, "='", text,
             "' is not a byte count");
  RSDP_CHECK(!d.too_big && d.value <= (kMaxBytes >> shift), "environment variable ", name,
             "='", text, "' is more than 1024G");
  return static_cast<size_t>(d.value << shift);
}

// A whole decimal number in [0, max].
int parse_int(const char* name, const char* text, int max) {
  const Decimal d = parse_decimal(text, static_cast<unsigned long long>(max));
  RSDP_CHECK(d.digits && !d.too_big && *d.end == '\0', "environment variable ", name, "='",
             text, "' is not a whole number from 0 to ", max);
  return static_cast<int>(d.value);
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

// RSDP_EMULATE_DEVICE: "0" (off), "1" (on), or comma-separated settings that
// turn it on: "jitter=<us>", "stall=<group rank>@<op number>".
void parse_emulate_device(const char* v, Options& o) {
  if (std::strcmp(v, "0") == 0) return;
  o.emulate_device_jitter_us = 20;
  if (std::strcmp(v, "1") == 0) return;
  std::string rest = v;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    if (item.compare(0, 7, "jitter=") == 0) {
      const Decimal us = parse_decimal(item.c_str() + 7, 10'000'000);
      if (us.digits && !us.too_big && *us.end == '\0') {
        o.emulate_device_jitter_us = static_cast<int>(us.value);
        continue;
      }
    }
    if (item.compare(0, 6, "stall=") == 0) {
      const Decimal rank = parse_decimal(item.c_str() + 6, 1 << 20);
      if (rank.digits && !rank.too_big && *rank.end == '@') {
        const Decimal seq = parse_decimal(rank.end + 1, ~0ull);
        if (seq.digits && !seq.too_big && *seq.end == '\0') {
          o.emulate_device_stall_rank = static_cast<int>(rank.value);
          o.emulate_device_stall_seq = seq.value;
          continue;
        }
      }
    }
    RSDP_FAIL(ErrorKind::kValue, "environment variable RSDP_EMULATE_DEVICE='", v,
              "': '", item, "' is none of 0, 1, jitter=<microseconds>, stall=<rank>@<op number>");
  }
}

// RSDP_TEST_PLACEMENT: comma-separated "on_cpu=<cpu>", "slow_from=<op number>".
void parse_test_placement(const char* v, Options& o) {
  std::string rest = v;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    if (item.compare(0, 7, "on_cpu=") == 0) {
      const Decimal cpu = parse_decimal(item.c_str() + 7, CPU_SETSIZE - 1);
      if (cpu.digits && !cpu.too_big && *cpu.end == '\0') {
        o.test_on_cpu = static_cast<int>(cpu.value);
        continue;
      }
    }
    if (item.compare(0, 10, "slow_from=") == 0) {
      const Decimal seq = parse_decimal(item.c_str() + 10, ~0ull);
      if (seq.digits && !seq.too_big && seq.value > 0 && *seq.end == '\0') {
        o.test_slow_from = seq.value;
        continue;
      }
    }
    RSDP_FAIL(ErrorKind::kValue, "environment variable RSDP_TEST_PLACEMENT='", v, "': '", item,
              "' is none of on_cpu=<cpu>, slow_from=<op number from 1>");
  }
}

}  // namespace

std::string algo_env_var(OpKind op) {
  std::string var = "RSDP_ALGO_";
  for (const char* p = op_name(op); *p; ++p) var += static_cast<char>(std::toupper(*p));
  return var;
}

Options Options::from_env() {
  Options o;
  if (const char* v = env("RSDP_SHM_BYTES")) o.shm_bytes = parse_bytes("RSDP_SHM_BYTES", v);
  if (const char* v = env("RSDP_ONESHOT_BYTES")) {
    o.oneshot_bytes = parse_bytes("RSDP_ONESHOT_BYTES", v);
    o.oneshot_set = true;
  }
  if (const char* v = env("RSDP_P2P_BYTES")) o.p2p_bytes = parse_bytes("RSDP_P2P_BYTES", v);
  if (const char* v = env("RSDP_POOL_BYTES")) o.pool_bytes = parse_bytes("RSDP_POOL_BYTES", v);
  if (const char* v = env("RSDP_SPIN_US")) o.spin_us = parse_int("RSDP_SPIN_US", v, 1'000'000);
  if (const char* v = env("RSDP_REPROBE_MS"))
    o.reprobe_ms = parse_int("RSDP_REPROBE_MS", v, 3'600'000);
  if (const char* v = env("RSDP_SPREAD_MS"))
    o.spread_ms = parse_int("RSDP_SPREAD_MS", v, 3'600'000);
  if (const char* v = env("RSDP_DEBUG")) o.debug = std::strcmp(v, "0") != 0;
  if (const char* v = env("RSDP_NODE_ID")) o.node_id = v;
  if (const char* v = env("RSDP_CUDA_STAGING_BYTES"))
    o.cuda_staging_bytes = parse_bytes("RSDP_CUDA_STAGING_BYTES", v);
  if (const char* v = env("RSDP_CUDA_ONESHOT_BYTES"))
    o.cuda_oneshot_bytes = parse_bytes("RSDP_CUDA_ONESHOT_BYTES", v);
  if (const char* v = env("RSDP_EMULATE_DEVICE")) parse_emulate_device(v, o);
  // `v` must be one of `names` (space-separated), a whole one: "ipc nccl" is in the list
  // but no choice.
  auto check_choice = [](const char* var, const char* v, const std::string& names) {
    RSDP_CHECK(std::strchr(v, ' ') == nullptr &&
                   (" " + names + " ").find(std::string(" ") + v + " ") != std::string::npos,
               "environment variable ", var, "='", v, "' is none of its choices: ", names);
  };
  // RSDP_ALGO_<OP>, as given ("auto" is unset): the names each op accepts are the algorithm
  // table's, which checks them (check_forced_algorithms, algorithms/select.cpp).
  for (int k = 0; k < kNumOpKinds; ++k) {
    const char* v = env(algo_env_var(static_cast<OpKind>(k)).c_str());
    if (v && std::strcmp(v, "auto") != 0) o.algo[k] = v;
  }
  if (const char* v = env("RSDP_CUDA_INTRA")) {
    check_choice("RSDP_CUDA_INTRA", v, "auto ipc nccl");
    o.cuda_intra = v;
  }
  if (const char* v = env("RSDP_SHM_STORES")) {
    check_choice("RSDP_SHM_STORES", v, "auto cached streaming");
    o.shm_stores = v;
  }
  if (const char* v = env("RSDP_TEST_WIRE_LIE")) {
    RSDP_CHECK(std::strchr(v, ' ') == nullptr &&
                   std::strstr(" bytes step dtype op bits count ",
                               (std::string(" ") + v + " ").c_str()) != nullptr,
               "environment variable RSDP_TEST_WIRE_LIE='", v,
               "' names no header field; choose one of: bytes step dtype op bits count");
    o.test_wire_lie = v;
  }
  if (const char* v = env("RSDP_TEST_PLACEMENT")) parse_test_placement(v, o);
  RSDP_CHECK(o.shm_bytes >= 8192, "RSDP_SHM_BYTES must be at least 8K, got ", o.shm_bytes);
  RSDP_CHECK(o.cuda_staging_bytes >= 8192, "RSDP_CUDA_STAGING_BYTES must be at least 8K, got ",
             o.cuda_staging_bytes);
  return o;
}

}  // namespace rsdp

#include "core/test_hooks.h"

#include <cstring>
#include <string>

#include "core/env_parse.h"
#include "core/error.h"

namespace rsdp {
namespace {

using env_parse::Decimal;
using env_parse::parse_decimal;

// RSDP_TEST_EMULATE_DEVICE: "0" (off), "1" (on), or comma-separated settings
// that turn it on: "jitter=<us>", "stall=<group rank>@<op number>".
void parse_emulate_device(const char* v, TestHooks& h) {
  if (std::strcmp(v, "0") == 0) return;
  h.emulate_device_jitter_us = 20;
  if (std::strcmp(v, "1") == 0) return;
  std::string rest = v;
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string item = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    if (item.compare(0, 7, "jitter=") == 0) {
      const Decimal us = parse_decimal(item.c_str() + 7, 10'000'000);
      if (us.digits && !us.too_big && *us.end == '\0') {
        h.emulate_device_jitter_us = static_cast<int>(us.value);
        continue;
      }
    }
    if (item.compare(0, 6, "stall=") == 0) {
      const Decimal rank = parse_decimal(item.c_str() + 6, 1 << 20);
      if (rank.digits && !rank.too_big && *rank.end == '@') {
        const Decimal seq = parse_decimal(rank.end + 1, ~0ull);
        if (seq.digits && !seq.too_big && *seq.end == '\0') {
          h.emulate_device_stall_rank = static_cast<int>(rank.value);
          h.emulate_device_stall_seq = seq.value;
          continue;
        }
      }
    }
    RSDP_FAIL(ErrorKind::kValue, "environment variable RSDP_TEST_EMULATE_DEVICE='", v,
              "': '", item, "' is none of 0, 1, jitter=<microseconds>, stall=<rank>@<op number>");
  }
}

}  // namespace

TestHooks TestHooks::from_env() {
  TestHooks h;
  if (const char* v = env_parse::env("RSDP_TEST_EMULATE_DEVICE")) parse_emulate_device(v, h);
  if (const char* v = env_parse::env("RSDP_TEST_SHM_STORES")) {
    RSDP_CHECK(std::strcmp(v, "cached") == 0 || std::strcmp(v, "streaming") == 0,
               "environment variable RSDP_TEST_SHM_STORES='", v,
               "' is none of its choices: cached streaming");
    h.shm_stores = v;
  }
  if (const char* v = env_parse::env("RSDP_TEST_WIRE_LIE")) {
    RSDP_CHECK(std::strchr(v, ' ') == nullptr &&
                   std::strstr(" bytes step dtype op bits count ",
                               (std::string(" ") + v + " ").c_str()) != nullptr,
               "environment variable RSDP_TEST_WIRE_LIE='", v,
               "' names no header field; choose one of: bytes step dtype op bits count");
    h.wire_lie = v;
  }
  return h;
}

}  // namespace rsdp

// The parsing of RSDP_* environment variables' values, shared by the user's
// settings (core/options.cpp) and the project's test hooks
// (core/test_hooks.cpp), so that both refuse a malformed value the same way:
// a ValueError naming the variable.
#pragma once

#include <cstddef>
#include <cstdlib>

#include "core/error.h"

namespace rsdp {
namespace env_parse {

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

inline Decimal parse_decimal(const char* text, unsigned long long max) {
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
inline size_t parse_bytes(const char* name, const char* text) {
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
inline int parse_int(const char* name, const char* text, int max) {
  const Decimal d = parse_decimal(text, static_cast<unsigned long long>(max));
  RSDP_CHECK(d.digits && !d.too_big && *d.end == '\0', "environment variable ", name, "='",
             text, "' is not a whole number from 0 to ", max);
  return static_cast<int>(d.value);
}

// The variable's value, or null when it is unset or empty (empty is unset).
inline const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

}  // namespace env_parse
}  // namespace rsdp

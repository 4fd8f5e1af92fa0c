// A cursor over a fuzz input: the targets take their fixed fields first and
// keep the rest as a message, so that a seed file reads as "fields, then
// bytes". Past the end every field reads as zero and the rest is empty: a
// truncated input is still a valid case (the decoders must cope with it).
// (clang's FuzzedDataProvider reads from the end and is not there for the g++
// fallback driver.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <string>

namespace fuzz {

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}

  template <typename T>
  T take() {
    T v{};
    const size_t k = n_ < sizeof(T) ? n_ : sizeof(T);
    std::memcpy(&v, p_, k);
    p_ += k;
    n_ -= k;
    return v;
  }
  // Pointer to the next n bytes (fewer if fewer are left; `*got` says how many).
  const uint8_t* bytes(size_t n, size_t* got) {
    const uint8_t* at = p_;
    *got = n < n_ ? n : n_;
    p_ += *got;
    n_ -= *got;
    return at;
  }
  const uint8_t* rest() const { return p_; }
  size_t left() const { return n_; }

 private:
  const uint8_t* p_;
  size_t n_;
};

// FUZZ_TRACE=1 in the environment: the targets print what they made of each
// input (to see what a seed exercises: `FUZZ_TRACE=1 build/fuzz/.../fuzz_x seed`).
inline bool tracing() {
  static const bool on = std::getenv("FUZZ_TRACE") != nullptr;
  return on;
}

// A broken invariant: reported like a sanitizer finding (abort), so that both
// drivers keep the input that caused it.
[[noreturn]] inline void fail(const char* file, int line, const std::string& what) {
  std::fprintf(stderr, "==FUZZ CHECK FAILED== %s:%d: %s\n", file, line, what.c_str());
  std::abort();
}

}  // namespace fuzz

#define FUZZ_TRACE(...)                                 \
  do {                                                  \
    if (::fuzz::tracing()) std::fprintf(stderr, __VA_ARGS__); \
  } while (0)

#define FUZZ_CHECK(cond, what)                                              \
  do {                                                                      \
    if (!(cond)) ::fuzz::fail(__FILE__, __LINE__, std::string(#cond ": ") + (what)); \
  } while (0)

// The checking macro of the standalone C++ tests here: counts passes and
// failures (printing the first 40 failures with their line), so that a test
// ends with one "N passed, M failed" line that tests/support/native.py reads.
#pragma once

#include <cstdio>

static int g_pass = 0, g_fail = 0;
#define CHECK(cond, ...)                                                                      \
  do {                                                                                        \
    if (cond) ++g_pass;                                                                       \
    else if (++g_fail <= 40)                                                                  \
      std::fprintf(stderr, "FAIL line %d: %s -- ", __LINE__, #cond),                          \
          std::fprintf(stderr, __VA_ARGS__), std::fputc('\n', stderr);                       \
  } while (0)

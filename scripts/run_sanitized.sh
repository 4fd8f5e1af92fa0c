#!/usr/bin/env bash
# Runs pytest over torch_rsdp built under the sanitizers, and fails on any report about it:
#
#   bash scripts/run_sanitized.sh [pytest arguments]          # ASan + UBSan (default: tests/native)
#   SANITIZER=thread bash scripts/run_sanitized.sh tests/native   # ThreadSanitizer
#
# The extension is built with RSDP_SANITIZE (setup.py) in build/sanitize-<sanitizer>/, its own
# folder: the normal build stays as it is and incremental, and so does this one. Every Python
# process then loads that build (RSDP_EXTENSION, torch_rsdp/_extension.py) with the sanitizer's
# runtime preloaded (the interpreter is not built with it, and the runtime must come first);
# the native C++ tests are compiled with the same sanitizers (RSDP_NATIVE_SANITIZE,
# tests/support/native.py). Every process writes its reports to build/sanitize-<s>/reports/,
# and scripts/sanitizers/sanitizer_reports.py judges them at the end: any error in our code, or
# any leak allocated through it, fails the run (leaks of Python, torch and the compilers are
# theirs and are ignored). Suppressions for third-party code only: scripts/sanitizers/*.supp.
#
# RSDP_SANITIZE_EXTENSION=0 skips the extension (a selection of tests/native only needs g++).
# SANITIZE_BUILD_ONLY=1 builds the extension and stops (scripts/run_tests.sh builds it so
# beside the plain suite).
# ThreadSanitizer sees the races between the threads of one process (the native tests, and a
# rank's op queue, watchdog and progress threads); it cannot see shared memory written by
# another process, nor synchronisation inside the uninstrumented interpreter and torch.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SAN=${SANITIZER:-address}
case "$SAN" in
  address | thread) ;;
  *) echo "[sanitized] SANITIZER=$SAN: expected 'address' (with UBSan) or 'thread'" >&2; exit 2 ;;
esac
say() { echo "[sanitized:$SAN] $*"; }
dir=$(pwd)/build/sanitize-$SAN
reports=$dir/reports
supp=$(pwd)/scripts/sanitizers
rm -rf "$reports"
mkdir -p "$reports"

if [ "${RSDP_SANITIZE_EXTENSION:-1}" != 0 ]; then
  say "building the extension in $dir (MAX_JOBS=${MAX_JOBS:-2}; log $dir/build.log)"
  if ! RSDP_SANITIZE=$SAN MAX_JOBS=${MAX_JOBS:-2} $PY setup.py -q build_ext \
      --build-temp "$dir/temp" --build-lib "$dir/lib" > "$dir/build.log" 2>&1; then
    tail -n 60 "$dir/build.log"
    say "the sanitized build failed (log above: $dir/build.log)"
    exit 1
  fi
  if [ "${SANITIZE_BUILD_ONLY:-0}" = 1 ]; then
    say "built $(ls "$dir"/lib/torch_rsdp/_C*.so)"
    exit 0
  fi
  so=$(ls "$dir"/lib/torch_rsdp/_C*.so)
  export RSDP_EXTENSION=$so
  # The runtime the extension was linked with, exactly (ldd names the file).
  runtime=$([ "$SAN" = address ] && echo libasan || echo libtsan)
  rt=$(ldd "$so" | awk -v r="$runtime" 'index($1, r) == 1 {print $3}')
  [ -f "$rt" ] || { say "cannot find $runtime in 'ldd $so'"; exit 1; }
  # libstdc++ right after it: the interpreter does not link it, and ASan looks up the real
  # __cxa_throw when it starts; without libstdc++ loaded by then, our first C++ exception
  # would end the process in "CHECK failed: ... real___cxa_throw".
  cxxrt=$(ldd "$so" | awk 'index($1, "libstdc++") == 1 {print $3}')
  export LD_PRELOAD=$rt${cxxrt:+:$cxxrt}${LD_PRELOAD:+:$LD_PRELOAD}
  # Python's own objects on the C heap: a pybind object still alive at exit then holds our
  # objects as an indirect leak of Python's, not as a direct one of ours.
  export PYTHONMALLOC=malloc
fi
export RSDP_NATIVE_SANITIZE=$SAN

# Every process logs to reports/report.<pid>. detect_container_overflow=0: torch's containers
# are not instrumented, and one std::vector grown there and read here would be a false report.
# Leaks do not change exit codes (a compiler's or Python's would fail the step that ran it):
# sanitizer_reports.py judges them.
export ASAN_OPTIONS="log_path=$reports/report:detect_leaks=1:detect_container_overflow=0:\
halt_on_error=1:abort_on_error=0:malloc_context_size=30:symbolize=1"
export LSAN_OPTIONS="exitcode=0:suppressions=$supp/lsan.supp"
export UBSAN_OPTIONS="log_path=$reports/report:print_stacktrace=1:halt_on_error=1"
# UCX patches malloc/mmap to watch memory (its "memory events"); under ThreadSanitizer, whose
# interceptors own those calls, a UCX process then dies of SIGSEGV at start. CPU buffers over
# TCP and shared memory do not need the events.
if [ "$SAN" = thread ]; then
  export UCX_MEM_EVENTS=no
fi
export TSAN_OPTIONS="log_path=$reports/report:suppressions=$supp/tsan.supp:halt_on_error=1:\
second_deadlock_stack=1:report_signal_unsafe=0"

say "pytest ${*:-tests/native}"
set +e
$PY -m pytest "${@:-tests/native}"
rc=$?
set -e
if ! $PY scripts/sanitizers/sanitizer_reports.py "$reports"; then
  rc=1
fi
exit $rc

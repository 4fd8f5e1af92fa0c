#!/usr/bin/env bash
# Sets everything up, then runs the whole test suite: what CI runs.
#
#   bash scripts/run_tests.sh            # everything, as CI
#   bash scripts/run_tests.sh ARGS...    # set up, then just `pytest ARGS...` (a selection)
#
# Everything is four steps, so that nothing runs twice:
#   1. the suite, less the sanitized selection (tests/sanitized_selection.txt);
#   2. that selection under AddressSanitizer + UBSan (scripts/run_sanitized.sh);
#   3. the native C++ tests under ThreadSanitizer;
#   4. every fuzz target for a bounded time from its committed corpus (scripts/run_fuzz.sh).
# Each step runs even when an earlier one failed; the exit code is the first failure's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
if [ $# -gt 0 ]; then
  exec python3 -m pytest -q tests "$@"
fi
rc=0
step() {
  local t0=$SECONDS
  echo "[run_tests] ==== $1 ===="
  shift
  "$@" || { local r=$?; [ $rc != 0 ] || rc=$r; echo "[run_tests] FAILED (exit $r)"; }
  echo "[run_tests] took $((SECONDS - t0)) s"
}
# Step 2's ASan build compiles during step 1, at the lowest priority: step 1 leaves about
# half of the machine idle (ranks wait on each other, on timeouts and deadlines), and a
# nice-19 build takes what the tests leave. Step 2 then finds it up to date.
mkdir -p build
nice -n 19 env SANITIZE_BUILD_ONLY=1 bash scripts/run_sanitized.sh \
  > build/sanitize-prebuild.log 2>&1 &
prebuild=$!
step "1/4 the suite, less the sanitized selection" \
  python3 -m pytest -q tests --sanitized-selection=exclude --durations=40
wait $prebuild || echo "[run_tests] the ASan build beside step 1 failed" \
  "(build/sanitize-prebuild.log); step 2 builds again"
step "2/4 the sanitized selection under ASan + UBSan" \
  bash scripts/run_sanitized.sh -q tests --sanitized-selection=only
step "3/4 the native tests under TSan" \
  env SANITIZER=thread RSDP_SANITIZE_EXTENSION=0 bash scripts/run_sanitized.sh -q tests/native \
  -k "not reduce_kernels"  # single-threaded kernels: nothing for TSan to see
step "4/4 the fuzz targets" bash scripts/run_fuzz.sh
exit $rc

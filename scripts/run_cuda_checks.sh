#!/usr/bin/env bash
# On a machine with a GPU and a CUDA build of torch, offline: build torch_rsdp with its CUDA
# parts, check that it imports, run the CUDA tests in batches, then a short CUDA benchmark.
#
#   bash scripts/run_cuda_checks.sh        # from the checkout; DRY_RUN=1 prints the plan
#
# Needs: a CUDA torch, nvcc, pytest, and vendor/ucx (scripts/vendor_ucx.sh, run where apt
# works; it travels with the checkout). Installs nothing: no apt, no pip, no network, so
# scripts/setup.sh (which installs what is missing) is not used here.
#
# Writes at most 8 files to $OUT (default /tmp/cuda-check): summary.txt first, rewritten after
# every stage (seconds, exit code, pass/fail counts, last lines of its log), and one log per
# stage. Every stage has its own time limit, and all of them together 450 s (under 8 minutes
# with the start and a last stage's 10 s to stop); pytest is stopped with SIGINT so a hang
# still prints the failures so far. A failed stage is recorded and the next one runs; the exit
# code is non-zero if any stage failed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
OUT=${OUT:-/tmp/cuda-check}
DRY_RUN=${DRY_RUN:-0}
mkdir -p "$OUT"
rm -f "$OUT"/summary.txt "$OUT"/*.log

# Time limits in seconds (each overridable). 2026-11-27 on an H200 with 16 cores: the build
# 90 s, the ws1 batch 27 s, the benchmark 15 s; ws2 hung, hence the limits. They add up to 455;
# TOTAL_S cuts the last ones short if the earlier ones ran long.
BUILD_S=${BUILD_S:-130}
IMPORT_S=${IMPORT_S:-20}
SOURCES_S=${SOURCES_S:-45}
WS1_S=${WS1_S:-45}
WS234_S=${WS234_S:-80}
REST_S=${REST_S:-75}
EMULATED_S=${EMULATED_S:-30}
BENCH_S=${BENCH_S:-30}
# The whole run stays within TOTAL_S: a stage gets at most what is left of it.
TOTAL_S=${TOTAL_S:-450}

export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
export RSDP_WITH_CUDA=1 MAX_JOBS=${MAX_JOBS:-$(nproc)}
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export UCX_HOME=${UCX_HOME:-$ROOT/vendor/ucx/usr}
# Never reach for the network, even by accident (nothing here installs anything).
export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The system compiler: a CXX wrapper (/opt/gcc/bin/g++ on the GPU machine) built an extension
# that segfaulted at import (docs/cuda.md). nvcc takes its host compiler from CC.
if [ -x /usr/bin/g++ ] && [ -x /usr/bin/gcc ]; then
  export CXX=/usr/bin/g++ CC=/usr/bin/gcc
fi

START=$(date +%s)
FAILED=0
TABLE=""
TAILS=""
HEADER="torch_rsdp CUDA checks, $(date -u '+%Y-%m-%d %H:%M:%S UTC'), $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet HEAD 2>/dev/null || echo '+changes')
host $(uname -n), $(nproc) cores; MAX_JOBS=$MAX_JOBS TORCH_CUDA_ARCH_LIST=$TORCH_CUDA_ARCH_LIST
CXX=${CXX:-(unset)} ($(${CXX:-c++} --version 2>/dev/null | head -1)); CC=${CC:-(unset)}
UCX_HOME=$UCX_HOME; nvcc: $(command -v nvcc || echo "${CUDA_HOME:-?}/bin/nvcc?")
limits (s): build $BUILD_S, import $IMPORT_S, sources $SOURCES_S, ws1 $WS1_S, ws2-4 $WS234_S, rest $REST_S, bench $BENCH_S, emulated $EMULATED_S; total $TOTAL_S"

write_summary() {  # $1: the stage running now, if any
  {
    echo "$HEADER"
    echo
    printf '%-10s %6s %5s  %-8s %s\n' stage seconds rc result "passed/failed/errors/skipped"
    printf '%s' "$TABLE"
    [ -n "${1:-}" ] && printf '%-10s %6s %5s  %-8s\n' "$1" "…" "" running
    echo
    printf '%s' "$TAILS"
  } > "$OUT/summary.txt"
}

# pytest's closing counts of a log: "P/F/E/S".
counts() {
  local line n
  line=$(grep -E '(passed|failed|error|skipped|deselected|no tests ran)' "$1" | grep -E ' in [0-9.]+s' | tail -1)
  for w in passed failed error skipped; do
    n=$(grep -oE "[0-9]+ $w" <<<"$line" | grep -oE '^[0-9]+' || true)
    printf '%s' "${n:-0}"; [ $w = skipped ] || printf /
  done
}

# run_stage NAME LIMIT LOG KIND CMD...: KIND "pytest" (fails unless something passed, since
# test_cuda.py skips itself where CUDA is unusable) or "plain". Appends to LOG.
run_stage() {
  local name=$1 limit=$2 log=$OUT/$3 kind=$4; shift 4
  local left=$(( TOTAL_S - ($(date +%s) - START) ))
  local t0 rc result cnt="" secs
  [ "$limit" -gt "$left" ] && limit=$left
  write_summary "$name"
  echo "[cuda-checks $(( $(date +%s) - START ))s] $name (limit ${limit}s): $*"
  echo "===== $name (limit ${limit}s): $*" >> "$log"  # import shares build.log
  t0=$(date +%s)
  if [ "$limit" -lt 5 ]; then
    echo "no time left for: $*" >> "$log"; rc=125
  elif [ "$DRY_RUN" = 1 ]; then
    echo "would run (timeout ${limit}s): $*" >> "$log"; rc=0
  elif [ "$kind" = pytest ]; then
    # SIGINT: pytest stops and prints what failed so far; SIGKILL 10 s later if it hangs on.
    timeout -s INT -k 10 "$limit" "$@" >> "$log" 2>&1; rc=$?
  else
    timeout -k 10 "$limit" "$@" >> "$log" 2>&1; rc=$?
  fi
  secs=$(( $(date +%s) - t0 ))
  result=ok
  if [ "$kind" = pytest ]; then
    cnt=$(counts "$log")
    [ "$DRY_RUN" = 1 ] || [ "${cnt%%/*}" -gt 0 ] || result=FAIL
  fi
  [ $rc -eq 0 ] || result=FAIL
  # 124: stopped at the limit; 137: killed 10 s later, still running.
  { [ $rc -eq 124 ] || [ $rc -eq 137 ]; } && result=TIMEOUT
  [ $rc -eq 125 ] && result=SKIPPED
  [ $result = ok ] || FAILED=1
  TABLE+=$(printf '%-10s %6s %5s  %-8s %s' "$name" "$secs" "$rc" "$result" "$cnt")$'\n'
  TAILS+="== $name ($(basename "$log")), last lines:"$'\n'"$(tail -n 8 "$log" | cut -c1-240)"$'\n\n'
  write_summary
  echo "[cuda-checks] $name: $result (rc $rc, ${secs}s${cnt:+, $cnt passed/failed/errors/skipped})"
}

fail_early() {  # a missing prerequisite: nothing else can run
  TABLE+=$(printf '%-10s %6s %5s  %-8s' preflight 0 1 FAIL)$'\n'
  TAILS+="== preflight: $*"$'\n'
  write_summary
  echo "[cuda-checks] cannot run: $*" >&2
  exit 2
}

write_summary preflight
# Prerequisites, checked before anything builds (each with what to do about it).
if [ "$DRY_RUN" != 1 ]; then
  # One interpreter start for the Python side (importing torch takes seconds).
  why=$($PY - 2>&1 <<'PY'
import importlib.util
try:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME
except Exception as e:  # noqa: BLE001
    print(f"torch does not import ({type(e).__name__}: {e})")
    raise SystemExit
if not torch.version.cuda:
    print(f"torch {torch.__version__} has no CUDA; this needs a GPU machine with a CUDA torch")
elif not torch.cuda.is_available():
    print("torch.cuda.is_available() is False: no usable GPU")
elif not CUDA_HOME:
    print("nvcc not found (set CUDA_HOME)")
elif importlib.util.find_spec("pytest") is None:
    print("pytest is not installed")
PY
)
  [ -z "$why" ] || fail_early "$PY: $why"
  [ -f "$UCX_HOME/include/ucp/api/ucp.h" ] \
    || fail_early "no UCX at UCX_HOME=$UCX_HOME; run scripts/vendor_ucx.sh where apt works and bring vendor/ along"
fi

PYTEST=($PY -m pytest -q -p no:cacheprovider -o addopts= -rf --tb=short)

run_stage build "$BUILD_S" build.log plain $PY setup.py -q build_ext --inplace
# A crash at import is reported with the compiler that built it (and rebuilt with /usr/bin/g++
# where another compiler did); then what was built, and whether CUDA is usable.
run_stage import "$IMPORT_S" build.log plain bash -c "$PY scripts/check_import.py \
  --log '$OUT/build.log' --rebuild '$PY setup.py -q build_ext --inplace' && $PY -c \
  'import torch_rsdp as t; print(t.build_info()); assert t.cuda_available(), \"cuda_available() is False\"'"
run_stage sources "$SOURCES_S" sources.log pytest "${PYTEST[@]}" \
  tests/cuda/test_cuda_sources.py tests/cuda/test_cuda_unavailable.py
# test_cuda.py's batches (BATCHES there): ws1 is the NCCL path, ws2-ws4 share the GPU over
# CUDA IPC with 1 MiB of staging; the rest is the default staging, RSDP parity, DDP, offload
# (test_cuda_offload: shards in pinned host memory; it builds Hugging Face models, hence the
# rest's longer limit) and the error cases.
run_stage ws1 "$WS1_S" ws1.log pytest "${PYTEST[@]}" -k ws1 tests/cuda/test_cuda.py
run_stage ws2-4 "$WS234_S" ws2-4.log pytest "${PYTEST[@]}" \
  -k "(ws2 or ws3 or ws4) and not staging and not rsdp" tests/cuda/test_cuda.py
run_stage rest "$REST_S" rest.log pytest "${PYTEST[@]}" \
  -k "not ws1 and not ws2 and not ws3 and not ws4 or staging or rsdp" tests/cuda/test_cuda.py
# Two ranks sharing the GPU (NCCL refuses that, so the reference is the device copy rate).
# Its results.md/json go to a temporary folder: the tables are in the log already.
bench_out=$(mktemp -d)
run_stage bench "$BENCH_S" bench.log plain $PY -m benchmarks collectives --device cuda \
  --world-size 2 --ops allreduce,allgather --dtypes float32 --min-bytes 4K \
  --max-bytes 256M --iters 10 --out "$bench_out"
rm -rf "$bench_out"
# Last, in what time is left: the emulated device's 2-rank batch with small staging (the whole
# file takes minutes and runs in CPU CI anyway), to compare with the real device's results.
if [ -f tests/cuda/test_emulated_device.py ]; then
  run_stage emulated "$EMULATED_S" emulated.log pytest "${PYTEST[@]}" -k "ws2 and not staging" \
    tests/cuda/test_emulated_device.py
fi

echo "[cuda-checks] done in $(( $(date +%s) - START ))s: $([ $FAILED = 0 ] && echo 'all stages passed' || echo 'some stages FAILED'); see $OUT/summary.txt"
exit $FAILED

#!/usr/bin/env bash
# Builds and runs the fuzz targets of tests/fuzz/ (tests/fuzz/README.md), each for a bounded
# time from a copy of its committed seed corpus, and fails on any crash, leak, timeout or
# broken invariant:
#
#   bash scripts/run_fuzz.sh                   # every target, 60 s in all (CI)
#   bash scripts/run_fuzz.sh 120               # every target, 120 s each
#   bash scripts/run_fuzz.sh 30 ucx_header     # one target (tests/fuzz/fuzz_ucx_header.cpp)
#   bash scripts/run_fuzz.sh --regress         # each committed input once (no fuzzing)
#
# A target is tests/fuzz/fuzz_<name>.cpp with LLVMFuzzerTestOneInput; its seeds are
# tests/fuzz/corpus/<name>/. The file names the csrc/ sources it needs on a line
# "// fuzz-sources: csrc/a.cpp csrc/b.cpp" (without one: csrc/**/<name>.cpp) and may add
# libFuzzer flags on a line "// fuzz-options: -max_len=N": a new target needs nothing else.
#
# With clang and libFuzzer (Debian: clang-14 and libclang-rt-14-dev, which ships
# libclang_rt.fuzzer; scripts/setup.sh installs them) the targets are built with
# -fsanitize=fuzzer,address,undefined; otherwise with g++ -fsanitize=address,undefined and
# tests/fuzz/standalone_driver.cpp, which runs the seeds and then blind mutations of them
# (FUZZ_DRIVER=standalone forces that). Objects are kept in build/fuzz/<driver>/ and rebuilt
# when a source or a header they include changes. Runs happen in build/fuzz/run/<name>/
# (--regress: build/fuzz/regress/<name>/): the fuzzer grows a copy of the corpus there, never
# the committed one.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { echo "[fuzz] $*"; }

regress=0
seconds=""
targets=()
for a in "$@"; do
  case "$a" in
    --regress) regress=1 ;;
    -h | --help) sed -n '2,23p' "$0"; exit 0 ;;
    *[!0-9]*) targets+=("$a") ;;
    *) seconds=$a ;;
  esac
done
if [ ${#targets[@]} = 0 ]; then
  for f in tests/fuzz/fuzz_*.cpp; do
    n=$(basename "$f" .cpp)
    targets+=("${n#fuzz_}")
  done
fi
for t in "${targets[@]}"; do
  [ -f "tests/fuzz/fuzz_$t.cpp" ] || { say "no target tests/fuzz/fuzz_$t.cpp"; exit 2; }
done
# 60 s in all by default, but at least 5 s a target.
if [ -z "$seconds" ]; then
  seconds=$((60 / ${#targets[@]}))
  [ "$seconds" -ge 5 ] || seconds=5
fi

# --- the compiler ------------------------------------------------------------------------
out=build/fuzz
mkdir -p "$out"
probe=$out/probe.cpp
printf '%s\n' '#include <cstdint>' '#include <cstddef>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' > "$probe"
driver=""
if [ "${FUZZ_DRIVER:-}" != standalone ]; then
  for cxx in ${FUZZ_CXX:-} clang++ clang++-14 clang++-15 clang++-16 clang++-17 clang++-18; do
    command -v "$cxx" >/dev/null 2>&1 || continue
    if "$cxx" -fsanitize=fuzzer,address,undefined "$probe" -o "$out/probe" >/dev/null 2>&1; then
      driver=libfuzzer
      CXX=$cxx
      break
    fi
  done
fi
SAN=(-g -O1 -fno-omit-frame-pointer -fno-sanitize-recover=all)
if [ -n "$driver" ]; then
  COMPILE=(-fsanitize=fuzzer-no-link,address,undefined "${SAN[@]}")
  LINK=(-fsanitize=fuzzer,address,undefined)
else
  driver=standalone
  CXX=${FUZZ_GXX:-g++}
  command -v "$CXX" >/dev/null || { say "neither clang with libFuzzer nor g++ found"; exit 2; }
  COMPILE=(-fsanitize=address,undefined "${SAN[@]}")
  LINK=(-fsanitize=address,undefined -pthread)
  [ "${FUZZ_DRIVER:-}" = standalone ] ||
    say "no clang with libFuzzer (apt-get install clang-14 libclang-rt-14-dev): using" \
        "tests/fuzz/standalone_driver.cpp with $CXX, blind mutations without coverage"
fi
say "driver: $driver ($($CXX --version | head -n 1))"
bdir=$out/$driver
mkdir -p "$bdir/obj"
flags_id="$CXX ${COMPILE[*]}"

# Compiles one source into bdir/obj (again only when it, a header it includes, or the flags
# changed), and prints the object's path.
compile() {
  local src=$1 obj dep
  obj=$bdir/obj/$(echo "$src" | tr '/' '_').o
  dep=$obj.d
  local stale=1
  if [ -f "$obj" ] && [ -f "$dep" ] && [ "$(cat "$obj.flags" 2>/dev/null)" = "$flags_id" ]; then
    stale=0
    # The dependency file: "obj: a.cpp b.h \" lines.
    for f in $(sed -e 's/^[^:]*://' -e 's/\\$//' "$dep"); do
      if [ ! -e "$f" ] || [ "$f" -nt "$obj" ]; then stale=1; break; fi
    done
  fi
  if [ "$stale" = 1 ]; then
    "$CXX" -std=c++17 "${COMPILE[@]}" -I csrc -I tests/fuzz -MMD -MF "$dep" -c "$src" -o "$obj" \
      >&2 || return 1
    echo "$flags_id" > "$obj.flags"
  fi
  echo "$obj"
}

# --- build and run each target ---------------------------------------------------------------
summary=()
failed=0
start_all=$(date +%s)
for t in "${targets[@]}"; do
  src=tests/fuzz/fuzz_$t.cpp
  sources=$(sed -n 's|^// fuzz-sources:||p' "$src")
  # Without the line: the csrc/ file of the target's name (fuzz_store_records.cpp tests
  # csrc/core/store_records.cpp), if there is exactly one.
  if [ -z "$sources" ]; then
    found=$(find csrc -name "$t.cpp")
    [ "$(echo "$found" | grep -c .)" = 1 ] && sources=$found
  fi
  options=$(sed -n 's|^// fuzz-options:||p' "$src")
  objs=()
  ok=1
  [ "$driver" = standalone ] && sources="$sources tests/fuzz/standalone_driver.cpp"
  for s in "$src" $sources; do
    if o=$(compile "$s"); then objs+=("$o"); else ok=0; break; fi
  done
  bin=$bdir/fuzz_$t
  if [ "$ok" = 1 ]; then
    relink=0
    [ -f "$bin" ] || relink=1
    for o in "${objs[@]}"; do [ "$o" -nt "$bin" ] && relink=1; done
    if [ "$relink" = 1 ]; then "$CXX" "${LINK[@]}" "${objs[@]}" -o "$bin" || ok=0; fi
  fi
  if [ "$ok" = 0 ]; then
    say "$t: the build failed"
    summary+=("$t|-|-|-|BUILD FAILED")
    failed=1
    continue
  fi

  # --regress has its own folders, so that it can run beside a fuzzing run.
  run=$out/$([ "$regress" = 1 ] && echo regress || echo run)/$t
  rm -rf "$run"
  mkdir -p "$run/corpus"
  seeds=tests/fuzz/corpus/$t
  nseeds=0
  if [ -d "$seeds" ]; then
    cp -r "$seeds/." "$run/corpus/"
    nseeds=$(find "$run/corpus" -type f | wc -l)
  else
    say "$t: no seed corpus $seeds (starting from nothing)"
  fi
  log=$run/log.txt
  # A report stops the process (halt_on_error); LSan judges leaks when each input ends
  # (libFuzzer) or at exit (standalone driver).
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  common=(-timeout=5 -rss_limit_mb=2048 -artifact_prefix="$run/" $options)
  t0=$(date +%s)
  if [ "$regress" = 1 ]; then
    mapfile -t files < <(find "$run/corpus" -type f | sort)
    set +e
    "$bin" "${common[@]}" -runs=0 "${files[@]}" > "$log" 2>&1
    rc=$?
    set -e
  else
    say "$t: fuzzing for ${seconds}s from $nseeds seeds"
    set +e
    "$bin" "${common[@]}" -max_total_time="$seconds" -print_final_stats=1 "$run/corpus" \
      > "$log" 2>&1
    rc=$?
    set -e
  fi
  t1=$(date +%s)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -n 1)
  corp=$(find "$run/corpus" -type f | wc -l)
  [ "$regress" = 1 ] && { execs=$nseeds; rate="-"; corp=$nseeds; }
  artifacts=$(find "$run" -maxdepth 1 -type f \
    \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' -o -name 'oom-*' \) | sort)
  if [ "$rc" = 0 ] && [ -z "$artifacts" ]; then
    result=ok
  else
    failed=1
    result="FAILED (exit $rc)"
    # The report from its first line (a sanitizer's, a broken check's, a timeout's), else the
    # log's end; then the lines that name the input.
    first=$(grep -n -m 1 -E 'ERROR: |runtime error: |FUZZ CHECK FAILED|deadly signal' "$log" \
      | cut -d: -f1 || true)
    say "$t: FAILED (exit $rc); the report (from $log):"
    if [ -n "$first" ]; then
      sed -n "$((first > 2 ? first - 2 : 1)),$((first + 40))p" "$log" | sed 's/^/    /'
      echo "    ..."
      grep -E 'SUMMARY|Test unit written' "$log" | sed 's/^/    /'
    else
      tail -n 60 "$log" | sed 's/^/    /'
    fi
    for a in $artifacts; do
      say "$t: the input that failed: $a"
      say "  keep it as a regression case once fixed:" \
          "cp $a tests/fuzz/corpus/$t/regression-<what>"
    done
  fi
  summary+=("$t|${execs:--}|${rate:--}|$corp|$result ($((t1 - t0))s)")
done

echo
printf '%-16s %12s %10s %8s  %s\n' target executions "exec/s" corpus result
for row in "${summary[@]}"; do
  IFS='|' read -r a b c d e <<< "$row"
  printf '%-16s %12s %10s %8s  %s\n' "$a" "$b" "$c" "$d" "$e"
done
say "$driver, $(( $(date +%s) - start_all ))s in all"
exit "$failed"

#!/usr/bin/env bash
# Installs everything torch_rsdp needs on a fresh Debian machine, idempotently:
# Python packages, Debian packages, and the extension itself (built against
# the installed torch). Safe to run again; it only does what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
TORCH_VERSION=${RSDP_TORCH_VERSION:-2.13.0}

say() { echo "[setup] $*"; }

# Debian packages: UCX (and pkg-config to find it) for the inter-node
# transport, which the build links; iproute2 (ip, tc) for the emulated-node
# tests; Open MPI (mpirun, and mpicc to build mpi4py) for the benchmark's
# `--peers mpi` reference, nothing else needs it. A failure is reported here
# and again, clearly, by setup.py (or by the benchmark, for Open MPI).
need_apt=()
# A UCX unpacked by scripts/vendor_ucx.sh serves where the package is missing.
if [ -z "${UCX_HOME:-}" ] && ! dpkg -s libucx-dev >/dev/null 2>&1 \
    && [ -f vendor/ucx/usr/include/ucp/api/ucp.h ]; then
  export UCX_HOME="$(pwd)/vendor/ucx/usr"
  say "using the UCX unpacked in vendor/ucx"
fi
[ -n "${UCX_HOME:-}" ] || dpkg -s libucx-dev >/dev/null 2>&1 || need_apt+=(libucx-dev)
command -v pkg-config >/dev/null 2>&1 || need_apt+=(pkg-config)
command -v ip >/dev/null 2>&1 || need_apt+=(iproute2)
dpkg -s openmpi-bin >/dev/null 2>&1 || need_apt+=(openmpi-bin)
dpkg -s libopenmpi-dev >/dev/null 2>&1 || need_apt+=(libopenmpi-dev)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "apt-get install ${need_apt[*]}"
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null) \
      || say "warning: could not install ${need_apt[*]} (the build needs UCX; the multi-node tests need iproute2; benchmarks collectives --peers mpi needs Open MPI)"
  else
    say "warning: missing Debian packages ${need_apt[*]} (need root to install)"
  fi
fi
# clang 14 and its runtime libraries for the fuzz targets (scripts/run_fuzz.sh): on bookworm
# libclang-rt-14-dev is what ships libclang_rt.fuzzer, which -fsanitize=fuzzer links
# (libfuzzer-14-dev only adds a standalone libFuzzer.a). Optional, and installed on its own so
# that a release without these names still gets the packages above: without them
# run_fuzz.sh falls back to g++ and a driver without coverage feedback.
need_fuzz_apt=()
dpkg -s clang-14 >/dev/null 2>&1 || need_fuzz_apt+=(clang-14)
dpkg -s libclang-rt-14-dev >/dev/null 2>&1 || need_fuzz_apt+=(libclang-rt-14-dev)
if [ ${#need_fuzz_apt[@]} -gt 0 ] && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  say "apt-get install ${need_fuzz_apt[*]} (for scripts/run_fuzz.sh)"
  ( (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
      --no-install-recommends "${need_fuzz_apt[@]}" >/dev/null) \
    || say "warning: could not install ${need_fuzz_apt[*]} (scripts/run_fuzz.sh then uses g++)"
fi

# libfabric for the benchmark's `--peers oneccl` (nothing else needs it): oneCCL's OFI
# transport loads libfabric.so.1 at run time. Optional and installed on its own, as above;
# without it the benchmark names it and leaves the peer out.
if ! dpkg -s libfabric1 >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    say "apt-get install libfabric1 (for python -m benchmarks collectives --peers oneccl)"
    ( (apt-get update -qq || true) && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        --no-install-recommends libfabric1 >/dev/null) \
      || say "warning: could not install libfabric1 (benchmarks collectives --peers oneccl needs it)"
  else
    say "warning: missing Debian package libfabric1 (need root to install; only" \
        "benchmarks collectives --peers oneccl needs it)"
  fi
fi

# torch first, pinned: any other spec would download a different build. A
# torch with CUDA that is already installed stays (GPU machines bring their
# own); the build then compiles the CUDA parts too.
if $PY -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
  say "keeping the installed CUDA torch $($PY -c 'import torch; print(torch.__version__)')"
elif ! $PY -c "import torch, sys; sys.exit(0 if torch.__version__.split('+')[0] == '$TORCH_VERSION' else 1)" 2>/dev/null; then
  say "pip install torch==$TORCH_VERSION"
  $PY -m pip install -q "torch==$TORCH_VERSION"
fi
# The Python packages of the tests and examples, at the exact versions of
# scripts/requirements-test.txt (what CI tests; the trainer libraries inside
# the ranges torch_rsdp's integrations were tested with): whatever is missing
# or at another version is installed. mpi4py (the benchmark's Open MPI peer)
# is built against mpicc where no wheel fits, and a wheel loads Open MPI's
# libmpi at run time: without Open MPI it is left out with a warning, and the
# benchmark skips the peer.
wanted=$($PY - <<'PY'
import importlib.metadata as md, importlib.util, shutil, sys
out = []
for line in open("scripts/requirements-test.txt"):
    line = line.split("#")[0].strip()
    if not line:
        continue
    name, version = line.split("==")
    try:
        if md.version(name) == version:
            continue
    except md.PackageNotFoundError:
        pass
    out.append(line)
if shutil.which("mpicc"):
    if importlib.util.find_spec("mpi4py") is None:
        out.append("mpi4py")
elif importlib.util.find_spec("mpi4py") is None:
    print("[setup] warning: mpicc not found (Debian package libopenmpi-dev): mpi4py not "
          "installed, python -m benchmarks collectives --peers mpi will skip Open MPI", file=sys.stderr)
print(" ".join(out))
PY
)
if [ -n "$wanted" ]; then
  say "pip install $wanted"
  $PY -m pip install -q $wanted
fi

# Intel oneCCL for the benchmark's `--peers oneccl` (nothing else needs it): the CPU runtime
# and its headers, at the version benchmarks/common.py names (ONECCL_VERSION), which
# compiles its peer program against them on first use. --no-deps: the runtime wheel asks for
# a `libfabric` distribution that PyPI does not have; the libfabric it loads is Debian's
# (above). A failure is a warning: the benchmark then says what is missing and runs without
# the peer.
ONECCL_VERSION=$(sed -n 's/^ONECCL_VERSION = "\([^"]*\)".*/\1/p' benchmarks/common.py)
oneccl_ok="import importlib.metadata as m, sys; sys.exit(0 if all(m.version(n) == sys.argv[1]
    for n in ('oneccl-cpu', 'oneccl-cpu-devel')) else 1)"
if ! $PY -c "$oneccl_ok" "$ONECCL_VERSION" 2>/dev/null; then
  say "pip install --no-deps oneccl-cpu==$ONECCL_VERSION oneccl-cpu-devel==$ONECCL_VERSION"
  $PY -m pip install -q --no-deps "oneccl-cpu==$ONECCL_VERSION" \
      "oneccl-cpu-devel==$ONECCL_VERSION" \
    || say "warning: could not install oneCCL $ONECCL_VERSION (benchmarks collectives --peers oneccl" \
           "will be left out)"
fi

# The extension, built in place with ninja against the installed torch. The
# objects are kept in build/, so a rebuild with nothing changed takes seconds
# (pip's editable install would recompile everything in a temporary directory
# every time). A .pth file then puts this checkout on Python's path, which is
# what an editable install amounts to.
# The compiler's command lines go to a log, not the terminal: ninja's [k/N]
# counter is shown instead (in place on a terminal, every 10 files otherwise),
# and the whole log is printed if the build fails.
mkdir -p build
log=build/setup-build.log
: > "$log"
build_progress() {
  local line shown=0
  while IFS= read -r line; do
    printf '%s\n' "$line" >> "$log"
    [[ $line =~ ^\[([0-9]+)/([0-9]+)\] ]] || continue
    local k=${BASH_REMATCH[1]} n=${BASH_REMATCH[2]}
    if [ -t 1 ]; then
      printf '\r[setup] compiling %d/%d' "$k" "$n"; shown=1
    elif [ "$k" = "$n" ] || [ $((k % 10)) = 0 ]; then
      say "compiled $k/$n"
    fi
  done
  if [ "$shown" = 1 ]; then echo; fi
}
# A compiler whose extension crashed at import here before (check_import.py below then
# rebuilt with the system compiler and noted it) is not used again: rebuilding with it would
# crash, and switching back and forth would recompile everything on every run.
safe_cc=build/import-safe-compiler
if [ -s "$safe_cc" ]; then
  read -r CXX CC < "$safe_cc"
  export CXX CC
  say "building with CXX=$CXX CC=$CC (see $safe_cc)"
fi
say "building torch_rsdp._C (MAX_JOBS=${MAX_JOBS:-2}; full log in $log)"
if ! MAX_JOBS=${MAX_JOBS:-2} $PY setup.py -q build_ext --inplace 2>&1 | build_progress; then
  say "the build failed; its log ($log):"
  cat "$log"
  exit 1
fi
# Import it in a child process: a compiler wrapper can build an extension that segfaults at
# import. On failure this names the compiler and rebuilds once from clean with /usr/bin/g++;
# silent when the import works.
if ! MAX_JOBS=${MAX_JOBS:-2} $PY scripts/check_import.py --log "$log" --remember "$safe_cc" \
    --rebuild "$PY setup.py -q build_ext --inplace"; then
  say "torch_rsdp does not import; fix the build before running anything (log: $log)"
  exit 1
fi
site=$($PY -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
echo "$(pwd)" > "$site/torch_rsdp_checkout.pth"
(cd / && $PY -c "import torch_rsdp, torch.distributed as d; assert 'rsdp' in d.Backend.backend_list; print('[setup] torch_rsdp', torch_rsdp.__version__, 'ready at', torch_rsdp.__path__[0])")

"""What every suite shares: sizes and their formatting, markdown tables, ports, the machine a
run measured, the result files, the CPU probe, and the communication libraries measured beside
torch.distributed (Open MPI through mpi4py, oneCCL through oneccl_peer.cpp).

Ranks are started through torch_rsdp.testing.launch (the launcher the tests use) or, for the
suites that drive torch.distributed themselves, torch.multiprocessing with `free_port()`.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

KiB, MiB = 1 << 10, 1 << 20
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")


# --------------------------------------------------------------------------- sizes, tables


def parse_size(text: str) -> int:
    """'8', '4K', '64M', '1G', '512KiB' -> bytes (binary multiples)."""
    s = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = 1
    if s and s[-1] in "KMG":
        mult = 1 << (10 * ("KMG".index(s[-1]) + 1))
        s = s[:-1]
    try:
        value = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (use e.g. 8, 4K, 64M)") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"size must be positive: {text!r}")
    return value * mult


def parse_sizes(text: str) -> list[int]:
    """'64K,1M' -> [65536, 1048576]."""
    return [parse_size(t) for t in text.split(",") if t.strip()]


def csv_list(choices=None):
    """An argparse type: 'a,b' -> ['a', 'b'], each one of `choices` when given."""
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        bad = [t for t in items if choices is not None and t not in choices]
        if bad:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(bad)} (choose from {', '.join(choices)})")
        return items
    return parse


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text}")
    return value


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt_bytes(b) -> str:
    """In the largest unit it reaches: exact multiples as such (64 KiB), others to one decimal
    (1.5 MiB, never 1536 KiB)."""
    if b is None or b != b:
        return "-"
    b = int(b) if float(b).is_integer() else b
    for unit, name in ((1 << 30, "GiB"), (MiB, "MiB"), (KiB, "KiB")):
        if abs(b) >= unit:
            return f"{b // unit} {name}" if b % unit == 0 else f"{b / unit:.1f} {name}"
    return f"{b:.0f} B"


def fmt_num(x, digits: int = 2) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 100:
        return f"{x:.1f}"
    if 0 < x < 0.01:
        return f"{x:.2g}"
    return f"{x:.{digits}f}"


def md_table(header: list[str], rows: list[list], align: str | None = None) -> str:
    """Markdown table padded to column width, so it also reads well on a terminal; `align`
    has one letter per column, "l" or "r" (default: the first left, the others right)."""
    align = align or "l" + "r" * (len(header) - 1)
    rows = [[str(c) for c in r] for r in rows]
    cells = [header] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]

    def line(r):
        return "| " + " | ".join(c.rjust(w) if a == "r" else c.ljust(w)
                                 for c, w, a in zip(r, widths, align)) + " |"

    sep = "|" + "|".join(("-" * (w + 1) + ":") if a == "r" else ("-" * (w + 2))
                         for w, a in zip(widths, align)) + "|"
    return "\n".join([line(header), sep] + [line(r) for r in rows])


# --------------------------------------------------------------------------- machine, results


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_field(path: str, key: str) -> str | None:
    """The value after `key` on its line of a /proc file (cpuinfo, meminfo, status)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return None


def cpu_model() -> str:
    return _proc_field("/proc/cpuinfo", "model name") or platform.processor() or "unknown"


def memory_bytes() -> int:
    return int((_proc_field("/proc/meminfo", "MemTotal:") or "0 kB").split()[0]) * 1024


def proc_status_kib(field: str) -> int:
    value = _proc_field("/proc/self/status", field + ":")
    return int(value.split()[0]) if value else 0


def git_commit() -> str:
    """The checkout's commit, with "+dirty" when tracked files differ from it."""
    try:
        head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short=12", "HEAD"],
                              capture_output=True, text=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "-uno"],
                               capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def machine() -> dict:
    """What a figure depends on besides the code: CPU model, vCPUs, memory, torch."""
    import torch
    return {"cpu_model": cpu_model(), "vcpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)), "memory_bytes": memory_bytes(),
            "torch": torch.__version__, "python": platform.python_version(),
            "kernel": platform.release(), "load_1min": round(os.getloadavg()[0], 2)}


def provenance(argv=None) -> dict:
    """The command line, commit, machine and time of this run."""
    argv = sys.argv[1:] if argv is None else list(argv)
    suite = os.environ.get("RSDP_BENCH_SUITE", "")
    return {"command": shlex.join(["python", "-m", "benchmarks", *([suite] if suite else []),
                                   *argv]),
            "commit": git_commit(), "machine": machine(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")}


def provenance_markdown(prov: dict) -> str:
    m = prov["machine"]
    return (f"Command: `{prov['command']}`  \n"
            f"Commit {prov['commit']}, {prov['date']}; {m['cpu_model']}, {m['vcpus']} vCPUs, "
            f"{m['memory_bytes'] / (1 << 30):.1f} GiB memory, torch {m['torch']}, "
            f"load {m['load_1min']}")


def write_result(out_dir: str, name: str, data, markdown: str | None = None,
                 argv=None) -> list[str]:
    """Writes `name`.json (the command line, commit, machine and `data`) and, given markdown,
    `name`.md (the same provenance above it) into `out_dir`; returns the paths. Every suite
    records its figures through here."""
    os.makedirs(out_dir, exist_ok=True)
    prov = provenance(argv)
    paths = [os.path.join(out_dir, name + ".json")]
    with open(paths[0], "w") as f:
        json.dump(dict(prov, results=data), f, indent=1, default=str)
    if markdown is not None:
        paths.append(os.path.join(out_dir, name + ".md"))
        with open(paths[1], "w") as f:
            f.write(provenance_markdown(prov) + "\n\n" + markdown.rstrip() + "\n")
    shown = [os.path.relpath(p) if not os.path.relpath(p).startswith("..") else p for p in paths]
    print("# wrote " + ", ".join(shown), flush=True)
    return paths


# --------------------------------------------------------------------------- ranks
#
# The training-style suites spawn their ranks with torch.multiprocessing, one process group,
# and measure every model they compare in the same processes, taking turns step by step, so
# that a slow spell of the machine touches each alike.


def tune_for_oversubscription(local_world: int) -> str:
    """With more ranks on this machine than cores, waiting rsdp ranks must not spin (the peer
    they wait for may need the core): sets RSDP_SPIN_US=0 unless the user set it. Call before
    init_process_group. Returns the setting in effect, for the report."""
    if "RSDP_SPIN_US" not in os.environ and local_world > (os.cpu_count() or 1):
        os.environ["RSDP_SPIN_US"] = "0"
    return f"RSDP_SPIN_US={os.environ.get('RSDP_SPIN_US', 'default')}"


def default_threads(local_world: int) -> int:
    return max(1, (os.cpu_count() or 1) // max(1, local_world))


def _rank_main(rank, fn, world, port, path, backend, threads, pin, cuda_devices, args):
    import torch
    import torch.distributed as dist
    cores = sorted(os.sched_getaffinity(0))
    if pin and world <= len(cores):
        os.sched_setaffinity(0, {cores[rank]})
    if cuda_devices:  # before any other CUDA call and before init_process_group
        torch.cuda.set_device(rank % cuda_devices)
    tune_for_oversubscription(world)
    import torch_rsdp  # noqa: F401  (registers "rsdp")
    torch.set_num_threads(threads or default_threads(world))
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world)
    out = fn(rank, world, *args)
    if rank == 0:
        with open(path, "w") as f:
            json.dump(out, f)
    dist.destroy_process_group()


def run_ranks(fn, world: int, *args, backend: str = "rsdp", threads: int | None = None,
              pin: bool = False, cuda_devices: int = 0):
    """fn(rank, world, *args) on `world` spawned ranks of one process group on `backend`
    (`threads` torch threads each, default cores // world; with `pin`, rank r on core r where
    there are enough; with `cuda_devices`, rank r on GPU r % cuda_devices); returns what rank
    0's returned (through JSON). A failed rank raises, its traceback in the message."""
    import torch.multiprocessing as mp
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "rank0.json")
        mp.spawn(_rank_main, args=(fn, world, free_port(), path, backend, threads, pin,
                                   cuda_devices, args), nprocs=world)
        with open(path) as f:
            return json.load(f)


def slowest(values) -> list[float]:
    """Per element, the largest value over the ranks of the default group."""
    import torch
    import torch.distributed as dist
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def take_turns(names: list, n_steps: int, step, first: int = 0) -> dict:
    """step(name, i) for i in first..first+n_steps-1 and every name, the order rotating by one
    each step, each after a barrier; {name: the slowest rank's time of each step}."""
    import torch.distributed as dist
    times = {v: [] for v in names}
    for s in range(n_steps):
        k = s % len(names)
        for v in names[k:] + names[:k]:
            dist.barrier()
            t0 = time.perf_counter()
            step(v, first + s)
            times[v].append(time.perf_counter() - t0)
    return {v: slowest(t) for v, t in times.items()}


def on_two_nodes(rate: str, info: dict, fn):
    """fn(nodes) on 2 emulated nodes (network namespaces) whose links `tc` limits to `rate`,
    or fn(None) on the loopback where namespaces are not available; info["link"] says which."""
    from torch_rsdp.testing import netns
    if not netns.namespaces_available():
        info["link"] = "loopback with RSDP_NODE_ID (no namespaces: no link emulated)"
        return fn(None)
    with netns.EmulatedNodes(2, rate=rate) as nodes:
        info["link"] = f"network namespaces, node links limited to {rate} (tc)"
        return fn(nodes)


def verdicts(checks: list[dict]) -> str:
    """- PASS: check (detail), one line each."""
    return "\n".join(f"- {'PASS' if c['ok'] else 'MISS'}: {c['check']} ({c['detail']})"
                     for c in checks)


# --------------------------------------------------------------------------- CPU probe
#
# A vCPU may share its host core with another hardware thread for seconds at a time, unseen by
# the guest; the interpreter (and every fixed cost of a call) then runs at about half speed.
# probe() times a fixed interpreter loop on each CPU alone, then on all at once (each pinned),
# the fastest of 3; a probe is contended when either takes more than THRESHOLD times the
# fastest alone time of the run.

LOOP = 1_000_000
THRESHOLD = 1.25


def _pinned(cpu: int, start, q) -> None:
    os.sched_setaffinity(0, {cpu})
    start.wait()
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        s = 0
        for i in range(LOOP):
            s += i
        best = min(best, time.perf_counter() - t0)
    q.put(best * 1e3)


def _loop_ms(cpus: list[int]) -> float:
    """The slowest of the interpreter loops run at once, one pinned to each of `cpus`."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    q, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_pinned, args=(c, start, q)) for c in cpus]
    for p in procs:
        p.start()
    time.sleep(0.05)  # all started and waiting
    start.set()
    worst = max(q.get() for _ in procs)
    for p in procs:
        p.join()
    return worst


def probe() -> dict:
    """{"alone_ms": {cpu: ms}, "together_ms": ms (slowest CPU)}."""
    cpus = sorted(os.sched_getaffinity(0))
    return {"alone_ms": {c: _loop_ms([c]) for c in cpus}, "together_ms": _loop_ms(cpus)}


def reference_ms(probes: list[dict]) -> float:
    """The fastest alone time of a run's probes: the machine uncontended."""
    return min(min(p["alone_ms"].values()) for p in probes)


def contended(p: dict, ref_ms: float) -> bool:
    worst = max(max(p["alone_ms"].values()), p["together_ms"])
    return worst > THRESHOLD * ref_ms


def describe(p: dict) -> str:
    alone = "/".join(f"{v:.0f}" for v in p["alone_ms"].values())
    return f"interpreter loop alone {alone} ms, together {p['together_ms']:.0f} ms"


# --------------------------------------------------------------------------- peers
#
# Libraries measured outside torch.distributed (collectives --peers, multinode's mpi variant):
# Open MPI runs mpi_rank.py under mpirun; oneCCL runs oneccl_peer.cpp, built on first use into
# build/oneccl/, one process per rank meeting through oneCCL's key-value store.

ONECCL_VERSION = "2022.2.0"  # the wheels scripts/setup.sh installs
# oneCCL's environment (a variable already set wins): OFI with libfabric's shared-memory
# provider, Open MPI vader's counterpart (tcp over the loopback is several times slower); the
# collective on the calling thread (a progress thread per rank would busy a second core); the
# key-value store on the loopback, local rank and size given (no process manager); errors only.
ONECCL_ENV = {"CCL_ATL_TRANSPORT": "ofi", "CCL_ATL_SHM": "1", "FI_PROVIDER": "shm",
              "CCL_WORKER_OFFLOAD": "0", "CCL_KVS_IFACE": "lo", "CCL_PROCESS_LAUNCHER": "none",
              "CCL_LOG_LEVEL": "error"}
ONECCL_SOURCE = os.path.join(HERE, "oneccl_peer.cpp")
ONECCL_BUILD = os.path.join(ROOT, "build", "oneccl")


def mpirun_command(n: int, plan: str, out: str, bind: bool = False, hosts: list[str] = (),
                   mca: dict | None = None) -> list[str]:
    """mpirun for n ranks of mpi_rank.py, on this machine or on `hosts` ("name:slots").
    --allow-run-as-root is Open MPI's documented switch for root (the usual user in a
    container); --oversubscribe lets n exceed the core count; --bind-to core pins one rank per
    core as collectives --bind pins the torch ranks (only while there are enough cores, there
    as here); btl self,vader is loopback plus shared memory, the transports of a single-node
    job."""
    cmd = ["mpirun"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    binding = "core" if bind and n <= len(os.sched_getaffinity(0)) else "none"
    cmd += ["--oversubscribe", "-np", str(n), "--bind-to", binding]
    if hosts:
        cmd += ["-H", ",".join(hosts), "--map-by", "slot"]
    for key, value in (mca or {"btl": "self,vader"}).items():
        cmd += ["--mca", key, value]
    return cmd + [sys.executable, os.path.join(HERE, "mpi_rank.py"), "--plan", plan, "--out", out]


def unavailable(peer: str) -> str | None:
    """Why `peer` ("mpi" or "oneccl") cannot run here, or None when it can."""
    if peer == "oneccl":
        return oneccl_unavailable()
    if shutil.which("mpirun") is None:
        return "mpirun not found (install Open MPI: apt-get install openmpi-bin libopenmpi-dev)"
    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed for {sys.executable} (pip install mpi4py)"
    try:
        version = subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                                 timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return f"mpirun --version failed ({exc})"
    if "Open MPI" not in version:  # the command line above uses Open MPI's options
        return f"mpirun is not Open MPI's ({version.strip().splitlines()[:1]})"
    return None


def oneccl_paths() -> tuple[str, str]:
    """(the directory of libccl.so.1, the include directory) of the installed oneccl-cpu and
    oneccl-cpu-devel wheels, found through their file lists: the wheels put them under the
    Python prefix (or the user base), not where a compiler or pkg-config looks, and the
    wheel's ccl.pc names packages (impi, sycl) that a CPU build does not have. LookupError
    says what is missing."""
    found = []
    for dist_name, suffix in (("oneccl-cpu", "libccl.so.1"),
                              ("oneccl-cpu-devel", "oneapi/ccl.hpp")):
        try:
            files = importlib.metadata.distribution(dist_name).files or []
        except importlib.metadata.PackageNotFoundError:
            raise LookupError(f"the {dist_name} wheel is not installed for {sys.executable} "
                              f"(bash scripts/setup.sh, or pip install "
                              f"{dist_name}=={ONECCL_VERSION})") from None
        paths = [os.path.normpath(str(f.locate())) for f in files
                 if str(f).replace(os.sep, "/").endswith(suffix)]
        paths = [q for q in paths if os.path.exists(q)]
        if not paths:
            raise LookupError(f"the {dist_name} wheel has no {suffix}")
        found.append(paths[0][:-len(suffix)].rstrip(os.sep) or os.sep)
    return found[0], found[1]


def oneccl_build(libdir: str, incdir: str) -> str:
    """Compiles oneccl_peer.cpp into build/oneccl/ unless the build there is newer than the
    source and the library; returns the program. RuntimeError with the compiler's output when
    it fails.

    The CPU wheel's libccl.so.1 needs a libccl.so.2 that only the full (SYCL) wheel ships (see
    oneccl_peer.cpp); where it is missing, the same source built with -DONECCL_RUNTIME_SHIM
    stands in for it, and the program links it first by name: libccl.so.1 looks for its
    dependencies only through its own RUNPATH, so the program's search path would not reach
    build/oneccl/, but a library already loaded under that name is taken as it."""
    cxx = shutil.which("g++")
    if cxx is None:
        raise RuntimeError("g++ not found (apt-get install g++)")
    os.makedirs(ONECCL_BUILD, exist_ok=True)
    exe = os.path.join(ONECCL_BUILD, "oneccl_peer")
    shim = os.path.join(ONECCL_BUILD, "libccl.so.2")
    need_shim = not os.path.exists(os.path.join(libdir, "libccl.so.2"))
    tmp = f".tmp{os.getpid()}"
    steps = []
    if need_shim:
        steps.append(([cxx, "-O2", "-shared", "-fPIC", "-DONECCL_RUNTIME_SHIM",
                       "-Wl,-soname,libccl.so.2", ONECCL_SOURCE, "-o", shim + tmp], shim))
    libs = (["-L", ONECCL_BUILD, "-Wl,--no-as-needed", "-l:libccl.so.2"] if need_shim else [])
    rpath = f"{ONECCL_BUILD}:{libdir}" if need_shim else libdir
    steps.append(([cxx, "-O2", "-std=c++17", ONECCL_SOURCE, "-I", incdir, *libs, "-L", libdir,
                   "-lccl", f"-Wl,-rpath,{rpath}", "-o", exe + tmp], exe))
    inputs = max(map(os.path.getmtime, (ONECCL_SOURCE, os.path.join(libdir, "libccl.so.1"))))
    if all(os.path.exists(out) and os.path.getmtime(out) > inputs for _, out in steps):
        return exe
    print(f"# oneccl: compiling {os.path.relpath(ONECCL_SOURCE, ROOT)} into "
          f"{os.path.relpath(ONECCL_BUILD, ROOT)}/", flush=True)
    for cmd, out in steps:  # each to a temporary name, then renamed: no half-written file
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)} failed:\n{proc.stdout}{proc.stderr}")
        os.replace(out + tmp, out)
    return exe


def oneccl_unavailable() -> str | None:
    import ctypes
    try:
        libdir, incdir = oneccl_paths()
    except LookupError as exc:
        return str(exc)
    try:  # oneCCL's OFI transport loads libfabric.so.1 at run time (dlopen)
        ctypes.CDLL("libfabric.so.1")
    except OSError:
        return ("libfabric.so.1 not found, oneCCL's OFI transport needs it (apt-get install "
                "libfabric1)")
    try:
        oneccl_build(libdir, incdir)
    except (RuntimeError, OSError) as exc:
        lines = str(exc).strip().splitlines()
        return "cannot build benchmarks/oneccl_peer.cpp: " + " / ".join(lines[-6:])
    return None


def run_mpirun(cmd: list[str], timeout: float, capture: bool = False) -> str | None:
    """Runs an mpirun command line; None when it exits 0, else why not. Past `timeout` it is
    sent SIGTERM (mpirun then stops its daemons and ranks itself), SIGKILL 30 s later. With
    `capture`, the end of its output goes into the error."""
    out = subprocess.PIPE if capture else None
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT if capture else None,
                            text=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
        return f"mpirun did not finish in {timeout:.0f} s"
    if proc.returncode != 0:
        return f"mpirun exited with status {proc.returncode}" + (f": {log[-2000:]}" if log else "")
    return None

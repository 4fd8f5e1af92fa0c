#!/usr/bin/env python3
"""nccl-tests-style benchmark of torch.distributed collectives on CPU (or CUDA) tensors.

For every backend named in --backends (the last one is the baseline), the script spawns
--world-size ranks on this machine, initialises a process group with that backend and sweeps
op x dtype x size (sizes double from --min-bytes to --max-bytes). For each point it

  1. checks the result once (inputs are small integers, so the expected output is exact),
  2. runs warm-up iterations,
  3. runs timed iterations: a barrier of the group under test (each library its own, as the
     MPI peer uses MPI_Barrier), time.perf_counter() around the op
     (around `reps` back-to-back ops for messages under 1 MiB, divided by reps, so the skew
     with which ranks leave the barrier is amortised, as nccl-tests does);
     afterwards the per-iteration times are all-gathered on the side group, the max across
     ranks is taken per iteration, and the median over iterations is reported (with
     --rounds R the sweep is repeated R times, alternating backends, and the iteration times
     of all rounds are pooled).

Sizes follow nccl-tests: "bytes" is the full buffer (for allgather the gathered output, for
reduce_scatter the unreduced input, for alltoall the whole send buffer); algbw = bytes / time;
busbw = algbw x factor (allreduce 2(n-1)/n; allgather, reduce_scatter, alltoall (n-1)/n;
broadcast 1). GB = 1e9 bytes.

Outputs (in --out, default benchmarks/results/): results.md, results.json and
busbw_<op>.png; the markdown table and a "targets" section go to stdout as well.

--device cuda: every rank uses GPU (rank % device count), buffers live there, and a timed
iteration is measured with CUDA events on the rank's current stream (start event after the
barrier, end event after the last op, synchronised). The default baseline is nccl; NCCL refuses
two ranks on one GPU, so with more ranks than GPUs the nccl baseline is left out (the script
says so) and the reference becomes the physical limit instead: the GPU's own device-to-device
copy bandwidth, measured in the same run (bytes read + written / time of the fastest copy of a
--memcpy-bytes buffer). Every backend then gets a `busbw/copy` column, and the report a
"Physical limit" section in place of the CPU targets.

--peers mpi (CPU only): after the torch backends, the same points are measured with Open MPI
(bench_mpi_peer.py under mpirun, mpi4py on numpy buffers, the same sizes, iteration counts and
timing; bfloat16 has no MPI datatype and is skipped), and rsdp once more on a 1-rank group
("rsdp@1", the cost of a call that communicates nothing). The table gets an `mpi` backend and
an `X/mpi` time ratio; the targets section checks that, from 8 B to 64 KiB, rsdp's time minus
its rsdp@1 time is at most Open MPI's (allreduce, allgather, broadcast, reduce_scatter). A
missing mpirun or mpi4py is reported and the peer left out. See bench_peers.py.

--peers oneccl (CPU only): the same points with Intel oneCCL (oneccl_peer.cpp, compiled on
first use into build/oneccl/ against the oneccl-cpu wheels, ranks bootstrapped through
oneCCL's own key-value store, libfabric's shared-memory transport; every dtype). The table gets
an `oneccl` backend and an `X/oneccl` ratio; `--peers mpi,oneccl` measures both.

Examples:
    python benchmarks/bench_collectives.py                       # rsdp vs gloo (gloo alone if rsdp is missing)
    python benchmarks/bench_collectives.py --backends gloo,gloo  # dry run: gloo against itself
    python benchmarks/bench_collectives.py --backends rsdp,gloo --ops allreduce --max-bytes 1M
    python benchmarks/bench_collectives.py --device cuda --world-size 4   # rsdp (+ nccl if 4 GPUs)
    python benchmarks/bench_collectives.py --peers mpi --max-bytes 64K   # + Open MPI, rsdp@1
    python benchmarks/bench_collectives.py --peers mpi,oneccl    # + Open MPI and oneCCL
    python benchmarks/bench_collectives.py --backends rsdp,rsdp:pool,gloo  # + communication memory
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import json
import os
import socket
import sys
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
# Let an uninstalled checkout work: torch_rsdp is found in the repository root as a fallback
# (appended, so an installed torch_rsdp takes precedence).
sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench_peers  # noqa: E402  (sibling module: Open MPI, oneCCL and rsdp@1 references)
import cpu_probe  # noqa: E402  (sibling module: are the CPUs contended now)
import bench_report  # noqa: E402  (sibling module: tables, targets, plots)

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall")
DTYPES = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
    "int32": torch.int32,
    "int64": torch.int64,
}
BUILTIN_BACKENDS = {"gloo", "nccl", "mpi", "ucc", "xccl"}
DEFAULT_BACKENDS = "rsdp,gloo"
DEFAULT_BACKENDS_CUDA = "rsdp,nccl"

# torch 2.13 renamed the single-tensor collectives (the old names warn); use what exists.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# Iteration scaling: a point of `nbytes` runs clamp(ITER_BYTES / nbytes, --min-iters, --iters)
# timed iterations and clamp(WARMUP_BYTES / nbytes, 1, --warmup) warm-up iterations, so small
# messages get many iterations and the 64 MiB points a handful. Each timed iteration is one
# barrier followed by clamp(REPS_BYTES / nbytes, 1, --reps) back-to-back ops: the ranks leave a
# barrier up to one message latency apart, and that skew would otherwise be counted in every
# small-message time (on the 2-core machine it doubled rsdp's 1 KiB allreduce time).
ITER_BYTES = 256 << 20
WARMUP_BYTES = 64 << 20
REPS_BYTES = 1 << 20
# After those warm-up ops, each point keeps warming up for about this long (an op count all
# ranks agree on, from the slowest rank's warm-up time): five ops of a small message take
# microseconds, too little to outlast what the previous points left behind (freed 64 MiB
# buffers, another library's threads winding down), which made the first sizes of an op run
# 1.5x slow in some rounds and not in others.
WARMUP_SECONDS = 0.02
WARMUP_MAX_OPS = 5000
# With more ranks than cores the ranks cannot be pinned, and the ranks the side group's
# reductions put to sleep between points are now and then woken on one core: three ranks on
# one core and one on the other, for 50-150 ms until the kernel's load balancer spreads them
# again (a 2-core guest, 4 ranks, 64 KiB all-reduce in 70 ms windows: 33-36 us stacked, 17-18
# once spread). A point timed inside that stretch measured the scheduler, not the library, so
# oversubscribed runs warm each point up for longer. The peers (bench_peers.py) get the same.
SETTLE_SECONDS = 0.25


def warmup_seconds(args) -> float:
    """How long each point keeps warming up: longer when ranks outnumber the usable cores."""
    if args.warmup_seconds is not None:
        return args.warmup_seconds
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    oversubscribed = args.device == "cpu" and args.world_size > (cores or 1)
    return SETTLE_SECONDS if oversubscribed else WARMUP_SECONDS


def warmup_max_ops(seconds: float) -> int:
    """The cap on the time-based warm-up's op count (5000 per 20 ms: 4 us per op)."""
    return int(WARMUP_MAX_OPS * max(1.0, seconds / WARMUP_SECONDS))


# --------------------------------------------------------------------------- arguments


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


def csv_list(choices=None):
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        if choices is not None:
            bad = [t for t in items if t not in choices]
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


def build_parser() -> argparse.ArgumentParser:
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(
        description="nccl-tests-style benchmark of torch.distributed collectives (CPU or CUDA "
                    "tensors)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backends", type=csv_list(), default=None,
                   help=f"comma-separated backends; the LAST one is the baseline. Default "
                        f"{DEFAULT_BACKENDS} (just gloo when torch_rsdp is not importable); with "
                        f"--device cuda {DEFAULT_BACKENDS_CUDA} (nccl left out when there are "
                        f"more ranks than GPUs). "
                        f"A backend X other than gloo/nccl/mpi/ucc is loaded with 'import torch_X'.")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the tensors live; cuda: rank r uses GPU r %% device count")
    p.add_argument("--ops", type=csv_list(OPS), default=list(OPS),
                   help=f"comma-separated, from {','.join(OPS)}")
    p.add_argument("--dtypes", type=csv_list(list(DTYPES)), default=["float32", "bfloat16"],
                   help=f"comma-separated, from {','.join(DTYPES)}")
    p.add_argument("--min-bytes", type=parse_size, default=8,
                   help="smallest message (full buffer), e.g. 8, 4K; sizes double up to max")
    p.add_argument("--max-bytes", type=parse_size, default=parse_size("64M"),
                   help="largest message, e.g. 64M")
    p.add_argument("--world-size", type=positive_int, default=2, help="ranks to spawn")
    p.add_argument("--iters", type=positive_int, default=20,
                   help="timed iterations for small messages (scaled down for large ones)")
    p.add_argument("--reps", type=positive_int, default=20,
                   help="back-to-back ops per timed iteration for small messages (scaled down "
                        "to 1 at 1 MiB); --reps 1 times every op on its own after a barrier")
    p.add_argument("--min-iters", type=positive_int, default=5,
                   help="timed iterations never drop below this")
    p.add_argument("--warmup", type=int, default=5,
                   help="warm-up iterations for small messages (scaled down for large ones)")
    p.add_argument("--warmup-seconds", type=float, default=None,
                   help=f"after the warm-up iterations, each point keeps warming up for about "
                        f"this long (default {WARMUP_SECONDS} s, {SETTLE_SECONDS} s when ranks "
                        f"outnumber the cores: the kernel takes that long to spread ranks it "
                        f"woke on one core); the peers use the same")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="repeat the whole sweep, alternating backends (A B A B ...); the "
                        "iteration times of all rounds are pooled before taking the median. "
                        "Use 2-3 on a noisy machine")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="torch intra-op threads per rank (default: cores // world size)")
    p.add_argument("--timeout", type=positive_int, default=300,
                   help="process-group timeout in seconds")
    p.add_argument("--bind", action=argparse.BooleanOptionalAction, default=True,
                   help="pin rank r to core r, and the MPI peer's ranks likewise (--bind-to "
                        "core), as OSU and nccl-tests runs do, when there are enough cores. Unpinned ranks that "
                        "sleep between points (in the side group) are now and then woken on "
                        "one core and stay stacked for a whole point, which doubles or "
                        "triples a small op's time, at random")
    p.add_argument("--peers", type=csv_list(bench_peers.PEERS), default=None,
                   help="also measure these libraries outside torch.distributed at the same "
                        "points (mpi: Open MPI via mpirun + mpi4py; oneccl: Intel oneCCL, "
                        "built on first use), and rsdp on 1 rank")
    p.add_argument("--out", default=os.path.join(here, "results"), help="output directory")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG plots")
    p.add_argument("--cpu-probes", action="store_true",
                   help="time an interpreter loop on each CPU alone and together (cpu_probe.py) "
                        "before the torch backends, before each peer and at the end; "
                        "results.json's machine.cpu_probes (bench_launches.py uses them)")
    p.add_argument("--memcpy-bytes", type=parse_size, default=parse_size("256M"),
                   help="buffer size for the single-core memcpy measurement (and, with "
                        "--device cuda, for the device-to-device copy)")
    return p


def resolve_backends(args, parser) -> list[str]:
    cuda = getattr(args, "device", "cpu") == "cuda"
    if args.backends is not None:
        backends = args.backends
    else:
        backends = (DEFAULT_BACKENDS_CUDA if cuda else DEFAULT_BACKENDS).split(",")
        fallback = "nccl" if cuda else "gloo"
        try:
            import_backend("rsdp")
        except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
            print(f"note: torch_rsdp is not importable ({type(exc).__name__}: {exc}); "
                  f"benchmarking {fallback} only. Pass --backends to choose explicitly.",
                  file=sys.stderr)
            backends = [fallback]
    for name in backends:
        try:
            import_backend(name)
        except Exception as exc:  # noqa: BLE001
            parser.error(f"backend {name!r}: cannot load torch_{name} ({type(exc).__name__}: {exc})")
    return backends


def base_backend(name: str) -> str:
    """'rsdp:pool' is rsdp with its buffers in communication memory (torch_rsdp.comm_empty)."""
    return name.split(":")[0]


def comm_alloc(label: str):
    """The allocator of a ':pool' backend's buffers (what FSDP2 gets through allocate_tensor)."""
    if not label.split("#")[0].endswith(":pool"):
        return None
    import torch_rsdp
    return torch_rsdp.comm_empty


def import_backend(name: str) -> None:
    """Plugin backends register themselves on import (torch_rsdp registers 'rsdp').

    A compiled extension torch_<name>._C, when the package has one, is imported too, so a
    broken build fails here, before any process is spawned.
    """
    name = base_backend(name)
    if name not in BUILTIN_BACKENDS:
        importlib.import_module(f"torch_{name}")
        if importlib.util.find_spec(f"torch_{name}._C") is not None:
            importlib.import_module(f"torch_{name}._C")


def backend_labels(backends: list[str]) -> list[str]:
    """Unique row labels: 'gloo,gloo' -> ['gloo', 'gloo#2']."""
    seen: dict[str, int] = {}
    labels = []
    for name in backends:
        seen[name] = seen.get(name, 0) + 1
        labels.append(name if seen[name] == 1 else f"{name}#{seen[name]}")
    return labels


def size_list(lo: int, hi: int) -> list[int]:
    sizes, s = [], lo
    while s <= hi:
        sizes.append(s)
        s *= 2
    return sizes


def current_cpu() -> int:
    """The CPU this process runs on now (/proc/self/stat, field 39); -1 where unreadable."""
    try:
        with open("/proc/self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, ValueError, IndexError):
        return -1


def stacked_share(cpus: torch.Tensor, n: int, side) -> float:
    """The share of a point's timed iterations after which more ranks were on one CPU than an
    even spread puts there (4 ranks on 2 cores: 3 on one), from every rank's CPU read after each
    iteration; unpinned ranks are placed by the kernel, which now and then stacks them."""
    every = torch.empty(n * cpus.numel(), dtype=torch.int64)
    all_gather_single(every, cpus, group=side)
    per_iter = every.view(n, -1).t().tolist()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    even = -(-n // max(1, min(n, cores or 1)))  # ceil(n / cores)
    if not per_iter or any(c < 0 for row in per_iter for c in row):
        return float("nan")
    stacked = sum(1 for row in per_iter if max(row.count(c) for c in row) > even)
    return round(stacked / len(per_iter), 3)


def iters_for(nbytes: int, args) -> tuple[int, int, int]:
    """(timed iterations, ops per timed iteration, warm-up ops) for a message of nbytes."""
    iters = max(args.min_iters, min(args.iters, ITER_BYTES // nbytes))
    reps = max(1, min(args.reps, REPS_BYTES // nbytes))
    warmup = max(min(1, args.warmup), min(args.warmup, WARMUP_BYTES // nbytes))
    return iters, reps, warmup


# --------------------------------------------------------------------------- machine info


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or "unknown"


def measure_memcpy(nbytes: int, repeats: int = 8) -> float:
    """Single-core memcpy bandwidth in GB/s: bytes copied / time of the fastest of `repeats`
    copies (the best copy is the least disturbed by other processes on a shared machine)."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes, dtype=torch.uint8)
        dst = torch.zeros(nbytes, dtype=torch.uint8)  # both touched: no page faults timed
        dst.copy_(src)
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - t0)
        del src, dst
        return nbytes / min(times) / 1e9
    finally:
        torch.set_num_threads(old)


def measure_device_copy(nbytes: int, device, repeats: int = 8) -> dict:
    """The GPU's device-to-device copy bandwidth: a `nbytes` buffer copied into another
    `repeats` times, each copy timed with CUDA events; the fastest copy counts. A copy reads
    and writes every byte, so the memory traffic is 2 x nbytes: `gbps` (the physical limit the
    report compares with) counts bytes read + written, `copy_gbps` bytes copied."""
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.zeros(nbytes, dtype=torch.uint8, device=device)
    dst.copy_(src)  # warm-up
    torch.cuda.synchronize(device)
    times = []
    for _ in range(repeats):
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    del src, dst
    torch.cuda.empty_cache()
    best = min(times)
    return {"gbps": 2 * nbytes / best / 1e9, "copy_gbps": nbytes / best / 1e9}


def cuda_info(args, copy: dict, note: str) -> dict:
    """What a --device cuda run adds to machine_info (a CPU run's info has none of it)."""
    props = torch.cuda.get_device_properties(0)
    gpus = torch.cuda.device_count()
    return {
        "device": "cuda",
        "gpu_name": props.name,
        "gpu_count": gpus,
        "gpu_memory_bytes": props.total_memory,
        "ranks_per_gpu": -(-args.world_size // gpus),
        "torch_cuda_version": torch.version.cuda,
        "d2d_copy_gbps": round(copy["gbps"], 2),
        "d2d_copy_gbps_bytes_copied": round(copy["copy_gbps"], 2),
        "d2d_copy_method": (f"torch copy_ of a {bench_report.fmt_bytes(args.memcpy_bytes)} "
                            f"buffer on GPU 0, fastest of 8, CUDA events; bytes read + written"),
        "baseline_note": note,
    }


def check_cuda(args, parser) -> str:
    """--device cuda: checks that it can run; drops the nccl baseline when ranks would share
    a GPU. Returns the note printed (and reported) about that, or ""."""
    if not torch.cuda.is_available():
        parser.error(f"--device cuda: no CUDA device (torch {torch.__version__}, "
                     f"CUDA {torch.version.cuda})")
    if "rsdp" in args.backends:
        import torch_rsdp
        available = getattr(torch_rsdp, "cuda_available", None)
        if available is None or not available():
            parser.error("--device cuda: this build of torch_rsdp has no CUDA support "
                         "(torch_rsdp.cuda_available() is False); rebuild it where torch has "
                         "CUDA and nvcc is installed")
    gpus = torch.cuda.device_count()
    note = ""
    if "nccl" in args.backends and args.world_size > gpus:
        note = (f"nccl left out: {args.world_size} ranks on {gpus} GPU(s) would put several ranks "
                f"on one GPU, which NCCL refuses; the reference is the GPU's own "
                f"device-to-device copy bandwidth instead (column busbw/copy)")
        args.backends = [b for b in args.backends if b != "nccl"]
        if not args.backends:
            parser.error(f"--device cuda: {note}, and no other backend was given")
    return note


def machine_info(args, memcpy_gbps: float) -> dict:
    import platform
    info = {
        "cpu_model": cpu_model(),
        "cores": os.cpu_count(),
        "cores_usable": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_version": torch.__version__,
        "python_version": platform.python_version(),
        "platform": platform.platform(),
        "memcpy_gbps_single_core": round(memcpy_gbps, 3),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "memcpy_bytes": args.memcpy_bytes,
        "world_size": args.world_size,
        "threads_per_rank": args.threads,
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
    }
    try:
        import torch_rsdp  # noqa: F401
        info["torch_rsdp_version"] = getattr(torch_rsdp, "__version__", "unknown")
    except Exception:  # noqa: BLE001
        pass
    return info


# --------------------------------------------------------------------------- one collective


def element_count(op: str, nbytes: int, esize: int, n: int) -> int:
    """Elements in the full buffer; divisible by n where the op splits it into chunks."""
    count = max(1, nbytes // esize)
    if op in ("allgather", "reduce_scatter", "alltoall"):
        count = max(n, count - count % n)
    return count


def pattern(count: int, dtype, offset: int) -> torch.Tensor:
    """(i % 7) + offset: small integers, exact in every dtype, distinct along the buffer."""
    return (torch.arange(count, dtype=torch.int32) % 7 + offset).to(dtype)


class Collective:
    """Buffers plus run()/check() for one (op, dtype, count) point on one rank.

    Inputs are small integers so sums are exact in bfloat16; gathered chunks carry their
    source rank (8*rank) and a position pattern, so misplaced chunks are caught too.
    """

    def __init__(self, op: str, dtype, count: int, rank: int, n: int, device=None, alloc=None):
        self.op, self.dtype, self.count, self.rank, self.n = op, dtype, count, rank, n
        chunk = count // n
        self.chunk = chunk
        self._init_buffers(op, dtype, count, rank, chunk)
        if alloc is not None:  # the buffers peers read, in the backend's communication memory
            for name in ("buf", "inp"):
                if hasattr(self, name):
                    t = getattr(self, name)
                    setattr(self, name, alloc(t.numel(), dtype=t.dtype).copy_(t))
        if device is not None:  # built on the CPU (same values), then moved
            for name in ("src", "buf", "inp", "out"):
                if hasattr(self, name):
                    setattr(self, name, getattr(self, name).to(device))

    def _init_buffers(self, op, dtype, count, rank, chunk) -> None:
        if op == "allreduce":
            self.src = pattern(count, dtype, rank + 1)
            self.buf = self.src.clone()
        elif op == "allgather":
            self.inp = pattern(chunk, dtype, 8 * rank + 1)
            self.out = torch.zeros(count, dtype=dtype)
        elif op == "reduce_scatter":
            self.inp = pattern(count, dtype, rank + 1)
            self.out = torch.zeros(chunk, dtype=dtype)
        elif op == "broadcast":
            self.src = pattern(count, dtype, 1) if rank == 0 else torch.zeros(count, dtype=dtype)
            self.buf = self.src.clone()
        elif op == "alltoall":
            self.inp = pattern(count, dtype, 8 * rank + 1)
            self.out = torch.zeros(count, dtype=dtype)
        else:
            raise ValueError(op)

    def prepare(self) -> None:
        """Untimed, before each iteration: in-place ops get their pristine input back."""
        if self.op in ("allreduce", "broadcast"):
            self.buf.copy_(self.src)

    def run(self, group=None) -> None:
        op = self.op
        if op == "allreduce":
            dist.all_reduce(self.buf, group=group)
        elif op == "allgather":
            all_gather_single(self.out, self.inp, group=group)
        elif op == "reduce_scatter":
            reduce_scatter_single(self.out, self.inp, group=group)
        elif op == "broadcast":
            dist.broadcast(self.buf, src=0, group=group)
        elif op == "alltoall":
            dist.all_to_all_single(self.out, self.inp, group=group)

    def expected(self) -> torch.Tensor:
        n, r, c, dt = self.n, self.rank, self.chunk, self.dtype
        i = torch.arange(self.count, dtype=torch.int64)
        if self.op == "allreduce":
            return (n * (i % 7) + n * (n + 1) // 2).to(dt)
        if self.op == "allgather":
            j = torch.arange(c, dtype=torch.int64)
            return torch.cat([(j % 7 + 8 * k + 1) for k in range(n)]).to(dt)
        if self.op == "reduce_scatter":
            j = torch.arange(r * c, (r + 1) * c, dtype=torch.int64)
            return (n * (j % 7) + n * (n + 1) // 2).to(dt)
        if self.op == "broadcast":
            return (i % 7 + 1).to(dt)
        if self.op == "alltoall":
            j = torch.arange(r * c, (r + 1) * c, dtype=torch.int64)
            return torch.cat([(j % 7 + 8 * k + 1) for k in range(n)]).to(dt)
        raise ValueError(self.op)

    def result(self) -> torch.Tensor:
        return self.buf if self.op in ("allreduce", "broadcast") else self.out

    def check(self) -> bool:
        """One untimed run from fresh inputs; True when this rank's output is exact."""
        if self.op in ("allgather", "reduce_scatter", "alltoall"):
            self.out.fill_(-1)
        self.prepare()
        self.run()
        return torch.equal(self.result().cpu(), self.expected())


# --------------------------------------------------------------------------- worker


def sweep_backend(label: str, name: str, args, rank: int, side, emit, rnd: int) -> None:
    n = args.world_size
    sizes = size_list(args.min_bytes, args.max_bytes)
    cuda = args.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else None
    for op in args.ops:
        for dtype_name in args.dtypes:
            dtype = DTYPES[dtype_name]
            esize = torch.empty((), dtype=dtype).element_size()
            t_start = time.perf_counter()
            last_count = None
            failed = None
            for nbytes in sizes:
                count = element_count(op, nbytes, esize, n)
                if count == last_count:
                    continue  # rounding made this size equal to the previous one
                last_count = count
                row = {"backend": label, "backend_name": name, "op": op, "dtype": dtype_name,
                       "bytes": count * esize, "count": count, "world_size": n, "round": rnd}
                coll = Collective(op, dtype, count, rank, n, device, comm_alloc(label))
                # 1. correctness (also catches "op not supported": every rank raises the same way)
                err = ""
                try:
                    ok = coll.check()
                except Exception as exc:  # noqa: BLE001
                    ok, err = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                flags = torch.tensor([0.0 if ok else 1.0, 1.0 if err else 0.0], dtype=torch.float64)
                dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=side)
                if flags[1] > 0:
                    row.update(error=err or "failed on another rank", correct=False)
                    emit(row)
                    failed = row["error"]
                    break  # skip the larger sizes of this op x dtype
                row["correct"] = bool(flags[0] == 0)
                # 2. warm-up, 3. timed iterations
                iters, reps, warmup = iters_for(count * esize, args)
                t_warm = time.perf_counter()
                for _ in range(warmup):
                    coll.prepare()
                    coll.run()
                per_op = torch.tensor([(time.perf_counter() - t_warm) / max(1, warmup)])
                dist.all_reduce(per_op, op=dist.ReduceOp.MAX, group=side)
                settle = warmup_seconds(args)
                more = 0 if warmup == 0 else \
                    int(min(warmup_max_ops(settle), settle / max(per_op.item(), 1e-7)))
                for _ in range(more):
                    coll.prepare()
                    coll.run()
                times = torch.empty(iters, dtype=torch.float64)
                if cuda:
                    time_cuda(coll, iters, reps, side, times)
                else:
                    cpus = torch.empty(iters, dtype=torch.int64)
                    for it in range(iters):
                        coll.prepare()  # untimed; within a batch in-place inputs keep growing
                        # The group's own barrier, as the MPI peer uses MPI's: a barrier of
                        # another library releases the ranks with its own skew (tens of µs
                        # for gloo's), which the first op would then pay for.
                        dist.barrier()
                        t0 = time.perf_counter()
                        for _ in range(reps):
                            coll.run()
                        times[it] = (time.perf_counter() - t0) / reps
                        cpus[it] = current_cpu()
                    row["stacked"] = stacked_share(cpus, n, side)
                gathered = torch.empty(n * iters, dtype=torch.float64)
                all_gather_single(gathered, times, group=side)
                per_iter = gathered.view(n, iters).max(dim=0).values  # slowest rank
                row.update(iters=iters, reps=reps, warmup=warmup,
                           samples_us=[round(t * 1e6, 3) for t in per_iter.tolist()])
                emit(row)
                del coll
            if rank == 0:
                status = f"  ERROR: {failed}" if failed else ""
                tag = f" round {rnd + 1}/{args.rounds}" if args.rounds > 1 else ""
                print(f"[{label}{tag}] {op:<14} {dtype_name:<9} done in "
                      f"{time.perf_counter() - t_start:6.1f} s{status}", flush=True)


def time_cuda(coll, iters: int, reps: int, side, times) -> None:
    """--device cuda: per timed iteration, the GPU time from a start event recorded on the
    current stream right after the barrier to an end event after the last op (the GPU is idle
    at the barrier, so the start is when the host begins issuing)."""
    start = torch.cuda.Event(enable_timing=True)
    end = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    for it in range(iters):
        coll.prepare()
        torch.cuda.synchronize()  # the restore copy is not timed; the GPU is idle
        dist.barrier(group=side)
        start.record()
        for _ in range(reps):
            coll.run()
        end.record()
        end.synchronize()
        times[it] = start.elapsed_time(end) / 1e3 / reps


def record_handoff(label: str, raw_path: str) -> None:
    """What a hand-off between the ranks cost when this group was made (the backend's own
    probe, torch_rsdp.topology()["handoff"]): the launch's mode, "near" or "far", decides
    how fast any library's collectives can be in it (docs/benchmarks.md, "Launch modes")."""
    import torch_rsdp

    path = raw_path + ".handoff.json"
    seen = json.load(open(path)) if os.path.exists(path) else {}
    seen[label] = torch_rsdp.topology()["handoff"]
    with open(path, "w") as f:
        json.dump(seen, f)


def worker(rank: int, args, port: int, raw_path: str) -> None:
    if args.device == "cuda":  # before any CUDA call and before init_process_group
        torch.cuda.set_device(rank % torch.cuda.device_count())
    torch.set_num_threads(args.threads)
    n = args.world_size
    cores = sorted(os.sched_getaffinity(0))
    if args.bind and args.device == "cpu" and n <= len(cores):
        os.sched_setaffinity(0, {cores[rank]})
    timeout = datetime.timedelta(seconds=args.timeout)
    store = dist.TCPStore("127.0.0.1", port, n, is_master=(rank == 0), timeout=timeout)
    rows: list[dict] = []
    # bench_peers sets `labels` to run rsdp on one rank under the label "rsdp@1".
    labels = getattr(args, "labels", None) or backend_labels(args.backends)
    for rnd in range(args.rounds):
        for idx, (label, name) in enumerate(zip(labels, args.backends)):
            import_backend(name)
            dist.init_process_group(base_backend(name),
                                    store=dist.PrefixStore(f"bench/{rnd}/{idx}", store),
                                    rank=rank, world_size=n, timeout=timeout)
            side = dist.new_group(backend="gloo")  # barriers and timing reductions
            if rank == 0 and base_backend(name) == "rsdp":
                record_handoff(label, raw_path)
            try:
                sweep_backend(label, name, args, rank, side, rows.append, rnd)
                dist.barrier(group=side)
            finally:
                dist.destroy_process_group()
            if rank == 0:  # keep what we have, even if a later backend crashes
                with open(raw_path, "w") as f:
                    json.dump(rows, f)


# --------------------------------------------------------------------------- main


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.min_bytes > args.max_bytes:
        parser.error("--min-bytes is larger than --max-bytes")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    if args.min_iters > args.iters:
        args.min_iters = args.iters
    args.backends = resolve_backends(args, parser)
    cuda_note = check_cuda(args, parser) if args.device == "cuda" else ""
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) // args.world_size)

    labels = backend_labels(args.backends)
    print(f"# bench_collectives: backends {', '.join(labels)} (baseline {labels[-1]}), "
          f"{args.world_size} ranks, ops {','.join(args.ops)}, dtypes {','.join(args.dtypes)}, "
          f"{bench_report.fmt_bytes(args.min_bytes)}..{bench_report.fmt_bytes(args.max_bytes)}",
          flush=True)
    load1 = os.getloadavg()[0]
    if load1 > 0.5 * (os.cpu_count() or 1):
        print(f"# WARNING: load average {load1:.1f} on {os.cpu_count()} cores: other processes "
              f"are running, timings will be noisy (compare with --rounds 3, or rerun when idle)",
              flush=True)
    memcpy = measure_memcpy(args.memcpy_bytes)
    info = machine_info(args, memcpy)
    print(f"# machine: {info['cpu_model']}, {info['cores']} cores, torch {info['torch_version']}, "
          f"single-core memcpy {memcpy:.2f} GB/s", flush=True)
    if args.device == "cuda":
        info.update(cuda_info(args, measure_device_copy(args.memcpy_bytes, "cuda:0"), cuda_note))
        print(f"# GPU: {info['gpu_name']} x{info['gpu_count']}, {info['ranks_per_gpu']} rank(s) "
              f"per GPU, CUDA {info['torch_cuda_version']}; device-to-device copy "
              f"{info['d2d_copy_gbps']:.1f} GB/s (bytes read + written)", flush=True)
        if cuda_note:
            print(f"# {cuda_note}", flush=True)
    peer_notes = bench_peers.check(args) if args.peers else []

    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    if args.cpu_probes:
        info["cpu_probes"] = [["torch", cpu_probe.probe()]]
    with tempfile.TemporaryDirectory() as tmp:
        raw_path = os.path.join(tmp, "raw.json")
        crashed = None
        try:
            mp.spawn(worker, args=(args, free_port(), raw_path), nprocs=args.world_size, join=True)
        except Exception as exc:  # noqa: BLE001 - report, keep partial results, exit non-zero
            crashed = exc
        raw = json.load(open(raw_path)) if os.path.exists(raw_path) else []
        if os.path.exists(raw_path + ".handoff.json"):
            info["handoff"] = json.load(open(raw_path + ".handoff.json"))
            for label, h in info["handoff"].items():
                print(f"# {label}: hand-off between ranks {h['mode']} (step {h['step_ns']:.0f} "
                      f"ns, pull {h['pull_gbps']:.1f} GB/s), staging stores {h['stores']}",
                      flush=True)
    peer_errors = []
    if args.peers and crashed is None:
        peer_raw, peer_info, peer_errors = bench_peers.run(args, sys.modules[__name__],
                                                           peer_notes)
        raw += peer_raw
        info.setdefault("cpu_probes", []).extend(peer_info.pop("cpu_probes", []))
        info.update(peer_info)
    elif peer_notes:
        info["peer_notes"] = peer_notes
    if args.cpu_probes:
        info["cpu_probes"].append(["end", cpu_probe.probe()])
    rows = bench_report.aggregate(raw)
    elapsed = time.perf_counter() - t0
    info["elapsed_s"] = round(elapsed, 1)

    config = {k: v for k, v in vars(args).items() if k not in ("out",)}
    if args.device == "cpu":
        del config["device"]  # CPU results.json stays as it was before --device existed
    if args.peers is None:
        del config["peers"]  # likewise without --peers
    config.update(baseline=labels[-1], labels=labels, iter_bytes=ITER_BYTES,
                  warmup_bytes=WARMUP_BYTES)
    report = bench_report.Report(rows, labels, info, config)
    text = report.markdown()
    print()
    print(text)
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(report.to_json(), f, indent=1)
    written = ["results.md", "results.json"]
    if not args.no_plot and rows:
        written += report.plots(args.out)
    print(f"\n# sweep took {elapsed:.1f} s; wrote {', '.join(written)} to {args.out}")

    if crashed is not None:
        print(f"\nERROR: the benchmark crashed ({type(crashed).__name__}: {crashed}); "
              f"results above are partial", file=sys.stderr)
        return 1
    if peer_errors:
        print(f"\nERROR: {'; '.join(peer_errors)}", file=sys.stderr)
        return 1
    bad = report.bad_rows()
    if bad:
        print(f"\nERROR: {len(bad)} point(s) gave wrong results or raised:", file=sys.stderr)
        for r in bad[:20]:
            print(f"  {r['backend']} {r['op']} {r['dtype']} {r['bytes']} B: "
                  f"{r.get('error') or 'wrong result'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
    except SystemExit:
        raise
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(1)

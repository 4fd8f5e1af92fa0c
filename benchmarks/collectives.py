"""nccl-tests-style sweep of torch.distributed collectives (op x dtype x size) on CPU or CUDA
tensors: each backend of --backends against the last, each point checked exact, then timed
(the slowest rank's time per iteration, the median); "bytes", algbw and busbw follow
nccl-tests. --peers measures Open MPI and oneCCL at the same points ("peers" below).
See docs/benchmarks.md, collectives.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.metadata
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import common
from .common import (KiB, MiB, csv_list, fmt_bytes, fmt_num, free_port, md_table, parse_size,
                     positive_int)

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall")
DTYPES = {n: getattr(torch, n) for n in ("float32", "bfloat16", "float16", "float64", "int32",
                                         "int64")}
DEFAULT_BACKENDS = "rsdp,gloo"
DEFAULT_BACKENDS_CUDA = "rsdp,nccl"

# torch 2.13 renamed the single-tensor collectives (the old names warn); use what exists.
all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

# Iteration scaling: a point of `nbytes` runs clamp(ITER_BYTES / nbytes, --min-iters, --iters)
# timed iterations and clamp(WARMUP_BYTES / nbytes, 1, --warmup) warm-up ops; each timed
# iteration is one barrier and clamp(REPS_BYTES / nbytes, 1, --reps) back-to-back ops, since
# the ranks leave a barrier up to one message latency apart and that skew would otherwise be
# counted in every small message's time.
ITER_BYTES = 256 << 20
WARMUP_BYTES = 64 << 20
REPS_BYTES = 1 << 20
# Then each point keeps warming up for about this long (an op count the ranks agree on): a few
# small ops do not outlast what the previous points left behind (freed buffers, another
# library's threads winding down).
WARMUP_SECONDS = 0.02
WARMUP_MAX_OPS = 5000
# With more ranks than cores, ranks woken between points may be stacked on one core until the
# kernel's load balancer spreads them again, for up to a few hundred ms: oversubscribed runs
# (and the peers) warm each point up for this long instead.
SETTLE_SECONDS = 0.25
# The buffer of the single-core memcpy (and, with --device cuda, device copy) measurement.
MEMCPY_BYTES = 256 << 20


def warmup_seconds(args) -> float:
    """How long each point keeps warming up: longer when ranks outnumber the usable cores."""
    oversubscribed = args.device == "cpu" and args.world_size > len(os.sched_getaffinity(0))
    return SETTLE_SECONDS if oversubscribed else WARMUP_SECONDS


def warmup_max_ops(seconds: float) -> int:
    """The cap on the time-based warm-up's op count (5000 per 20 ms: 4 us per op)."""
    return int(WARMUP_MAX_OPS * max(1.0, seconds / WARMUP_SECONDS))


# --------------------------------------------------------------------------- arguments


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks collectives",
        description="nccl-tests-style benchmark of torch.distributed collectives (CPU or CUDA "
                    "tensors)",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--backends", type=csv_list(), default=None,
                   help=f"comma-separated backends; the LAST one is the baseline. Default "
                        f"{DEFAULT_BACKENDS}; with "
                        f"--device cuda {DEFAULT_BACKENDS_CUDA} (nccl left out when there are "
                        f"more ranks than GPUs)")
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
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="repeat the whole sweep, alternating backends (A B A B ...); the "
                        "iteration times of all rounds are pooled before taking the median. "
                        "Use 2-3 on a noisy machine")
    p.add_argument("--timeout", type=positive_int, default=300,
                   help="process-group timeout in seconds")
    p.add_argument("--bind", action=argparse.BooleanOptionalAction, default=True,
                   help="pin rank r to core r, and the peers' ranks likewise, as OSU and "
                        "nccl-tests runs do, when there are enough cores (unpinned ranks may "
                        "be stacked on one core for a whole point)")
    p.add_argument("--peers", type=csv_list(PEERS), default=None,
                   help="also measure these libraries outside torch.distributed at the same "
                        "points (mpi: Open MPI via mpirun + mpi4py; oneccl: Intel oneCCL, "
                        "built on first use), and rsdp on 1 rank")
    p.add_argument("--out", default=common.RESULTS, help="output directory")
    p.add_argument("--name", default="results", help="result file stem (NAME.md, NAME.json)")
    return p


def resolve_backends(args, parser) -> list[str]:
    backends = args.backends or (DEFAULT_BACKENDS_CUDA if args.device == "cuda"
                                 else DEFAULT_BACKENDS).split(",")
    for name in backends:
        try:
            import_backend(name)
        except Exception as exc:  # noqa: BLE001
            parser.error(f"backend {name!r}: cannot import torch_rsdp ({type(exc).__name__}: "
                         f"{exc})")
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
    """rsdp registers itself when torch_rsdp is imported (and a broken build fails here,
    before any process is spawned); the others are torch's own."""
    if base_backend(name) == "rsdp":
        import torch_rsdp  # noqa: F401


def backend_labels(backends: list[str]) -> list[str]:
    """Unique row labels: 'gloo,gloo' -> ['gloo', 'gloo#2']."""
    return [f"{b}#{backends[:i].count(b) + 1}" if b in backends[:i] else b
            for i, b in enumerate(backends)]


def size_list(lo: int, hi: int) -> list[int]:
    """lo, 2 lo, 4 lo, ... up to hi."""
    return [lo << i for i in range((hi // lo).bit_length())]


def iters_for(nbytes: int, args) -> tuple[int, int, int]:
    """(timed iterations, ops per timed iteration, warm-up ops) for a message of nbytes."""
    iters = max(args.min_iters, min(args.iters, ITER_BYTES // nbytes))
    reps = max(1, min(args.reps, REPS_BYTES // nbytes))
    warmup = max(min(1, args.warmup), min(args.warmup, WARMUP_BYTES // nbytes))
    return iters, reps, warmup


# --------------------------------------------------------------------------- machine info


def measure_copy(nbytes: int, device: str = "cpu", repeats: int = 8) -> float:
    """Copy bandwidth in GB/s of bytes copied: a `nbytes` buffer copied into another `repeats`
    times, the fastest copy counting (the least disturbed by other processes on a shared
    machine); on the CPU by one thread, on a GPU timed with CUDA events."""
    cuda = device != "cpu"
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        src = torch.ones(nbytes, dtype=torch.uint8, device=device)
        dst = torch.zeros(nbytes, dtype=torch.uint8, device=device)
        dst.copy_(src)  # both touched: no page faults timed
        times = []
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            if cuda:
                start.record()
                dst.copy_(src)
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) / 1e3)
            else:
                t0 = time.perf_counter()
                dst.copy_(src)
                times.append(time.perf_counter() - t0)
        del src, dst
        return nbytes / min(times) / 1e9
    finally:
        torch.set_num_threads(old)
        if cuda:
            torch.cuda.empty_cache()


def cuda_info(args, copy_gbps: float, note: str) -> dict:
    """What a --device cuda run adds to machine_info (a CPU run's info has none of it)."""
    gpus = torch.cuda.device_count()
    return {"device": "cuda", "gpu_name": torch.cuda.get_device_name(0), "gpu_count": gpus,
            "ranks_per_gpu": -(-args.world_size // gpus), "torch_cuda_version": torch.version.cuda,
            # a copy reads and writes every byte: the memory traffic is twice the bytes copied
            "d2d_copy_gbps": round(2 * copy_gbps, 2),
            "d2d_copy_gbps_bytes_copied": round(copy_gbps, 2), "baseline_note": note}


def check_cuda(args, parser) -> str:
    """--device cuda: checks that it can run; drops the nccl baseline when ranks would share
    a GPU. Returns the note printed (and reported) about that, or ""."""
    if not torch.cuda.is_available():
        parser.error(f"--device cuda: no CUDA device (torch {torch.__version__}, "
                     f"CUDA {torch.version.cuda})")
    if "rsdp" in args.backends:
        import torch_rsdp
        if not torch_rsdp.cuda_available():
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


IN_PLACE = ("allreduce", "broadcast")


class Collective:
    """Buffers plus run()/check() for one (op, dtype, count) point on one rank: `inp` (the
    in-place ops' buffer) and `out`.

    Inputs are small integers so sums are exact in bfloat16; gathered chunks carry their
    source rank (8*rank) and a position pattern, so misplaced chunks are caught too.
    """

    def __init__(self, op: str, dtype, count: int, rank: int, n: int, device=None, alloc=None):
        self.op, self.dtype, self.count, self.rank, self.n = op, dtype, count, rank, n
        self.chunk = c = count // n
        length, offset = {"allreduce": (count, rank + 1), "allgather": (c, 8 * rank + 1),
                          "reduce_scatter": (count, rank + 1), "broadcast": (count, 1),
                          "alltoall": (count, 8 * rank + 1)}[op]
        self.inp = (torch.zeros(count, dtype=dtype) if op == "broadcast" and rank
                    else pattern(length, dtype, offset))
        if alloc is not None:  # the buffer peers read, in the backend's communication memory
            self.inp = alloc(self.inp.numel(), dtype=dtype).copy_(self.inp)
        self.src = self.inp.clone() if op in IN_PLACE else None  # the pristine input
        self.out = (None if op in IN_PLACE else
                    torch.zeros(c if op == "reduce_scatter" else count, dtype=dtype))
        if device is not None:  # built on the CPU (same values), then moved
            for name in ("src", "inp", "out"):
                if getattr(self, name) is not None:
                    setattr(self, name, getattr(self, name).to(device))

    def prepare(self) -> None:
        """Untimed, before each iteration: in-place ops get their pristine input back."""
        if self.src is not None:
            self.inp.copy_(self.src)

    def run(self) -> None:
        op, inp, out = self.op, self.inp, self.out
        if op == "allreduce":
            dist.all_reduce(inp)
        elif op == "broadcast":
            dist.broadcast(inp, src=0)
        elif op == "allgather":
            all_gather_single(out, inp)
        elif op == "reduce_scatter":
            reduce_scatter_single(out, inp)
        else:
            dist.all_to_all_single(out, inp)

    def expected(self) -> torch.Tensor:
        n, r, c = self.n, self.rank, self.chunk
        every = torch.arange(self.count, dtype=torch.int64)
        mine = torch.arange(r * c, (r + 1) * c, dtype=torch.int64)
        summed = lambda j: n * (j % 7) + n * (n + 1) // 2  # noqa: E731
        gathered = lambda j: torch.cat([(j % 7 + 8 * k + 1) for k in range(n)])  # noqa: E731
        return {"allreduce": lambda: summed(every), "broadcast": lambda: every % 7 + 1,
                "allgather": lambda: gathered(torch.arange(c, dtype=torch.int64)),
                "reduce_scatter": lambda: summed(mine),
                "alltoall": lambda: gathered(mine)}[self.op]().to(self.dtype)

    def check(self) -> bool:
        """One untimed run from fresh inputs; True when this rank's output is exact."""
        if self.out is not None:
            self.out.fill_(-1)
        self.prepare()
        self.run()
        return torch.equal((self.inp if self.out is None else self.out).cpu(), self.expected())


# --------------------------------------------------------------------------- worker


def points(args, dtypes) -> list[dict]:
    """Every point of the sweep in its order (op, dtype, size), with its element count and
    iteration counts: the torch side and the peers measure exactly these."""
    out = []
    for op in args.ops:
        for dtype in dtypes:
            esize = DTYPES[dtype].itemsize
            # rounding may make a size equal to the previous one: measured once
            counts = dict.fromkeys(element_count(op, b, esize, args.world_size)
                                   for b in size_list(args.min_bytes, args.max_bytes))
            for count in counts:
                iters, reps, warmup = iters_for(count * esize, args)
                out.append(dict(op=op, dtype=dtype, count=count, bytes=count * esize,
                                iters=iters, reps=reps, warmup=warmup))
    return out


def sweep_backend(label: str, name: str, args, rank: int, side, emit, rnd: int) -> None:
    n, cuda = args.world_size, args.device == "cuda"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else None
    by_op = itertools.groupby(points(args, args.dtypes), key=lambda p: (p["op"], p["dtype"]))
    for (op, dtype_name), pts in by_op:
        t_start, failed = time.perf_counter(), None
        for p in pts:
            count, iters, reps, warmup = p["count"], p["iters"], p["reps"], p["warmup"]
            row = {"backend": label, "backend_name": name, "op": op, "dtype": dtype_name,
                   "bytes": p["bytes"], "count": count, "world_size": n, "round": rnd}
            coll = Collective(op, DTYPES[dtype_name], count, rank, n, device, comm_alloc(label))
            # 1. correctness (also catches "op not supported": every rank raises the same way)
            row["correct"], error = agree(coll.check, side)
            if error:
                row.update(error=error, correct=False)
                emit(row)
                failed = error
                break  # skip the larger sizes of this op x dtype
            # 2. warm-up: `warmup` ops, then more for about warmup_seconds (an op count from
            # the slowest rank's warm-up time, so that every rank agrees on it)
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
            # 3. timed iterations, after the group's own barrier, as the MPI peer uses MPI's: a
            # barrier of another library releases the ranks with its own skew (tens of µs for
            # gloo's), which the first op would then pay for
            per_iter = timed_iterations(coll, iters, reps, side, None, cuda)
            row.update(iters=iters, reps=reps, warmup=warmup,
                       samples_us=[round(t * 1e6, 3) for t in per_iter])
            emit(row)
            del coll
        if rank == 0:
            status = f"  ERROR: {failed}" if failed else ""
            tag = f" round {rnd + 1}/{args.rounds}" if args.rounds > 1 else ""
            print(f"[{label}{tag}] {op:<14} {dtype_name:<9} done in "
                  f"{time.perf_counter() - t_start:6.1f} s{status}", flush=True)


def agree(check, side) -> tuple[bool, str]:
    """Runs check() on every rank: (True when it returned True on every rank, "" or the error
    when it raised on any rank, this rank's own message where it raised here)."""
    err = ""
    try:
        ok = check()
    except Exception as exc:  # noqa: BLE001
        ok, err = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
    flags = torch.tensor([0.0 if ok else 1.0, 1.0 if err else 0.0], dtype=torch.float64)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=side)
    return bool(flags[0] == 0), (err or "failed on another rank") if flags[1] > 0 else ""


def timed_iterations(coll, iters: int, reps: int, side, barrier, cuda: bool) -> list[float]:
    """Seconds per op of each timed iteration (`reps` back-to-back ops after a barrier of the
    group `barrier`), the slowest rank's, gathered over `side`. On the CPU the host's clock;
    with `cuda` the GPU time from a start event recorded on the current stream right after the
    barrier to an end event after the last op (the GPU is idle at the barrier, so the start is
    when the host begins issuing)."""
    times = torch.empty(iters, dtype=torch.float64)
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
    for it in range(iters):
        coll.prepare()  # untimed; within a batch in-place inputs keep growing
        if cuda:
            torch.cuda.synchronize()  # the restore copy is not timed; the GPU is idle
            dist.barrier(group=side)
            start.record()
        else:
            dist.barrier(group=barrier)
            t0 = time.perf_counter()
        for _ in range(reps):
            coll.run()
        if cuda:
            end.record()
            end.synchronize()
            times[it] = start.elapsed_time(end) / 1e3 / reps
        else:
            times[it] = (time.perf_counter() - t0) / reps
    n = dist.get_world_size()
    gathered = torch.empty(n * iters, dtype=torch.float64)
    all_gather_single(gathered, times, group=side)
    return gathered.view(n, iters).max(dim=0).values.tolist()


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
    # run_world1 sets `labels` to run rsdp on one rank under the label "rsdp@1".
    labels = getattr(args, "labels", None) or backend_labels(args.backends)
    for rnd in range(args.rounds):
        for idx, (label, name) in enumerate(zip(labels, args.backends)):
            import_backend(name)
            dist.init_process_group(base_backend(name),
                                    store=dist.PrefixStore(f"bench/{rnd}/{idx}", store),
                                    rank=rank, world_size=n, timeout=timeout)
            side = dist.new_group(backend="gloo")  # barriers and timing reductions
            try:
                sweep_backend(label, name, args, rank, side, rows.append, rnd)
                dist.barrier(group=side)
            finally:
                dist.destroy_process_group()
            if rank == 0:  # keep what we have, even if a later backend crashes
                with open(raw_path, "w") as f:
                    json.dump(rows, f)


# --------------------------------------------------------------------------- peers
#
# Libraries measured outside torch.distributed at the same points with the same timing
# (`--peers mpi,oneccl`; common.py has mpirun's command line and builds the oneCCL program), and
# rsdp on a 1-rank group. A peer that cannot run here is announced and left out; one that
# starts and fails is an error.

PEERS = ("mpi", "oneccl")
WORLD1 = "rsdp@1"  # rsdp on a 1-rank group: what a call costs besides the communication
# numpy dtypes with an MPI datatype (mpi_rank.MPI_TYPES). MPI has no bfloat16, and Open
# MPI 4.1 no float16 either (MPIX_C_FLOAT16 came with 5.0).
MPI_DTYPES = ("float32", "float64", "int32", "int64")


def check_peers(args) -> list[str]:
    """Before the sweep: drops the peers that cannot run (printing why) and returns the notes
    for the report."""
    notes = []
    if args.device != "cpu":
        notes.append("--peers: the peers are measured on CPU buffers only; left out with "
                     "--device cuda")
        args.peers = []
    for peer in list(args.peers):
        why = common.unavailable(peer)
        if why:
            notes.append(f"{peer} not measured: {why}")
            args.peers.remove(peer)
    if args.peers and "rsdp" not in args.backends:
        notes.append(f"{WORLD1} not measured: rsdp is not among --backends")
    skipped = [d for d in args.dtypes if d not in MPI_DTYPES]  # oneCCL has every dtype
    if "mpi" in args.peers and skipped:
        notes.append(f"mpi: {', '.join(skipped)} not measured (no MPI datatype)")
    for note in notes:
        print(f"# NOTE: {note}", flush=True)
    return notes


def run_world1(args, tmp: str) -> list[dict]:
    """rsdp on a 1-rank group, through worker (the same timing code).

    The element counts are those of a 1-rank run of the same bytes; for the 2-rank target
    they equal the 2-rank counts (every size is even). Threads per rank stay as in the sweep.
    """
    one = argparse.Namespace(**vars(args))
    one.world_size, one.backends, one.labels = 1, ["rsdp"], [WORLD1]
    raw_path = os.path.join(tmp, "world1.json")
    mp.spawn(worker, args=(one, free_port(), raw_path), nprocs=1, join=True)
    return json.load(open(raw_path)) if os.path.exists(raw_path) else []


def run_mpi(args, tmp: str) -> tuple[list[dict], dict, str | None]:
    """(raw rows, machine-info additions, error or None); the rows written before a failure
    are kept."""
    plan, out = os.path.join(tmp, "mpi_plan.json"), os.path.join(tmp, "mpi_result.json")
    dtypes = [d for d in args.dtypes if d in MPI_DTYPES]
    with open(plan, "w") as f:
        settle = warmup_seconds(args)
        json.dump({"world_size": args.world_size, "rounds": args.rounds,
                   "warmup_seconds": settle, "warmup_max_ops": warmup_max_ops(settle),
                   "points": points(args, dtypes)}, f)
    cmd = common.mpirun_command(args.world_size, plan, out, args.bind)
    launcher = " ".join(cmd[:cmd.index(sys.executable)])
    print(f"# mpi: {launcher} python benchmarks/mpi_rank.py ...", flush=True)
    # A hung job must not hang the benchmark: it gets twice the process-group timeout.
    error = common.run_mpirun(cmd, 2 * args.timeout)
    result = json.load(open(out)) if os.path.exists(out) else {}
    info = {"mpi_library_version": result.get("library_version", "unknown"),
            "mpi_standard_version": result.get("mpi_version"),
            "mpi4py_version": result.get("mpi4py_version"),
            "mpi_command": launcher}
    return result.get("rows", []), info, error


def run_oneccl(args, tmp: str) -> tuple[list[dict], dict, str | None]:
    """(raw rows, machine-info additions, error or None), as run_mpi: one oneccl_peer process
    per rank, pinned as the collectives suite pins the torch ranks."""
    libdir, incdir = common.oneccl_paths()
    exe = common.oneccl_build(libdir, incdir)
    n = args.world_size
    plan, kvs, out = (os.path.join(tmp, name) for name in
                      ("oneccl_plan.txt", "oneccl_kvs", "oneccl_result.json"))
    with open(plan, "w") as f:
        settle = warmup_seconds(args)
        f.write(f"{n} {args.rounds} {settle} {warmup_max_ops(settle)} {args.timeout}\n")
        for p in points(args, args.dtypes):
            f.write(f"{p['op']} {p['dtype']} {p['count']} {p['bytes']} {p['iters']} "
                    f"{p['reps']} {p['warmup']}\n")
    cores = sorted(os.sched_getaffinity(0))
    bind = args.bind and n <= len(cores)
    env = dict(os.environ)
    for key, value in common.ONECCL_ENV.items():
        env.setdefault(key, value)
    if bind:  # oneCCL's own threads stay on their rank's core
        env.setdefault("CCL_WORKER_AFFINITY", ",".join(str(c) for c in cores[:n]))
    shown = [k for k in (*common.ONECCL_ENV, "CCL_WORKER_AFFINITY") if k in env]
    launcher = " ".join(f"{k}={env[k]}" for k in shown)
    print(f"# oneccl: {launcher} build/oneccl/oneccl_peer x {n}"
          f"{' (one core each)' if bind else ''}", flush=True)
    procs = []
    try:
        for r in range(n):
            pin = (lambda c=cores[r]: os.sched_setaffinity(0, {c})) if bind else None
            procs.append(subprocess.Popen(
                [exe, plan, kvs, out, str(r)], preexec_fn=pin,
                env=dict(env, CCL_LOCAL_RANK=str(r), CCL_LOCAL_SIZE=str(n))))
        error = wait_ranks(procs, 2 * args.timeout)
    finally:
        for proc in procs:  # whatever happened, no rank outlives the run
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    result = json.load(open(out)) if os.path.exists(out) else {}
    info = {"oneccl_library_version": result.get("library_version", "unknown"),
            "oneccl_wheel_version": importlib.metadata.version("oneccl-cpu"),
            "oneccl_command": f"{launcher} oneccl_peer x {n}"}
    return result.get("rows", []), info, error


def wait_ranks(procs: list, timeout: float) -> str | None:
    """Waits for every rank; None when all exit 0. A rank that fails leaves the others waiting
    for it in a collective: they get a few seconds to report their own error, then are
    stopped. A job that runs past `timeout` (twice the process-group timeout) is stopped."""
    deadline = time.monotonic() + timeout
    # poll() sets returncode: None while running, 0 on success
    while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
        if time.monotonic() > deadline:
            return f"the ranks did not finish in {timeout:.0f} s"
        time.sleep(0.1)
    failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode]
    if failed:
        grace = time.monotonic() + 5
        while any(p.poll() is None for p in procs) and time.monotonic() < grace:
            time.sleep(0.1)
        return "; ".join(f"rank {r} exited with status {c}" for r, c in failed)
    return None


def run_peers(args, notes: list[str]) -> tuple[list[dict], dict, list[str]]:
    """Runs the peers still in args.peers after check_peers(). Returns (raw rows, machine-info
    additions, errors); a failing part adds an error and the others still run."""
    rows, info, errors = [], {}, []
    with tempfile.TemporaryDirectory() as tmp:
        if "rsdp" in args.backends:
            print(f"# {WORLD1}: rsdp on a 1-rank group", flush=True)
            try:
                rows += run_world1(args, tmp)
            except Exception as exc:  # noqa: BLE001 - reported, the peers still run
                errors.append(f"{WORLD1}: {type(exc).__name__}: {exc}")
        for peer, runner in (("mpi", run_mpi), ("oneccl", run_oneccl)):
            if peer not in args.peers:
                continue
            try:
                peer_rows, peer_info, error = runner(args, tmp)
                rows += peer_rows
                info.update(peer_info)
                if error:
                    errors.append(f"{peer}: {error}")
            except Exception as exc:  # noqa: BLE001 - reported, the other peers still run
                errors.append(f"{peer}: {type(exc).__name__}: {exc}")
    info["peer_notes"] = notes + [f"ERROR {e}" for e in errors]
    return rows, info, errors


# --------------------------------------------------------------------------- report
#
# A row is one measured point: {"backend", "op", "dtype", "bytes", "count", "time_us",
# "algbw_gbps", "busbw_gbps", "correct", ...}. Report adds the ratios to the baseline (the last
# backend label), renders the markdown report and evaluates the targets.

# busbw = algbw x this factor (nccl-tests), as text and as a function of the world size
BUSBW_FACTOR = {"allreduce": ("2(n-1)/n", lambda n: 2 * (n - 1) / n),
                "allgather": ("(n-1)/n", lambda n: (n - 1) / n),
                "reduce_scatter": ("(n-1)/n", lambda n: (n - 1) / n),
                "alltoall": ("(n-1)/n", lambda n: (n - 1) / n), "broadcast": ("1", lambda n: 1.0)}

# Targets, stated for 2 ranks (docs/benchmarks.md).
BUSBW_SPEEDUP = 5.0            # busbw >= 5x baseline ...
BUSBW_RANGE = (64 * KiB, 64 * MiB)  # ... from 64 KiB to 64 MiB ...
BUSBW_OPS = ("allreduce", "allgather", "reduce_scatter")  # ... for these ops
LATENCY_RATIO = 0.2            # time <= 1/5 of baseline ...
LATENCY_MAX_BYTES = 4 * KiB    # ... at 4 KiB and below (every op measured)
# busbw >= this fraction of single-core memcpy, for these ops, at this size and above.
MEMCPY_TARGETS = ((("allreduce",), 0.6, 16 * MiB), (("allgather", "broadcast"), 0.8, 1 * MiB))
# With --peers mpi: rsdp's time minus its own world-size-1 time ("rsdp@1", the cost of the call
# itself) <= Open MPI's time, for every size in this range, for these ops.
PEER = "mpi"
PEER_RANGE = (8, 64 * KiB)
PEER_OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")


def aggregate(raw: list[dict]) -> list[dict]:
    """Merge the per-round rows of one point: pool the iteration samples, take the median.

    A point is correct only if it was correct in every round; an error in any round sticks.
    """
    merged: dict[tuple, dict] = {}
    for r in raw:
        key = (r["backend"], r["op"], r["dtype"], r["bytes"])
        m = merged.get(key)
        if m is None:
            m = merged[key] = {k: v for k, v in r.items() if k not in ("round", "samples_us")}
            m.update(rounds=0, iters=0, correct=True, samples_us=[])
        m["rounds"] += 1
        m["correct"] = m["correct"] and r.get("correct", False)
        if r.get("error"):
            m["error"] = r["error"]
        m["iters"] += r.get("iters", 0)
        m["samples_us"] += r.get("samples_us", [])
    rows = list(merged.values())
    for m in rows:
        if m["samples_us"] and not m.get("error"):
            med = m["time_us"] = statistics.median(m["samples_us"])
            m["algbw_gbps"] = m["bytes"] / med / 1e3 if med > 0 else float("inf")
            m["busbw_gbps"] = m["algbw_gbps"] * BUSBW_FACTOR[m["op"]][1](m["world_size"])
    return rows


class Report:
    def __init__(self, rows: list[dict], labels: list[str], info: dict, config: dict):
        self.rows = rows
        self.labels = labels
        self.baseline = labels[-1]
        self.candidates = labels[:-1]
        self.info = info
        self.config = config
        self.n = config["world_size"]
        self.memcpy = info["memcpy_gbps_single_core"]
        self.cuda = info.get("device") == "cuda"
        self.copy = info.get("d2d_copy_gbps") if self.cuda else None
        self._index = {(r["backend"], r["op"], r["dtype"], r["bytes"]): r for r in rows}
        # Peers measured in this run (shown as backends after the torch ones), and the torch
        # labels compared with them (the candidates, or the baseline when alone).
        self.peers = [p for p in config.get("peers") or [] if any(r["backend"] == p for r in rows)]
        self.vs_peer = (self.candidates or [self.baseline]) if self.peers else []

        def ratio(r, other, key):  # r[key] / other's at the same point, both measured
            o = self._index.get((other, r["op"], r["dtype"], r["bytes"]))
            return r[key] / o[key] if self._ok(r) and o and self._ok(o) and o[key] > 0 else None

        for r in rows:
            r["busbw_ratio"] = r["latency_ratio"] = None
            if r["backend"] in self.vs_peer:
                for peer in self.peers:
                    r[f"latency_ratio_{peer}"] = ratio(r, peer, "time_us")
            if r["backend"] not in self.labels:
                continue  # peers and rsdp@1: no ratios to the torch baseline
            r["busbw_ratio"] = ratio(r, self.baseline, "busbw_gbps")
            r["latency_ratio"] = ratio(r, self.baseline, "time_us")
            if self.cuda:
                r["copy_fraction"] = (r["busbw_gbps"] / self.copy
                                      if self._ok(r) and self.copy else None)

    @staticmethod
    def _ok(r: dict) -> bool:
        return r.get("correct", False) and not r.get("error") and "time_us" in r

    def bad_rows(self) -> list[dict]:
        return [r for r in self.rows if not self._ok(r)]

    def _ops_dtypes(self):
        return [(op, dt) for op in self.config["ops"] for dt in self.config["dtypes"]]

    # ------------------------------------------------------------------ markdown

    def markdown(self) -> str:
        info, cfg, cuda = self.info, self.config, self.cuda
        vs = (f"{', '.join(self.candidates)} vs {self.baseline} (baseline)"
              if self.candidates else f"{self.baseline} only")
        where = (f"GPU: {info['gpu_name']} x{info['gpu_count']}, {info['ranks_per_gpu']} rank(s) "
                 f"per GPU, CUDA {info['torch_cuda_version']}; device-to-device copy "
                 f"{fmt_num(self.copy)} GB/s counting bytes read + written "
                 f"({fmt_num(info['d2d_copy_gbps_bytes_copied'])} GB/s of bytes copied). Host: "
                 if cuda else "Machine: ")
        ratios = (f"`busbw×` = busbw / {self.baseline} busbw (higher is better); "
                  f"`lat×` = time / {self.baseline} time (lower is better)")
        out = [
            f"# Collective benchmark: {vs}, {self.n} ranks, {'CUDA' if cuda else 'CPU'} tensors",
            "",
            f"{where}{info['cpu_model']}, {info['vcpus']} vCPUs, torch {info['torch']}"
            + ("" if cuda else f", single-core memcpy {self.memcpy:.2f} GB/s") + ". "
            f"Sizes {fmt_bytes(cfg['min_bytes'])}..{fmt_bytes(cfg['max_bytes'])}, "
            f"up to {cfg['iters']} timed iterations (at least {cfg['min_iters']}) of up to "
            f"{cfg['reps']} back-to-back ops (1 from 1 MiB)"
            + ("; " if cuda else f", {cfg['threads']} thread(s) per rank; ")
            + f"run took {info.get('elapsed_s', '?')} s."]
        if cuda and info.get("baseline_note"):
            out += ["", f"Note: {info['baseline_note']}."]
        when = (" GPU time (CUDA events on each rank's current stream from right after a "
                "barrier to after the last op of the iteration)" if cuda else " time")
        out += ["", f"time = per-op{when} in µs: median over iterations of the slowest rank's "
                "iteration time / ops per iteration; algbw = bytes / time, busbw = algbw × "
                "factor, in GB/s (1e9 B/s)"
                + ("; `busbw/copy` = busbw / the device-to-device copy bandwidth above"
                   if cuda else "") + (f"; {ratios}" if self.candidates else "")
                + ". `WRONG` marks a point whose result did not match."]
        out += [] if cuda else self._peers_header()
        if not self.rows:
            out += ["", "**No results: the run failed before the first point was measured.**"]
            return "\n".join(out) + "\n"
        for op, dtype in self._ops_dtypes():
            out += ["", self._section(op, dtype)]
        if not cuda:  # the goals are stated for CPU tensors; busbw/copy is the CUDA reference
            out += ["", self.targets_markdown()]
        return "\n".join(out) + "\n"

    def _peers_header(self) -> list[str]:
        info, out = self.info, []
        world1 = (f" `{WORLD1}` = rsdp on a 1-rank group, same points (in results.json and "
                  "the targets section)." if any(r["backend"] == WORLD1 for r in self.rows)
                  else "")
        for peer in self.peers:
            vs = ", ".join(f"`{lb}/{peer}`" for lb in self.vs_peer)
            if peer == "mpi":
                what = (f"{info.get('mpi_library_version', '?').split(',')[0]} "
                        f"(MPI {info.get('mpi_standard_version', '?')}, mpi4py "
                        f"{info.get('mpi4py_version', '?')}), `{info.get('mpi_command', '')}`, "
                        "numpy buffers")
            else:  # oneccl
                what = (f"oneCCL {info.get('oneccl_library_version', '?').split(' ')[0]} "
                        f"(wheel oneccl-cpu {info.get('oneccl_wheel_version', '?')}), "
                        f"`{info.get('oneccl_command', '')}`, C++ on page-aligned buffers")
            out += ["", f"Peer `{peer}`: {what}, the same points, iteration counts and timing; "
                        f"{vs} = time / {peer} time (lower is better).{world1}"]
            world1 = ""  # said once
        out += [f"\nNote: {n}." for n in info.get("peer_notes", [])]
        return out

    def _section(self, op: str, dtype: str) -> str:
        # A peer without this dtype (MPI has no bfloat16) gets no columns here.
        peers = [p for p in self.peers if self._rows(p, op, dtype)]
        shown = self.labels + peers
        get = lambda lb, b: self._index.get((lb, op, dtype, b)) or {}  # noqa: E731

        def measured(r):
            if not r:
                return ["-", "-", "-"]
            if r.get("error"):
                return ["ERROR", "-", "-"]
            return [fmt_num(r["time_us"], 1), fmt_num(r["algbw_gbps"], 3),
                    fmt_num(r["busbw_gbps"], 3) + ("" if r.get("correct") else " WRONG")]

        # (label, row key, column) of the ratios shown after the measured columns
        ratios = [(lb, k, f"{lb} {h}") for lb in self.candidates
                  for k, h in (("busbw_ratio", "busbw×"), ("latency_ratio", "lat×"))]
        ratios += [(lb, f"latency_ratio_{p}", f"{lb}/{p}") for lb in self.vs_peer for p in peers]
        ratios += [(lb, "copy_fraction", f"{lb} busbw/copy") for lb in self.labels
                   if self.cuda]
        header = (["bytes"] + [f"{lb} {c}" for lb in shown for c in ("µs", "algbw", "busbw")]
                  + [h for _, _, h in ratios])
        sizes = sorted({r["bytes"] for r in self.rows if r["op"] == op and r["dtype"] == dtype
                        and r["backend"] in shown})
        body = [[fmt_bytes(b)] + [c for lb in shown for c in measured(get(lb, b))]
                + [fmt_num(get(lb, b).get(k)) for lb, k, _ in ratios] for b in sizes]
        errors = {r["backend"]: r["error"] for r in self.rows
                  if r["op"] == op and r["dtype"] == dtype and r.get("error")
                  and r["backend"] in shown}
        title = (f"## {op}, {dtype}  (busbw factor {BUSBW_FACTOR[op][0]} = "
                 f"{BUSBW_FACTOR[op][1](self.n):.2f})")
        if not body:
            return f"{title}\n\n(no data)"
        notes = "".join(f"\n\n{lb}: {msg}" for lb, msg in errors.items())
        return f"{title}\n\n{md_table(header, body, 'l' + 'r' * (len(header) - 1))}{notes}"

    # ------------------------------------------------------------------ targets

    def _rows(self, label, op, dtype, lo=0, hi=float("inf")):
        return [r for r in self.rows if r["backend"] == label and r["op"] == op
                and r["dtype"] == dtype and lo <= r["bytes"] <= hi]

    @staticmethod
    def _entry(target, label, op, dtype, rows, value, need, fmt=None, detail=None):
        """A target's verdict over `rows`: the worst row's value(row) against `need`, a floor for
        the busbw targets and a ceiling for the others (times); n/a without rows, MISS where a
        row lacks the value."""
        e = dict(target=target, backend=label, op=op, dtype=dtype, value=None,
                 at_bytes=None, need=need)
        if not rows:
            return dict(e, measured="no sizes in range", result="n/a")
        bad = [r for r in rows if value(r) is None]
        if bad:
            return dict(e, at_bytes=bad[0]["bytes"], result="MISS",
                        measured=f"failed/missing at {fmt_bytes(bad[0]['bytes'])}")
        high = target.startswith("busbw")
        worst = (min if high else max)(rows, key=value)
        v = value(worst)
        shown = fmt(v) if fmt else f"{v:.3f}x" if v < 1 else f"{v:.2f}x"
        return dict(e, value=v, at_bytes=worst["bytes"],
                    measured=f"{'min' if high else 'max'} {shown} at "
                             f"{fmt_bytes(worst['bytes'])}" + (detail(worst) if detail else ""),
                    result="PASS" if (v >= need if high else v <= need) else "MISS")

    def targets(self) -> list[dict]:
        if self.cuda:
            return []  # the targets are stated for CPU tensors
        rng = f"{fmt_bytes(BUSBW_RANGE[0])}..{fmt_bytes(BUSBW_RANGE[1])}"
        memcpy = lambda r: r["busbw_gbps"] / self.memcpy if self._ok(r) else None  # noqa: E731
        # (target, backends, ops, size range, value of a row, need, format)
        goals = [(f"busbw >= {BUSBW_SPEEDUP:g}x {self.baseline}, {rng}", self.candidates,
                  BUSBW_OPS, BUSBW_RANGE, lambda r: r.get("busbw_ratio"), BUSBW_SPEEDUP, None),
                 (f"latency <= 1/{1 / LATENCY_RATIO:g} of {self.baseline}, "
                  f"<= {fmt_bytes(LATENCY_MAX_BYTES)}", self.candidates, OPS,
                  (0, LATENCY_MAX_BYTES), lambda r: r.get("latency_ratio"), LATENCY_RATIO, None)]
        goals += [(f"busbw >= {frac:.0%} of 1-core memcpy ({self.memcpy:.2f} GB/s), "
                   f">= {fmt_bytes(lo)}", self.candidates or [self.baseline], ops,
                   (lo, float("inf")), memcpy, frac, lambda v: f"{v:.0%}")
                  for ops, frac, lo in MEMCPY_TARGETS]
        return [self._entry(target, lb, op, dt, self._rows(lb, op, dt, *sizes), value, need, fmt)
                for target, labels, ops, sizes, value, need, fmt in goals
                for lb in labels for op, dt in self._ops_dtypes() if op in ops
                ] + self.world1_targets()

    def world1_targets(self) -> list[dict]:
        """rsdp - rsdp@1 <= mpi at every size of PEER_RANGE, per op and dtype the peer measured
        (MPI has no bfloat16)."""
        if PEER not in self.peers or "rsdp" not in self.labels:
            return []
        target = (f"rsdp - {WORLD1} <= {PEER}, "
                  f"{fmt_bytes(PEER_RANGE[0])}..{fmt_bytes(PEER_RANGE[1])}")

        def us(label, r):
            x = self._index.get((label, r["op"], r["dtype"], r["bytes"]))
            return x["time_us"] if x and self._ok(x) else None

        res = []
        for op, dt in self._ops_dtypes():
            if op not in PEER_OPS or not self._rows(PEER, op, dt):
                continue
            pts = []
            for r in self._rows("rsdp", op, dt, *PEER_RANGE):
                rsdp, one, mpi = (us(lb, r) for lb in ("rsdp", WORLD1, PEER))
                ok = rsdp is not None and one is not None and mpi
                pts.append(dict(bytes=r["bytes"], ratio=(rsdp - one) / mpi if ok else None,
                                detail=f": {fmt_num(rsdp, 1)} - {fmt_num(one, 1)} = "
                                       f"{fmt_num(rsdp - one, 1)} µs vs {fmt_num(mpi, 1)} µs"
                                if ok else ""))
            res.append(self._entry(target, "rsdp", op, dt, pts, lambda p: p["ratio"], 1.0,
                                   lambda v: f"{v:.2f}x", lambda w: w["detail"]))
        return res

    def targets_markdown(self) -> str:
        out = ["## Targets"]
        if self.n != 2:
            out.append(f"\nThe targets are stated for 2 ranks; this run has {self.n}, "
                       "so the verdicts below are for information only.")
        if not self.candidates:
            out.append(f"\nOnly one backend ({self.baseline}) was measured: the ratio targets "
                       "need a candidate and a baseline (e.g. --backends rsdp,gloo).")
        cols = ["target", "backend", "op", "dtype", "measured", "result"]
        targets = self.targets()
        if targets:
            out += ["", md_table(cols, [[t[c] for c in cols] for t in targets], "llllll"),
                    f"\n{sum(t['result'] == 'PASS' for t in targets)} of {len(targets)} PASS."]
        return "\n".join(out)

    # ------------------------------------------------------------------ json

    def to_json(self) -> dict:
        return {"machine": self.info, "config": self.config, "rows": self.rows,
                "targets": self.targets()}


# --------------------------------------------------------------------------- main


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.min_bytes > args.max_bytes:
        parser.error("--min-bytes is larger than --max-bytes")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    args.min_iters = min(args.min_iters, args.iters)
    args.backends = resolve_backends(args, parser)
    cuda_note = check_cuda(args, parser) if args.device == "cuda" else ""
    args.threads = max(1, (os.cpu_count() or 1) // args.world_size)

    labels = backend_labels(args.backends)
    print(f"# collectives: backends {', '.join(labels)} (baseline {labels[-1]}), "
          f"{args.world_size} ranks, ops {','.join(args.ops)}, dtypes {','.join(args.dtypes)}, "
          f"{fmt_bytes(args.min_bytes)}..{fmt_bytes(args.max_bytes)}", flush=True)
    # the machine, and the single-core memcpy the figures are relative to
    info = dict(common.machine(), memcpy_gbps_single_core=round(measure_copy(MEMCPY_BYTES), 3),
                memcpy_bytes=MEMCPY_BYTES, world_size=args.world_size,
                threads_per_rank=args.threads)
    print(f"# machine: {info['cpu_model']}, {info['vcpus']} vCPUs, torch {info['torch']}, "
          f"single-core memcpy {info['memcpy_gbps_single_core']:.2f} GB/s", flush=True)
    if args.device == "cuda":
        info.update(cuda_info(args, measure_copy(MEMCPY_BYTES, "cuda:0"), cuda_note))
        print(f"# GPU: {info['gpu_name']} x{info['gpu_count']}, {info['ranks_per_gpu']} rank(s) "
              f"per GPU, CUDA {info['torch_cuda_version']}; device-to-device copy "
              f"{info['d2d_copy_gbps']:.1f} GB/s (bytes read + written)", flush=True)
        if cuda_note:
            print(f"# {cuda_note}", flush=True)
    peer_notes = check_peers(args) if args.peers else []

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        raw_path = os.path.join(tmp, "raw.json")
        crashed = None
        try:
            mp.spawn(worker, args=(args, free_port(), raw_path), nprocs=args.world_size, join=True)
        except Exception as exc:  # noqa: BLE001 - report, keep partial results, exit non-zero
            crashed = exc
        raw = json.load(open(raw_path)) if os.path.exists(raw_path) else []
    peer_errors = []
    if args.peers and crashed is None:
        peer_raw, peer_info, peer_errors = run_peers(args, peer_notes)
        raw += peer_raw
        info.update(peer_info)
    elif peer_notes:
        info["peer_notes"] = peer_notes
    rows = aggregate(raw)
    info["elapsed_s"] = round(time.perf_counter() - t0, 1)

    config = {k: v for k, v in vars(args).items() if k != "out"}
    config.update(baseline=labels[-1], labels=labels, iter_bytes=ITER_BYTES,
                  warmup_bytes=WARMUP_BYTES)
    report = Report(rows, labels, info, config)
    text = report.markdown()
    print("\n" + text)
    common.write_result(args.out, args.name, report.to_json(), text, argv)

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

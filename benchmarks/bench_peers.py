"""Peers for bench_collectives.py (`--peers mpi`): communication libraries measured outside
torch.distributed, at the same points and with the same timing method, plus rsdp on a
world-size-1 group as the reference for the per-call overhead.

After the torch backends are swept, run() does, for the peer "mpi":

1. "rsdp@1": spawns ONE rank running bench_collectives.worker with the rsdp backend, the same
   ops, dtypes, sizes and iteration counts (rows labelled "rsdp@1", world_size 1). A 1-rank
   collective moves nothing between processes, so its time is what rsdp spends on a call
   besides the communication: the torch dispatch, the backend's bookkeeping, the local copy.
2. "mpi": writes the plan (every point bench_collectives would measure, with its element
   count and iteration counts, for the dtypes MPI has a datatype for) and runs
   bench_mpi_peer.py under Open MPI's mpirun with the same number of ranks; it reads the rows
   back from a JSON file and records the library version in the machine info.

A peer that cannot run here (no mpirun, no mpi4py, an mpirun that is not Open MPI's) is
announced at the start and left out; the run goes on and its exit status is not affected.
A peer that starts and then fails is reported as an error (exit status 1), like a crash of
the torch side.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch.multiprocessing as mp

PEERS = ("mpi",)
WORLD1_LABEL = "rsdp@1"
# numpy dtypes with an MPI datatype (bench_mpi_peer.MPI_TYPES). MPI has no bfloat16, and Open
# MPI 4.1 no float16 either (MPIX_C_FLOAT16 came with 5.0).
MPI_DTYPES = ("float32", "float64", "int32", "int64")
HERE = os.path.dirname(os.path.abspath(__file__))


def mpirun_command(n: int, plan: str, out: str, bind: bool = False) -> list[str]:
    """mpirun for n ranks on this machine. --allow-run-as-root is Open MPI's documented switch
    for root (the usual user in a container); --oversubscribe lets n exceed the core count;
    --bind-to core pins one rank per core as bench_collectives --bind pins the torch ranks
    (only while there are enough cores, there as here), else --bind-to none; btl self,vader
    is loopback plus shared memory, the transports of a single-node job."""
    cmd = ["mpirun"]
    if os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    binding = "core" if bind and n <= len(os.sched_getaffinity(0)) else "none"
    cmd += ["--oversubscribe", "-np", str(n), "--bind-to", binding, "--mca", "btl", "self,vader",
            sys.executable, os.path.join(HERE, "bench_mpi_peer.py"), "--plan", plan, "--out", out]
    return cmd


def unavailable(peer: str) -> str | None:
    """Why `peer` cannot run here, or None when it can."""
    if peer != "mpi":
        return f"unknown peer {peer!r}"
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


def check(args) -> list[str]:
    """Before the sweep: drops the peers that cannot run (printing why) and returns the notes
    for the report."""
    notes = []
    if args.device != "cpu":
        notes.append("--peers: the peers are measured on CPU buffers only; left out with "
                     "--device cuda")
        args.peers = []
    for peer in list(args.peers):
        why = unavailable(peer)
        if why:
            notes.append(f"{peer} not measured: {why}")
            args.peers.remove(peer)
    if args.peers and "rsdp" not in args.backends:
        notes.append(f"{WORLD1_LABEL} not measured: rsdp is not among --backends")
    skipped = [d for d in args.dtypes if d not in MPI_DTYPES]
    if "mpi" in args.peers and skipped:
        notes.append(f"mpi: {', '.join(skipped)} not measured (no MPI datatype)")
    for note in notes:
        print(f"# NOTE: {note}", flush=True)
    return notes


def plan_points(args, bc, dtypes) -> list[dict]:
    """Every point bench_collectives.sweep_backend measures (same element counts, same
    iteration counts), in its order: op, dtype, size."""
    points = []
    for op in args.ops:
        for dtype_name in dtypes:
            esize = bc.torch.empty((), dtype=bc.DTYPES[dtype_name]).element_size()
            last = None
            for nbytes in bc.size_list(args.min_bytes, args.max_bytes):
                count = bc.element_count(op, nbytes, esize, args.world_size)
                if count == last:
                    continue
                last = count
                iters, reps, warmup = bc.iters_for(count * esize, args)
                points.append(dict(op=op, dtype=dtype_name, count=count, bytes=count * esize,
                                   iters=iters, reps=reps, warmup=warmup))
    return points


def run_world1(args, bc, tmp: str) -> list[dict]:
    """rsdp on a 1-rank group, through bench_collectives.worker (the same timing code).

    The element counts are those of a 1-rank run of the same bytes; for the 2-rank target
    they equal the 2-rank counts (every size is even). Threads per rank stay as in the sweep.
    """
    one = argparse.Namespace(**vars(args))
    one.world_size, one.backends, one.labels = 1, ["rsdp"], [WORLD1_LABEL]
    raw_path = os.path.join(tmp, "world1.json")
    mp.spawn(bc.worker, args=(one, bc.free_port(), raw_path), nprocs=1, join=True)
    return json.load(open(raw_path)) if os.path.exists(raw_path) else []


def run_mpi(args, bc, tmp: str) -> tuple[list[dict], dict, str | None]:
    """(raw rows, machine-info additions, error or None); the rows written before a failure
    are kept."""
    plan, out = os.path.join(tmp, "mpi_plan.json"), os.path.join(tmp, "mpi_result.json")
    dtypes = [d for d in args.dtypes if d in MPI_DTYPES]
    with open(plan, "w") as f:
        json.dump({"world_size": args.world_size, "rounds": args.rounds,
                   "points": plan_points(args, bc, dtypes)}, f)
    cmd = mpirun_command(args.world_size, plan, out, getattr(args, "bind", False))
    launcher = " ".join(cmd[:cmd.index(sys.executable)])
    print(f"# mpi: {launcher} python benchmarks/bench_mpi_peer.py ...", flush=True)
    error = None
    proc = subprocess.Popen(cmd)
    try:
        # A hung job must not hang the benchmark: it gets twice the process-group timeout.
        if proc.wait(timeout=2 * args.timeout) != 0:
            error = f"mpirun exited with status {proc.returncode}"
    except subprocess.TimeoutExpired:
        proc.terminate()  # SIGTERM: mpirun then stops its ranks itself
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        error = f"mpirun did not finish in {2 * args.timeout} s (2 x --timeout)"
    result = json.load(open(out)) if os.path.exists(out) else {}
    info = {"mpi_library_version": result.get("library_version", "unknown"),
            "mpi_standard_version": result.get("mpi_version"),
            "mpi4py_version": result.get("mpi4py_version"),
            "mpi_command": launcher}
    return result.get("rows", []), info, error


def run(args, bc, notes: list[str]) -> tuple[list[dict], dict, list[str]]:
    """Runs the peers still in args.peers after check(). Returns (raw rows, machine-info
    additions, errors); a failing part adds an error and the others still run."""
    rows, info, errors = [], {}, []
    with tempfile.TemporaryDirectory() as tmp:
        if "rsdp" in args.backends:
            print(f"# {WORLD1_LABEL}: rsdp on a 1-rank group", flush=True)
            try:
                rows += run_world1(args, bc, tmp)
            except Exception as exc:  # noqa: BLE001 - reported, the peers still run
                errors.append(f"{WORLD1_LABEL}: {type(exc).__name__}: {exc}")
        if "mpi" in args.peers:
            try:
                mpi_rows, mpi_info, error = run_mpi(args, bc, tmp)
                rows += mpi_rows
                info.update(mpi_info)
                if error:
                    errors.append(f"mpi: {error}")
            except Exception as exc:  # noqa: BLE001
                errors.append(f"mpi: {type(exc).__name__}: {exc}")
    info["peer_notes"] = notes + [f"ERROR {e}" for e in errors]
    return rows, info, errors

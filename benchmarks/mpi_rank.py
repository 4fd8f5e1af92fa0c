#!/usr/bin/env python3
"""The Open MPI side of `collectives --peers mpi` and of multinode's `mpi` variant: one rank of
an mpirun job, started by its path, plain MPI on numpy buffers (neither torch nor this package
imported):

    mpirun ... python benchmarks/mpi_rank.py --plan PLAN.json --out RESULT.json

The plan holds the torch side's points (op, dtype, count, iterations, ops per iteration,
warm-up), each checked exact and timed as the torch side times it; rank 0 rewrites RESULT.json
after every op x dtype, so a crash keeps what was measured.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np
from mpi4py import MPI

NUMPY = {"float32": np.float32, "float64": np.float64, "int32": np.int32, "int64": np.int64}
MPI_TYPES = {"float32": MPI.FLOAT, "float64": MPI.DOUBLE, "int32": MPI.INT32_T,
             "int64": MPI.INT64_T}


def pattern(count: int, dtype, offset: int) -> np.ndarray:
    """(i % 7) + offset, as collectives.pattern: exact in every dtype."""
    return (np.arange(count, dtype=np.int64) % 7 + offset).astype(dtype)


class Point:
    """Buffers plus run()/check() for one (op, dtype, count) point on one rank, as
    collectives.Collective: the same inputs, the same expected outputs."""

    def __init__(self, comm, op: str, dtype_name: str, count: int):
        n, rank = comm.size, comm.rank
        dt, mt = NUMPY[dtype_name], MPI_TYPES[dtype_name]
        self.op, self.dtype, self.count, self.n, self.rank = op, dt, count, n, rank
        self.chunk = c = count // n
        length, offset = {"allreduce": (count, rank + 1), "allgather": (c, 8 * rank + 1),
                          "reduce_scatter": (count, rank + 1), "broadcast": (count, 1),
                          "alltoall": (count, 8 * rank + 1)}[op]
        self.inp = pattern(length, dt, offset)
        self.out = np.zeros(c if op == "reduce_scatter" else count, dt)
        s, r = [self.inp, mt], [self.out, mt]
        if op == "broadcast":
            # Bcast works in place: the root's buffer is the source, the others' the result.
            self.out = self.inp if rank == 0 else self.out
            r = [self.out, mt]
        self.run = {"allreduce": lambda: comm.Allreduce(s, r, MPI.SUM),
                    "allgather": lambda: comm.Allgather(s, r),
                    "reduce_scatter": lambda: comm.Reduce_scatter_block(s, r, MPI.SUM),
                    "broadcast": lambda: comm.Bcast(r, root=0),
                    "alltoall": lambda: comm.Alltoall(s, r)}[op]

    def expected(self) -> np.ndarray:
        n, r, c = self.n, self.rank, self.chunk
        every = np.arange(self.count, dtype=np.int64)
        mine = np.arange(r * c, (r + 1) * c, dtype=np.int64)
        summed = lambda j: n * (j % 7) + n * (n + 1) // 2  # noqa: E731
        gathered = lambda j: np.concatenate([j % 7 + 8 * k + 1 for k in range(n)])  # noqa: E731
        return {"allreduce": lambda: summed(every), "broadcast": lambda: every % 7 + 1,
                "allgather": lambda: gathered(np.arange(c, dtype=np.int64)),
                "reduce_scatter": lambda: summed(mine),
                "alltoall": lambda: gathered(mine)}[self.op]().astype(self.dtype)

    def check(self) -> bool:
        """One untimed run into a poisoned output; True when this rank's output is exact."""
        if self.op != "broadcast":
            self.out.fill(-1)
        elif self.rank != 0:
            self.out.fill(0)
        self.run()
        return bool(np.array_equal(self.out, self.expected()))


def sweep(comm, points: list[dict], rnd: int, rounds: int, emit, flush,
          warmup_seconds: float = 0.0, warmup_max_ops: int = 0) -> None:
    n, rank = comm.size, comm.rank
    groups: dict[tuple, list[dict]] = {}
    for p in points:  # the collectives suite's order: op, dtype, then sizes
        groups.setdefault((p["op"], p["dtype"]), []).append(p)
    for (op, dtype_name), pts in groups.items():
        t_start = time.perf_counter()
        failed = None
        for p in pts:
            row = {"backend": "mpi", "backend_name": "mpi", "op": op, "dtype": dtype_name,
                   "bytes": p["bytes"], "count": p["count"], "world_size": n, "round": rnd}
            point = Point(comm, op, dtype_name, p["count"])
            err = ""
            try:
                ok = point.check()
            except Exception as exc:  # noqa: BLE001 - reported as the torch side does
                ok, err = False, f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            flags = np.array([0.0 if ok else 1.0, 1.0 if err else 0.0])
            comm.Allreduce(MPI.IN_PLACE, flags, MPI.MAX)
            if flags[1] > 0:
                row.update(error=err or "failed on another rank", correct=False)
                emit(row)
                failed = row["error"]
                break  # skip the larger sizes of this op x dtype, as the torch side does
            row["correct"] = bool(flags[0] == 0)
            iters, reps, warmup = p["iters"], p["reps"], p["warmup"]
            run = point.run
            t_warm = time.perf_counter()
            for _ in range(warmup):
                run()
            # Then more warm-up for about warmup_seconds, as the torch side and the oneCCL
            # peer do: an op count from the slowest rank's warm-up time, so every rank agrees.
            per_op = np.array([(time.perf_counter() - t_warm) / max(1, warmup)])
            comm.Allreduce(MPI.IN_PLACE, per_op, MPI.MAX)
            more = 0 if warmup == 0 else \
                int(min(warmup_max_ops, warmup_seconds / max(per_op[0], 1e-7)))
            for _ in range(more):
                run()
            times = np.empty(iters, dtype=np.float64)
            for it in range(iters):
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(reps):
                    run()
                times[it] = (time.perf_counter() - t0) / reps
            slowest = np.empty_like(times) if rank == 0 else None
            comm.Reduce(times, slowest, MPI.MAX, root=0)
            if rank == 0:
                row.update(iters=iters, reps=reps, warmup=warmup,
                           samples_us=[round(t * 1e6, 3) for t in slowest.tolist()])
            emit(row)
        flush()
        if rank == 0:
            status = f"  ERROR: {failed}" if failed else ""
            tag = f" round {rnd + 1}/{rounds}" if rounds > 1 else ""
            print(f"[mpi{tag}] {op:<14} {dtype_name:<9} done in "
                  f"{time.perf_counter() - t_start:6.1f} s{status}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--plan", required=True, help="JSON written by common.run_mpi")
    p.add_argument("--out", required=True, help="where rank 0 writes the results (JSON)")
    args = p.parse_args(argv)
    comm = MPI.COMM_WORLD
    with open(args.plan) as f:
        plan = json.load(f)
    if comm.size != plan["world_size"]:
        if comm.rank == 0:
            print(f"mpi_rank: the plan is for {plan['world_size']} ranks, mpirun started "
                  f"{comm.size}", file=sys.stderr)
        return 2
    import mpi4py
    result = {"library_version": MPI.Get_library_version().rstrip("\x00\n "),
              "mpi_version": "%d.%d" % MPI.Get_version(),
              "mpi4py_version": mpi4py.__version__, "rows": []}

    def flush() -> None:
        if comm.rank == 0:
            with open(args.out, "w") as f:
                json.dump(result, f)

    flush()
    for rnd in range(plan["rounds"]):
        sweep(comm, plan["points"], rnd, plan["rounds"], result["rows"].append, flush,
              plan.get("warmup_seconds", 0.0), plan.get("warmup_max_ops", 0))
    comm.Barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())

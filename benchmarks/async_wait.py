"""What waiting costs: blocking, async (`.wait()`), future and overlapped all-reduces against
each other, rsdp and gloo, pinned or not ([Note: waiting runs the op] in
csrc/backend/work_rsdp.cpp). See docs/benchmarks.md, async-wait.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
import torch.distributed as dist

from .common import RESULTS, fmt_bytes, md_table, run_ranks, write_result

SIZES = (8, 64 << 10, 1 << 20)
KINDS = ("blocking", "async", "future", "overlap", "mm")


def timed(fn, calls: int) -> float:
    """Median over 5 batches of `calls` calls, µs per call, after 200 warm-up calls."""
    for _ in range(200):
        fn()
    batches = []
    for _ in range(5):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        batches.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(batches)


def rank_main(rank: int, n: int) -> list:
    a = torch.randn(64, 64)
    rows = []
    for nbytes in SIZES:
        t = torch.ones(nbytes // 4)
        calls = 1000 if nbytes < (1 << 20) else 200

        def overlap():
            w = dist.all_reduce(t, async_op=True)
            torch.mm(a, a)
            w.wait()

        fns = {"blocking": lambda: dist.all_reduce(t),
               "async": lambda: dist.all_reduce(t, async_op=True).wait(),
               "future": lambda: dist.all_reduce(t, async_op=True).get_future().wait(),
               "overlap": overlap,
               "mm": lambda: torch.mm(a, a)}
        rows.append((nbytes, {k: timed(fns[k], calls) for k in KINDS}))
    return rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--backends", default="rsdp,gloo")
    p.add_argument("--world-sizes", default="1,2")
    p.add_argument("--pin", choices=("yes", "no", "both"), default="both")
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    cores = len(os.sched_getaffinity(0))
    pins = {"yes": [True], "no": [False], "both": [False, True]}[args.pin]
    table = []
    for n in (int(x) for x in args.world_sizes.split(",")):
        for pin in pins:
            if pin and n > cores:
                continue
            for backend in args.backends.split(","):
                for nbytes, r in run_ranks(rank_main, n, backend=backend, threads=1, pin=pin):
                    table.append(dict(backend=backend, ranks=n, pinned=pin, bytes=nbytes, **r))
                    print(f"# {backend} {n} ranks pinned={pin} {fmt_bytes(nbytes)}: "
                          f"async / blocking {r['async'] / r['blocking']:.2f}", flush=True)
    text = md_table(["backend", "ranks", "pinned", "size"] + [f"{k} µs" for k in KINDS]
                    + ["async / blocking"],
                    [[r["backend"], r["ranks"], "yes" if r["pinned"] else "no",
                      fmt_bytes(r["bytes"])] + [f"{r[k]:.1f}" for k in KINDS]
                     + [f"{r['async'] / r['blocking']:.2f}"] for r in table])
    print(text)
    write_result(args.out, "async_wait", table, text, argv)
    return 0

#!/usr/bin/env python3
"""Cached against streaming stores into the staging memory, in one launch.

Two ranks pinned to two CPUs make two rsdp groups over the same ranks, one with
RSDP_SHM_STORES=cached and one with streaming (the variable is read when a group is made),
and time a float32 all-reduce on each in turn: per size, --rounds rounds of (3 warm-up ops,
then 5 timed ops after a barrier) on each group, the median per group. Both groups share
the launch's placement of the CPUs, so the comparison holds in either launch mode. A third
group is left to choose (auto): its probe (torch_rsdp.topology()["handoff"]: the mode, and a
hand-off timed with either kind of store) and its choice are printed with the times. Run
it several times to meet both modes (docs/benchmarks.md, "Launch modes").

    python benchmarks/bench_shm_stores.py
    for i in $(seq 12); do python benchmarks/bench_shm_stores.py; sleep 3; done
"""
from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.append(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch_rsdp  # noqa: E402

MODES = ("cached", "streaming")


def rank_main(rank: int, port: int, sizes: list[int], rounds: int) -> None:
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("rsdp", store=store, rank=rank, world_size=2)
    groups = {}
    for mode in MODES:
        os.environ["RSDP_SHM_STORES"] = mode
        groups[mode] = dist.new_group([0, 1])
    # A third group left to choose (RSDP_SHM_STORES=auto): its probe times a hand-off with
    # either kind of store, and the faster decides (csrc/transport/shm/handoff_probe.cpp).
    os.environ["RSDP_SHM_STORES"] = "auto"
    handoff = torch_rsdp.topology(dist.new_group([0, 1]))["handoff"]
    cells = []
    for size in sizes:
        x = torch.ones(size // 4)
        times = {m: [] for m in MODES}
        for _ in range(rounds):
            for mode, g in groups.items():
                for _ in range(3):
                    dist.all_reduce(x, group=g)
                for _ in range(5):
                    dist.barrier(group=g)
                    t0 = time.perf_counter()
                    dist.all_reduce(x, group=g)
                    times[mode].append(time.perf_counter() - t0)
        cells.append(f"{size >> 10} KiB " + " / ".join(
            f"{statistics.median(times[m]) * 1e6:.0f}" for m in MODES))
    if rank == 0:
        print(f"{handoff['mode']} (fastest step {handoff['step_ns']:.0f} ns; hand-off "
              f"{handoff['cached_gbps']:.1f} GB/s cached, {handoff['streamed_gbps']:.1f} "
              f"streaming: chose {handoff['stores']}) | cached / streaming µs: "
              + " | ".join(cells), flush=True)
    dist.destroy_process_group()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="65536,1048576,16777216", help="bytes, comma-separated")
    p.add_argument("--rounds", type=int, default=15)
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sizes = [int(v) for v in args.sizes.split(",")]
    mp.spawn(rank_main, args=(port, sizes, args.rounds), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

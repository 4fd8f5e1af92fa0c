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

--follow N instead times the three groups in turn, N rounds about a second apart (rotating
which goes first), at the first size: whether the group left to choose keeps up when the
host moves the CPUs (its re-probe, RSDP_REPROBE_MS): in how many rounds its stores, read
after the round, were not those of the faster fixed setting.

    python benchmarks/bench_shm_stores.py
    for i in $(seq 12); do python benchmarks/bench_shm_stores.py; sleep 3; done
    python benchmarks/bench_shm_stores.py --follow 40 --sizes 1048576
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


def timed_median(x: torch.Tensor, group, ops: int) -> float:
    """Median µs of `ops` all-reduces on `group`, each timed alone after a barrier."""
    for _ in range(3):
        dist.all_reduce(x, group=group)
    times = []
    for _ in range(ops):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        dist.all_reduce(x, group=group)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def follow(rank: int, groups: dict, auto, size: int, rounds: int) -> None:
    """--follow: the auto group against both fixed settings, round after round."""
    x = torch.ones(size // 4)
    order = [("auto", auto)] + list(groups.items())
    behind = 0
    for r in range(rounds):
        turn = order[r % 3:] + order[:r % 3]  # the first after the pause starts colder
        med = {name: timed_median(x, g, 40) for name, g in turn}
        h = torch_rsdp.topology(auto)["handoff"]
        faster = min(MODES, key=lambda m: med[m])
        wrong = h["stores"] != faster
        behind += wrong
        if rank == 0:
            print(f"{r:3d} {h['mode']:<4} {h['stores']:<9} auto {med['auto']:7.1f} | cached "
                  f"{med['cached']:7.1f} | streaming {med['streaming']:7.1f} µs"
                  + (f"  ({faster} was the faster)" if wrong else ""), flush=True)
        time.sleep(0.5)
    if rank == 0:
        print(f"# {size >> 10} KiB: the group left to choose stored otherwise than the faster "
              f"fixed setting in {behind} of {rounds} rounds", flush=True)


def rank_main(rank: int, port: int, sizes: list[int], rounds: int, follow_rounds: int) -> None:
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
    auto = dist.new_group([0, 1])
    if follow_rounds:
        follow(rank, groups, auto, sizes[0], follow_rounds)
        dist.destroy_process_group()
        return
    handoff = torch_rsdp.topology(auto)["handoff"]
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
    p.add_argument("--follow", type=int, default=0, metavar="N",
                   help="N rounds of the three groups in turn at the first size (see above)")
    args = p.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sizes = [int(v) for v in args.sizes.split(",")]
    mp.spawn(rank_main, args=(port, sizes, args.rounds, args.follow), nprocs=2, join=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""How a 2-rank group follows the host moving its vCPUs: one all-reduce, timed in windows.

Two ranks, each pinned to its own CPU, run a --bytes all-reduce (input rewritten before each op,
as a gradient is) in windows of --window-ops ops for --seconds. After each window rank 0 prints
the window's median time, the group's hand-off mode and staging stores
(`torch_rsdp.topology()["handoff"]`), and how many probes the group has made (and how many of
them came early because its work slowed: csrc/transport/shm/slow_watch.cpp). The summary counts
the windows per mode and the *stale* ones: windows slower than --stale times the median of the
windows in the same mode and stores, i.e. a placement the group's stores no longer suit.

    python benchmarks/placement_watch.py                  # 60 s, 1 MiB
    python benchmarks/placement_watch.py --seconds 20 --bytes 4M
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))  # an uninstalled checkout: torch_rsdp from the source
sys.path.append(HERE)
from bench_collectives import free_port, parse_size  # noqa: E402


def worker(rank: int, args, port: int) -> None:
    import torch_rsdp

    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[rank]})
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("rsdp", rank=rank, world_size=2)
    count = args.bytes // 4
    x, src = torch.empty(count), torch.rand(count)
    end = time.perf_counter() + args.seconds
    t_start = time.perf_counter()
    rows = []
    while True:
        go = torch.tensor([1.0 if time.perf_counter() < end else 0.0])
        dist.all_reduce(go, op=dist.ReduceOp.MIN)  # both ranks stop after the same window
        if go.item() == 0:
            break
        times = []
        for _ in range(args.window_ops):
            x.copy_(src)
            t0 = time.perf_counter()
            dist.all_reduce(x)
            times.append(time.perf_counter() - t0)
        h = torch_rsdp.topology()["handoff"]
        rows.append((time.perf_counter() - t_start, statistics.median(times) * 1e6, h["mode"],
                     h["stores"], h["probes"], h["early_probes"]))
    dist.destroy_process_group()
    if rank != 0:
        return
    for t, us, mode, stores, probes, early in rows:
        print(f"{t:7.2f} s  {us:7.1f} µs  {mode:<10} {stores:<9} probes {probes} "
              f"(early {early})")
    by_state: dict = {}
    for _, us, mode, stores, _, _ in rows:
        by_state.setdefault((mode, stores), []).append(us)
    print(f"\n{len(rows)} windows of {args.window_ops} ops, {args.bytes >> 10} KiB all-reduce; "
          f"{rows[-1][4]} probes, {rows[-1][5]} of them early")
    for (mode, stores), v in sorted(by_state.items()):
        med = statistics.median(v)
        stale = [u for u in v if u > args.stale * med]
        print(f"  {mode}/{stores}: {len(v)} windows, median {med:.1f} µs; {len(stale)} stale "
              f"(over {args.stale}x: {', '.join(f'{u:.0f}' for u in stale) or '-'})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--bytes", type=parse_size, default=1 << 20)
    p.add_argument("--window-ops", type=int, default=1000)
    p.add_argument("--stale", type=float, default=1.5)
    args = p.parse_args(argv)
    if len(os.sched_getaffinity(0)) < 2:
        p.error("needs two CPUs (one per rank)")
    port = free_port()
    mp.start_processes(worker, args=(args, port), nprocs=2, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What makes a slow launch slow: the ranks' placement, the group's memory, or the launch.

On the 2-vCPU guest a 4-rank all-reduce runs some whole launches about 1.3x slower than others
(docs/benchmarks.md, "Two hundred timed iterations per launch"). This script takes the usual
suspects away one at a time, in one launch:

  * one process, pinned to the first CPU, copies and adds L3-resident 1 MiB tensors: the
    memory system seen from one CPU, with no traffic between CPUs (`alone`);
  * --world-size ranks, pinned as --pin says (default: unpinned), run an all-reduce of
    --bytes with its input rewritten before each op (as a gradient is), in --groups rsdp
    groups made one after the other (each its own staging memory) and two fresh tensors per
    group: the fastest iteration and the median of --iters (slowest rank per iteration).

If the groups of one launch agree with each other and differ from another launch's, the state
is the launch's, not a group's memory; if every pairing of --pin meets both speeds, it is not
the pairing.

    python benchmarks/launch_state.py                       # 4 ranks, unpinned, 6 groups
    python benchmarks/launch_state.py --pin 0,0,1,1 --groups 2
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.append(os.path.dirname(HERE))  # an uninstalled checkout: torch_rsdp from the source
sys.path.append(HERE)
from bench_collectives import free_port, parse_size  # noqa: E402


def alone_us(reps: int = 300) -> float:
    """Median µs of one CPU copying and adding 8 L3-resident 1 MiB tensors in a ring."""
    os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})
    torch.set_num_threads(1)
    bufs = [torch.rand(1 << 18) for _ in range(8)]
    out = torch.empty(1 << 18)

    def once():
        for i in range(8):
            torch.add(bufs[i], bufs[(i + 1) % 8], out=out)
            bufs[i].copy_(out)

    for _ in range(reps):
        once()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        once()
        times.append(time.perf_counter() - t0)
    return sorted(times)[reps // 2] * 1e6


def worker(rank: int, args, port: int) -> None:
    import torch_rsdp  # noqa: F401  (registers "rsdp")

    if args.pin:
        os.sched_setaffinity(0, {args.pin[rank]})
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("rsdp", rank=rank, world_size=args.world_size)
    side = dist.new_group(backend="gloo")  # gathers the timings
    count = args.bytes // 4
    groups = []
    for g in range(args.groups):
        group = dist.new_group(backend="rsdp")
        groups.append(group)  # kept alive: the next group gets new staging memory
        cells = []
        for _ in range(2):
            x, src = torch.empty(count), torch.rand(count)
            for _ in range(args.warmup):
                x.copy_(src)
                dist.all_reduce(x, group=group)
            times = torch.empty(args.iters, dtype=torch.float64)
            for it in range(args.iters):
                x.copy_(src)
                dist.barrier(group=group)
                t0 = time.perf_counter()
                dist.all_reduce(x, group=group)
                times[it] = time.perf_counter() - t0
            every = [torch.empty_like(times) for _ in range(args.world_size)]
            dist.all_gather(every, times, group=side)
            slowest = torch.stack(every).max(0).values.sort().values * 1e6
            cells.append(f"{slowest[0].item():.0f}/{slowest[args.iters // 2].item():.0f}")
        if rank == 0:
            print(f"group {g}: fastest/median µs, two tensors: {'  '.join(cells)}", flush=True)
    dist.destroy_process_group()


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--bytes", type=parse_size, default=1 << 20, help="e.g. 1M, 256K")
    p.add_argument("--groups", type=int, default=6)
    p.add_argument("--iters", type=int, default=200)
    p.add_argument("--warmup", type=int, default=300)
    p.add_argument("--pin", default="", help="comma-separated CPU per rank (default: unpinned)")
    args = p.parse_args(argv)
    args.pin = [int(c) for c in args.pin.split(",")] if args.pin else []
    if args.pin and len(args.pin) != args.world_size:
        p.error(f"--pin names {len(args.pin)} CPUs for {args.world_size} ranks")
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:  # its own process: the pinning must not follow the ranks
        print(f"alone: one CPU, copy + add of L3-resident tensors, {pool.apply(alone_us):.0f} µs",
              flush=True)
    port = free_port()
    mp.start_processes(worker, args=(args, port), nprocs=args.world_size, start_method="spawn")
    return 0


if __name__ == "__main__":
    sys.exit(main())

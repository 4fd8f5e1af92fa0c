"""FSDP2 over rsdp with its collective buffers from torch.empty or from the process group
(`set_allocate_memory_from_process_group_for_comm`: memory the peers read in place, one copy
instead of two), the same model both ways in the same processes, alternating: median step
time, ratio, one-copy collectives. See docs/benchmarks.md, comm-memory.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from . import training_models as tm
from .common import RESULTS, md_table, run_ranks, slowest, write_result

VARIANTS = {"torch.empty": False, "communication memory": True}


def build(args, from_pg: bool):
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(args.width, args.width)
                                  for _ in range(args.layers)])
    tm.fully_shard_blocks(model, model)
    for m in (*model, model):
        m.set_allocate_memory_from_process_group_for_comm(from_pg)
    return model, torch.optim.SGD(model.parameters(), lr=1e-3)


def worker(rank: int, world: int, args) -> dict:
    import torch_rsdp

    runs = {name: build(args, from_pg) for name, from_pg in VARIANTS.items()}
    times = {name: [] for name in VARIANTS}
    one_copy = {name: 0 for name in VARIANTS}
    x = torch.randn(args.batch, args.width, generator=torch.Generator().manual_seed(rank))
    for _ in range(args.rounds):
        for name, (model, opt) in runs.items():
            def step(_, model=model, opt=opt):
                model(x).square().mean().backward()
                opt.step()
                opt.zero_grad()

            before = torch_rsdp.comm_stats()["one_copy_ops"]
            # the first step of a batch re-warms this model's buffers: untimed
            times[name] += tm.timed_steps(step, args.steps, warmup=1)
            one_copy[name] += torch_rsdp.comm_stats()["one_copy_ops"] - before
    # The slowest rank's step is the step.
    return {name: dict(step_ms=statistics.median(slowest(times[name])) * 1e3,
                       one_copy_ops=one_copy[name]) for name in VARIANTS}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=1024)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5, help="timed steps per variant per round")
    p.add_argument("--rounds", type=int, default=6, help="alternations of the two variants")
    p.add_argument("--out", default=RESULTS)
    args = p.parse_args(argv)
    res = run_ranks(worker, args.ranks, args, threads=1, pin=True)
    base = res["torch.empty"]["step_ms"]
    params = args.layers * (args.width * args.width + args.width)
    print(f"# FSDP2 over rsdp, {args.ranks} ranks, {args.layers} x Linear({args.width}, "
          f"{args.width}) ({params / 1e6:.1f} M parameters), batch {args.batch}, "
          f"median of {args.rounds} x {args.steps} steps\n")
    text = md_table(["FSDP2 comm buffers", "step ms", "speedup", "one-copy collectives"],
                    [[name, f"{r['step_ms']:.1f}", f"{base / r['step_ms']:.2f}x",
                      r["one_copy_ops"]] for name, r in res.items()])
    print(text)
    write_result(args.out, "comm_memory", res, text, argv)
    return 0

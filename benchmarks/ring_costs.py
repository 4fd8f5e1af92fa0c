"""Where an RSDP step's time goes next to FSDP2's (the rsdp-fsdp2 suite's `act` setting):

  steps   every --variants model in the same processes, timed in turns: wall and CPU time per
          step, CPU share of cores x wall, context switches and system time (getrusage), ring
          hops per step;
  hops    a 256 x 256 matmul per iteration followed by nothing, one ring hop, a whole rotation,
          an all-gather or a reduce-scatter of a --numel shard: the cost of each synchronisation;
  single  one rank: a step unsharded, under RSDP and FSDP2, and AdamW alone;
  phases  forward, backward and the optimizer's step timed apart.
"""
from __future__ import annotations

import argparse
import os
import resource
import time

from . import rsdp_fsdp2 as bench
from .common import RESULTS, run_ranks, write_result

CFG = bench.SETTINGS["act"]
_LINES = []  # what rank 0 printed: its worker returns them for the result file


def _say(rank, text):
    if rank == 0:
        print(text, flush=True)
        _LINES.append(text)


def _models(names, rank):
    """{name: (model, AdamW, step(i))}; "unsharded" is the model as built."""
    import torch
    out = {}
    for v in names:
        m = bench.build_model(CFG)
        m = m if v == "unsharded" else bench.wrap(m, v)
        opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
        out[v] = (m, opt, bench.step_fn(m, opt, CFG, rank))
    return out


def _steps_worker(rank, world, a):
    import torch
    import torch.distributed as dist
    import torch_rsdp.rsdp as rsdp
    models = _models(a.variants.split(","), rank)
    rings = {v: rsdp.rsdp_state(m).ring for v, (m, _, _) in models.items()
             if bench.VARIANTS[v] is not None}
    for rnd in range(a.rounds):
        for v, (_, _, step) in models.items():
            bench.use_variant(v)
            step(0)
            step(1)
            dist.barrier()
            ru0, c0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), \
                time.perf_counter()
            h0 = rings[v].hops if v in rings else 0
            for i in range(a.steps):
                step(10 + i)
            dist.barrier()
            wall, cpu = time.perf_counter() - t0, time.process_time() - c0
            hops = ((rings[v].hops - h0) / a.steps) if v in rings else 0
            ru1 = resource.getrusage(resource.RUSAGE_SELF)
            t = torch.tensor([wall, cpu, ru1.ru_nvcsw - ru0.ru_nvcsw,
                              ru1.ru_nivcsw - ru0.ru_nivcsw, ru1.ru_stime - ru0.ru_stime],
                             dtype=torch.float64) / a.steps
            dist.all_reduce(t)
            wall_s, cpu_s = t[0].item() / world, t[1].item()
            share = cpu_s / (min(world, os.cpu_count() or 1) * wall_s)
            _say(rank, f"round {rnd + 1} {v:14s} wall {wall_s * 1e3:7.1f} ms/step  "
                       f"cpu {cpu_s * 1e3:7.1f} ms/step ({share:.2f} of the cores)  "
                       f"switches {t[2].item():5.0f} voluntary {t[3].item():5.0f} involuntary  "
                       f"sys {t[4].item() * 1e3:5.1f} ms  ring hops {hops:.0f}/step")
    return _LINES


def _hops_worker(rank, world, a):
    import torch
    import torch.distributed as dist
    from torch_rsdp._ring import rsdp_backend
    be = rsdp_backend()
    x, w = torch.randn(256, 256), torch.randn(256, 256)
    for n in (int(s) for s in a.numel.split(",")):
        src, bufs, gathered = torch.randn(n), [torch.empty(n), torch.empty(n)], \
            torch.empty(world * n)

        def ring(hops):
            cur = src
            for t in range(hops):
                be.ring_step(cur, bufs[t % 2], 1, None).wait()
                cur = bufs[t % 2]

        modes = {"none": lambda: None, "ring1": lambda: ring(1),
                 "ring": lambda: ring(world - 1),
                 "allgather": lambda: dist.all_gather_into_tensor(gathered, src),
                 "reduce_scatter": lambda: dist.reduce_scatter_tensor(src, gathered)}
        for rnd in range(a.rounds):
            us = {}
            for mode, sync in modes.items():
                dist.barrier()
                t0 = time.perf_counter()
                for _ in range(a.iters):
                    torch.mm(x, w)
                    sync()
                dist.barrier()
                us[mode] = (time.perf_counter() - t0) / a.iters * 1e6
            _say(rank, f"round {rnd + 1}, shard {n * 4 / 1024:.0f} KiB: matmul alone "
                       f"{us['none']:.0f} us per iteration; added: "
                       + ", ".join(f"{m} {us[m] - us['none']:+.0f} us" for m in us
                                   if m != "none"))
    return _LINES


def _single_worker(rank, world, a):
    import torch
    models = _models(("unsharded", "rsdp", "fsdp2"), 0)
    best = dict.fromkeys(models, float("inf"))
    for _ in range(max(a.rounds, 3)):
        for k, (_, _, step) in models.items():
            t0 = time.perf_counter()
            for i in range(a.steps):
                step(i)
            best[k] = min(best[k], (time.perf_counter() - t0) / a.steps)
    for k, (m, opt, _) in models.items():
        ids = torch.zeros(1, CFG["seq"], dtype=torch.long)
        m(input_ids=ids, labels=ids).loss.backward()
        ts = []
        for _ in range(5):
            t0 = time.perf_counter()
            opt.step()
            ts.append(time.perf_counter() - t0)
        opt.zero_grad(set_to_none=True)
        _say(rank, f"{k:10s} step {best[k] * 1e3:6.1f} ms (best round)  AdamW step alone "
                   f"{min(ts) * 1e3:5.1f} ms")
    return _LINES


def _phases_worker(rank, world, a):
    import torch
    import torch.distributed as dist
    from . import training_models as tm
    variants = a.variants.split(",")
    models = _models(variants, rank)
    times = {v: [] for v in variants}
    warmup = 3
    for s in range(warmup + a.steps):
        k = s % len(variants)
        for v in variants[k:] + variants[:k]:  # taking turns, as the rsdp-fsdp2 suite does
            bench.use_variant(v)
            model, opt, _ = models[v]
            ids = tm.token_batch(CFG["vocab"], CFG["batch"], CFG["seq"], 1000 * s + rank)
            dist.barrier()
            t0 = time.perf_counter()
            loss = model(input_ids=ids, labels=ids).loss
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            opt.step()
            opt.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            if s >= warmup:
                times[v].append([t1 - t0, t2 - t1, t3 - t2, t3 - t0])
    for v in variants:
        t = torch.tensor(times[v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's, step by step
        med = t.median(dim=0).values * 1e3
        _say(rank, f"{v:14s} forward {med[0]:6.1f}  backward {med[1]:6.1f}  optimizer "
                   f"{med[2]:5.1f}  step {med[3]:6.1f} ms (medians of the slowest rank's)")
    return _LINES


WORKERS = {"steps": _steps_worker, "hops": _hops_worker, "single": _single_worker,
           "phases": _phases_worker}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=tuple(WORKERS))
    p.add_argument("--world-size", type=int, default=4)
    p.add_argument("--variants", default="rsdp,fsdp2",
                   help="steps, phases: rsdp-fsdp2 variants")
    p.add_argument("--steps", type=int, default=8,
                   help="steps / single: steps per round; phases: timed steps")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--numel", default="1024,49152", help="hops: shard sizes (float32 elements)")
    p.add_argument("--iters", type=int, default=300, help="hops: iterations per mode")
    p.add_argument("--out", default=RESULTS)
    a = p.parse_args(argv)
    bad = [v for v in a.variants.split(",") if v not in bench.VARIANTS]
    if bad:
        p.error(f"unknown variant(s) {bad}; choose from {list(bench.VARIANTS)}")
    world = 1 if a.what == "single" else a.world_size
    threads = 1 if a.what in ("hops", "single") else None
    lines = run_ranks(WORKERS[a.what], world, a, threads=threads)
    write_result(a.out, f"ring_costs_{a.what}", lines, "```\n" + "\n".join(lines) + "\n```",
                 argv)
    return 0

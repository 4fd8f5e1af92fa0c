#!/usr/bin/env python3
"""The spread of collective times over launches, per launch mode: rsdp against its peers.

On a virtual machine the host places the guest's CPUs, and two things change under a launch:
 * the caches: in some launches two ranks share a last-level cache ("near"), in others they do
   not ("far") and every library's shared-memory collectives slow down, for minutes;
 * the cores: a vCPU may share its host core with another hardware thread (the other vCPU, or
   another guest's), for seconds at a time; the interpreter, and with it every fixed cost of a
   call, then runs at about half speed ("contended"; benchmarks/cpu_probe.py).
One launch compared with another is then a coin toss. This script runs --launches rounds; each
round

  1. probes the mode: two rsdp ranks are set up and their group's hand-off probe is read
     (torch_rsdp.topology()["handoff"]: the round trip of one step and the bandwidth of
     pulling lines the other core just wrote; transport/shm/handoff_probe.h);
  2. runs benchmarks/bench_collectives.py once, rsdp with --peers (Open MPI, oneCCL), so that
     each peer runs as its own launch right after rsdp's (a round takes seconds), with
     --cpu-probes: an interpreter loop is timed on each CPU alone and on all at once
     (cpu_probe.py) before rsdp, before each peer and at the end. Each library's run gets
     the CPU state of the probes around it: "clear" or "contended" (against the fastest alone
     time of the whole script) when both agree, "changed" when they differ.

Then, per mode (hand-off/CPUs) and size: every library's median time over the launches it ran
in that mode, its min/max and spread (max/min), and rsdp's time over the peer's in the launches
where both ran in that mode. Goals (printed as PASS/MISS): in every steady mode ("changed" is
shown, not judged), launch by launch, rsdp is at or below Open MPI's time from 64 KiB; over all
launches rsdp's spread is no wider than Open MPI's.

    python benchmarks/bench_launches.py --launches 10                    # 2 ranks, Open MPI
    python benchmarks/bench_launches.py --launches 10 --world-size 4
    python benchmarks/bench_launches.py --launches 4 --peers mpi,oneccl --sizes 64K,1M

Outputs (--out, default benchmarks/results/launches/): launches.json (every launch), and the
table on stdout and in launches.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.append(ROOT)  # an uninstalled checkout: torch_rsdp from the source tree
sys.path.append(HERE)
import cpu_probe  # noqa: E402  (sibling module)

FROM_SIZE = 64 << 10  # the goals hold from 64 KiB (below it a call's fixed cost dominates)
# Timed iterations per size in every launch. bench_collectives' own default (20 for small
# messages, 16 at 16 MiB) suits one sweep, but a launch's median of 20 is itself noisy: on the
# 2-core guest, 4 ranks, resampling one launch's 200 iterations put the median of 20 anywhere in
# a 1.04x (64 KiB) to 1.13x (1 MiB) band (5-95%), of 200 within 1.01-1.03x; over 10 launches
# that noise alone would widen a spread (max/min) by about as much. 200 is also how the
# launch-to-launch variation was first seen (median of 200 barrier-separated ops).
ITERS = 200


def parse_size(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    return int(text[:-1]) * units[text[-1]] if text[-1] in units else int(text)


def fmt_bytes(n: int) -> str:
    for unit, size in (("M", 1 << 20), ("K", 1 << 10)):
        if n >= size and n % size == 0:
            return f"{n // size}{unit}"
    return f"{n}B"


def _probe_rank(rank: int, port: int, out: str) -> None:
    import datetime

    import torch.distributed as dist

    import torch_rsdp

    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("rsdp", store=store, rank=rank, world_size=2)
    if rank == 0:
        with open(out, "w") as f:
            json.dump(torch_rsdp.topology()["handoff"], f)
    dist.destroy_process_group()


def probe_mode() -> dict:
    """The hand-off probe of a fresh 2-rank rsdp group on this machine, now."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "handoff.json")
        mp.spawn(_probe_rank, args=(port, out), nprocs=2, join=True)
        return json.load(open(out))


def one_launch(args, out_dir: str) -> dict:
    """bench_collectives.py at the chosen sizes: rsdp, then each peer as its own launch."""
    cmd = [sys.executable, os.path.join(HERE, "bench_collectives.py"), "--backends", "rsdp",
           "--world-size", str(args.world_size), "--ops", args.op, "--dtypes", "float32",
           "--min-bytes", str(min(args.sizes)), "--max-bytes", str(max(args.sizes)),
           "--out", out_dir, "--no-plot", "--cpu-probes"]
    if args.iters:
        cmd += ["--iters", str(args.iters), "--min-iters", str(args.iters)]
    if args.peers:
        cmd += ["--peers", ",".join(args.peers)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"bench_collectives failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(os.path.join(out_dir, "results.json")) as f:
        res = json.load(f)
    times, stacked = {}, {}
    for row in res["rows"]:
        if row["bytes"] in args.sizes and row["op"] == args.op and row.get("time_us"):
            if row["backend"] == "rsdp@1":
                continue
            times.setdefault(row["backend"], {})[row["bytes"]] = row["time_us"]
            if row["backend"] == "rsdp" and "stacked" in row:
                stacked[row["bytes"]] = row["stacked"]
    return {"times": times, "stacked": stacked,
            "handoff": res["machine"].get("handoff", {}).get("rsdp"),
            "cpu_probes": res["machine"].get("cpu_probes", [])}


def cpu_states(ln: dict, ref_ms: float) -> dict:
    """Each library's CPU state in launch `ln`: from the probes just before and after it."""
    probes = ln["cpu_probes"]  # [[who, probe]]: "torch" (rsdp), each peer, "end"
    states = {}
    for i, (who, p) in enumerate(probes[:-1]):
        pair = {cpu_probe.contended(p, ref_ms), cpu_probe.contended(probes[i + 1][1], ref_ms)}
        state = "changed" if len(pair) > 1 else "contended" if pair.pop() else "clear"
        states["rsdp" if who == "torch" else who] = state
    return states


def spread(values: list[float]) -> float:
    return max(values) / min(values) if values and min(values) > 0 else float("nan")


def summarize(launches: list[dict], sizes: list[int]) -> tuple[str, list[str]]:
    """The per-mode table and the goals' verdicts."""
    backends = sorted({b for ln in launches for b in ln["times"]},
                      key=lambda b: (b != "rsdp", b))
    lines = ["| mode | launches (rsdp) | size | " + " | ".join(
        f"{b} median µs (min–max, spread) [launches]" for b in backends)
        + " | rsdp/mpi per launch (both in the mode) |",
        "|---" * (4 + len(backends)) + "|"]
    verdicts = []

    def mode_of(ln, b):
        return f"{ln['probe']['mode']}/{ln['states'].get(b, '?')}"

    modes = sorted({mode_of(ln, b) for ln in launches for b in ln["times"]})
    def runs(b, size, mode):  # the launches in which b ran `size` in `mode`
        return [ln for ln in launches if size in ln["times"].get(b, {})
                and (mode == "all" or mode_of(ln, b) == mode)]

    for mode in modes + ["all"]:
        for size in sizes:
            cells = []
            for b in backends:
                vals = [ln["times"][b][size] for ln in runs(b, size, mode)]
                cells.append(f"{statistics.median(vals):.1f} ({min(vals):.1f}–{max(vals):.1f}, "
                             f"{spread(vals):.2f}x) [{len(vals)}]" if vals else "–")
            both = [ln for ln in runs("rsdp", size, mode) if ln in runs("mpi", size, mode)]
            ratios = [ln["times"]["rsdp"][size] / ln["times"]["mpi"][size] for ln in both]
            group = runs("rsdp", size, mode)
            ratio = (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"
                     f" [{len(ratios)}]" if ratios else "–")
            lines.append(f"| {mode} | {len(group)} | {fmt_bytes(size)} | " + " | ".join(cells)
                         + f" | {ratio} |")
            if size < FROM_SIZE or not ratios:
                continue
            if mode != "all" and not mode.endswith("/changed"):
                worst = max(ratios)
                verdicts.append(f"{'PASS' if worst <= 1.0 else 'MISS'}  {mode} launches, "
                                f"{fmt_bytes(size)}: rsdp/mpi at most {worst:.2f} (goal <= 1)")
            if mode == "all":
                rs = spread([ln["times"]["rsdp"][size] for ln in runs("rsdp", size, mode)])
                ms = spread([ln["times"]["mpi"][size] for ln in runs("mpi", size, mode)])
                verdicts.append(f"{'PASS' if rs <= ms else 'MISS'}  all launches, "
                                f"{fmt_bytes(size)}: rsdp spread {rs:.2f}x, Open MPI {ms:.2f}x")
    return "\n".join(lines), verdicts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=10, help="rounds (each: probe, rsdp, peers)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--op", default="allreduce",
                   choices=("allreduce", "allgather", "reduce_scatter", "broadcast"))
    p.add_argument("--sizes", default="64K,1M,16M",
                   help="comma-separated; the sweep covers min..max, these are reported")
    p.add_argument("--peers", default="mpi", help="comma-separated peers of bench_collectives "
                   "(empty: rsdp alone)")
    p.add_argument("--iters", type=int, default=ITERS,
                   help="timed iterations at every size, for every library (bench_collectives.py "
                        "--iters and --min-iters); 0: bench_collectives' own scaling (20 for "
                        "small messages down to 5 at 64 MiB), how runs before this option were "
                        "measured")
    p.add_argument("--pause", type=float, default=0.0,
                   help="seconds idle between rounds (lets the host move the vCPUs)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per launch")
    p.add_argument("--out", default=os.path.join(HERE, "results", "launches"))
    args = p.parse_args(argv)
    args.sizes = sorted(parse_size(s) for s in args.sizes.split(","))
    args.peers = [x for x in args.peers.split(",") if x]
    os.makedirs(args.out, exist_ok=True)

    launches = []
    t0 = time.perf_counter()
    for i in range(args.launches):
        probe = probe_mode()
        with tempfile.TemporaryDirectory() as tmp:
            ln = one_launch(args, tmp)
        ln.update(round=i, probe=probe, load1=os.getloadavg()[0])
        own = ln["handoff"] or {}
        print(f"[launch {i + 1}/{args.launches}] hand-off {probe['mode']} (probe: step "
              f"{probe['step_ns']:.0f} ns, pull {probe['pull_gbps']:.1f} GB/s; rsdp's own: "
              f"{own.get('mode', '?')}, stores {own.get('stores', '?')}); CPU probes: "
              + "; ".join(f"{who} {cpu_probe.describe(p)}" for who, p in ln["cpu_probes"])
              + "; " + "; ".join(f"{b} " + " ".join(f"{fmt_bytes(s)} {t:.0f}"
                                             for s, t in sorted(v.items()))
                          for b, v in sorted(ln["times"].items())) + " µs"
              + ("; rsdp's ranks stacked on one CPU after " + ", ".join(
                  f"{fmt_bytes(s)} {100 * f:.0f}%" for s, f in sorted(ln["stacked"].items()))
                 + " of the timed iterations" if any(ln["stacked"].values()) else ""),
              flush=True)
        launches.append(ln)
        if args.pause:
            time.sleep(args.pause)
    ref = cpu_probe.reference_ms([p for ln in launches for _, p in ln["cpu_probes"]])
    for ln in launches:
        ln["states"] = cpu_states(ln, ref)
    table, verdicts = summarize(launches, args.sizes)
    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo")
                if line.startswith("model name")), "?")
    head = (f"# {args.launches} launches, {args.world_size} ranks, {args.op} float32, "
            f"peers {','.join(args.peers) or 'none'}; {cpu}, {os.cpu_count()} CPUs; "
            f"{time.perf_counter() - t0:.0f} s; CPUs contended beyond {cpu_probe.THRESHOLD}x "
            f"the fastest interpreter loop of the run, {ref:.0f} ms")
    text = "\n".join([head, "", table, "", *verdicts])
    print("\n" + text)
    with open(os.path.join(args.out, "launches.md"), "w") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, "launches.json"), "w") as f:
        json.dump({"config": {k: v for k, v in vars(args).items()}, "launches": launches}, f,
                  indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

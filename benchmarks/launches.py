"""The spread of collective times over launches, per launch mode: rsdp against its peers, or
rsdp under several environments against each other (--variants), each round one launch of the
collectives suite per variant, the order rotating. See docs/benchmarks.md, launches.
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

from . import common
from .common import RESULTS, fmt_bytes, parse_sizes

FROM_SIZE = 64 << 10  # the goals hold from 64 KiB (below it a call's fixed cost dominates)
# Timed iterations per size in every launch: a launch's median of the collectives suite's own
# 20 is itself noisy (resampling 200 iterations of one launch put the median of 20 anywhere in
# a 1.04x-1.13x band, the median of 200 within 1.01-1.03x), and over 10 launches that noise
# alone would widen a spread (max/min) by about as much.
ITERS = 200
OP = "allreduce"
TIMEOUT = 900  # seconds per launch


def parse_variants(text: str) -> list[tuple[str, dict]]:
    """'off:A=1;B=2,on:A=3' -> [("off", {"A": "1", "B": "2"}), ("on", {"A": "3"})]; empty ->
    one variant "rsdp" with no change to the environment."""
    variants = []
    for item in (t.strip() for t in text.split(",") if t.strip()):
        name, _, assigns = item.partition(":")
        env = {}
        for a in (s.strip() for s in assigns.split(";") if s.strip()):
            key, eq, value = a.partition("=")
            if not eq or not key:
                raise argparse.ArgumentTypeError(f"variant {name!r}: {a!r} is not VAR=VALUE")
            env[key] = value
        if not name or name in dict(variants):
            raise argparse.ArgumentTypeError(f"variant names must be unique and non-empty: "
                                             f"{text!r}")
        variants.append((name, env))
    return variants or [("rsdp", {})]


def _probe_rank(rank: int, world: int) -> dict:
    import torch_rsdp
    return torch_rsdp.topology().get("handoff", {})


def probe_mode() -> dict:
    """The hand-off probe of a fresh 2-rank rsdp group on this machine, now."""
    return common.run_ranks(_probe_rank, 2, threads=1)


def one_launch(args, out_dir: str, label: str = "rsdp", env: dict | None = None,
               peers=()) -> dict:
    """The collectives suite at the chosen sizes: rsdp (under `env`, reported as `label`),
    then each of `peers`; {library: {size: µs}}."""
    cmd = [sys.executable, "-m", "benchmarks", "collectives", "--backends", "rsdp",
           "--world-size", str(args.world_size), "--ops", OP, "--dtypes", "float32",
           "--min-bytes", str(min(args.sizes)), "--max-bytes", str(max(args.sizes)),
           "--out", out_dir]
    if args.iters:
        cmd += ["--iters", str(args.iters), "--min-iters", str(args.iters)]
    if peers:
        cmd += ["--peers", ",".join(peers)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT,
                          cwd=common.ROOT, env=dict(os.environ, **(env or {})))
    if proc.returncode != 0:
        raise RuntimeError(f"collectives ({label}) failed ({proc.returncode}):\n"
                           f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    with open(os.path.join(out_dir, "results.json")) as f:
        rows = json.load(f)["results"]["rows"]
    times = {}
    for row in rows:  # rsdp@1 is no launch's
        if (row["bytes"] in args.sizes and row["op"] == OP and row.get("time_us")
                and row["backend"] != "rsdp@1"):
            who = label if row["backend"] == "rsdp" else row["backend"]
            times.setdefault(who, {})[row["bytes"]] = row["time_us"]
    return times


def one_round(args, order: list[tuple[str, dict]]) -> dict:
    """One launch per variant in `order`, the peers with the last, a CPU probe before each
    launch and after the last; merged into one record."""
    ln = {"times": {}, "launched": [], "cpu_probes": [common.probe()]}
    for i, (label, env) in enumerate(order):
        peers = args.peers if i == len(order) - 1 else []
        with tempfile.TemporaryDirectory() as tmp:
            ln["times"].update(one_launch(args, tmp, label, env, peers))
        ln["launched"].append([label, *peers])
        ln["cpu_probes"].append(common.probe())
    return ln


def cpu_states(ln: dict, ref_ms: float) -> dict:
    """Each library's CPU state in round `ln`, from the probes just before and after its
    launch."""
    states = {}
    for i, libs in enumerate(ln["launched"]):
        pair = {common.contended(p, ref_ms) for p in ln["cpu_probes"][i:i + 2]}
        state = "changed" if len(pair) > 1 else "contended" if pair.pop() else "clear"
        states.update(dict.fromkeys(libs, state))
    return states


def spread(values: list[float]) -> float:
    return max(values) / min(values) if values and min(values) > 0 else float("nan")


def _ratio_cell(ratios: list[float]) -> str:
    return (f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f}) "
            f"[{len(ratios)}]" if ratios else "–")


def summarize(launches: list[dict], sizes: list[int], variants: list[str] | None = None
              ) -> tuple[str, list[str]]:
    """The per-mode table and the goals' verdicts; `variants` are rsdp's labels, the first the
    reference (default: the one label "rsdp")."""
    variants = variants or ["rsdp"]
    ref = variants[0]
    peers = sorted({b for ln in launches for b in ln["times"]} - set(variants))
    libs = variants + peers
    header = ["mode", f"launches ({ref})", "size"] + [
        f"{b} median µs (min–max, spread) [launches]" for b in libs]
    header += [f"{v}/{ref} per launch" for v in variants[1:]]
    header += [f"{ref}/mpi per launch (both in the mode)"] if "mpi" in peers else []
    rows, verdicts = [], []

    def mode_of(ln, b):
        return f"{ln['probe'].get('mode', '?')}/{ln['states'].get(b, '?')}"

    def runs(b, size, mode):  # the launches in which b ran `size` in `mode`
        return [ln for ln in launches if size in ln["times"].get(b, {})
                and (mode == "all" or mode_of(ln, b) == mode)]

    def ratios(a, b, size, mode):
        both = [ln for ln in runs(a, size, mode) if ln in runs(b, size, mode)]
        return [ln["times"][a][size] / ln["times"][b][size] for ln in both]

    modes = sorted({mode_of(ln, b) for ln in launches for b in ln["times"]})
    for mode in modes + ["all"]:
        for size in sizes:
            label, cells = fmt_bytes(size).replace(" ", "").replace("iB", ""), []
            for b in libs:
                vals = [ln["times"][b][size] for ln in runs(b, size, mode)]
                cells.append(f"{statistics.median(vals):.1f} ({min(vals):.1f}–{max(vals):.1f}, "
                             f"{spread(vals):.2f}x) [{len(vals)}]" if vals else "–")
            cells += [_ratio_cell(ratios(v, ref, size, mode)) for v in variants[1:]]
            vs_mpi = ratios(ref, "mpi", size, mode) if "mpi" in peers else []
            cells += [_ratio_cell(vs_mpi)] if "mpi" in peers else []
            rows.append([mode, len(runs(ref, size, mode)), label] + cells)
            if size < FROM_SIZE or not vs_mpi:
                continue
            if mode != "all" and not mode.endswith("/changed"):
                worst = max(vs_mpi)
                verdicts.append(f"{'PASS' if worst <= 1.0 else 'MISS'}  {mode} launches, "
                                f"{label}: {ref}/mpi at most {worst:.2f} (goal <= 1)")
            if mode == "all":
                rs = spread([ln["times"][ref][size] for ln in runs(ref, size, mode)])
                ms = spread([ln["times"]["mpi"][size] for ln in runs("mpi", size, mode)])
                verdicts.append(f"{'PASS' if rs <= ms else 'MISS'}  all launches, "
                                f"{label}: {ref} spread {rs:.2f}x, Open MPI {ms:.2f}x")
    return common.md_table(header, rows, "llr" + "r" * (len(header) - 3)), verdicts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks launches", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--launches", type=int, default=10, help="rounds (each: probe, rsdp, peers)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--sizes", type=parse_sizes, default=parse_sizes("64K,1M,16M"),
                   help="comma-separated; the sweep covers min..max, these are reported")
    p.add_argument("--peers", default="mpi", help="comma-separated peers of the collectives "
                   "suite (empty: rsdp alone)")
    p.add_argument("--variants", type=parse_variants, default=parse_variants(""),
                   metavar="NAME:VAR=VAL[;VAR=VAL],...",
                   help="rsdp under each environment, alternating launches; the first is the "
                        "reference of the ratios (default: rsdp as the environment has it)")
    p.add_argument("--iters", type=int, default=ITERS,
                   help="timed iterations at every size, for every library (collectives "
                        "--iters and --min-iters); 0: the collectives suite's own scaling")
    p.add_argument("--out", default=RESULTS)
    p.add_argument("--name", default="launches", help="result file stem")
    args = p.parse_args(argv)
    args.sizes = sorted(args.sizes)
    args.peers = [x for x in args.peers.split(",") if x]
    names = [name for name, _ in args.variants]

    launches = []
    t0 = time.perf_counter()
    for i in range(args.launches):
        probe = probe_mode()
        k = i % len(args.variants)
        ln = one_round(args, args.variants[k:] + args.variants[:k])
        ln.update(round=i, probe=probe, load1=os.getloadavg()[0])
        print(f"[launch {i + 1}/{args.launches}] hand-off {probe.get('mode', '?')} (step "
              f"{probe.get('step_ns', float('nan')):.0f} ns, pull "
              f"{probe.get('pull_gbps', float('nan')):.1f} GB/s); CPU probes: "
              + "; ".join(common.describe(p) for p in ln["cpu_probes"])
              + "; " + "; ".join(f"{b} " + " ".join(f"{fmt_bytes(s)} {t:.0f}"
                                             for s, t in sorted(v.items()))
                          for b, v in sorted(ln["times"].items())) + " µs", flush=True)
        launches.append(ln)
    ref = common.reference_ms([p for ln in launches for p in ln["cpu_probes"]])
    for ln in launches:
        ln["states"] = cpu_states(ln, ref)
    table, verdicts = summarize(launches, args.sizes, names)
    variants = "; ".join(f"{n}: " + (" ".join(f"{k}={v}" for k, v in env.items()) or "as is")
                         for n, env in args.variants)
    head = (f"{args.launches} launches, {args.world_size} ranks, {OP} float32, peers "
            f"{','.join(args.peers) or 'none'}, variants {variants}; "
            f"{time.perf_counter() - t0:.0f} s; CPUs contended beyond {common.THRESHOLD}x the "
            f"fastest interpreter loop of the run, {ref:.0f} ms")
    text = "\n".join([head, "", table, "", *verdicts])
    print("\n" + text)
    common.write_result(args.out, args.name, {"variants": dict(args.variants),
                                              "launches": launches, "verdicts": verdicts},
                        text, argv)
    return 0

"""A guard against performance regressions, short enough for every CI run (about 15 s; another
run, up to three, only when one misses a floor).

It runs ``benchmarks/bench_rsdp_fsdp2.py --quick``: RSDP and FSDP2 train the same Hugging Face
Llama (4.2 M parameters, activations dominate) on 2 ranks, taking turns step by step in the
same processes, and a 4 MiB all-reduce is timed over rsdp and gloo in the same processes. Only
ratios measured in one run are checked, against floors well below what the benchmark measures
(docs/benchmarks.md, "RSDP against FSDP2": the quick mode's spread over repeated runs on a busy
2-core machine), so that noise passes and a change that halves a headline ratio fails:

* RSDP's throughput >= ``RSDP_FLOOR`` x FSDP2's (measured 0.93-1.10 in quick mode);
* rsdp's all-reduce >= ``ALLREDUCE_FLOOR`` x as fast as gloo's (measured 5.5-13x).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RSDP_FLOOR = 0.6
ALLREDUCE_FLOOR = 3.0


def _measure(out_dir):
    """One run of the quick benchmark: (its results, its output)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "bench_rsdp_fsdp2.py"), "--quick",
           "--out", str(out_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    (res,) = json.load(open(out_dir / "rsdp_fsdp2.json"))["results"]
    rows = res["rows"]
    # the two ran the same math from the same weights
    assert abs(rows["rsdp"]["final_loss"] - rows["fsdp2"]["final_loss"]) < 1e-3, out[-2000:]
    return res, out


def _cpu_ticks():
    """{pid: (user + system clock ticks, command line)} of every process now."""
    from support import leftovers
    out = {}
    for pid in leftovers.pids():
        try:
            p = leftovers.proc(pid)
        except (OSError, IndexError, ValueError):  # gone meanwhile
            continue
        out[pid] = (p["cpu"], p["cmd"][:140])
    return out


def _busiest_processes(n=6, seconds=1.0):
    """The processes that used the most CPU over the next second, for a failure's message: on
    a 2-core machine another job beside the guard (or a process a test left running) is the
    usual cause of a missed floor."""
    import time
    before = _cpu_ticks()
    time.sleep(seconds)
    after = _cpu_ticks()
    hz = os.sysconf("SC_CLK_TCK")
    busy = sorted(((t - before[p][0], p, cmd) for p, (t, cmd) in after.items() if p in before),
                  reverse=True)[:n]
    return "\n".join(f"  {100 * d / hz / seconds:5.0f}% pid {p}: {cmd}" for d, p, cmd in busy)


def test_rsdp_and_allreduce_keep_their_ratios(tmp_path):
    """Best of up to three runs: a neighbour's burst on a 2-core machine can stall the
    timings of a whole run (once a 4 MiB all-reduce measured 2.7 ms instead of well under
    1 ms; once 3.6-4.2 ms in two runs in a row), while a regression that halves a ratio
    shows in every run. A failure names the busiest processes of the machine."""
    pytest.importorskip("transformers")
    runs = []
    for i in range(3):
        res, _ = _measure(tmp_path / str(i))
        runs.append(res)
        if (res["rows"]["rsdp"]["quiet"]["x_fsdp2"] >= RSDP_FLOOR
                and res["allreduce"]["speedup"] >= ALLREDUCE_FLOOR):
            break
    best = max(runs, key=lambda r: r["rows"]["rsdp"]["quiet"]["x_fsdp2"])
    ratio, rows = best["rows"]["rsdp"]["quiet"]["x_fsdp2"], best["rows"]
    fastest = max(runs, key=lambda r: r["allreduce"]["speedup"])
    speedup = fastest["allreduce"]["speedup"]
    assert ratio >= RSDP_FLOOR, (
        f"RSDP's throughput is {ratio:.2f}x FSDP2's (floor {RSDP_FLOOR}) in the better of "
        f"{len(runs)} runs; steps (s): rsdp {rows['rsdp']['quiet']['steps']}, fsdp2 "
        f"{rows['fsdp2']['quiet']['steps']}; busiest processes:\n{_busiest_processes()}")
    assert speedup >= ALLREDUCE_FLOOR, (
        f"rsdp's 4 MiB all-reduce is {speedup:.1f}x gloo's (floor {ALLREDUCE_FLOOR}) in the "
        f"better of {len(runs)} runs: {[r['allreduce'] for r in runs]}; busiest processes:\n"
        f"{_busiest_processes()}")

"""A guard against performance regressions, short enough for every CI run (about 40 s).

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


def test_rsdp_and_allreduce_keep_their_ratios(tmp_path):
    pytest.importorskip("transformers")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "bench_rsdp_fsdp2.py"), "--quick",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    doc = json.load(open(tmp_path / "rsdp_fsdp2.json"))
    (res,) = doc["results"]
    rows = res["rows"]
    ratio = rows["rsdp"]["quiet"]["x_fsdp2"]
    speedup = res["allreduce"]["speedup"]
    # the two ran the same math from the same weights
    assert abs(rows["rsdp"]["final_loss"] - rows["fsdp2"]["final_loss"]) < 1e-3, out[-2000:]
    assert ratio >= RSDP_FLOOR, (
        f"RSDP's throughput is {ratio:.2f}x FSDP2's (floor {RSDP_FLOOR}); steps (s): rsdp "
        f"{rows['rsdp']['quiet']['steps']}, fsdp2 {rows['fsdp2']['quiet']['steps']}")
    assert speedup >= ALLREDUCE_FLOOR, (
        f"rsdp's 4 MiB all-reduce is {speedup:.1f}x gloo's (floor {ALLREDUCE_FLOOR}): "
        f"{res['allreduce']}")

"""``python -m benchmarks finetune --shapes tiny`` runs as a user runs it and reports what it
claims to measure (about 30 s).

A tiny Llama is written with ``save_pretrained``, then built on ``meta``, wrapped with peft's
LoRA, sharded by RSDP and by FSDP2, materialised and loaded by every rank from that checkpoint,
and trained with and without activation checkpointing, taking turns. Checked: both loaded the
same model (first losses agree to bf16's precision) and every figure the table shows is a
positive finite number measured in this run; how the two compare is the benchmark's to report.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_tiny_benchmark_loads_one_model_and_reports_its_figures(tmp_path):
    pytest.importorskip("peft")
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "benchmarks", "finetune", "--shapes", "tiny", "--steps", "1",
           "--seq", "32", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "beyond / FSDP2's" in (tmp_path / "finetune.md").read_text()
    result = json.load(open(tmp_path / "finetune.json"))
    assert result["command"].startswith("python -m benchmarks finetune --shapes tiny")
    assert result["machine"]["vcpus"] >= 1 and result["commit"]
    runs = result["results"]["tiny"]["runs"]
    assert set(runs) == {"rsdp", "rsdp+ckpt", "rsdp-units", "rsdp-units+ckpt", "fsdp2",
                         "fsdp2+ckpt"}
    for kind in ("rsdp", "rsdp-units"):
        assert abs(runs[kind]["loss_first"] - runs["fsdp2"]["loss_first"]) < 2e-2, runs
    for name, r in runs.items():
        for key in ("resident", "beyond", "load_peak", "step_s", "sent"):
            assert math.isfinite(r[key]) and r[key] > 0, (name, key, r)

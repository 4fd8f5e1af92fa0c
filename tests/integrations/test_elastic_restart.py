"""The fine-tuning example under ``torchrun --max-restarts``: a rank SIGKILLed mid-run, the job
restarted, resumed from its newest complete checkpoint, ends with the weights of a run that
never stopped (examples/finetune_chess.py --checkpoint-dir, examples/training_checkpoints.py)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SMALL = ["--steps", "7", "--layers", "2", "--d-model", "64", "--ffn", "128", "--heads", "2",
         "--kv-heads", "1", "--seq-len", "32", "--batch-size-per-device", "2",
         "--gradient-accumulation-steps", "2", "--eval-prompts", "0", "--no-memory",
         "--log-every", "1", "--timeout", "60"]
#: a mix: rotate, FSDP2, operator splitting and ZeRO-1 in one model
PLAN = {"mapping": {"model.embed_tokens": "rotate", "model.layers.0": "full_shard",
                    "model.layers.1": "split:2", "model.norm": "shard_optim"},
        "default": "no_shard"}


def _torchrun(tmp_path, name, *extra, restarts=0):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", "--max-restarts", str(restarts), os.path.join(ROOT, "examples",
                                                              "finetune_chess.py"),
           *SMALL, "--strategy", "plan", "--plan", str(tmp_path / "plan.json"),
           "--save", str(tmp_path / f"{name}.pt"), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env,
                          cwd=str(tmp_path))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_killed_and_restarted_run_ends_like_one_that_never_stopped(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps(PLAN))
    ckpt = tmp_path / "ckpt"
    out = _torchrun(tmp_path, "resumed", "--checkpoint-dir", str(ckpt), "--checkpoint-every",
                    "2", "--fail-at-step", "5", restarts=1)
    assert "resumed from" in out and "step-000004" in out, out[-3000:]
    _torchrun(tmp_path, "straight")
    a = torch.load(tmp_path / "resumed.pt")
    b = torch.load(tmp_path / "straight.pt")
    assert a.keys() == b.keys()
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    assert diff <= 1e-6, f"the restarted run differs from the uninterrupted one by {diff}"
    # nothing half-written is left for the next attempt: only complete checkpoints, the newest
    left = sorted(os.listdir(ckpt))
    assert left == ["step-000004", "step-000006"], left
    assert all((ckpt / d / "COMPLETE").exists() for d in left)

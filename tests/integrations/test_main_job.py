"""The main job's comparison (examples/finetune_chess.py --compare), shortened: two runs on 2
ranks from the same weights on the same batches, taking turns step by step, agree, progress
lines and the table are printed, and the JSON and both plots are written with every figure the
table shows. Then its fine-tuning phase (examples/finetune_lora.py), shortened, on the model
the comparison saved: LoRA under RSDP and FSDP2 from that checkpoint, built on meta."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_compare_writes_table_json_and_plots(tmp_path):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               RSDP_PLAN_CACHE=str(tmp_path / "cache"))
    cmd = [sys.executable, os.path.join(ROOT, "examples", "finetune_chess.py"), "--compare",
           "--nproc", "2", "--runs", "rsdp:rsdp,plan=auto:rsdp", "--steps", "6",
           "--log-every", "2", "--eval-prompts", "11", "--timeout", "120",
           "--out", str(tmp_path / "out"), "--save-pretrained", str(tmp_path / "pretrained")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "step    6/6" in out and "s left" in out, out[-4000:]
    assert "checked in place" in out and "<- kept" in out, out[-4000:]
    assert "| run " in out and "legal moves (opening/middle/end)" in out, out[-4000:]
    doc = json.load(open(tmp_path / "out" / "chess.json"))
    assert doc["runs"] == ["rsdp:rsdp", "plan=auto:rsdp"] and doc["world_size"] == 2
    # the runs took turns ([Note: runs take turns]): the plan's step 3 came between RSDP's
    # steps 3 and 5, each run timed by its own steps
    assert doc["runs_took_turns"] is True
    order = [out.index(f"[{r}] step    {i}/6") for r, i in
             (("rsdp:rsdp", 3), ("plan=auto:rsdp", 3), ("rsdp:rsdp", 5))]
    assert order == sorted(order), out[-4000:]
    a, b = doc["results"]
    for r in (a, b):
        assert r["steps"] == 6 and len(r["losses"]) >= 3 and r["tokens_per_s"] > 0
        # torch's MemTracker categories at the peak, which they add up to
        bd = r["mem_breakdown_bytes"]
        assert set(bd) == {"params", "buffers", "grads", "optim", "activations", "temp", "other"}
        assert bd["params"] > 0 and r["mem_peak_bytes"] == sum(bd.values()), r
        assert r["legal_move_prompts"] == 22 and 0 <= r["legal_move_rate"] <= 1
        assert len(r["legal_move_rate_by_third"]) == 3
        assert r["sample_completion"]["moves"]
    # same weights, same batches: the strategies train alike
    assert abs(a["final_loss"] - b["final_loss"]) < 1e-3, (a["final_loss"], b["final_loss"])
    for name in ("chess_loss.png", "chess_memory.png"):
        assert (tmp_path / "out" / name).stat().st_size > 1000
    _finetune_lora(tmp_path / "pretrained", tmp_path / "lora", env)


def _finetune_lora(pretrained, out_dir, env):
    """The fine-tuning phase on the saved model: both strategies load the same checkpoint
    (same held-out loss before training, to float precision), train the adapters only, and
    report memory, speed and the learning check."""
    assert (pretrained / "config.json").is_file()
    cmd = [sys.executable, os.path.join(ROOT, "examples", "finetune_lora.py"), "--pretrained",
           str(pretrained), "--nproc", "2", "--steps", "6", "--log-every", "3",
           "--eval-prompts", "4", "--out", str(out_dir)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "| run " in out and "legal next moves" in out, out[-4000:]
    rsdp, fsdp2 = json.load(open(out_dir / "lora.json"))["results"]
    assert (rsdp["strategy"], fsdp2["strategy"]) == ("rsdp", "fsdp2")
    assert abs(rsdp["loss_before"] - fsdp2["loss_before"]) < 1e-4, (rsdp, fsdp2)
    for r in (rsdp, fsdp2):
        assert 0 < r["trainable"] < 0.2 * r["resident"] / 4, r  # adapters only: a few percent
        assert r["resident"] > 0 and r["beyond"] > 0 and r["tokens_per_s"] > 0, r
        assert r["loss_after"] < r["loss_before"], r  # the adapters learnt something


def test_weights_preset_shows_rsdp_memory_below_fsdp2_and_ddp(tmp_path):
    """``--compare --preset weights`` (the main job's second comparison), shortened: the wider
    model where weights dominate; RSDP's peak per rank is below FSDP2's and DDP's, and the three
    train alike."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.join(ROOT, "examples", "finetune_chess.py"), "--compare",
           "--preset", "weights", "--nproc", "2", "--steps", "4", "--log-every", "2",
           "--eval-prompts", "4", "--timeout", "120", "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    doc = json.load(open(tmp_path / "out" / "chess.json"))
    assert doc["runs"] == ["rsdp:rsdp", "fsdp2:rsdp", "ddp:rsdp"]
    assert "--preset weights" in doc["title"]
    rsdp, fsdp2, ddp = doc["results"]
    peak = {r["strategy"]: r["mem_peak_bytes"] for r in doc["results"]}
    assert peak["rsdp"] < 0.85 * peak["fsdp2"] and peak["rsdp"] < 0.6 * peak["ddp"], peak
    for r in (rsdp, fsdp2, ddp):
        assert r["params"] > 15e6 and r["legal_move_prompts"] == 8
        bd = r["mem_breakdown_bytes"]
        # weights, gradients and optimizer state dominate
        assert bd["params"] + bd["grads"] + bd["optim"] > 3 * bd["activations"], bd
    assert abs(rsdp["final_loss"] - ddp["final_loss"]) < 1e-3
    assert abs(fsdp2["final_loss"] - ddp["final_loss"]) < 1e-3

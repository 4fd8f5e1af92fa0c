"""examples/torchft_train.py end to end: torchft's Manager and lighthouse over rsdp, a replica
group (one rank of it, or its whole node) SIGKILLed mid-run and restarted, healed from a live
replica.

Each case runs the example's one command (lighthouse, stores and every rank of every replica
group started by it; ports chosen by the OS) with a small model, and reads the summary it
writes: the killed group was restarted and the others never were (a survivor that crashed on
the failed all-reduce would have been), the restarted group joined at the step the survivors
had reached (healed from one of them, not from its fresh initialisation), right after the heal
its model and optimizer state equal a live replica's bit for bit, its first loss is the
survivors' (not the initial loss), every loss is finite, every group's committed steps are
contiguous (the survivors' from 0 to the end: no committed step lost), and every replica group
ends with the same weights (exactly: they apply the same averaged gradients to the same state).
No timing is asserted. Plus the comm hook of ``torch_rsdp.torchft.DistributedDataParallel`` on
a failed all-reduce, without processes.

Skipped without torchft.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

pytest.importorskip("torchft")

import torch  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "torchft_train.py")
SMALL = ["--dim", "64", "--layers", "2", "--seq", "32", "--batch", "8", "--lr", "1e-2",
         "--steps", "16", "--kill-at-step", "5", "--log-every", "50", "--deadline", "150"]


def _run(tmp_path, *extra):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    proc = subprocess.run([sys.executable, EXAMPLE, *SMALL, "--out", str(out), *extra],
                          capture_output=True, text=True, timeout=200, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    with open(out / "summary.json") as f:
        return json.load(f), proc.stdout


def _check_healed(summary, stdout, groups: int, killed: int):
    rec = summary["recovery"]
    assert rec is not None, stdout
    # only the killed group was restarted: the survivors lived through the failed step
    assert summary["attempts"] == {str(g): int(g == killed) for g in range(groups)}, stdout
    assert rec["killed_group"] == killed
    # it joined where the survivors were and healed from them
    assert rec["healed_at_step"] > rec["kill_at_step"], rec
    assert rec["first_step"] == rec["healed_at_step"], rec
    curves = {int(g): {int(s): v for s, v in d.items()} for g, d in summary["curves"].items()}
    assert all(math.isfinite(v) for d in curves.values() for v in d.values()), curves
    gap = [s for s in curves[killed] if rec["kill_at_step"] <= s < rec["first_step"]]
    assert gap == [], f"the killed group committed steps {gap} while it was away"
    # what it healed to is what the live replicas hold, weights and optimizer state alike
    heal = summary["heal_check"]
    assert heal["step"] == rec["healed_at_step"], heal
    assert heal["against_groups"] == [g for g in range(groups) if g != killed], heal
    assert heal["model_tensors"] > 0 and heal["optim_tensors"] > 0, heal
    assert heal["bitwise_equal"] and heal["max_abs_diff"] == 0.0, heal
    # no committed step lost: the survivors committed every step once, in order
    assert summary["continuity"]["no_step_lost"], summary["continuity"]
    # the loss curve continues: the restarted group's first loss is the survivors' level,
    # well below where training started
    first, surv, init = (rec["restarted_first_loss"], rec["survivors_loss_at_first_step"],
                         rec["initial_loss"])
    assert first < 0.6 * init, rec
    assert abs(first - surv) < 0.3 * surv, rec
    for d in curves.values():  # and it fell for everyone
        assert d[max(d)] < 0.6 * d[min(d)], curves
    # every replica group took the last step and ends with the same weights
    last = summary["final_step"] - 1
    assert all(last in curves[g] for g in range(groups)), (last, curves)
    assert summary["final_step"] >= 16
    assert summary["max_abs_diff"] == 0.0, summary["max_abs_diff"]
    assert "max abs difference 0" in stdout


def test_ddp_replica_killed_heals(tmp_path):
    """torchft DDP, 3 replica groups x 1 rank: replica group 1 SIGKILLed mid-step."""
    summary, stdout = _run(tmp_path, "--mode", "ddp")
    _check_healed(summary, stdout, groups=3, killed=1)


def test_hsdp_node_killed_heals(tmp_path):
    """Replica groups = nodes: FSDP2 inside 2 replica groups x 2 ranks, each group an emulated
    node (RSDP_NODE_ID: shared memory inside, UCX between groups), ProcessGroupRSDP across
    them. Every rank of replica group 0 SIGKILLed at once mid-step; the other group goes on
    without a restart, the node is started again and heals shard by shard (rank r from rank r
    of the live group)."""
    summary, stdout = _run(tmp_path, "--mode", "hsdp", "--kill-group", "0", "--kill-node")
    _check_healed(summary, stdout, groups=2, killed=0)
    rec = summary["recovery"]
    assert rec["kill_node"] and rec["killed_ranks"] == [0, 1], rec
    assert summary["nodes"].startswith("RSDP_NODE_ID"), summary["nodes"]


class _FailingWork(torch.distributed._Work):
    def wait(self, timeout=None):
        raise RuntimeError("rsdp rank 0: rank 1 (pid 1) exited during allreduce")


class _Bucket:
    def __init__(self, t):
        self.t = t

    def buffer(self):
        return self.t


class _Manager:
    """The part of torchft's Manager its managed work and DDP hook use."""

    def __init__(self, errored: bool = False):
        import logging

        self._logger = logging.getLogger("test_torchft_train")
        self.error = RuntimeError("earlier") if errored else None

    def report_error(self, e):
        self.error = e

    def allreduce(self, tensor):
        from torchft.manager import _ManagedWork
        from torchft.work import _DummyWork

        if self.error is not None:  # what the Manager does once a step has failed
            return _DummyWork(tensor)
        work = _ManagedWork(self, _FailingWork(), tensor)
        work.get_future().then(lambda fut: tensor)  # the Manager's averaging callback
        return work


@pytest.mark.parametrize("errored", [False, True], ids=["fails_now", "failed_before"])
def test_ddp_hook_survives_failed_allreduce(errored):
    """An all-reduce whose wait() raises (a replica died in it) or the Manager's no-op work
    after an earlier failure: the hook hands the bucket back and the Manager holds the error
    (so should_commit() is False), where torchft 0.2.0's own hook raises out of backward()."""
    from torch_rsdp.torchft import DistributedDataParallel

    manager = _Manager(errored)
    bucket = _Bucket(torch.arange(4.0))
    fut = DistributedDataParallel._comm_hook(manager, bucket)
    assert fut.done()
    assert torch.equal(fut.value(), torch.arange(4.0))
    assert manager.error is not None
    if not errored:
        assert "exited during allreduce" in str(manager.error)

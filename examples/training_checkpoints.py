"""Periodic checkpoints, and resuming from the newest complete one, for the examples.

    ckpt = TrainingCheckpoints("/ckpt", every=10)
    start = ckpt.resume(model, opt, sched)           # 0 when there is nothing to resume
    for step in range(start, steps):
        ...
        ckpt.maybe_save(step + 1, model, opt, sched)

Each checkpoint is ``torch.distributed.checkpoint``'s, taken with ``get_state_dict`` (every
rank writes its own shards; a planned model's, an ``rsdp.shard`` model's, FSDP2's or DDP's)
in ``DIR/step-000010/``, with the optimizer, the learning-rate schedule, the step (the data
position: the examples' batches are a function of the step), every rank's RNG state and, for
a planned model whose gradients cross nodes compressed, every rank's error-feedback residuals
(:func:`torch_rsdp.plan.feedback_state_dict`).

[Note: complete checkpoints]
A job may die while it writes a checkpoint. DCP writes ``.metadata`` last, once every rank's
files are written; then rank 0 writes ``COMPLETE`` (by rename, so it exists whole or not at
all). Resuming takes the newest directory with ``COMPLETE`` and checks its files
(:class:`torch_rsdp.plan.CheckpointReader`); a directory without it is removed, as are
complete ones beyond the newest ``keep``. So a restart (``torchrun --max-restarts``, a Slurm
requeue) finds nothing half-written, and the run ends with the weights of a run that never
stopped.
"""
from __future__ import annotations

import os
import re
import shutil
from typing import Optional

import torch
import torch.distributed as dist

__all__ = ["TrainingCheckpoints"]

COMPLETE = "COMPLETE"
_DIR = re.compile(r"^step-(\d{6,})$")


class TrainingCheckpoints:
    """Checkpoints every ``every`` steps under ``directory`` (all ranks call every method).

    Args:
        directory: where checkpoints go (shared by every rank).
        every: steps between checkpoints (0: only :meth:`resume`).
        keep: complete checkpoints kept (the newest).
        log: a ``print``-like function (rank 0's).
    """

    def __init__(self, directory: str, every: int, keep: int = 2, log=print):
        self.directory, self.every, self.keep, self.log = directory, every, max(1, keep), log
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        if self.rank == 0:
            os.makedirs(directory, exist_ok=True)
        dist.barrier()

    # ------------------------------------------------------------------------------ state
    def _state(self, model, opt, sched, step: int, rng: bool = True) -> dict:
        from torch.distributed.checkpoint.state_dict import get_state_dict
        msd, osd = get_state_dict(model, opt)
        state = {"model": msd, "optim": osd,
                 "train": {"step": step, "world": self.world, "sched": sched.state_dict()}}
        if rng:
            state["rng"] = {f"rank{self.rank}": torch.get_rng_state()}
        if getattr(model, "_rsdp_plan", None) is not None:  # compressed units' residuals
            import torch_rsdp.plan as plan
            state["feedback"] = plan.feedback_state_dict(model)
        return state

    def maybe_save(self, step: int, model, opt, sched) -> None:
        """Saves after ``step`` optimizer steps if ``step`` is a multiple of ``every``."""
        if self.every and step % self.every == 0:
            self.save(step, model, opt, sched)

    def save(self, step: int, model, opt, sched) -> str:
        import torch.distributed.checkpoint as dcp
        path = os.path.join(self.directory, f"step-{step:06d}")
        dcp.save(self._state(model, opt, sched, step), checkpoint_id=path)
        dist.barrier()  # every rank's save returned: .metadata is written
        if self.rank == 0:
            tmp = os.path.join(path, COMPLETE + ".tmp")
            with open(tmp, "w") as f:
                f.write(f"{step}\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, os.path.join(path, COMPLETE))
            self._prune()
            self.log(f"checkpoint: step {step} -> {path}", flush=True)
        dist.barrier()
        return path

    # ---------------------------------------------------------------------------- resume
    def _complete(self):
        """(step, path) of the complete checkpoints, oldest first."""
        out = []
        for name in os.listdir(self.directory):
            m = _DIR.match(name)
            path = os.path.join(self.directory, name)
            if m and os.path.exists(os.path.join(path, COMPLETE)):
                out.append((int(m.group(1)), path))
        return sorted(out)

    def _prune(self) -> None:
        """Rank 0: removes incomplete checkpoints and complete ones beyond ``keep``."""
        complete = {p for _, p in self._complete()}
        for name in os.listdir(self.directory):
            path = os.path.join(self.directory, name)
            if _DIR.match(name) and path not in complete:
                shutil.rmtree(path, ignore_errors=True)
        for _, path in self._complete()[:-self.keep]:
            shutil.rmtree(path, ignore_errors=True)

    def latest(self) -> Optional[str]:
        """The newest complete checkpoint (rank 0 decides, every rank learns it)."""
        box = [None]
        if self.rank == 0:
            self._prune()  # what a killed run left half-written
            found = self._complete()
            box[0] = found[-1][1] if found else None
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def resume(self, model, opt, sched) -> int:
        """Loads the newest complete checkpoint into ``model``, ``opt`` and ``sched`` (any
        plan, any world size) and returns its step; 0 if there is none."""
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import set_state_dict
        import torch_rsdp.plan as plan
        path = self.latest()
        if path is None:
            return 0
        reader = plan.CheckpointReader(path)
        # the RNG states come back when the job had as many ranks (one state per rank)
        saved = reader.read_metadata().state_dict_metadata
        same_world = sum(k.startswith("rng.rank") for k in saved) == self.world
        state = self._state(model, opt, sched, 0, rng=same_world)
        if "feedback" in state:  # this layout's residuals, if the checkpoint has them
            state["feedback"] = plan.feedback_state_dict(model, reader.read_metadata(),
                                                         "feedback")
        dcp.load(state, storage_reader=reader)
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        if "feedback" in state:
            note = plan.set_feedback_state_dict(model, state["feedback"])
            if note:
                self.log(note, flush=True)
        sched.load_state_dict(state["train"]["sched"])
        if same_world:
            torch.set_rng_state(state["rng"][f"rank{self.rank}"])
        step = int(state["train"]["step"])
        self.log(f"resumed from {path}: step {step} (saved by {state['train']['world']} "
                 f"ranks, now {self.world})", flush=True)
        return step

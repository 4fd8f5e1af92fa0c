"""The planner's last step: race its pick against the best uniform plans, measured in place.

The cost model prices each unit from measurements of that unit alone; a whole step can still
come out slower than predicted (overlap the model does not see, the allocator, the cores
shared differently), and its memory model errs by some percent both ways. So after its
search, :func:`~torch_rsdp.plan.auto` trains a few steps of its pick and of the
fastest-predicted uniform plans (``Plan.uniform``: a unit per block and one for the rest, as
users apply FSDP2) that fit the budget or miss it by less than the memory model's error, each
on a copy of the model, measures each one's peak memory as torch does
(``MemTracker``, one more step), and keeps the fastest whose measured peak fits. A mix must be
measurably faster: a uniform plan wins a tie, and two plans tie when they are closer than
``auto.RACE_TIE`` or than the spread of either one's own timed steps (this machine's noise,
measured in the race itself). So its plan is never slower than the best fitting uniform plan
by more than the noise of a few steps.

Each candidate: the model copied, the plan applied (as :func:`~torch_rsdp.plan.apply`
does, communication included), the optimizer of the planner's rule built as a user builds it
(``cls(model.parameters())``: ZeRO-1 attaches itself at the first step, :mod:`.._optim`), one
warm-up step, then ``steps`` timed steps (forward, backward, optimizer step;
with ``accumulation`` micro-batches under ``plan.no_sync`` but the last; the loss is the
model's own where it returns one, else the sum of its outputs), then one step under
torch's ``MemTracker`` (every tensor torch allocates). Every step starts after a barrier and
counts at the slowest rank; the peak is the largest rank's. Candidates take turns over
``rounds`` rounds, so a slow spell of a shared machine touches each alike; one copy is alive
at a time, so the check needs the model once more, sharded by the plan being timed.
"""
from __future__ import annotations

import contextlib
import copy
import gc
import statistics
import time
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils._pytree import tree_flatten

from .._accumulate import no_sync
from .._apply import apply
from .._feedback_state import feedback_state_dict
from .profile import _as_args, _clone_inputs

__all__ = ["PlanCheck", "measure_plans", "OPTIMIZERS"]

#: The optimizer class (and its extra arguments) timed for each state rule.
OPTIMIZERS = {"adamw": (torch.optim.AdamW, {}), "adam": (torch.optim.Adam, {}),
              "sgd": (torch.optim.SGD, {}), "sgd_momentum": (torch.optim.SGD, {"momentum": 0.9}),
              "adagrad": (torch.optim.Adagrad, {}), "rmsprop": (torch.optim.RMSprop, {})}


@dataclass
class PlanCheck:
    """One candidate of the in-place check: what was predicted and what was measured."""
    label: str                # "planned" or "uniform <strategy>"
    predicted_s: float        # the cost model's step time (x accumulation)
    predicted_peak_bytes: int
    measured_s: float = float("nan")   # median step, slowest rank
    measured_peak_bytes: int = 0       # MemTracker over one step, largest rank
    kept: bool = False
    #: The spread of its timed steps relative to their median, the slowest one left out (a
    #: single hiccup is not noise the plans share): how far apart two runs of one plan land.
    measured_spread: float = 0.0


def _loss_of(out):
    """The model's own loss where it returns one (a Hugging Face model given labels), else
    the sum of its outputs: a scalar whose backward costs what a loss's would (a sum's
    gradient is a broadcast view, not one more output-sized tensor)."""
    loss = getattr(out, "loss", None)
    if isinstance(loss, torch.Tensor) and loss.requires_grad:
        return loss
    outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad
            and t.is_floating_point()]
    return sum(t.float().sum() for t in outs) if outs else None


def _step(model, args, kwargs, opt, accumulation: int) -> None:
    for micro in range(accumulation):
        a, k = _clone_inputs(args, kwargs)
        with no_sync(model) if micro < accumulation - 1 else contextlib.nullcontext():
            out = model(*a, **k)
            loss = _loss_of(out)
            if loss is not None:
                loss.backward()
        del out, loss
    opt.step()
    opt.zero_grad(set_to_none=True)


def _time_one(model: nn.Module, plan, args, kwargs, group, optimizer: str, steps: int,
              accumulation: int, memory: bool) -> Tuple[List[float], int]:
    cls, extra = OPTIMIZERS[optimizer]
    trial = apply(copy.deepcopy(model), plan, group=group, sync_module_states=False)
    # the user's own optimizer (what trainers build); the copy's values do not matter
    opt = cls(trial.parameters(), lr=1e-12, **extra)
    times = []
    for i in range(steps + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        _step(trial, args, kwargs, opt, accumulation)
        if i:  # the first step warms up (allocations, optimizer state)
            times.append(time.perf_counter() - t0)
    peak = 0
    if memory:
        # torch's MemTracker takes seconds to import: only when a race measures memory
        from torch.distributed._tools.mem_tracker import MemTracker
        mt = MemTracker()
        # error-feedback residuals: held all along, made outside the tracked step
        mt.track_external(trial, opt, *feedback_state_dict(trial).values())
        with mt:
            _step(trial, args, kwargs, opt, accumulation)
        peak = max(v.get("Total", 0) for v in mt.get_tracker_snapshot("peak").values())
    del trial, opt
    gc.collect()
    return times, peak


def measure_plans(model: nn.Module, example_inputs, plans: Sequence, *, group, optimizer: str,
                  steps: int = 3, rounds: int = 2, accumulation: int = 1
                  ) -> List[Tuple[float, int, float]]:
    """(median step seconds at the slowest rank, peak bytes at the largest rank, spread of
    the steps: :attr:`PlanCheck.measured_spread`) of each of ``plans`` applied to a copy of
    ``model``. Collective: every rank of ``group`` calls it with the same plans."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"torch_rsdp.plan.auto: no optimizer to time for rule {optimizer!r}")
    args, kwargs = _as_args(example_inputs)
    per_round = max(1, -(-steps // rounds))
    times: Dict[int, List[float]] = {i: [] for i in range(len(plans))}
    peaks = [0] * len(plans)
    order = list(range(len(plans)))
    for rd in range(rounds):  # each round starts one candidate later
        for i in order[rd % len(order):] + order[:rd % len(order)]:
            t, peak = _time_one(model, plans[i], args, kwargs, group, optimizer, per_round,
                                accumulation, memory=rd == rounds - 1)
            times[i] += t
            peaks[i] = max(peaks[i], peak)
    flat = torch.tensor([t for i in order for t in times[i]] + peaks, dtype=torch.float64)
    dist.all_reduce(flat, op=dist.ReduceOp.MAX, group=group)  # the slowest / largest rank
    out, at = [], 0
    for i in order:
        n = len(times[i])
        steps_i = sorted(flat[at:at + n].tolist())
        mid = statistics.median(steps_i)
        kept = steps_i[:-1] if n >= 3 else steps_i
        spread = (kept[-1] - kept[0]) / mid if mid > 0 else 0.0
        out.append((mid, int(flat[-len(plans) + i]), spread))
        at += n
    return out

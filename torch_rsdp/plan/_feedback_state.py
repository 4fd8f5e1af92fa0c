"""The error-feedback residuals of a compressed plan, as checkpointable state.

What quantising a unit's gradients lost last step is added to its next step's
(:mod:`._plan_compression`), so a run resumed without it differs from the run that never stopped.
The residuals belong to one layout: this rank's place in this plan, world and node shape,
and the gradient buckets. So every key carries a digest of that layout and this rank::

    feedback.<layout digest>.rank<r>.<unit>.residual              (FSDP units)
    feedback.<layout digest>.rank<r>.<unit>.<layer>.residual      (rotate units' layers)
    feedback.<layout digest>.rank<r>.bucket<i>.residual / .owner   (replicated units' buckets)

Each rank's keys are its own, so ``torch.distributed.checkpoint`` writes each once. A resume
under the same layout gets every residual back (and continues exactly); under another plan or
world size the keys do not match, and the residuals start at zero (error feedback stays
correct: one step's carried error is dropped) — :func:`set_feedback_state_dict` says which.

    state["feedback"] = plan.feedback_state_dict(model)                    # saving
    state["feedback"] = plan.feedback_state_dict(model, saved, "feedback")  # before dcp.load
    dcp.load(state, ...)
    plan.set_feedback_state_dict(model, state["feedback"])
"""
from __future__ import annotations

import hashlib
from typing import Dict, Iterator, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from .._compression import FeedbackAllReduce
from ..rsdp import rsdp_state
from ._apply import plan_state

__all__ = ["feedback_state_dict", "set_feedback_state_dict"]


def _layout(model: nn.Module) -> str:
    st = plan_state(model)
    parts = [st.plan.digest(), str(dist.get_world_size(st.group)), repr(st.meshes.nodes())]
    parts += [f"{u.name}={u.compression and sorted(u.compression.items())}"
              for u in sorted(st.units.values(), key=lambda u: u.name)]
    if st.grad_sync is not None:
        parts += [f"b{i}:{sum(p.numel() for p in b.params)}:{b.comp is not None}"
                  for i, b in enumerate(st.grad_sync.buckets)]
    return hashlib.sha256(";".join(parts).encode()).hexdigest()[:12]


def _holders(model: nn.Module) -> Iterator[Tuple[str, object, Tuple[str, ...]]]:
    """(name, object, attributes) of everything that keeps residuals."""
    st = plan_state(model)
    for u in sorted(st.units.values(), key=lambda u: u.name):
        if u.feedback is not None:
            yield (u.name or "<root>"), u.feedback, ("residual",)
        if u.compression and u.strategy.kind == "rotate":
            # RingFeedback of each rotating layer, on the ranks whose sends leave the node
            rs = rsdp_state(u.module)
            if rs.ring.quantises_sums(-1):
                for name, fb in sorted(rs.error_feedback().items()):
                    yield ".".join(x for x in (u.name, name) if x), fb, ("residual",)
    if st.grad_sync is not None:
        for i, b in enumerate(st.grad_sync.buckets):
            if b.comp is not None and b.comp[1]:
                if b.feedback is None:
                    b.feedback = FeedbackAllReduce(b.comp[0])
                yield f"bucket{i}", b.feedback, ("residual", "owner_residual")


def _prefix(model: nn.Module) -> str:
    return f"{_layout(model)}.rank{dist.get_rank(plan_state(model).group)}."


def feedback_state_dict(model: nn.Module, saved=None, prefix: str = ""
                        ) -> Dict[str, torch.Tensor]:
    """This rank's residuals, keyed by layout and rank (see the module's doc).

    Args:
        model: a model :func:`~torch_rsdp.plan.apply` planned.
        saved: to prepare a load: the checkpoint's metadata
            (``reader.read_metadata()``); the result then holds an empty tensor of the saved
            size for each of this rank's keys that the checkpoint has under this layout, for
            ``dcp.load`` to fill (nothing when it was saved under another layout).
        prefix: where the dict sits in the saved state (``"feedback"`` for
            ``state["feedback"]``), to find its keys in ``saved``.
    """
    mine = _prefix(model)
    if saved is not None:
        lead = f"{prefix}." if prefix else ""
        out = {}
        for key, md in saved.state_dict_metadata.items():
            if key.startswith(lead + mine) and hasattr(md, "size"):
                out[key[len(lead):]] = torch.empty(tuple(md.size),
                                                   dtype=md.properties.dtype)
        return out
    out = {}
    for name, obj, attrs in _holders(model):
        for a in attrs:
            t = getattr(obj, a)
            if t is not None:
                out[f"{mine}{name}.{a}"] = t
    return out


def set_feedback_state_dict(model: nn.Module, state: Dict[str, torch.Tensor]) -> Optional[str]:
    """Puts residuals from :func:`feedback_state_dict` (as loaded) back in place. Returns
    None when every residual of this layout came back, or a sentence saying which start at
    zero (another layout saved them, or none were saved)."""
    mine = _prefix(model)
    missing = []
    for name, obj, attrs in _holders(model):
        for a in attrs:
            t = state.get(f"{mine}{name}.{a}")
            if t is None:
                missing.append(f"{name}.{a}")
                setattr(obj, a, None)  # zeros at its first use
            else:
                setattr(obj, a, t.detach().clone().float())
    if not missing:
        return None
    return (f"rank {dist.get_rank(plan_state(model).group)}: error-feedback residuals start at "
            f"zero for {', '.join(missing)} (the checkpoint was saved under another plan, world "
            f"size or node layout, or without them)")

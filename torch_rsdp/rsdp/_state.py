"""``RSDPState``: what :func:`torch_rsdp.rsdp.shard` attaches to the model it shards, and
``rsdp_state(model)`` that returns it: the one view of a sharded model's state that users and
``torch_rsdp.plan`` use (parameters, gradient sync, error feedback, what stayed whole, and the
state-dict questions a checkpoint asks of a shard).
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.nn as nn

from .._dtensor_params import local
from .._grad_sync import GradSync
from . import _coverage as coverage
from ._coverage import LeftWhole
from ._rotation.ring_feedback import RingFeedback
from ._rotation.ring_order import Ring
from ._state_dict import FullTensors, local_shard_of, shard_dim, sharded_owner

__all__ = ["RSDPState", "rsdp_state"]


class RSDPState:
    """What :func:`torch_rsdp.rsdp.shard` attached to the root (``rsdp_state(model)`` returns
    it): the public view of a sharded model's state, which ``torch_rsdp.plan`` uses too."""

    def __init__(self, ring: Ring, sharded: dict, replicated: List[nn.Parameter],
                 grad_sync: Optional[GradSync], left_whole: Optional[List[LeftWhole]] = None,
                 full_numel: int = 0, root: Optional[nn.Module] = None,
                 not_units: Optional[Dict[str, str]] = None):
        self.ring = ring
        self.sharded = sharded  # qualified name -> RSDPLinear / RSDPEmbedding / ...
        self.left_whole = list(left_whole or [])  # every parameter every rank holds whole
        # module name -> why tp_plan="auto" named it a rotation unit but its layers were
        # sharded one by one instead
        self.not_units = dict(not_units or {})
        self.full_numel = full_numel  # parameter elements of the unsharded model
        self._replicated = replicated
        self._grad_sync = grad_sync
        self._root = root

    @property
    def group(self):
        return self.ring.group

    def sharded_parameters(self) -> List[nn.Parameter]:
        """This rank's shards: one Parameter per sharded parameter of the unwrapped model."""
        return [m._rsdp.param(n) for m in self.sharded.values() for n in m._rsdp.names]

    def replicated_parameters(self) -> List[nn.Parameter]:
        """The parameters every rank holds whole and that need a gradient."""
        return list(self._replicated)

    def set_gradient_sync(self, enabled: bool) -> None:
        """Turns the averaging of the replicated parameters' gradients on or off (off:
        backward passes accumulate them locally, as under DDP's ``no_sync``). The sharded
        gradients always travel home with the rotation, which backward does anyway."""
        if self._grad_sync is not None:
            self._grad_sync.enabled = enabled

    def error_feedback(self) -> Dict[str, RingFeedback]:
        """Qualified name -> the error feedback (:class:`RingFeedback`) of each sharded module
        that keeps one: what its gradients' quantised ring hops between nodes lost."""
        return {n: m._rsdp.feedback for n, m in self.sharded.items()
                if m._rsdp.feedback is not None}

    def set_error_feedback(self, enabled: bool) -> None:
        """Keeps (the default) or drops every sharded module's error feedback of the
        gradients' quantised ring hops between nodes."""
        for m in self.sharded.values():
            if not enabled:
                m._rsdp.feedback = None
            elif m._rsdp.feedback is None:
                m._rsdp.feedback = RingFeedback()

    def resident_numel(self) -> int:
        """Parameter elements this rank holds (its shards plus every whole parameter)."""
        if self._root is None:
            return 0
        return sum(local(p).numel() for p in self._root.parameters())

    def report(self) -> str:
        """A table: how much of the model this rank holds (trainable and frozen apart, when
        some is frozen), and every parameter left whole with its shape, size and the
        reason."""
        return coverage.report(self.left_whole, self.full_numel, self.resident_numel(),
                               self.ring.world, self.ring.rank, len(self.sharded),
                               self.not_units, self.trainable_numel())

    def trainable_numel(self) -> tuple:
        """(trainable, frozen) parameter elements this rank holds: a frozen base's shards
        never get a gradient or optimizer state."""
        if self._root is None:
            return (0, 0)
        seen, out = set(), [0, 0]
        for p in self._root.parameters():
            if id(p) not in seen:
                seen.add(id(p))
                out[0 if p.requires_grad else 1] += local(p).numel()
        return tuple(out)

    # ---- what a checkpoint asks of the shards (torch_rsdp.plan's rotate handler asks too);
    # keys are the unwrapped model's state-dict keys, relative to the model shard() was given
    def full_tensors(self, rank0_only: bool = True) -> FullTensors:
        """A gatherer of whole tensors, one sharded module at a time (``.owns(key)``,
        ``.full(key)``: the whole tensor on group rank 0, or every rank without
        ``rank0_only``). Collective per module."""
        return FullTensors(self._root, rank0_only)

    def holds_shard(self, key: str) -> bool:
        """Whether ``key`` names a parameter this model holds as shards."""
        return sharded_owner(self._root, key) is not None

    def local_shard_of(self, key: str, full: torch.Tensor) -> torch.Tensor:
        """This rank's shard of the whole tensor ``full`` of ``key``."""
        return local_shard_of(self._root, key, full)

    def shard_dim(self, key: str):
        """``(dim, whole shape)`` when ``key``'s shard is a slice of one dimension of the whole
        tensor (what a ``Shard(dim)`` DTensor describes), None when ``key`` is not sharded;
        raises ``ValueError`` naming the layout when no checkpoint can describe it."""
        return shard_dim(self._root, key)


def rsdp_state(model: nn.Module) -> RSDPState:
    """The :class:`RSDPState` that :func:`torch_rsdp.rsdp.shard` attached to ``model``.

    A module inside a sharded model that holds sharded layers but was not itself passed to
    ``shard`` (the base model peft's ``merge_and_unload()`` hands back, say) gets a view of
    its own shards: the state-dict questions work on it; it syncs no gradients."""
    st = getattr(model, "_rsdp_root", None)
    if st is not None:
        return st
    sharded = {n: m for n, m in model.named_modules() if getattr(m, "_rsdp", None) is not None}
    if not sharded:
        raise ValueError("this module was not passed to torch_rsdp.rsdp.shard() and holds no "
                         "sharded layer")
    ring = next(iter(sharded.values()))._rsdp.ring
    return RSDPState(ring, sharded, [], None, root=model)

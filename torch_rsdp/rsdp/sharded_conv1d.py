"""transformers' ``Conv1D`` (GPT-2, GPT, ...) sharded like ``nn.Linear``.

``Conv1D(nf, nx)`` is a Linear with its weight stored transposed: ``weight`` is ``[nx, nf]``
(in, out) and ``y = x @ weight + bias``. Output split shards columns of the weight and the
bias; input split shards rows of the weight (bias replicated). The rotation and arithmetic
are :mod:`.sharded_linear`'s, on the transposed view.

transformers is not a dependency of torch_rsdp: a module is recognised by its class name and
module (``transformers.*.Conv1D``) and by its attributes, and the sharded class is made on the
fly as a subclass of the user's ``Conv1D`` class, so ``isinstance(m, Conv1D)`` keeps holding
for code that checks it (transformers' own initialisers and pruning helpers).
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .ring_plan import RingPlan
from .shard_state import MixedPrecision
from .sharded_linear import shard_linear_like, sharded_linear_forward

__all__ = ["is_conv1d", "shard_conv1d", "RSDPConv1DMixin"]


def is_conv1d(module: nn.Module) -> bool:
    """True for a (non-subclassed) ``transformers`` ``Conv1D`` with its usual attributes."""
    cls = type(module)
    if cls.__name__ != "Conv1D" or not cls.__module__.startswith("transformers"):
        return False
    w = getattr(module, "weight", None)
    return (isinstance(w, nn.Parameter) and w.dim() == 2
            and tuple(w.shape) == (getattr(module, "nx", None), getattr(module, "nf", None)))


class RSDPConv1DMixin:
    """Forward of a sharded ``Conv1D``; mixed into a subclass of the model's own class."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sharded_linear_forward(self, x)

    def __repr__(self) -> str:
        return (f"RSDPConv1D(nf={self.nf}, nx={self.nx}, rsdp_split={self._rsdp_split}, "
                f"local_weight={tuple(self.weight.shape)})")


_CLASSES: dict = {}


def _sharded_class(base: type) -> type:
    """``RSDPConv1D``: the mixin over ``base``, made once per ``Conv1D`` class."""
    cls = _CLASSES.get(base)
    if cls is None:
        cls = type("RSDPConv1D", (RSDPConv1DMixin, base), {"__module__": __name__})
        _CLASSES[base] = cls
    return cls


def shard_conv1d(module: nn.Module, plan: RingPlan, split: str = "out",
                 mp: MixedPrecision | None = None) -> nn.Module:
    """Shards a ``Conv1D`` in place (its class becomes ``RSDPConv1D``) and returns it."""
    if not is_conv1d(module):
        raise TypeError(f"shard_conv1d expects a transformers Conv1D, got "
                        f"{type(module).__module__}.{type(module).__name__}")
    shard_linear_like(module, plan, split, mp, module.nx, module.nf, transposed=True)
    module.__class__ = _sharded_class(type(module))
    return module

"""transformers' ``Conv1D`` (GPT-2, GPT, ...) sharded like ``nn.Linear``.

``Conv1D(nf, nx)`` is a Linear with its weight stored transposed: ``weight`` is ``[nx, nf]``
(in, out) and ``y = x @ weight + bias``. Output split shards columns of the weight and the
bias; input split shards rows of the weight (bias replicated). The rotation and arithmetic
are :mod:`.sharded_linear`'s, on the transposed view.

transformers is not a dependency of torch_rsdp: a module is recognised by its class name and
module (``transformers.*.Conv1D``) and by its attributes (:func:`torch_rsdp._utils.is_conv1d`),
and the sharded class is made on the fly as a subclass of the user's ``Conv1D`` class, so ``isinstance(m, Conv1D)`` keeps holding
for code that checks it (transformers' own initialisers and pruning helpers).
"""
from __future__ import annotations

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from ..._utils import is_conv1d, swap_class
from .._rotation.ring_order import Ring
from .sharded_linear import shard_linear_like, sharded_linear_forward

__all__ = ["shard_conv1d", "RSDPConv1DMixin"]


class RSDPConv1DMixin:
    """Forward of a sharded ``Conv1D``; mixed into a subclass of the model's own class."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sharded_linear_forward(self, x)

    def __repr__(self) -> str:
        return (f"RSDPConv1D(nf={self.nf}, nx={self.nx}, rsdp_split={self._rsdp_split}, "
                f"local_weight={tuple(self.weight.shape)})")


def shard_conv1d(module: nn.Module, ring: Ring, split: str = "out",
                 mp: MixedPrecisionPolicy | None = None) -> nn.Module:
    """Shards a ``Conv1D`` in place (its class becomes ``RSDPConv1D``) and returns it."""
    if not is_conv1d(module):
        raise TypeError(f"shard_conv1d expects a transformers Conv1D, got "
                        f"{type(module).__module__}.{type(module).__name__}")
    shard_linear_like(module, ring, split, mp, module.nx, module.nf, transposed=True)
    return swap_class(module, RSDPConv1DMixin, "RSDPConv1D")

"""peft's LoRA layers as layers of a rotation unit: the base layers' shards rotate, the adapters
stay whole.

[Note: adapters inside a unit]
A LoRA layer computes ``base(x) + B(A(dropout(x))) * scaling``. In a rotation unit
(:mod:`.rotation_unit`) each shard's call computes the base layer's part for the shard in
hand, and the adapter's part splits the same way, because it is linear:

* column-split layers (q/k/v, gate/up): shard ``j`` produces the output features ``j``, which
  are rows ``j`` of the base weight and of ``B``: the call computes ``B[rows_j] A x``;
* the row-split layer (o, down) reads only shard ``j``'s input features ``x_j``: the call
  computes ``B A[:, cols_j] x_j``, and the partial outputs summed over the ring give
  ``B A x``.

The adapters stay whole on every rank ([Note: adapters stay whole] in :mod:`.._coverage`):
each shard's call reads its slice of them, autograd adds the slices' gradients into the
whole adapter's, which the unit returns as its own replicated parameters' gradients
(:func:`.unit_call.own_replicas`), and their all-reduce with the other replicas averages
over the group. No adapter travels in the ring, and a frozen base sends no gradients. peft's
own forward runs unchanged: only the base layer and the one adapter matrix that is sliced
compute differently, and only while the unit has a shard in hand.

Refused (the layers then rotate one by one, as any peft layer does): LoRA variants (DoRA and
the like: the variant's forward needs the whole base weight), adapters that are not plain
``nn.Linear``, a bias on the row-split layer's ``B`` (each shard's call would add it once), and
a model whose adapters are merged into the base.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch.nn as nn
import torch.nn.functional as F

from ..._utils import swap_class
from .tp_plan import COL

__all__ = ["is_peft_layer", "unit_member", "attach_adapters", "set_cut"]


def is_peft_layer(m: nn.Module) -> bool:
    """Whether ``m`` is one of peft's tuner layers (it holds the layer it adapts as
    ``base_layer``)."""
    return any(c.__name__ == "BaseTunerLayer" for c in type(m).__mro__)


def _adapter_problem(m: nn.Module, style: str) -> Optional[str]:
    if not isinstance(getattr(m, "base_layer", None), nn.Linear):
        return "its base layer is not an nn.Linear"
    if getattr(m, "merged", False):
        return "its adapters are merged into the base layer"
    if getattr(m, "lora_variant", None):
        kinds = sorted({type(v).__name__ for v in m.lora_variant.values()})
        return f"it uses a LoRA variant ({', '.join(kinds)})"
    for name in ("lora_embedding_A", "lora_embedding_B"):
        if len(getattr(m, name, {})):
            return "it has embedding adapters"
    for name, mat in list(m.lora_A.items()) + list(m.lora_B.items()):
        if type(mat) is not nn.Linear:
            return f"its adapter {name!r} is a {type(mat).__name__}, not an nn.Linear"
    if style != COL and any(b.bias is not None for b in m.lora_B.values()):
        return "its lora_B has a bias, which each shard's call would add once"
    return None


def unit_member(key: str, m: nn.Module, style: str) -> Tuple[tuple, Optional[str]]:
    """``(attribute, module, style)`` of a unit's planned layer ``m`` (attribute ``key``) as the
    unit sees it, and a problem or None: a LoRA layer's member is its base layer
    (``key.base_layer``), whose adapters are sliced around it ([Note: adapters inside a
    unit])."""
    if not is_peft_layer(m):
        return (key, m, style), None
    problem = _adapter_problem(m, style)
    if problem is not None:
        return (key, m, style), f"{key} is a peft layer the unit cannot split: {problem}"
    return (f"{key}.base_layer", m.base_layer, style), None


class _AdapterSlice:
    """An adapter matrix (``lora_B`` of a column-split layer, ``lora_A`` of the row-split one)
    that computes with the slice of its weight matching the shard its base layer has in hand."""

    _rsdp_base: nn.Module
    _rsdp_dim: int

    def forward(self, x):
        cut = self._rsdp_base.__dict__.get("_rsdp_cut")
        if cut is None:
            return super().forward(x)
        start, size = cut
        w = self.weight.narrow(self._rsdp_dim, start, size)
        b = self.bias
        if b is not None and self._rsdp_dim == 0:
            b = b.narrow(0, start, size)
        return F.linear(x, w, b)


def _row_output(wrapper, args, out):
    """The row-split layer's output, for the unit's check that its forward returns it as is,
    is the LoRA layer's (base plus adapter), not its base layer's."""
    wrapper.base_layer._rsdp_last = out


def attach_adapters(unit: nn.Module, members) -> None:
    """Makes the adapters of ``unit``'s LoRA members compute with the slice of the shard in
    hand ([Note: adapters inside a unit])."""
    for key, base, style in members:
        if not key.endswith(".base_layer"):
            continue
        wrapper = unit.get_submodule(key[:-len(".base_layer")])
        mats = wrapper.lora_B if style == COL else wrapper.lora_A
        for mat in mats.values():
            mat._rsdp_base, mat._rsdp_dim = base, 0 if style == COL else 1
            swap_class(mat, _AdapterSlice, "RSDPUnitAdapter" + type(mat).__name__)
        if style != COL:
            wrapper.register_forward_hook(_row_output)


def set_cut(members, heads: Optional[slice], atoms: int) -> None:
    """Tells each member which of its features the shard in hand holds (``heads``: the
    shard's atoms; None, or every atom, when the unit computes whole)."""
    for _, m, _ in members:
        if heads is None or (heads.start == 0 and heads.stop == atoms):
            m.__dict__.pop("_rsdp_cut", None)
            continue
        per = (m._rsdp_out if m._rsdp_split == "out" else m._rsdp_in) // atoms
        m.__dict__["_rsdp_cut"] = (heads.start * per, (heads.stop - heads.start) * per)

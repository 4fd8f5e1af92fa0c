"""Full (unsharded) state dicts of a planned model, whatever mix of strategies it uses.

Every strategy keeps the unwrapped model's parameter names, so ``model.state_dict()`` already
has the right keys; only the values differ: FSDP2 units hold DTensors, RSDP units row/column
shards, ``split:k`` layers row shards, replicated units whole tensors. Each key belongs to the
unit that owns its parameter (buffers belong to no unit and are saved as they are), and that
unit's strategy handler turns the value into the whole tensor
(:meth:`~._strategies.StrategyHandler.full_value`: collectives in ``state_dict`` order, one
tensor, or one RSDP module's shards, at a time) or a whole tensor into this rank's part
(:meth:`~._strategies.StrategyHandler.local_value`: slicing, no communication). A checkpoint
taken under one plan therefore loads under any other, and into the plain model.

A model sharded by :func:`torch_rsdp.rsdp.shard` alone is one ``rotate`` unit over the whole
model here (what ``plan.apply(model, {}, default="rotate")`` would make of it): the same
handler asks its :class:`~torch_rsdp.rsdp.RSDPState` for whole tensors and local shards, so
both kinds of model have one pair of functions and one code path.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from .._checkpoint_hooks import raw_state_dict
from .._dtensor_params import like_param
from ..rsdp import rsdp_state
from ._ownership import Unit, units_by_key
from ._spec import Strategy

__all__ = ["full_state_dict", "load_full_state_dict"]


def _owners(model: nn.Module,
            caller: str) -> Tuple[Optional[dist.ProcessGroup], Dict[str, Unit]]:
    """The model's group and its parameter names -> owning unit: a planned model's units, or
    one ``rotate`` unit over a model that :func:`torch_rsdp.rsdp.shard` sharded."""
    st = getattr(model, "_rsdp_plan", None)
    if st is not None:
        return st.group, units_by_key(model, st.units)
    try:
        state = rsdp_state(model)
    except ValueError:
        raise ValueError(f"torch_rsdp.plan.{caller}: this module was passed neither to "
                         f"torch_rsdp.plan.apply() nor to torch_rsdp.rsdp.shard()") from None
    whole = Unit("", Strategy("rotate"), model,
                 params=dict(model.named_parameters(remove_duplicate=False)))
    return state.group, units_by_key(model, {"": whole})


@torch.no_grad()
def full_state_dict(model: nn.Module, rank0_only: bool = True) -> Dict[str, torch.Tensor]:
    """The unwrapped model's state dict on group rank 0 (``{}`` elsewhere) or, with
    ``rank0_only=False``, on every rank. Collective.

    Args:
        model: a model passed to :func:`torch_rsdp.plan.apply` or
            :func:`torch_rsdp.rsdp.shard`.
        rank0_only: assemble the whole tensors on group rank 0 only.
    """
    group, units = _owners(model, "full_state_dict")
    keep = not rank0_only or dist.get_rank(group) == 0
    scratch: Dict[str, object] = {}
    out: Dict[str, torch.Tensor] = {}
    with raw_state_dict():  # this rank's own parts, whatever a checkpoint could describe
        local_state = model.state_dict()
    for key, value in local_state.items():
        unit = units.get(key)
        full: Optional[torch.Tensor] = (value.detach() if unit is None else
                                        unit.strategy.handler.full_value(
                                            unit, key, value, rank0_only, scratch))
        if isinstance(full, DTensor):  # a replica (Replicate()): no communication
            full = full.full_tensor()
        if keep:
            out[key] = full.detach().clone()
    return out


@torch.no_grad()
def load_full_state_dict(model: nn.Module, full: Dict[str, torch.Tensor], strict: bool = True):
    """Loads an unwrapped model's state dict (present on every rank); each rank keeps its
    part. Returns ``load_state_dict``'s result.

    Args:
        model: a model passed to :func:`torch_rsdp.plan.apply` or
            :func:`torch_rsdp.rsdp.shard`.
        full: the unwrapped model's state dict (e.g. from :func:`full_state_dict`).
        strict: as ``nn.Module.load_state_dict``'s.
    """
    _, units = _owners(model, "load_full_state_dict")
    with raw_state_dict():
        current = model.state_dict()
    local = {}
    for key, value in full.items():
        unit, cur = units.get(key), current.get(key)
        v = (value if unit is None or cur is None else
             unit.strategy.handler.local_value(unit, key, value, cur))
        local[key] = like_param(cur, v, repr(key)) if cur is not None else v
    with raw_state_dict():
        return model.load_state_dict(local, strict=strict)

"""Full (unsharded) state dicts of a planned model, whatever mix of strategies it uses.

Every strategy keeps the unwrapped model's parameter names, so ``model.state_dict()`` already
has the right keys; only the values differ: FSDP2 units hold DTensors, RSDP units row/column
shards, ``split:k`` layers row shards, replicated units whole tensors.
:func:`full_state_dict` turns each into the whole tensor (collectives in ``state_dict`` order,
one tensor at a time, so the peak is one gathered tensor beyond the result) and
:func:`load_full_state_dict` takes each rank's part of a whole tensor by slicing (no
communication). A checkpoint taken under one plan therefore loads under any other, and into
the plain model.
"""
from __future__ import annotations

from typing import Dict

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ..rsdp.state_dict import sharded_owner
from .apply import plan_state
from .split_linear import full_weight, local_rows_of

__all__ = ["full_state_dict", "load_full_state_dict"]


def _split_module(model: nn.Module, key: str):
    path, _, attr = key.rpartition(".")
    if attr != "weight":
        return None
    mod = model.get_submodule(path) if path else model
    return mod if getattr(mod, "_split", None) is not None else None


def _rsdp_full(st, name: str, cache: dict) -> torch.Tensor:
    """The whole parameter ``name`` of an RSDP shard state (every rank's flat storage is
    gathered once per module and reused for its other parameters)."""
    if cache.get("id") != id(st):
        flat = st.local_flat()
        if st.plan.world == 1:
            parts = [flat]
        else:
            parts = [torch.empty_like(flat) for _ in range(st.plan.world)]
            dist.all_gather(parts, flat, group=st.plan.group)
        cache.clear()
        cache.update(id=id(st), parts=parts)
    parts = cache["parts"]
    return st.assemble(name, [st.layout.view(parts[j], name, j) for j in range(st.plan.world)])


@torch.no_grad()
def full_state_dict(model: nn.Module, rank0_only: bool = True) -> Dict[str, torch.Tensor]:
    """The unwrapped model's state dict on group rank 0 (``{}`` elsewhere) or, with
    ``rank0_only=False``, on every rank. Collective."""
    st = plan_state(model)
    keep = not rank0_only or dist.get_rank(st.group) == 0
    out: Dict[str, torch.Tensor] = {}
    cache: dict = {}
    for key, value in model.state_dict().items():
        if isinstance(value, DTensor):
            full = value.full_tensor()
        elif (mod := _split_module(model, key)) is not None:
            full = full_weight(mod)
        elif (owner := sharded_owner(model, key)) is not None:
            full = _rsdp_full(owner[0], owner[1], cache)
        else:
            full = value.detach()
        if keep:
            out[key] = full.detach().clone()
    return out


@torch.no_grad()
def load_full_state_dict(model: nn.Module, full: Dict[str, torch.Tensor], strict: bool = True):
    """Loads an unwrapped model's state dict (present on every rank); each rank keeps its
    part. Returns ``load_state_dict``'s result."""
    plan_state(model)
    current = model.state_dict()
    local = {}
    for key, value in full.items():
        cur = current.get(key)
        if isinstance(cur, DTensor):
            if tuple(value.shape) != tuple(cur.shape):
                raise ValueError(f"torch_rsdp.plan.load_full_state_dict: {key!r} has shape "
                                 f"{tuple(value.shape)}, the model expects {tuple(cur.shape)}")
            local[key] = distribute_tensor(value.to(cur.dtype), cur.device_mesh, cur.placements,
                                           src_data_rank=None)
        elif cur is not None and (mod := _split_module(model, key)) is not None:
            local[key] = local_rows_of(mod, value)
        elif cur is not None and (owner := sharded_owner(model, key)) is not None:
            st, name = owner
            local[key] = st.take(name, value, st.plan.rank)
        else:
            local[key] = value
    return model.load_state_dict(local, strict=strict)

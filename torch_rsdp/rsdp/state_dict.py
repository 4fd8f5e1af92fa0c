"""State dicts of a sharded model.

* Sharded: ``model.state_dict()`` already is one - the same keys as the unwrapped model, with
  this rank's shards as values; ``model.load_state_dict(sd)`` copies them back in place (the
  parameters keep viewing the flat storage). Save one per rank.
* Full: :func:`full_state_dict` gathers every sharded parameter (one module at a time) into the
  unwrapped model's state dict on group rank 0 (or every rank); it loads into the unwrapped
  model. :func:`load_full_state_dict` takes such a dict (present on every rank) and keeps each
  rank's slices.
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from .shard_state import ShardState

__all__ = ["full_state_dict", "load_full_state_dict", "local_shard_of", "sharded_owner"]


def sharded_owner(model: nn.Module, key: str) -> Optional[Tuple[ShardState, str]]:
    """(ShardState, local name) when ``key`` names a sharded parameter, else None.

    The state may sit on an ancestor of the parameter's module (an attention module owns its
    ``out_proj.weight``), so every split of ``key`` into module path and name is tried."""
    parts = key.split(".")
    for cut in range(len(parts) - 1, -1, -1):
        mod_name, pname = ".".join(parts[:cut]), ".".join(parts[cut:])
        try:
            mod = model.get_submodule(mod_name) if mod_name else model
        except AttributeError:
            continue
        st = getattr(mod, "_rsdp", None)
        if isinstance(st, ShardState) and pname in st.names:
            return st, pname
    return None


def local_shard_of(model: nn.Module, key: str, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full`` (the unwrapped model's value for ``key``)."""
    owner = sharded_owner(model, key)
    if owner is None:
        return full
    st, name = owner
    return st.take(name, full, st.plan.rank)


@torch.no_grad()
def full_state_dict(model: nn.Module, rank0_only: bool = True) -> Dict[str, torch.Tensor]:
    """The unwrapped model's state dict, assembled on group rank 0 (``{}`` on the others) or,
    with ``rank0_only=False``, on every rank. Collective."""
    out: Dict[str, torch.Tensor] = {}
    cur_id, parts = None, None  # the module being assembled and every rank's flat storage
    plan = getattr(getattr(model, "_rsdp_root", None), "plan", None)
    keep = plan is None or not rank0_only or plan.rank == 0
    for key, value in model.state_dict().items():
        owner = sharded_owner(model, key)
        if owner is None:
            if keep:
                out[key] = value.detach().clone()
            continue
        st, name = owner
        if id(st) != cur_id:  # keys of one module are adjacent; free the previous module's
            cur_id, parts = id(st), _gather_flat(st, rank0_only)
        if parts is not None:
            out[key] = st.assemble(name, [st.layout.view(parts[j], name, j)
                                          for j in range(st.plan.world)])
    return out if keep else {}


def _gather_flat(st: ShardState, rank0_only: bool):
    """Every rank's flat storage of ``st`` (on rank 0 only when ``rank0_only``)."""
    plan, flat = st.plan, st.local_flat()
    with record_function("RSDP::state_dict_gather"):
        if plan.world == 1:
            return [flat]
        if rank0_only:
            parts = ([torch.empty_like(flat) for _ in range(plan.world)]
                     if plan.rank == 0 else None)
            dst = dist.get_global_rank(plan.group, 0) if plan.group is not None else 0
            dist.gather(flat, parts, dst=dst, group=plan.group)
            return parts
        parts = [torch.empty_like(flat) for _ in range(plan.world)]
        dist.all_gather(parts, flat, group=plan.group)
        return parts


@torch.no_grad()
def load_full_state_dict(model: nn.Module, full: Dict[str, torch.Tensor], strict: bool = True):
    """Loads an unwrapped model's state dict (present on every rank); each rank keeps its
    slices. Returns ``load_state_dict``'s result."""
    local = {k: local_shard_of(model, k, v) for k, v in full.items()}
    return model.load_state_dict(local, strict=strict)

"""``shard(model)``: the FSDP2-like entry point of RSDP.

    import torch_rsdp.rsdp as rsdp
    model = rsdp.shard(model)                 # collective: every rank of the group calls it
    opt = torch.optim.AdamW(model.parameters())   # sees only the local shards

What happens, in order:

1. The ring order of ``group`` is learnt (:class:`.RingPlan`, collective).
2. With ``sync_module_states`` every parameter and buffer is broadcast from group rank 0, so
   all ranks start from the same model (like DDP; the model is still whole at this point).
3. Every plain ``nn.Linear`` / ``nn.Embedding`` / ``nn.MultiheadAttention`` accepted by
   ``filter`` (and with at least ``min_numel`` weight elements, and no parameter shared with
   another module) is sharded in place: its class becomes :class:`.RSDPLinear` /
   :class:`.RSDPEmbedding` / :class:`.RSDPMultiheadAttention` (split by heads) and its
   parameters become this rank's shards; the full tensors are dropped.
4. All other parameters stay replicated; their gradients are averaged over the group after
   every backward (:class:`.ReplicatedGradSync`).

Sharded gradients arrive at their owner already averaged over the group, so one optimiser
step equals DDP's on the same global batch. Buffers (e.g. BatchNorm statistics) are only
synchronised once, at step 2.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.distributed as dist
import torch.nn as nn

from .replicated import ReplicatedGradSync
from .ring_plan import RingPlan
from .shard_state import MixedPrecision
from .sharded_attention import RSDPMultiheadAttention, can_shard_attention, shard_attention
from .sharded_embedding import RSDPEmbedding, can_shard_embedding, shard_embedding
from .sharded_linear import RSDPLinear, shard_linear

__all__ = ["shard", "RSDPState", "rsdp_state"]

Filter = Callable[[str, nn.Module], bool]


class RSDPState:
    """What :func:`shard` attached to the root (``rsdp_state(model)`` returns it)."""

    def __init__(self, plan: RingPlan, sharded: dict, replicated: ReplicatedGradSync):
        self.plan = plan
        self.sharded = sharded  # qualified name -> RSDPLinear / RSDPEmbedding
        self.replicated = replicated

    @property
    def group(self):
        return self.plan.group


def rsdp_state(model: nn.Module) -> RSDPState:
    st = getattr(model, "_rsdp_root", None)
    if st is None:
        raise ValueError("this module was not passed to torch_rsdp.rsdp.shard()")
    return st


def shard(model: nn.Module, group: Optional[dist.ProcessGroup] = None, *,
          linear_split: str | Callable[[str, nn.Linear], str] = "out",
          min_numel: int = 0, filter: Optional[Filter] = None,
          mp_policy: Optional[MixedPrecision] = None,
          sync_module_states: bool = True) -> nn.Module:
    """Shards ``model`` over ``group`` (default: world) in place and returns it. Collective.

    linear_split: ``"out"`` (rows of W and b), ``"in"`` (columns of W; bias replicated), or a
        callable ``(qualified_name, linear) -> "out" | "in" | "none"``.
    min_numel: layers whose weight has fewer elements stay replicated.
    filter: ``(qualified_name, module) -> bool``; False keeps that module replicated.
    mp_policy: compute in ``param_dtype``, reduce gradients in ``reduce_dtype``
        (master shards keep the parameters' dtype).
    sync_module_states: broadcast parameters and buffers from group rank 0 first.
    """
    if getattr(model, "_rsdp_root", None) is not None:
        raise ValueError("shard() was already applied to this module")
    plan = RingPlan(group)
    if sync_module_states and plan.world > 1:
        src = dist.get_global_rank(group, 0) if group is not None else 0
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=src, group=group)

    # Parameters used by more than one module (tied weights) stay replicated: sharding one
    # user would silently untie them.
    owners: dict = {}
    for mod in model.modules():
        for p in mod.parameters(recurse=False):
            owners.setdefault(id(p), set()).add(id(mod))
    shared = {pid for pid, mods in owners.items() if len(mods) > 1}

    sharded = {}
    for name, mod in list(model.named_modules()):
        if isinstance(mod, (RSDPLinear, RSDPEmbedding, RSDPMultiheadAttention)):
            continue
        if any(id(p) in shared for p in mod.parameters(recurse=False)):
            continue
        if filter is not None and not filter(name, mod):
            continue
        if type(mod) is nn.Linear and mod.weight.numel() >= min_numel:
            split = linear_split(name, mod) if callable(linear_split) else linear_split
            if split != "none":
                sharded[name] = shard_linear(mod, plan, split, mp_policy)
        elif can_shard_embedding(mod) and mod.weight.numel() >= min_numel:
            sharded[name] = shard_embedding(mod, plan, mp_policy)
        elif can_shard_attention(mod) and mod.in_proj_weight.numel() >= min_numel:
            sharded[name] = shard_attention(mod, plan, mp_policy)

    local = set()
    for mod in sharded.values():
        local.update(id(mod._rsdp.param(n)) for n in mod._rsdp.names)
    replicated, seen = [], set()
    for p in model.parameters():
        if id(p) not in local and id(p) not in seen and p.requires_grad:
            seen.add(id(p))
            replicated.append(p)
    model._rsdp_root = RSDPState(plan, sharded, ReplicatedGradSync(model, replicated, group))
    return model

"""What the trainer integrations ask of a model: is it sharded by torch_rsdp, its whole state
dict, its whole optimizer state dict, and its clipped gradient norm.

A trainer hands these functions whatever it holds: the sharded model itself, or a wrapper
around it (a ``LightningModule`` whose ``self.model`` was passed to ``plan.apply``). The
sharded *roots* are the outermost modules ``torch_rsdp.plan.apply`` or
``torch_rsdp.rsdp.shard`` returned; every function here works on the module it is given, and
each root's part of it goes through that root's own full state dict (which serves every
layout, the ones a ``DTensor`` cannot describe included).

Every function but :func:`is_sharded` and :func:`sharded_roots` is collective over the roots'
groups: every rank calls it, in the same order, as every rank of a trainer does in its save
paths (the integrations make sure of that).
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

from .._checkpoint_hooks import raw_state_dict
from .._dtensor_params import local

__all__ = ["is_sharded", "sharded_roots", "full_model_state_dict", "full_optimizer_state_dict",
           "clip_grad_norm_"]


def _root_kind(m: nn.Module) -> Optional[str]:
    if getattr(m, "_rsdp_plan", None) is not None:
        return "plan"
    if getattr(m, "_rsdp_root", None) is not None:
        return "rsdp"
    return None


def sharded_roots(module: nn.Module) -> List[Tuple[str, nn.Module]]:
    """``(prefix, root)`` of every outermost module of ``module`` (itself included) that
    torch_rsdp sharded; ``prefix`` is the root's name in ``module`` plus a dot, or ""."""
    roots: List[Tuple[str, nn.Module]] = []
    skip: List[str] = []
    for name, m in module.named_modules():
        if any(name.startswith(s) for s in skip) or _root_kind(m) is None:
            continue
        prefix = name + "." if name else ""
        roots.append((prefix, m))
        skip.append(prefix if prefix else "\0")  # a root at the top covers everything
        if not prefix:
            break
    return roots


def is_sharded(module) -> bool:
    """Whether ``module`` (an ``nn.Module``; anything else is not) holds parameters that
    torch_rsdp sharded."""
    return isinstance(module, nn.Module) and bool(sharded_roots(module))


def _root_full_state_dict(root: nn.Module) -> Dict[str, torch.Tensor]:
    from ..plan import full_state_dict  # planned roots and rsdp.shard's alike
    return full_state_dict(root, rank0_only=True)


def _is_group_rank0(root: nn.Module) -> bool:
    group = (root._rsdp_plan.group if _root_kind(root) == "plan" else root._rsdp_root.group)
    return dist.get_rank(group) == 0


@torch.no_grad()
def full_model_state_dict(module: nn.Module) -> Dict[str, torch.Tensor]:
    """``module.state_dict()`` with whole tensors, on rank 0 of the roots' groups (``{}``
    elsewhere), in ``module.state_dict()``'s key order. Collective."""
    roots = sharded_roots(module)
    whole: Dict[str, torch.Tensor] = {}
    for prefix, root in roots:
        whole.update({prefix + k: v for k, v in _root_full_state_dict(root).items()})
    if roots and not _is_group_rank0(roots[0][1]):
        return {}
    with raw_state_dict():
        layout = module.state_dict()
    out: Dict[str, torch.Tensor] = {}
    for key, value in layout.items():
        if key in whole:
            out[key] = whole[key]
        elif not any(key.startswith(p) for p, _ in roots if p):
            out[key] = local(value).detach().clone()  # outside every root: as it is
    return out


def full_optimizer_state_dict(module: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """The whole optimizer state of ``optimizer`` over ``module``'s parameters, as one process
    would hold it (keyed by parameter name, torch's full optimizer state dict), on rank 0
    (``{}`` elsewhere, on CPU). ``optimizer.load_state_dict`` of it on every rank, at any
    world size and under any plan, gives each rank its part back. Collective."""
    from torch.distributed.checkpoint.state_dict import (StateDictOptions,
                                                         get_optimizer_state_dict)

    return get_optimizer_state_dict(
        module, optimizer,
        options=StateDictOptions(full_state_dict=True, cpu_offload=True))


def clip_grad_norm_(module: nn.Module, max_norm: float, norm_type: float = 2.0):
    """``torch.nn.utils.clip_grad_norm_(module.parameters(), ...)`` as one process computes
    it: a model planned by ``torch_rsdp.plan`` goes through ``plan.clip_grad_norm_`` (it
    serves the shards a ``DTensor`` cannot describe), anything else through torch's own
    function (every torch_rsdp shard there is a ``DTensor``; a layout it cannot mix raises
    there, loudly). Collective."""
    roots = sharded_roots(module)
    mine = {id(p) for p in module.parameters() if p.requires_grad}
    if len(roots) == 1 and _root_kind(roots[0][1]) == "plan":
        covered = {id(p) for p in roots[0][1].parameters()}
        if mine <= covered:
            from ..plan import clip_grad_norm_ as plan_clip
            return plan_clip(roots[0][1], max_norm, norm_type)
    return torch.nn.utils.clip_grad_norm_(
        [p for p in module.parameters() if p.requires_grad], max_norm, norm_type)

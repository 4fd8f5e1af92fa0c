"""``torch.nn.utils.clip_grad_norm_`` for a planned model.

torch's own function computes the norm of the gradients a rank *holds*. Under a plan those
are of three kinds, and it gets two of them wrong: FSDP2 units hold DTensor shards (torch
reduces those itself), ``rotate`` and ``split:k`` units hold plain tensors that are this
rank's disjoint piece of each weight (torch counts only the local piece, so every rank clips
by a different factor and the replicated weights drift apart, silently), and replicated units
(``no_shard``, ``shard_optim``, what rotate and split leave whole) hold the whole averaged
gradient on every rank (to be counted once, not once per rank). :func:`clip_grad_norm_`
asks each unit's strategy which it holds (:meth:`StrategyHandler.holds_shard`), sums
``|g|^p`` over the pieces with one all-reduce over the plan's group, and scales every rank's
gradients by the same factor: the norm and the clipped step one process would compute.
"""
from __future__ import annotations

from typing import Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor

from ._apply import plan_state

__all__ = ["clip_grad_norm_", "grad_norm"]


def _pieces(model: nn.Module) -> Tuple[List[Tuple[torch.Tensor, float]], List[torch.Tensor]]:
    """(local gradient, how many ranks hold that same piece) of every gradient, and the
    gradients themselves (to scale)."""
    st = plan_state(model)
    world = dist.get_world_size(st.group)
    seen: Dict[int, None] = {}
    pieces, grads = [], []
    for unit in st.units.values():
        handler = unit.strategy.handler
        for key, p in unit.params.items():
            if id(p) in seen or p.grad is None:
                continue
            seen[id(p)] = None
            g = p.grad
            grads.append(g)
            if isinstance(g, DTensor):
                copies = 1
                for dim, pl in enumerate(g.placements):
                    if pl.is_replicate():
                        copies *= g.device_mesh.size(dim)
                    elif not pl.is_shard():
                        raise RuntimeError(
                            f"torch_rsdp.plan.clip_grad_norm_: rank {dist.get_rank(st.group)}: "
                            f"gradient of {key!r} has placement {pl} (not Shard or Replicate)")
                pieces.append((g.to_local(), float(copies)))
            elif handler.holds_shard(unit, key):
                pieces.append((g, 1.0))
            else:
                pieces.append((g, float(world)))
    missing = [n for n, p in model.named_parameters() if p.grad is not None and id(p) not in seen]
    if missing:
        raise RuntimeError(f"torch_rsdp.plan.clip_grad_norm_: parameters {missing[:4]} belong "
                           f"to no unit of the plan")
    return pieces, grads


def _total(group, pieces, norm_type: float) -> torch.Tensor:
    if norm_type == float("inf"):
        local = max((g.detach().abs().max().float() for g, _ in pieces if g.numel()),
                    default=torch.zeros((), dtype=torch.float32))
        total = local.reshape(1).clone()
        dist.all_reduce(total, op=dist.ReduceOp.MAX, group=group)
        return total[0]
    # float64 partial sums: the pieces are added in a different order than one process would
    acc = torch.zeros(1, dtype=torch.float64)
    for g, copies in pieces:
        if g.numel():
            acc += torch.linalg.vector_norm(g.detach().double(), norm_type) ** norm_type / copies
    dist.all_reduce(acc, group=group)
    return (acc[0] ** (1.0 / norm_type)).float()


def grad_norm(model: nn.Module, norm_type: float = 2.0) -> torch.Tensor:
    """The ``norm_type``-norm of the whole model's gradient (as one process would compute
    it), the same float32 scalar on every rank. Collective over the plan's group."""
    return _total(plan_state(model).group, _pieces(model)[0], float(norm_type))


def clip_grad_norm_(model: nn.Module, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> torch.Tensor:
    """Scales the gradients of a planned model in place so that their total norm is at most
    ``max_norm``, as ``torch.nn.utils.clip_grad_norm_(model.parameters(), ...)`` does in one
    process; returns the total norm before clipping. Collective over the plan's group; call
    it where torch's would go (after backward, before ``optimizer.step()``).

    Raises ``RuntimeError`` (on every rank alike) when ``error_if_nonfinite`` and the norm is
    NaN or infinite."""
    pieces, grads = _pieces(model)
    total = _total(plan_state(model).group, pieces, float(norm_type))
    if error_if_nonfinite and not torch.isfinite(total):
        raise RuntimeError(
            f"torch_rsdp.plan.clip_grad_norm_: the total norm of order {float(norm_type)} of "
            f"the gradients is non-finite ({total.item()}), so it cannot be clipped; "
            f"error_if_nonfinite=False to clip anyway")
    coef = torch.clamp(float(max_norm) / (total + 1e-6), max=1.0)
    for g in grads:
        local = g.to_local() if isinstance(g, DTensor) else g
        local.mul_(coef.to(local.dtype))
    return total

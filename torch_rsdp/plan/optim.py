"""``make_optimizer``: one optimizer for a planned model, with ZeRO-1 for ``shard_optim`` units.

The parameters of ``shard_optim`` units are replicated and their gradients averaged like
``no_shard``'s, but each has one *owner* rank (assigned greedily by size, largest first, to
the least loaded rank, as torch's ``ZeroRedundancyOptimizer`` does), and only the owner keeps
its optimizer state and steps it. After every step each owner broadcasts its updated
parameters (in flat buckets of at most 25 MiB), so every replica is identical again.
Every other parameter (sharded by FSDP2, RSDP or splitting, whose state is sharded with it, or
``no_shard``) is stepped by the same inner optimizer on every rank.

So optimizer-state memory for ``shard_optim`` parameters is about ``1/W`` of ``no_shard``'s,
for one broadcast of the parameters per step.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim import Optimizer
from torch.profiler import record_function

from .apply import plan_state
from .._grad_sync import DEFAULT_BUCKET_BYTES, pack_buckets

__all__ = ["make_optimizer", "ShardedOptimizer"]


def make_optimizer(model: nn.Module, optimizer_class, *args, **kwargs) -> Optimizer:
    """``optimizer_class(model.parameters(), *args, **kwargs)``, with the state of
    ``shard_optim`` parameters sharded over the plan's group (the plain optimizer when the plan
    has no ``shard_optim`` unit).

    Args:
        model: a model passed to :func:`torch_rsdp.plan.apply`.
        optimizer_class: a ``torch.optim.Optimizer`` subclass.
        *args, **kwargs: its other arguments (learning rate, ...).
    """
    st = plan_state(model)
    if not st.shard_optim_params:
        return optimizer_class(model.parameters(), *args, **kwargs)
    return ShardedOptimizer(model, st.shard_optim_params, st.group, optimizer_class,
                            *args, **kwargs)


def _owners(params: List[nn.Parameter], world: int) -> List[int]:
    load = [0] * world
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
        r = min(range(world), key=lambda j: (load[j], j))
        owner[i] = r
        load[r] += params[i].numel()
    return owner


class ShardedOptimizer(Optimizer):
    """An optimizer over a whole planned model that keeps state for ``sharded`` parameters
    only on their owner rank. ``param_groups``, ``state``, ``state_dict`` (this rank's part)
    and learning-rate schedulers work as on the inner optimizer."""

    def __init__(self, model: nn.Module, sharded: List[nn.Parameter],
                 group: Optional[dist.ProcessGroup], optimizer_class, *args,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, **kwargs):
        self.group = group
        self.bucket_bytes = bucket_bytes
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        ids = {id(p) for p in sharded}
        owner = _owners(sharded, self.world)
        self.owned: Dict[int, List[nn.Parameter]] = {r: [] for r in range(self.world)}
        for p, r in zip(sharded, owner):
            self.owned[r].append(p)
        mine = {id(p) for p in self.owned[self.rank]}
        local = [p for p in model.parameters() if id(p) not in ids or id(p) in mine]
        # A rank may own nothing (fewer shard_optim parameters than ranks): torch's optimizers
        # refuse an empty list, but not a group with no parameters.
        self.inner = optimizer_class(local or [{"params": []}], *args, **kwargs)
        self._not_mine = [p for p in sharded if id(p) not in mine]
        self._sends = [self._buckets(self.owned[r]) for r in range(self.world)]  # per owner
        # Optimizer's own bookkeeping (hooks, step counters for LR schedulers) without a
        # second copy of the param groups: those live in the inner optimizer.
        self._optimizer_step_pre_hooks = {}
        self._optimizer_step_post_hooks = {}
        self._optimizer_state_dict_pre_hooks = {}
        self._optimizer_state_dict_post_hooks = {}
        self._optimizer_load_state_dict_pre_hooks = {}
        self._optimizer_load_state_dict_post_hooks = {}
        self.defaults = self.inner.defaults
        self._patch_step_function()

    @property
    def param_groups(self):
        return self.inner.param_groups

    @property
    def state(self):
        return self.inner.state

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none)
        for p in self._not_mine:
            if p.grad is not None:
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        loss = self.inner.step(closure)
        if self.world > 1:
            self._broadcast_owned()
        return loss

    def _broadcast_owned(self) -> None:
        """Every owner sends its updated parameters to the other replicas: parameters of one
        dtype packed into flat buckets of at most ``bucket_bytes``, a larger contiguous
        parameter sent in place, so the step never holds more than one bucket extra (a flat
        copy of an owner's whole share would be 1/W of the replicated model)."""
        for r in range(self.world):
            src = dist.get_global_rank(self.group, r) if self.group is not None else r
            for ps in self._sends[r]:
                p0 = ps[0]
                if len(ps) == 1 and p0.is_contiguous():
                    with record_function("RSDP::plan::shard_optim_broadcast"):
                        dist.broadcast(p0.detach(), src=src, group=self.group)
                    continue
                flat = torch.cat([p.detach().reshape(-1) for p in ps]) if r == self.rank \
                    else torch.empty(sum(p.numel() for p in ps), dtype=p0.dtype,
                                     device=p0.device)
                with record_function("RSDP::plan::shard_optim_broadcast"):
                    dist.broadcast(flat, src=src, group=self.group)
                if r != self.rank:
                    off = 0
                    for p in ps:
                        p.copy_(flat[off:off + p.numel()].view_as(p))
                        off += p.numel()
                del flat

    def _buckets(self, params: List[nn.Parameter]) -> List[List[nn.Parameter]]:
        """Consecutive parameters of one dtype and device, up to ``bucket_bytes`` a bucket."""
        return pack_buckets(params, self.bucket_bytes, key=lambda p: (p.dtype, p.device))

    def state_dict(self):
        return self.inner.state_dict()

    def load_state_dict(self, state_dict) -> None:
        self.inner.load_state_dict(state_dict)

    def add_param_group(self, param_group) -> None:
        self.inner.add_param_group(param_group)

"""Gradient averaging for the parameters RSDP leaves replicated (LayerNorm, small layers...).

[Note: when replicated gradients are synchronised]
A forward hook on the root module registers a hook on each output tensor; the first of those
to fire during a backward queues an autograd-engine callback, which runs once that backward has
finished. The callback all-reduces every replicated gradient in one flat buffer, in a fixed
order, so all ranks issue the same collective even if some parameter got no gradient on some
rank (that rank contributes zeros, like DDP's unused parameters; a parameter unused on every
rank keeps ``grad=None``). The result is divided by the group size (DDP averages), and is
bit-identical on every rank, so replicas never drift.

Contract: every rank runs a backward through the root's outputs the same number of times.
"""
from __future__ import annotations

from typing import List

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function
from torch.utils._pytree import tree_flatten

__all__ = ["ReplicatedGradSync"]


class ReplicatedGradSync:
    """Averages ``params``' gradients over ``group`` at the end of every backward."""

    def __init__(self, root: nn.Module, params: List[nn.Parameter], group=None):
        self.params = params
        self.group = group
        self.enabled = True
        self._queued = False
        self._handle = root.register_forward_hook(self._on_forward)

    def remove(self) -> None:
        self._handle.remove()

    def _on_forward(self, module, args, output):
        if not torch.is_grad_enabled() or not self.enabled:
            return
        for t in tree_flatten(output)[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(self._on_output_grad)

    def _on_output_grad(self, grad):
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._sync)
        return grad

    def _sync(self) -> None:
        self._queued = False
        self.sync()

    @torch.no_grad()
    def sync(self) -> None:
        """All-reduce (average) the replicated gradients now. Collective."""
        if not self.params:
            return
        W = dist.get_world_size(self.group)
        by_dtype = {}
        for p in self.params:
            by_dtype.setdefault(p.dtype, []).append(p)
        for dtype, ps in by_dtype.items():
            n = sum(p.numel() for p in ps)
            flat = torch.zeros(n + len(ps), dtype=torch.float64 if dtype == torch.float64
                               else torch.float32, device=ps[0].device)
            off = 0
            for i, p in enumerate(ps):
                if p.grad is not None:
                    flat[off:off + p.numel()].copy_(p.grad.reshape(-1))
                    flat[n + i] = 1
                off += p.numel()
            with record_function("RSDP::replicated_all_reduce"):
                if W > 1:
                    dist.all_reduce(flat, group=self.group)
            flat[:n].div_(W)
            off = 0
            for i, p in enumerate(ps):
                if flat[n + i] > 0:
                    g = flat[off:off + p.numel()].view_as(p)
                    if p.grad is None:
                        p.grad = g.to(p.dtype).clone()
                    else:
                        p.grad.copy_(g)
                off += p.numel()

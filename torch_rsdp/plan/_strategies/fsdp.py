"""FSDP2-backed strategies: ``full_shard`` (ZeRO-3), ``shard_grad_op`` (ZeRO-2) and
``hybrid_shard`` (HSDP).

Each calls torch's ``fully_shard`` on the unit with every parameter of the subtree that another
unit owns in ``ignored_params``; ``full_shard`` / ``shard_grad_op`` shard over the plan's group
(``reshard_after_forward=True`` / ``False``), ``hybrid_shard`` over a (replicate = nodes,
shard = ranks of a node) mesh (:mod:`.._mesh`; on one node it is ``full_shard``). Their
parameters become DTensors, which carry their own placement: the whole value is
``full_tensor()``, a rank's part of a whole value ``distribute_tensor`` without communication.
"""
from __future__ import annotations

from typing import List

import torch.nn as nn
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from ..._compression import FeedbackReduceScatter
from .._ownership import Unit, qualified_params
from .base import ApplyContext, Cost, StrategyHandler, fsdp_kwargs, register

__all__ = ["FullShard", "ShardGradOp", "HybridShard"]


class _FSDP(StrategyHandler):
    fsdp = True
    compressible = True
    reshard_after_forward = True
    #: Whether the reduce-scatter crosses nodes (error feedback belongs there).
    scatters_across_nodes = True

    def mesh(self, ctx: ApplyContext, compression=None):
        return ctx.meshes.flat(compression)

    def apply(self, unit: Unit, ctx: ApplyContext) -> List[nn.Parameter]:
        own = {id(p) for p in unit.params.values()}
        ignored = {p for p in unit.module.parameters() if id(p) not in own}
        kwargs = fsdp_kwargs(ctx.mp, ctx.offload)
        comp = ctx.unit_compression(unit)
        fully_shard(unit.module, mesh=self.mesh(ctx, comp),
                    reshard_after_forward=self.reshard_after_forward,
                    ignored_params=ignored or None, **kwargs)
        # All-gather and reduce-scatter buffers from the backend's communication memory,
        # which rsdp reads in one copy (torch_rsdp._comm_memory); other backends give
        # torch.empty.
        unit.module.set_allocate_memory_from_process_group_for_comm(True)
        if comp and comp["error_feedback"] and self.scatters_across_nodes:
            # Gradients cross nodes quantised: keep what that loses for the next step.
            unit.feedback = FeedbackReduceScatter()
            unit.module.set_custom_reduce_scatter(unit.feedback)
        # fully_shard replaced the parameters by DTensors: refresh the unit's view of them.
        unit.params = {n: p for n, p in qualified_params(unit).items()
                       if not any(p is q for q in ignored)}
        return []

    #: All-gathers of the weights per step (forward, and backward after a reshard).
    gathers = 2

    def cross_node(self, u, links):
        # a rail moves a node's share P / L of the unit (the rest stays in the node)
        rail = u.param_bytes / links.local
        return ([("all_gather", rail, "weights")] * self.gathers
                + [("reduce_scatter", u.trainable / links.local, "grads")])

    def feedback_bytes(self, u, links):
        # FeedbackReduceScatter: one float32 region of the output (P / W) per node
        return 4 * u.numel / links.world * links.nodes

    def set_gradient_sync(self, unit: Unit, enabled: bool) -> None:
        if isinstance(unit.module, FSDPModule):
            unit.module.set_requires_gradient_sync(enabled, recurse=False)

    def full_value(self, unit, key, value, rank0_only, scratch):
        return value.full_tensor() if isinstance(value, DTensor) else value.detach()

    def local_value(self, unit, key, full, current):
        if not isinstance(current, DTensor):
            return full
        if tuple(full.shape) != tuple(current.shape):
            raise ValueError(f"torch_rsdp.plan.load_full_state_dict: {key!r} has shape "
                             f"{tuple(full.shape)}, the model expects {tuple(current.shape)}")
        return distribute_tensor(full.to(current.dtype), current.device_mesh,
                                 current.placements, src_data_rank=None)


@register
class FullShard(_FSDP):
    kind = "full_shard"

    def cost(self, u, links, f, bucket) -> Cost:
        P, G, W, t = u.param_bytes, u.trainable, links.world, links.t
        return Cost(state=(P + f * G) / W, grads=G / W, live=u.act_bytes,
                    transient=u.temp_bytes + 2 * P + 2 * G,
                    comm_s=2 * t("all_gather", P) + t("reduce_scatter", G), stepped=G / W,
                    accumulation_bytes=G)


@register
class ShardGradOp(_FSDP):
    kind = "shard_grad_op"
    reshard_after_forward = False
    gathers = 1

    def cost(self, u, links, f, bucket) -> Cost:
        P, G, W, t = u.param_bytes, u.trainable, links.world, links.t
        return Cost(state=(P + f * G) / W, grads=G / W, live=u.act_bytes + P * (W - 1) / W,
                    transient=u.temp_bytes + P + 1.5 * G,
                    comm_s=t("all_gather", P) + t("reduce_scatter", G), stepped=G / W,
                    accumulation_bytes=G)


@register
class HybridShard(_FSDP):
    kind = "hybrid_shard"

    scatters_across_nodes = False  # its reduce-scatter stays in the node; the rails
    # all-reduce, compressed without feedback (FSDP2 issues that all-reduce itself)

    def mesh(self, ctx: ApplyContext, compression=None):
        return ctx.meshes.hybrid(compression)

    def cross_node(self, u, links):
        return [("all_reduce", u.trainable / links.local, "grads")]

    def feedback_bytes(self, u, links):
        return 0.0

    def applicable(self, u, links) -> bool:
        return u.param_bytes > 0 and links.nodes > 1

    def cost(self, u, links, f, bucket) -> Cost:
        P, G, L, t = u.param_bytes, u.trainable, links.local, links.t
        return Cost(state=(P + f * G) / L, grads=G / L, live=u.act_bytes,
                    transient=u.temp_bytes + 2 * P + 2 * G,
                    comm_s=(2 * t("all_gather", P, "intra") + t("reduce_scatter", G, "intra")
                            + t("all_reduce", G / L, "inter")),
                    stepped=G / L, accumulation_bytes=G)

    def fallback(self, links) -> str:
        return "full_shard" if links.nodes == 1 else "no_shard"

"""Replicated strategies: ``no_shard`` (DDP) and ``shard_optim`` (ZeRO-1).

Every rank holds the unit's parameters whole; their gradients are averaged by the plan's one
bucketed gradient sync (:class:`torch_rsdp._grad_sync.GradSync`), overlapped with backward.
``shard_optim`` also gives each parameter one owner rank that alone keeps its optimizer state
and steps it, then broadcasts it (:class:`~torch_rsdp.plan._optim.OptimizerSharding`).
"""
from __future__ import annotations

from typing import List

import torch.nn as nn

from .._ownership import Unit
from .base import ApplyContext, Cost, StrategyHandler, cast_unit, register

__all__ = ["NoShard", "ShardOptim"]


@register
class NoShard(StrategyHandler):
    kind = "no_shard"
    compressible = True

    def apply(self, unit: Unit, ctx: ApplyContext) -> List[nn.Parameter]:
        params = list(unit.params.values())
        cast_unit(unit, params, ctx.mp)
        ctx.unit_compression(unit)  # the plan's gradient sync reads unit.compression
        return params

    def applicable(self, u, links) -> bool:
        return True  # also a unit without parameters

    def cross_node(self, u, links):
        return [("all_reduce", u.trainable / links.local, "grads")]

    def feedback_bytes(self, u, links):
        # FeedbackAllReduce: the reduce-scatter's (nodes x P / W) and the owner's (P / W)
        return 4 * u.numel / links.world * (links.nodes + 1)

    def cost(self, u, links, f, bucket) -> Cost:
        P, G = u.param_bytes, u.trainable
        return Cost(state=P + f * G, grads=G, live=u.act_bytes,
                    transient=u.temp_bytes + min(G, bucket),
                    comm_s=links.t("all_reduce", G), stepped=G)


@register
class ShardOptim(NoShard):
    kind = "shard_optim"

    def apply(self, unit: Unit, ctx: ApplyContext) -> List[nn.Parameter]:
        params = super().apply(unit, ctx)
        ctx.optim_sharded += params
        return params

    def applicable(self, u, links) -> bool:
        return u.param_bytes > 0

    def cost(self, u, links, f, bucket) -> Cost:
        P, G, W = u.param_bytes, u.trainable, links.world
        broadcast = links.t("broadcast", G / W) * W if W > 1 else 0.0  # owners after the step
        return Cost(state=P + f * G / W, grads=G, live=u.act_bytes,
                    transient=u.temp_bytes + min(G, bucket),
                    comm_s=links.t("all_reduce", G) + W * links.t("broadcast", G / W),
                    stepped=G / W, after_step_comm_s=broadcast, step_bytes=G / W)

"""``rotate``: RSDP (:mod:`torch_rsdp.rsdp`), the unit's shards rotating around the ring.

The unit is passed to :func:`torch_rsdp.rsdp.shard`, restricted to the modules whose
parameters the unit owns. What RSDP cannot decompose stays whole and joins the plan's
replicated parameters (``rsdp.shard(sync_replicated=False)``: the plan averages them with its
other replicated parameters, in buckets of their own unit). Sharded gradients travel home with
the counter-rotation backward does anyway, so there is no gradient sync to turn off.
Compressed (``rotate+int8``): the unit rotates over the plan's compressed group
(:meth:`.._mesh.Meshes.group_for`), whose ring hops between nodes carry int8 weights and int8 /
int4 gradient partial sums (:func:`torch_rsdp.set_compression`'s ``ring_shift`` /
``ring_shift_reduce``), with error feedback on the rank at each node boundary
(``RingFeedback``). Everything goes through ``rsdp``'s public API:
:func:`~torch_rsdp.rsdp.shard` and the state it attaches (:class:`torch_rsdp.rsdp.RSDPState`: ``set_error_feedback`` drops
that feedback when the plan asks for none; ``full_tensors``, ``local_shard_of``,
``holds_shard`` and ``shard_dim`` answer the checkpoint's questions).
"""
from __future__ import annotations

from typing import List

import torch.nn as nn

from ...rsdp import rsdp_state, shard
from .._ownership import Unit, qualified_params
from .base import ApplyContext, Cost, StrategyHandler, cast_unit, register

__all__ = ["Rotate"]


@register
class Rotate(StrategyHandler):
    kind = "rotate"
    compressible = True

    def apply(self, unit: Unit, ctx: ApplyContext) -> List[nn.Parameter]:
        own = {id(p) for p in unit.params.values()}

        def owned(name, mod):
            ps = list(mod.parameters(recurse=False))
            return bool(ps) and all(id(p) in own for p in ps)

        comp = ctx.unit_compression(unit)
        group = ctx.meshes.group_for(comp) if comp else ctx.group
        shard(unit.module, group, filter=owned, mp_policy=ctx.mp,
              sync_module_states=False, sync_replicated=False, checkpoint_hooks=False,
              offload_policy=ctx.offload)
        st = rsdp_state(unit.module)
        if comp and not comp["error_feedback"]:
            st.set_error_feedback(False)
        sharded = {id(p) for p in st.sharded_parameters()}
        unit.params = {n: p for n, p in qualified_params(unit).items()
                       if id(p) in own or id(p) in sharded}
        prefix = unit.name + "." if unit.name else ""
        reasons = {prefix + e.name: e.reason for e in st.left_whole}
        whole = []
        for n, p in unit.params.items():
            if id(p) not in sharded:
                unit.left_whole[n] = (reasons.get(n, "not decomposable by rotation")
                                      + " (replicated, gradient averaged)")
                whole.append(p)
        cast_unit(unit, whole, ctx.mp)
        # rsdp.shard leaves deeper units' parameters whole too: those units sync their own.
        return whole

    def full_value(self, unit, key, value, rank0_only, scratch):
        # One gatherer at a time: a unit's keys are adjacent, and the gatherer holds its last
        # module's shards from every rank until it is dropped.
        name, gather = scratch.get(self.kind, (None, None))
        if gather is None or name != unit.name:
            gather = rsdp_state(unit.module).full_tensors(rank0_only)
            scratch[self.kind] = (unit.name, gather)
        rel = unit.relative(key)
        return gather.full(rel) if gather.owns(rel) else value.detach()

    def local_value(self, unit, key, full, current):
        return rsdp_state(unit.module).local_shard_of(unit.relative(key), full)

    def holds_shard(self, unit, key):
        return rsdp_state(unit.module).holds_shard(unit.relative(key))

    def checkpoint_refusal(self, unit, key):
        try:
            rsdp_state(unit.module).shard_dim(unit.relative(key))
        except ValueError as e:
            return str(e)
        return None

    def cross_node(self, u, links):
        # Each node boundary carries every shard shift once: forward's and backward's weight
        # rotations (W-1 hops each) and the gradient accumulators' W-1 hops.
        hop, W = u.rotate_bytes / links.world, links.world
        return ([("ring_shift", hop, "weights")] * (2 * (W - 1))
                + [("ring_shift", u.trainable_rotate / W, "grads")] * (W - 1))

    def feedback_bytes(self, u, links):
        # RingFeedback: a float32 shard per gradient hop, (W-1)/W of the rotating parameters,
        # on the boundary rank of each node (the planner prices the rank that holds most)
        if not u.param_bytes:
            return 0.0
        W = links.world
        return 4 * u.numel * u.rotate_bytes / u.param_bytes * (W - 1) / W

    def applicable(self, u, links) -> bool:
        return u.param_bytes > 0 and u.rotate_bytes > 0

    def cost(self, u, links, f, bucket) -> Cost:
        P, W, pr, gr = u.param_bytes, links.world, u.rotate_bytes, u.trainable_rotate
        rest, grest = P - pr, u.trainable - gr
        t = links.t
        return Cost(state=(pr + f * gr) / W + rest + f * grest, grads=gr / W + grest,
                    live=u.act_bytes, transient=u.temp_bytes + (pr + gr) / W,
                    comm_s=(W - 1) * (2 * t("ring_shift", pr / W) + t("ring_shift", gr / W))
                    + t("all_reduce", grest),
                    stepped=gr / W + grest)

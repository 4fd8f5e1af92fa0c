"""``split:k``: OSDP's operator splitting (:mod:`.split_linear`).

Each Linear / ``Conv1D`` weight the unit owns (and no other module shares) is computed in ``k``
input-feature slices, each sharded by rows over the group and gathered only while it is used.
Everything else of the unit (biases, norms, tied weights) stays replicated and joins the plan's
gradient sync. A split weight's local part is a row shard of the whole weight: the whole value
is the slices gathered side by side, a rank's part of a whole value its rows.
"""
from __future__ import annotations

from typing import Dict, List

import torch.nn as nn

from .._ownership import Unit
from .base import ApplyContext, Cost, StrategyHandler, cast_unit, register
from .split_linear import (full_weight, in_features, is_split, is_splittable, local_rows_of,
                           set_sync_grads, split_linear)

__all__ = ["Split"]


def _split_module(unit: Unit, key: str):
    """The split module whose ``weight`` is ``key``, else None."""
    path, _, attr = unit.relative(key).rpartition(".")
    if attr != "weight":
        return None
    mod = unit.module.get_submodule(path) if path else unit.module
    return mod if is_split(mod) else None


@register
class Split(StrategyHandler):
    kind = "split"
    exact_why = "its slices are gathered and reduced by the split layers' own collectives"
    takes_k = True

    def check(self, model, unit_name, modules) -> None:
        k = self.strategy.k
        for name, mod in modules:
            if is_splittable(mod) and k > in_features(mod):
                raise ValueError(f"torch_rsdp.plan: {unit_name or '<root>'!r} is split:{k} but "
                                 f"its layer {name!r} has only {in_features(mod)} input "
                                 f"features")

    def apply(self, unit: Unit, ctx: ApplyContext) -> List[nn.Parameter]:
        own = {id(p): n for n, p in unit.params.items()}
        seen: Dict[int, int] = {}
        for _, p in unit.module.named_parameters(remove_duplicate=False):
            seen[id(p)] = seen.get(id(p), 0) + 1
        mp = ctx.mp
        kw = {}
        if mp is not None:
            kw = dict(param_dtype=mp.param_dtype, reduce_dtype=mp.reduce_dtype,
                      output_dtype=mp.output_dtype)
        split_ids = set()
        for _, mod in list(unit.module.named_modules()):
            if is_splittable(mod) and id(mod.weight) in own and seen[id(mod.weight)] == 1:
                qn = own.pop(id(mod.weight))
                split_linear(mod, self.strategy.k, ctx.group, **kw)
                unit.params[qn] = mod.weight
                split_ids.add(id(mod.weight))
        rest = [p for p in unit.params.values() if id(p) not in split_ids]
        for n, p in unit.params.items():
            if id(p) not in split_ids:
                why = ("tied to another module's parameter" if seen.get(id(p), 1) > 1
                       else "not a Linear weight")
                unit.left_whole[n] = why + " (replicated, gradient averaged)"
        cast_unit(unit, rest, mp)
        return rest

    def set_gradient_sync(self, unit: Unit, enabled: bool) -> None:
        for mod in unit.module.modules():
            if is_split(mod):
                set_sync_grads(mod, enabled)

    def full_value(self, unit, key, value, rank0_only, scratch):
        mod = _split_module(unit, key)
        return full_weight(mod) if mod is not None else value.detach()

    def local_value(self, unit, key, full, current):
        mod = _split_module(unit, key)
        return local_rows_of(mod, full) if mod is not None else full

    def holds_shard(self, unit, key):
        return _split_module(unit, key) is not None

    def applicable(self, u, links) -> bool:
        return u.param_bytes > 0 and u.linear_bytes > 0

    def cost(self, u, links, f, bucket) -> Cost:
        P, W, k, t = u.param_bytes, links.world, self.strategy.k, links.t
        pl, gl = u.linear_bytes, u.trainable_linear
        rest, grest = P - pl, u.trainable - gl
        return Cost(state=(pl + f * gl) / W + rest + f * grest, grads=gl / W + grest,
                    live=u.act_bytes, transient=u.temp_bytes + (2 * pl + gl) / k,
                    comm_s=(k * (2 * t("all_gather", pl / k) + t("reduce_scatter", gl / k))
                            + t("all_reduce", grest)),
                    stepped=gl / W + grest, accumulation_bytes=gl)

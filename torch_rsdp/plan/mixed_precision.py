"""One mixed-precision policy for every strategy.

The policy is FSDP2's :class:`torch.distributed.fsdp.MixedPrecisionPolicy` (``param_dtype``,
``reduce_dtype``, ``output_dtype``, ``cast_forward_inputs``): parameters are kept in their own
dtype (the optimizer's master copy) and computed with in ``param_dtype``; gradients are reduced
in ``reduce_dtype``. FSDP2 units take it as it is, RSDP (``rotate``) gets the equivalent
:class:`torch_rsdp.rsdp.MixedPrecision`, ``split:k`` casts each gathered slice, and units whose
parameters stay replicated (``no_shard``, ``shard_optim``) get :func:`cast_replicated`: during
their forward each parameter is replaced by a ``param_dtype`` copy, through which autograd
carries the gradient back to the full-precision parameter, as FSDP2 does with its unsharded
parameters.
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.nn.utils.stateless import _reparametrize_module
from torch.utils._pytree import tree_map

from ..rsdp.shard_state import MixedPrecision

__all__ = ["as_policy", "to_rsdp", "cast_replicated"]


def as_policy(mp) -> Optional[MixedPrecisionPolicy]:
    """``None``, an FSDP2 ``MixedPrecisionPolicy`` or a ``torch_rsdp.rsdp.MixedPrecision``."""
    if mp is None or isinstance(mp, MixedPrecisionPolicy):
        return mp
    if isinstance(mp, MixedPrecision):
        return MixedPrecisionPolicy(param_dtype=mp.param_dtype, reduce_dtype=mp.reduce_dtype,
                                    output_dtype=mp.output_dtype)
    raise TypeError(f"torch_rsdp.plan: mp_policy must be a torch.distributed.fsdp."
                    f"MixedPrecisionPolicy, got {type(mp).__name__}")


def to_rsdp(mp: Optional[MixedPrecisionPolicy]) -> Optional[MixedPrecision]:
    if mp is None:
        return None
    return MixedPrecision(param_dtype=mp.param_dtype, reduce_dtype=mp.reduce_dtype,
                          output_dtype=mp.output_dtype)


def _cast(dtype):
    def f(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            return x.to(dtype)
        return x
    return f


def cast_replicated(module: nn.Module, names: Dict[str, nn.Parameter],
                    mp: MixedPrecisionPolicy) -> None:
    """Makes ``module``'s forward compute with ``param_dtype`` copies of the parameters
    ``names`` (dotted names relative to ``module``), cast floating inputs (if the policy says
    so) and outputs (to ``output_dtype``)."""
    pdt = mp.param_dtype
    if pdt is None and mp.output_dtype is None:
        return
    stack = []

    def pre(mod, args, kwargs):
        casted = {}
        if pdt is not None:
            by_id: Dict[int, torch.Tensor] = {}
            for n, p in names.items():
                if p.is_floating_point() and p.dtype != pdt:
                    if id(p) not in by_id:  # tied parameters share one copy
                        by_id[id(p)] = p.to(pdt)
                    casted[n] = by_id[id(p)]
        ctx = _reparametrize_module(mod, casted, tie_weights=True) if casted else None
        if ctx is not None:
            ctx.__enter__()
        stack.append(ctx)
        if pdt is not None and mp.cast_forward_inputs:
            return tree_map(_cast(pdt), args), tree_map(_cast(pdt), kwargs)
        return None

    def post(mod, args, kwargs, output):
        ctx = stack.pop()
        if ctx is not None:
            ctx.__exit__(None, None, None)
        if mp.output_dtype is not None:
            return tree_map(_cast(mp.output_dtype), output)
        return None

    module.register_forward_pre_hook(pre, with_kwargs=True)
    module.register_forward_hook(post, with_kwargs=True, always_call=True)

"""One mixed-precision policy for every strategy.

The policy is FSDP2's :class:`torch.distributed.fsdp.MixedPrecisionPolicy` (``param_dtype``,
``reduce_dtype``, ``output_dtype``, ``cast_forward_inputs``): parameters are kept in their own
dtype (the optimizer's master copy) and computed with in ``param_dtype``; gradients are reduced
in ``reduce_dtype``. FSDP2 units and RSDP (``rotate``) take it as it is, ``split:k`` casts
each gathered slice, and units whose
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

__all__ = ["as_policy", "cast_replicated"]


def as_policy(mp) -> Optional[MixedPrecisionPolicy]:
    """``mp`` itself when it is ``None`` or an FSDP2 ``MixedPrecisionPolicy``; else a
    ``TypeError``."""
    if mp is None or isinstance(mp, MixedPrecisionPolicy):
        return mp
    raise TypeError(f"torch_rsdp.plan: mp_policy must be a torch.distributed.fsdp."
                    f"MixedPrecisionPolicy, got {type(mp).__name__}")


def _cast(dtype):
    def f(x):
        if isinstance(x, torch.Tensor) and x.is_floating_point() and x.dtype != dtype:
            return x.to(dtype)
        return x
    return f


def cast_replicated(module: nn.Module, names: Dict[str, nn.Parameter],
                    mp: MixedPrecisionPolicy) -> None:
    """Makes ``module`` compute with ``param_dtype`` copies of the parameters ``names``
    (dotted names relative to ``module``) and return ``output_dtype`` outputs.

    The cast is made by each module that *holds* such a parameter, around its own forward,
    which also casts its floating inputs: a norm inside a replicated unit may receive the
    output of a sharded sibling in ``output_dtype``, and must still compute in one dtype."""
    pdt = mp.param_dtype
    if pdt is not None:
        holders: Dict[str, Dict[str, nn.Parameter]] = {}
        for n, p in names.items():
            if p.is_floating_point() and p.dtype != pdt:
                path, _, attr = n.rpartition(".")
                holders.setdefault(path, {})[attr] = p
        for path, params in holders.items():
            _cast_holder(module.get_submodule(path) if path else module, params, pdt)
    if mp.output_dtype is not None:
        out = _cast(mp.output_dtype)
        module.register_forward_hook(lambda mod, args, output: tree_map(out, output))


def _cast_holder(mod: nn.Module, params: Dict[str, nn.Parameter], pdt: torch.dtype) -> None:
    stack = []
    cast_in = _cast(pdt)

    def pre(m, args, kwargs):
        # by name: the plan re-registers replicated parameters as DTensors after this hook
        ctx = _reparametrize_module(m, {n: m._parameters[n].to(pdt) for n in params})
        ctx.__enter__()
        stack.append(ctx)
        return tree_map(cast_in, args), tree_map(cast_in, kwargs)

    def post(m, args, kwargs, output):
        stack.pop().__exit__(None, None, None)

    mod.register_forward_pre_hook(pre, with_kwargs=True)
    mod.register_forward_hook(post, with_kwargs=True, always_call=True)

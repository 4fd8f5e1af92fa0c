"""State dicts of sharded models: private copies, loads of any form, and layouts refused.

Neutral ground (torch and :mod:`torch_rsdp._dtensor_params` only): :func:`torch_rsdp.rsdp.shard` and :func:`torch_rsdp.plan.apply`
both install these hooks.

Every sharded parameter is a ``DTensor`` (:mod:`torch_rsdp._dtensor_params`), so
``torch.distributed.checkpoint`` already sees each piece for what it is. What the hooks add:

[Note: checkpoint hooks]
* the model's ``state_dict`` and every optimizer's over it hold *copies* ([Note: copies]);
* the model's ``load_state_dict`` (a pre-hook) takes, for a DTensor parameter, a DTensor of its
  placements, a DTensor of another layout (gathered whole first: collective, every rank loads
  the same keys), the whole tensor (``full_state_dict=True``, ``torch.load`` of a plain
  checkpoint: this rank's ``torch.chunk`` piece is taken) or this rank's part; an optimizer's
  state of such a parameter likewise;
* a shard that is not one ``torch.chunk`` piece per rank (``nn.MultiheadAttention``'s packed
  heads) stays a plain local tensor, which
  DCP would take for a whole one: its state dict and load raise, naming the key
  (``plan.full_state_dict`` still serves it);
* ``shard_optim``'s optimizers mark their parameter groups "per_owner" and a full state dict
  missing an owner's state refuses to load (:func:`_check_owned`).

Optimizers are hooked the first time they step (a global step pre-hook: ``set_state_dict`` and
``get_state_dict`` step an optimizer with no state once, with zero gradients and learning
rate, before they touch its state), or by ``make_optimizer`` at once. State loaded into an
optimizer before its first step (a trainer resuming from a checkpoint) is taken then, as the
load hook would have taken it (:func:`_adopt_early_state`).

[Note: copies]
Every value of the model's and the optimizer's state dicts is a copy of this rank's tensor
(while the state dict lives: this rank's share of the model and of the optimizer state), not
the tensor itself, as it is on an unhooked module: ``dcp.load`` then fills the copies, and the
model and optimizer change only in ``load_state_dict``, once every file has been read, so a
load that fails halfway (a missing or truncated file) leaves both as they were. (A view would
also meet a limit of ``async_save``'s staging: a DTensor over a view at a non-zero offset
inherits that offset, and staging takes the wrapper for a tensor with storage of its own.)

[Note: loading a materialised model in place]
A model just allocated by ``to_empty`` (:mod:`torch_rsdp._materialize`) holds nothing worth
protecting, and copies would make loading it peak at twice this rank's share. Until it is
first loaded (``load_state_dict``) or run (its first forward), its state dict holds its own
tensors: ``dcp.load(model.state_dict(), ...)`` fills the shards in place, and loading peaks at
this rank's share plus what the reader holds in flight.

The copies are recorded (:func:`is_private_copy`): :class:`torch_rsdp.plan.CopyOnceStager`
lets ``dcp.async_save`` take them as its staged state dict instead of copying them again.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable, Dict, Optional

import torch
import torch.nn as nn
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_pre_hook

from ._dtensor_params import like_param

__all__ = ["install", "hook_optimizer", "raw_state_dict", "refusal_of", "state_keys",
           "STATE_KEY", "is_private_copy"]

#: The copies the hooks made for state dicts ([Note: copies]), while they live: id -> weak
#: reference (a WeakSet would compare tensors by value).
_PRIVATE: Dict[int, "weakref.ref[torch.Tensor]"] = {}


def _record(c: torch.Tensor) -> torch.Tensor:
    key = id(c)
    _PRIVATE[key] = weakref.ref(c, lambda _r, key=key: _PRIVATE.pop(key, None))
    return c


def _private(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` that nothing else holds, recorded as such."""
    return _record(t.detach().clone(memory_format=torch.contiguous_format))


def is_private_copy(t: torch.Tensor) -> bool:
    """Whether ``t`` (or a DTensor's local tensor) is a copy these hooks made for a state
    dict, which training never writes to."""
    for x in ((t, t._local_tensor) if isinstance(t, DTensor) else (t,)):
        ref = _PRIVATE.get(id(x))
        if ref is not None and ref() is x:
            return True
    return False


_RAW = [0]  # > 0 inside raw_state_dict()


def refusal_of(p: torch.Tensor) -> Optional[str]:
    """Why parameter ``p`` cannot be checkpointed as it is (a layout DCP cannot describe), as
    :func:`install` recorded it on the parameter; None if it can."""
    return getattr(p, "_rsdp_refusal", None)


@contextlib.contextmanager
def raw_state_dict():
    """``state_dict`` / ``load_state_dict`` without the hooks: local shards as they are."""
    _RAW[0] += 1
    try:
        yield
    finally:
        _RAW[0] -= 1


#: How a rank's optimizer state dict covers the parameters, in every parameter group:
#: "whole" (every parameter it steps), or "per_owner" (``torch_rsdp.plan``'s ``shard_optim``:
#: each rank holds the state of the parameters it owns).
STATE_KEY = "shard_optim_state"

#: ``key -> None`` when the parameter can be checkpointed as it is, else why not.
RefusalFn = Callable[[str], Optional[str]]


def install(model: nn.Module, keys, refusal: RefusalFn) -> None:
    """Hooks ``model`` ([Note: checkpoint hooks]).

    Args:
        model: the root module.
        keys: the parameter names (state-dict keys) to ask ``refusal`` about.
        refusal: ``key ->`` None, or why a checkpoint cannot hold it (naming the key and who
            sharded it).
    """
    refused: Dict[str, str] = {}
    params = dict(model.named_parameters(remove_duplicate=False))
    for p in params.values():
        p._rsdp_checkpointed = True  # optimizers over it get the hooks
    for key in keys:
        p = params[key]
        if isinstance(p, DTensor):
            continue  # torch sees it for what it is
        why = refusal(key)
        if why is not None:
            refused[key] = why
            if refusal_of(p) is None:  # a tied parameter: its first key speaks for it
                p._rsdp_refusal = why
    dtensors = {k: p for k, p in params.items() if isinstance(p, DTensor)}

    def on_state_dict(module, state_dict, prefix, local_metadata):
        if _RAW[0]:
            return
        for full_key, value in list(state_dict.items()):
            if not full_key.startswith(prefix):
                continue
            why = refused.get(full_key[len(prefix):])
            if why is not None:
                raise ValueError(why)
            # [Note: copies]; [Note: loading a materialised model in place]
            if isinstance(value, torch.Tensor) and not getattr(module, "_rsdp_unloaded", 0):
                state_dict[full_key] = _private(value)

    def on_load(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        module._rsdp_unloaded = False
        if _RAW[0]:
            return
        for key, why in refused.items():
            if prefix + key in state_dict:
                raise ValueError(why)
        for key, p in dtensors.items():  # whole tensors or local parts into DTensor parameters
            full_key = prefix + key
            if full_key in state_dict:
                state_dict[full_key] = like_param(p, state_dict[full_key], repr(full_key))

    model.register_state_dict_post_hook(on_state_dict)
    model.register_load_state_dict_pre_hook(on_load)


# ------------------------------------------------------------------------------ optimizers
def state_keys(opt: torch.optim.Optimizer, state_dict: dict) -> Dict[object, torch.Tensor]:
    """Key of ``state_dict["state"]`` -> parameter of ``opt``. The keys are what
    ``state_dict["param_groups"]`` lists, in the order of ``opt.param_groups``: integers from
    ``Optimizer.state_dict()``, parameter names from ``torch.distributed.checkpoint``'s
    ``set_state_dict``."""
    return dict(zip((k for g in state_dict.get("param_groups", []) for k in g["params"]),
                    (p for g in opt.param_groups for p in g["params"])))


def _convert_state(opt: torch.optim.Optimizer, state_dict: dict, convert) -> dict:
    """``convert(param, state name, tensor)`` on every state tensor (not scalars), into new
    dicts (the caller's stay as they are)."""
    params = state_keys(opt, state_dict)
    state = dict(state_dict.get("state", {}))
    state_dict["state"] = state
    for key in list(state):
        p = params.get(key)
        state[key] = {k: convert(p, key, k, v) if isinstance(v, torch.Tensor) and v.dim() else v
                      for k, v in state[key].items()}
    return state_dict


def _present(p, key, name: str, v: torch.Tensor):
    why = refusal_of(p) if p is not None else None
    if why is not None and not isinstance(v, DTensor) and v.shape == p.shape:
        raise ValueError(f"optimizer state {name!r} of {key!r}: {why}")
    return _private(v)  # [Note: copies]


def _take(p, key, name: str, v: torch.Tensor):
    if p is None:
        return v
    why = refusal_of(p)
    if why is not None and v.shape == p.shape:
        raise ValueError(f"optimizer state {name!r} of {key!r}: {why}")
    # a DTensor parameter's state as the optimizer keeps it: a DTensor of its placements
    return like_param(p, v, f"optimizer state {name!r} of {key!r}")


def _check_owned(opt: torch.optim.Optimizer, state_dict: dict) -> None:
    """Raises if ``state_dict`` is one rank's part of a ``shard_optim`` optimizer's state and
    lacks the state of a parameter ``opt`` steps ([Note: state of other ranks' parameters] in
    :mod:`torch_rsdp.plan._optim`); drops the parameter groups' marker."""
    groups = state_dict.get("param_groups", [])
    per_owner = any(g.get(STATE_KEY) == "per_owner" for g in groups)
    state_dict["param_groups"] = [{k: v for k, v in g.items() if k != STATE_KEY}
                                  for g in groups]
    if not per_owner:
        return
    sharding = getattr(opt, "_rsdp_sharding", None)  # torch_rsdp.plan's OptimizerSharding
    not_mine = {id(p) for p in sharding.not_mine} if sharding is not None else set()
    state = state_dict.get("state", {})
    for key, p in state_keys(opt, state_dict).items():
        has = any(isinstance(v, torch.Tensor) for v in (state.get(key) or {}).values())
        if p.requires_grad and not has and id(p) not in not_mine:
            raise ValueError(
                f"torch_rsdp: no optimizer state for parameter {key!r} in this state "
                f"dict: it was saved by a shard_optim optimizer, whose ranks each hold the "
                f"state of the parameters they step, and a full optimizer state dict holds "
                f"only rank 0's part. Save with torch.distributed.checkpoint (dcp.save of "
                f"get_state_dict's sharded state dict), which keeps every rank's part")


def hook_optimizer(opt: torch.optim.Optimizer) -> None:
    """Hooks ``opt``'s ``state_dict`` / ``load_state_dict`` (once) if it holds parameters
    sharded by torch_rsdp (:func:`install` marked them)."""
    if getattr(opt, "_rsdp_checkpoint_hooks", False):
        return
    opt._rsdp_checkpoint_hooks = True
    if not any(getattr(p, "_rsdp_checkpointed", False) for g in opt.param_groups
               for p in g["params"]):
        return

    def post(optimizer, state_dict):
        if _RAW[0]:
            return None
        for g in state_dict.get("param_groups", []):
            g.setdefault(STATE_KEY, "whole")  # "per_owner" from a shard_optim optimizer
        return _convert_state(optimizer, state_dict, _present)

    def pre(optimizer, state_dict):
        if _RAW[0]:
            return None
        _check_owned(optimizer, state_dict)
        return _convert_state(optimizer, state_dict, _take)

    opt.register_state_dict_post_hook(post)
    opt.register_load_state_dict_pre_hook(pre)


def _adopt_early_state(opt: torch.optim.Optimizer) -> None:
    """State loaded before the hooks existed (a trainer resuming loads a checkpoint's optimizer
    state into the fresh optimizer before its first step): each parameter's state as the load
    hook would have taken it, so a DTensor parameter's moments are DTensors of its placements,
    this rank's part of the whole tensors a full optimizer state dict holds."""
    index = {id(p): i for i, p in enumerate(p for g in opt.param_groups for p in g["params"])}
    for p, st in opt.state.items():
        if not isinstance(p, DTensor) and refusal_of(p) is None:
            continue
        for name, v in list(st.items()):
            if isinstance(v, torch.Tensor) and v.dim() and not isinstance(v, DTensor):
                st[name] = _take(p, index.get(id(p)), name, v)


def _on_any_step(opt, args, kwargs) -> None:
    if not getattr(opt, "_rsdp_checkpoint_hooks", False):
        hook_optimizer(opt)
        if opt.state:
            _adopt_early_state(opt)


register_optimizer_step_pre_hook(_on_any_step)

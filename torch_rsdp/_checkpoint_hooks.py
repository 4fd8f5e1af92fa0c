"""Shards as ``torch.distributed.checkpoint`` sees them: DTensors, for every strategy.

Neutral ground (torch only): :func:`torch_rsdp.rsdp.shard` and :func:`torch_rsdp.plan.apply`
both install these hooks, each telling how its own parameters are split.

``torch.distributed.checkpoint.state_dict.get_state_dict`` / ``set_state_dict`` call
``model.state_dict()``, ``model.load_state_dict()``, ``optimizer.state_dict()`` and
``optimizer.load_state_dict()``, and DCP saves and reshards what they hold by its type: a
``DTensor`` is a piece of a global tensor at known offsets, every other tensor is replicated
(written once, read whole). FSDP2's parameters are DTensors already and replicated units'
tensors are whole; but RSDP (``rsdp.shard``, the plan's ``rotate``) and ``split:k`` keep plain
local shards under the whole tensor's key, which DCP would take for a replicated tensor: it would write one rank's shard
and, on load, copy a shard where the whole tensor belongs (or fail on the shape).

[Note: checkpoint hooks]
:func:`install` gives every such parameter a :class:`ShardLayout` (from ``rsdp.shard_dim``,
or the plan's strategy handler, ``StrategyHandler.shard_layout``: the dimension it is split
along as ``torch.chunk`` splits it over the group, and the global shape), and hooks

* the model's ``state_dict``: those values become ``DTensor.from_local(shard, mesh of the
  group, [Shard(dim)])`` over a copy of the local shard (no communication; [Note: copies]);
* the model's ``load_state_dict`` (a pre-hook): a DTensor of that layout gives its local
  tensor; a DTensor of another layout is gathered whole first (collective: every rank loads
  the same keys); a whole tensor (``full_state_dict=True``, ``torch.load`` of a plain
  checkpoint) gives this rank's part by slicing; this rank's own part is taken as it is;
* every optimizer over such parameters, ``plan.make_optimizer``'s or any ``torch.optim``:
  its state tensors shaped like the parameter are presented and taken back the same way. An
  optimizer is hooked the first time it steps (a global step hook: ``set_state_dict`` and
  ``get_state_dict`` step an optimizer with no state once, with zero gradients and learning
  rate, before they touch its state), or by ``make_optimizer`` at once.

[Note: copies]
Every value of the model's and the optimizer's state dicts is a copy of this rank's tensor
(while the state dict lives: this rank's share of the model and of the optimizer state), not
the tensor itself, as it is on an unhooked module: ``dcp.load`` then fills the copies, and the
model and optimizer change only in ``load_state_dict``, once every file has been read, so a
load that fails halfway (a missing or truncated file) leaves both as they were. (A view would
also meet a limit of ``async_save``'s staging: a DTensor over a view at a non-zero offset
inherits that offset, and staging takes the wrapper for a tensor with storage of its own.)

The copies are recorded (:func:`is_private_copy`): :class:`torch_rsdp.plan.CopyOnceStager`
lets ``dcp.async_save`` take them as its staged state dict instead of copying them again.

A layout that is not one ``torch.chunk`` piece per rank (``nn.MultiheadAttention``'s heads)
raises when a state dict is taken, naming the key: ``plan.full_state_dict`` still serves it.
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Shard
from torch.optim.optimizer import register_optimizer_step_post_hook

from ._dtensor_params import like_param, local

__all__ = ["ShardLayout", "install", "hook_optimizer", "raw_state_dict", "layout_of",
           "state_keys", "STATE_KEY", "is_private_copy"]

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


@dataclass
class ShardLayout:
    """Where a parameter's local tensor lies in the unwrapped model's tensor ``key``."""

    key: str
    mesh: Optional[DeviceMesh]
    dim: int = 0
    shape: Tuple[int, ...] = ()
    local_shape: Tuple[int, ...] = ()
    local_of: Optional[Callable[[torch.Tensor], torch.Tensor]] = None  # whole -> this rank's
    error: Optional[str] = None  # why a checkpoint cannot describe it

    def present(self, local: torch.Tensor, copy: bool = True) -> torch.Tensor:
        """``local`` (this rank's part, or a tensor shaped like it) as a DTensor, over a copy
        of it (with ``copy``, or where it is a view into a larger storage: [Note: copies])."""
        if self.error is not None:
            raise ValueError(self.error)
        shape = torch.Size(self.shape)
        local = local.detach()
        private = copy or local.storage_offset() or local.numel() == 0
        if private:
            local = _private(local)
        out = DTensor.from_local(local, self.mesh, [Shard(self.dim)], run_check=False,
                                 shape=shape, stride=_contiguous_strides(shape))
        if private:  # from_local wraps a view of the copy: as private as the copy
            _record(out._local_tensor)
        return out

    def take(self, value, what: str) -> torch.Tensor:
        """This rank's part of ``value`` (a DTensor, the whole tensor, or this rank's part)."""
        if self.error is not None:
            raise ValueError(self.error)
        if isinstance(value, DTensor):
            if value.device_mesh == self.mesh and tuple(value.placements) == (Shard(self.dim),):
                return value.to_local()
            value = value.full_tensor()  # another layout: every rank gathers the same keys
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"torch_rsdp: {what}: expected a tensor, got "
                            f"{type(value).__name__}")
        shape = tuple(value.shape)
        if shape == self.shape:
            return self.local_of(value)
        if shape == self.local_shape:
            return value
        raise ValueError(f"torch_rsdp: {what} has shape {shape}; the model holds "
                         f"{self.key!r} as {self.shape} ({self.local_shape} on this rank)")


def _contiguous_strides(shape) -> Tuple[int, ...]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= max(1, d)
    return tuple(reversed(strides))


_RAW = [0]  # > 0 inside raw_state_dict()


def layout_of(p: torch.Tensor) -> Optional[ShardLayout]:
    """The layout :func:`install` gave parameter ``p`` (kept on the parameter itself, so it
    goes with it)."""
    return getattr(p, "_rsdp_layout", None)


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

#: ``key -> (dim, global shape, whole -> this rank's part)``, ``None`` for a value presented
#: as it is; raises ``ValueError`` for a layout a checkpoint cannot describe.
LayoutFn = Callable[[str], Optional[Tuple[int, Tuple[int, ...],
                                          Callable[[torch.Tensor], torch.Tensor]]]]


def install(model: nn.Module, keys, layout: LayoutFn, mesh_fn,
            owner: Callable[[str], str]) -> None:
    """Gives the parameters that need it a layout and hooks ``model`` ([Note: checkpoint
    hooks]).

    Args:
        model: the root module.
        keys: the parameter names (state-dict keys) to ask ``layout`` about.
        layout: ``key -> (dim, global shape, local_of)`` or ``None``.
        mesh_fn: returns the 1-D device mesh of the group the shards are split over.
        owner: ``key ->`` who shards it, named in errors (``"unit 'x', rotate"``).
    """
    by_key: Dict[str, ShardLayout] = {}
    params = dict(model.named_parameters(remove_duplicate=False))
    for p in params.values():
        p._rsdp_checkpointed = True  # optimizers over it get the hooks
    for key in keys:
        p = params[key]
        if isinstance(p, DTensor):
            continue  # torch sees it for what it is already
        try:
            lay = layout(key)
        except ValueError as e:
            by_key[key] = ShardLayout(key, None, error=f"{key!r} ({owner(key)}): {e}")
            if layout_of(p) is None:
                p._rsdp_layout = by_key[key]
            continue
        if lay is None:
            continue
        dim, shape, local_of = lay
        by_key[key] = ShardLayout(key, mesh_fn(), dim, tuple(shape), tuple(local(p).shape),
                                  local_of)
        if layout_of(p) is None:  # a tied parameter: its first key speaks for it
            p._rsdp_layout = by_key[key]

    def on_state_dict(module, state_dict, prefix, local_metadata):
        if _RAW[0]:
            return
        for full_key, value in list(state_dict.items()):
            if not full_key.startswith(prefix):
                continue
            lay = by_key.get(full_key[len(prefix):])
            if lay is not None:
                state_dict[full_key] = lay.present(value)
            elif isinstance(value, torch.Tensor):  # [Note: copies]
                state_dict[full_key] = _private(value)

    dtensors = {k: p for k, p in params.items() if isinstance(p, DTensor) and k not in by_key}

    def on_load(module, state_dict, prefix, local_metadata, strict, missing, unexpected, errors):
        if _RAW[0]:
            return
        for key, lay in by_key.items():
            full_key = prefix + key
            if full_key in state_dict:
                state_dict[full_key] = lay.take(state_dict[full_key], repr(full_key))
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


def _convert_state(opt: torch.optim.Optimizer, state_dict: dict, convert,
                   every: bool = False) -> dict:
    """``convert(layout, name, tensor)`` on the state tensors (not scalars) of parameters
    with a layout (``every``: of every parameter, the layout then maybe ``None``)."""
    params = state_keys(opt, state_dict)
    state = dict(state_dict.get("state", {}))  # the caller's dicts stay as they are
    state_dict["state"] = state
    for key in list(state):
        p = params.get(key)
        lay = layout_of(p) if p is not None else None
        if lay is None and not every:
            continue
        state[key] = {k: convert(lay, k, v) if isinstance(v, torch.Tensor) and v.dim() else v
                      for k, v in state[key].items()}
    return state_dict


def _present(lay: Optional[ShardLayout], name: str, v: torch.Tensor):
    if lay is not None and tuple(v.shape) == lay.local_shape:
        return lay.present(v)
    return _private(v)  # [Note: copies]


def _check_owned(opt: torch.optim.Optimizer, state_dict: dict) -> None:
    """Raises if ``state_dict`` is one rank's part of a ``shard_optim`` optimizer's state and
    lacks the state of a parameter ``opt`` steps ([Note: state of other ranks' parameters] in
    :mod:`torch_rsdp.plan.optim`); drops the parameter groups' marker."""
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
        return _convert_state(optimizer, state_dict, _present, every=True)

    def pre(optimizer, state_dict):
        if _RAW[0]:
            return None
        _check_owned(optimizer, state_dict)
        state_dict = _convert_state(optimizer, state_dict,
                                    lambda lay, k, v: lay.take(v, f"optimizer state {k!r} of "
                                                                  f"{lay.key!r}"))
        # State of DTensor parameters given as plain tensors (a torch.save'd state dict):
        # DTensors again, as the optimizer keeps them.
        params = state_keys(optimizer, state_dict)
        state = state_dict.get("state", {})
        for key, st in state.items():
            p = params.get(key)
            if isinstance(p, DTensor) and isinstance(st, dict):
                state[key] = {k: like_param(p, v, f"optimizer state {k!r} of {key!r}")
                              if isinstance(v, torch.Tensor) and not isinstance(v, DTensor)
                              and v.dim() else v for k, v in st.items()}
        return state_dict

    opt.register_state_dict_post_hook(post)
    opt.register_load_state_dict_pre_hook(pre)


def _on_any_step(opt, args, kwargs) -> None:
    if not getattr(opt, "_rsdp_checkpoint_hooks", False):
        hook_optimizer(opt)


register_optimizer_step_post_hook(_on_any_step)

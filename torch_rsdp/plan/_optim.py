"""ZeRO-1 for ``shard_optim`` units, whatever optimizer steps them.

The user's own ``torch.optim.AdamW(model.parameters())`` (what every trainer builds) gets it
at its first step: a global optimizer step pre-hook finds the ``shard_optim`` parameters of a
plan among the ones it steps and attaches :class:`OptimizerSharding` before anything keeps
state. :func:`make_optimizer` attaches it at once. (An optimizer that is not a
``torch.optim.Optimizer`` has no step hooks: it keeps whole state, as it would anywhere.)

The parameters of ``shard_optim`` units are replicated and their gradients averaged like
``no_shard``'s, but each has one *owner* rank (assigned greedily by size, largest first, to
the least loaded rank, as torch's ``ZeroRedundancyOptimizer`` does), and only the owner keeps
its optimizer state and steps it. After every step each owner broadcasts its updated
parameters (in flat buckets of at most 25 MiB), so every replica is identical again.
Every other parameter (sharded by FSDP2, RSDP or splitting, whose state is sharded with it, or
``no_shard``) is stepped on every rank.

So optimizer-state memory for ``shard_optim`` parameters is about ``1/W`` of ``no_shard``'s,
for one broadcast of the parameters per step.

[Note: ZeRO-1 as hooks]
``make_optimizer`` returns the user's own optimizer class over ``model.parameters()``, with
two step hooks (:class:`OptimizerSharding`): before a step, the gradients of the parameters
another rank owns are set aside (torch's optimizers skip a parameter without a gradient, so
they never get state here), and after it they are put back and every owner broadcasts its
parameters. Everything else is the optimizer's own: ``param_groups`` hold every parameter, as
on one process, so learning-rate schedulers, ``state_dict`` (the state of the parameters this
rank steps) and ``torch.distributed.checkpoint`` (which keys optimizer state by parameter name
and needs the same parameter groups on every rank) work as on any optimizer.

[Note: a closure under ZeRO-1]
``optimizer.step(closure)`` runs the closure (forward and backward) inside ``step``, after the
step pre-hook that sets aside the gradients of other ranks' parameters: those parameters would
then get gradients of the closure's backward alone, be stepped, and get state. So the pre-hook
runs the closure itself first (with gradients enabled, as ``step`` would), sets the complete
gradients aside, and hands ``step`` a closure returning that loss. (LBFGS, which evaluates its
closure several times a step, is refused.)

[Note: state of other ranks' parameters]
``state_dict()`` gives each parameter another rank steps an empty state, so that every rank
presents every parameter, as ``set_state_dict`` requires of a parameter that needs a gradient;
a sharded checkpoint (``dcp.save``) then holds each parameter's real state once, written by its
owner, which any plan at any world size reads back. A *full* optimizer state dict
(``StateDictOptions(full_state_dict=True)``) is rank 0's view, empty for the others'
parameters; its parameter groups say ``"shard_optim_state": "per_owner"``, and loading it where
such a parameter is stepped raises, naming the parameter, instead of silently restarting its
moments (:mod:`torch_rsdp._checkpoint_hooks`; every hooked optimizer's groups carry the
entry, "whole" elsewhere, so that the key exists in every checkpoint).
"""
from __future__ import annotations

import sys
from typing import Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.optim import Optimizer
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.profiler import record_function

from .._dtensor_params import local
from .._grad_sync import DEFAULT_BUCKET_BYTES, pack_buckets
from ._apply import plan_state
from .._checkpoint_hooks import STATE_KEY, hook_optimizer, state_keys

__all__ = ["make_optimizer", "OptimizerSharding", "optimizer_sharding"]


def make_optimizer(model: nn.Module, optimizer_class, *args,
                   bucket_bytes: int = DEFAULT_BUCKET_BYTES, **kwargs) -> Optimizer:
    """``optimizer_class(model.parameters(), *args, **kwargs)``, with the state of
    ``shard_optim`` parameters sharded over the plan's group ([Note: ZeRO-1 as hooks]).

    Args:
        model: a model passed to :func:`torch_rsdp.plan.apply`.
        optimizer_class: a ``torch.optim.Optimizer`` subclass.
        *args, **kwargs: its other arguments (learning rate, ...).
        bucket_bytes: the most bytes one broadcast of owned parameters packs.
    """
    st = plan_state(model)
    opt = optimizer_class(model.parameters(), *args, **kwargs)
    if st.shard_optim_params and dist.get_world_size(st.group) > 1:
        OptimizerSharding(opt, st.shard_optim_params, st.group, bucket_bytes)
    hook_optimizer(opt)
    return opt


def _attach_on_first_step(opt: Optimizer, args, kwargs) -> None:
    """Global step pre-hook: ZeRO-1 for the ``shard_optim`` parameters ``opt`` steps, attached
    before its first step keeps any state (its own pre-hook then runs for this step too)."""
    if opt.__dict__.get("_rsdp_zero1_checked", False):
        return
    opt._rsdp_zero1_checked = True
    if optimizer_sharding(opt) is not None:
        return
    plans = {}
    for g in opt.param_groups:
        for p in g["params"]:
            st = getattr(p, "_rsdp_zero1", None)
            if st is not None:
                plans[id(st)] = st
    for st in plans.values():
        if dist.get_world_size(st.group) > 1:
            OptimizerSharding(opt, st.shard_optim_params, st.group)


register_optimizer_step_pre_hook(_attach_on_first_step)


def optimizer_sharding(opt: Optimizer) -> Optional["OptimizerSharding"]:
    """The ZeRO-1 state :func:`make_optimizer` gave ``opt`` (``None`` if none)."""
    return getattr(opt, "_rsdp_sharding", None)


def _full_state_dict_call() -> Optional[str]:
    """``"save"`` inside torch's ``get_state_dict`` asked for a full optimizer state dict,
    ``"load"`` inside ``set_state_dict`` building the local template a full one is merged
    into, else ``None``: a ``shard_optim`` optimizer must then present every owner's state
    ([Note: state of other ranks' parameters]). Read off the calling frames: torch passes
    nothing else down to ``Optimizer.state_dict``."""
    frame = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            return None
        if (frame.f_code.co_name == "_get_optim_state_dict"
                and frame.f_globals.get("__name__") == "torch.distributed.checkpoint.state_dict"):
            info = frame.f_locals.get("info")
            caller = frame.f_back
            while caller is not None and caller.f_code.co_name == "decorate_context":
                caller = caller.f_back  # torch.no_grad() around it
            if caller is not None and caller.f_code.co_name == "_load_optim_state_dict":
                return "load"  # the only call there builds the full path's template
            return "save" if getattr(info, "full_state_dict", False) else None
        frame = frame.f_back
    return None


def _state_template(opt: Optimizer, p: nn.Parameter) -> dict:
    """What ``opt`` would keep for ``p`` had it stepped it, in zeros: the keys of a state it
    keeps for another parameter, a tensor shaped like that parameter shaped like ``p``."""
    for q, st in opt.state.items():
        if st:
            return {k: (torch.zeros_like(p, dtype=v.dtype) if v.shape == q.shape
                        else torch.zeros_like(v)) if isinstance(v, torch.Tensor) else v
                    for k, v in st.items()}
    return {}


def _owners(params: List[nn.Parameter], world: int) -> List[int]:
    load = [0] * world
    owner = [0] * len(params)
    for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
        r = min(range(world), key=lambda j: (load[j], j))
        owner[i] = r
        load[r] += params[i].numel()
    return owner


class OptimizerSharding:
    """ZeRO-1 for ``sharded`` (replicated) parameters of ``opt``: one owner rank steps each
    and broadcasts it after every step ([Note: ZeRO-1 as hooks])."""

    def __init__(self, opt: Optimizer, sharded: List[nn.Parameter],
                 group: Optional[dist.ProcessGroup], bucket_bytes: int = DEFAULT_BUCKET_BYTES):
        self.group = group
        self.bucket_bytes = bucket_bytes
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        stepped = {id(p) for g in opt.param_groups for p in g["params"]}
        sharded = [p for p in sharded if id(p) in stepped]
        self.owned: Dict[int, List[nn.Parameter]] = {r: [] for r in range(self.world)}
        for p, r in zip(sharded, _owners(sharded, self.world)):
            self.owned[r].append(p)
        mine = {id(p) for p in self.owned[self.rank]}
        self.not_mine = [p for p in sharded if id(p) not in mine]
        for p in self.not_mine:  # loaded before the first step (a full state dict): the owner's
            opt.state.pop(p, None)
        self.sends = [self.buckets(self.owned[r]) for r in range(self.world)]  # per owner
        self._aside: List[Optional[torch.Tensor]] = []
        opt.register_step_pre_hook(self._before_step)
        opt.register_step_post_hook(self._after_step)
        opt.register_state_dict_post_hook(self._on_state_dict)
        opt.register_load_state_dict_pre_hook(self._on_load)
        opt._rsdp_sharding = self

    def buckets(self, params: List[nn.Parameter]) -> List[List[nn.Parameter]]:
        """Consecutive parameters of one dtype and device, up to ``bucket_bytes`` a bucket."""
        return pack_buckets(params, self.bucket_bytes, key=lambda p: (p.dtype, p.device))

    def _on_state_dict(self, opt, state_dict):
        """An empty state for each parameter another rank steps, or, where torch's
        ``get_state_dict`` / ``set_state_dict`` handle a full state dict, every owner's state
        ([Note: state of other ranks' parameters])."""
        keys = {id(p): k for k, p in state_keys(opt, state_dict).items()}
        state = state_dict.setdefault("state", {})
        full = _full_state_dict_call()
        if full == "save":
            self._gather_owned(opt, state, keys)
        for p in self.not_mine:
            if full == "load":  # a template that the full state dict's values replace
                state.setdefault(keys[id(p)], _state_template(opt, p))
            else:
                state.setdefault(keys[id(p)], {})
        for g in state_dict.get("param_groups", []):
            g[STATE_KEY] = "whole" if full else "per_owner"
        return state_dict

    def _gather_owned(self, opt, state: dict, keys: dict) -> None:
        """Every owner's state of its parameters, on every rank (a full state dict)."""
        for r in range(self.world):
            mine = ([{k: v.detach().cpu() if isinstance(v, torch.Tensor) else v
                      for k, v in opt.state.get(p, {}).items()} for p in self.owned[r]]
                    if r == self.rank else None)
            box = [mine]
            src = dist.get_global_rank(self.group, r) if self.group is not None else r
            dist.broadcast_object_list(box, src=src, group=self.group)
            if r != self.rank:
                for p, st in zip(self.owned[r], box[0]):
                    state[keys[id(p)]] = {k: v.to(p.device) if isinstance(v, torch.Tensor)
                                          else v for k, v in st.items()}

    def _on_load(self, opt, state_dict):
        """Keeps only the state of the parameters this rank steps."""
        keys = {id(p): k for k, p in state_keys(opt, state_dict).items()}
        state = dict(state_dict.get("state", {}))
        for p in self.not_mine:
            state.pop(keys.get(id(p)), None)
        state_dict["state"] = state
        return state_dict

    def _before_step(self, opt, args, kwargs):
        # torch passes step's own arguments, the optimizer first: (opt, closure?)
        closure = kwargs.get("closure", args[1] if len(args) > 1 else None)
        if closure is not None:
            # step(closure) (Lightning, every closure-style loop) computes the gradients inside
            # step, after this hook: run it here, so that the gradients set aside are complete,
            # and hand step the loss it returned ([Note: a closure under ZeRO-1])
            if isinstance(opt, torch.optim.LBFGS):
                raise ValueError(
                    f"torch_rsdp.plan: rank {self.rank}: shard_optim cannot shard LBFGS, which "
                    f"re-evaluates its closure within one step; plan those units no_shard")
            with torch.enable_grad():
                loss = closure()
            args, kwargs = args[:1], {**kwargs, "closure": lambda: loss}
        self._aside = [p.grad for p in self.not_mine]
        for p in self.not_mine:
            p.grad = None
        return (args, kwargs) if closure is not None else None

    @torch.no_grad()
    def _after_step(self, opt, args, kwargs) -> None:
        for p, g in zip(self.not_mine, self._aside):
            p.grad = g
        self._aside = []
        self._broadcast_owned()

    def _broadcast_owned(self) -> None:
        """Every owner sends its updated parameters to the other replicas: parameters of one
        dtype packed into flat buckets of at most ``bucket_bytes``, a larger contiguous
        parameter sent in place, so the step never holds more than one bucket extra (a flat
        copy of an owner's whole share would be 1/W of the replicated model)."""
        for r in range(self.world):
            src = dist.get_global_rank(self.group, r) if self.group is not None else r
            for ps in self.sends[r]:
                p0 = ps[0]
                mine = [local(p) for p in ps]  # replicas: DTensors of whole local tensors
                if len(ps) == 1 and mine[0].is_contiguous():
                    with record_function("RSDP::plan::shard_optim_broadcast"):
                        dist.broadcast(mine[0], src=src, group=self.group)
                    continue
                flat = torch.cat([t.reshape(-1) for t in mine]) if r == self.rank \
                    else torch.empty(sum(t.numel() for t in mine), dtype=p0.dtype,
                                     device=p0.device)
                with record_function("RSDP::plan::shard_optim_broadcast"):
                    dist.broadcast(flat, src=src, group=self.group)
                if r != self.rank:
                    off = 0
                    for t in mine:
                        t.copy_(flat[off:off + t.numel()].view_as(t))
                        off += t.numel()
                del flat

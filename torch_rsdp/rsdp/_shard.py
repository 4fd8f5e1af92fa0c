"""``shard(model)``: the FSDP2-like entry point of RSDP.

    import torch_rsdp.rsdp as rsdp
    model = rsdp.shard(model)                 # collective: every rank of the group calls it
    opt = torch.optim.AdamW(model.parameters())   # sees only the local shards
    print(rsdp.rsdp_state(model).report())    # what stayed whole on every rank, and why

What happens, in order:

1. The ring order of ``group`` is learnt (:class:`._rotation.ring_order.Ring`, collective).
2. With ``sync_module_states`` every parameter and buffer is broadcast from group rank 0, so
   all ranks start from the same model (like DDP; the model is still whole at this point).
3. Every plain ``nn.Linear``, transformers ``Conv1D`` (GPT-2's transposed Linear),
   ``nn.Embedding`` and ``nn.MultiheadAttention`` accepted by ``filter`` (and with at least
   ``min_numel`` weight elements) is sharded in place: its class becomes :class:`._layers.sharded_linear.RSDPLinear`
   / ``RSDPConv1D`` / :class:`._layers.sharded_embedding.RSDPEmbedding` / :class:`._layers.sharded_attention.RSDPMultiheadAttention` (split by
   heads) and its parameters become this rank's shards; the full tensors are dropped.
   An embedding and the output head(s) tied to it (one Parameter) share one shard: the head
   is split by input features, which is the embedding's split by embedding dimension, and
   stays tied (:mod:`._tied`). Other shared parameters stay whole.
   With ``tp_plan``, first the planned pairs of column-split layers and the row-split layer
   they feed (attention q/k/v -> o, MLP gate/up -> down) become rotation units that keep all
   their shards in one buffer (:mod:`._units.tp_plan`, :mod:`._units.rotation_unit`).
4. All other parameters stay replicated; their gradients are averaged over the group during
   every backward (:class:`torch_rsdp._grad_sync.GradSync`, bucketed as DDP does), unless
   ``sync_replicated=False`` leaves that to the caller. ``rsdp_state(model).left_whole`` lists
   each with its size and the reason (:mod:`._coverage`); a module with a matrix RSDP cannot
   decompose also raises a warning on group rank 0.

Sharded gradients arrive at their owner already averaged over the group, so one optimiser
step equals DDP's on the same global batch. Buffers (e.g. BatchNorm statistics) are only
synchronised once, at step 2.
"""
from __future__ import annotations

import warnings
from typing import Callable, Dict, List, Optional

import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from .. import _checkpoint_hooks
from .._apply_guard import guard_apply
from .._dtensor_params import mesh_of_group, refuse_ddp, replicate_params
from .._grad_sync import GradSync
from .._utils import broadcast_module_states
from . import _coverage as coverage
from ._layers.block_gather import SmallLayers, make_blocks
from ._coverage import FILTERED, NOT_DECOMPOSABLE, TOO_SMALL, LeftWhole, classify
from ._state_dict import shard_dim
from ._rotation.ring_order import Ring
from ._units.rotation_unit import shard_unit, unit_problem
from ._layers.sharded_attention import shard_attention
from ._layers.sharded_conv1d import shard_conv1d
from ._layers.sharded_embedding import shard_embedding
from ._layers.sharded_linear import shard_linear, tie_linear
from ._tied import find_ties, tied_group
from ._units.tp_plan import group_units, resolve_plan
from ._units.unit_block import make_unit_blocks
from ._state import RSDPState

__all__ = ["shard"]

Filter = Callable[[str, nn.Module], bool]


def shard(model: nn.Module, group: Optional[dist.ProcessGroup] = None, *,
          linear_split: str | Callable[[str, nn.Module], str] = "out",
          min_numel: int = 0, filter: Optional[Filter] = None,
          mp_policy: Optional[MixedPrecisionPolicy] = None,
          sync_module_states: bool = True, tp_plan=None,
          unit_recompute: bool = False, sync_replicated: bool = True,
          checkpoint_hooks: bool = True) -> nn.Module:
    """Shards ``model`` over ``group`` (default: world) in place and returns it. Collective.

    Args:
        model: the model to shard (the same architecture on every rank).
        group: the process group (default: world).
        linear_split: ``"out"`` (rows of W and b), ``"in"`` (columns of W; bias replicated),
            or a callable ``(qualified_name, module) -> "out" | "in" | "none"``; applies to
            ``nn.Linear`` and ``Conv1D``. A head tied to an embedding is always split
            ``"in"`` (unless ``"none"``, which leaves the head and its embedding whole).
        min_numel: layers whose weight has fewer elements stay replicated.
        filter: ``(qualified_name, module) -> bool``; False keeps that module replicated (for
            tied modules: False for any of them keeps all of them replicated).
        mp_policy: FSDP2's ``MixedPrecisionPolicy``: compute in ``param_dtype``, reduce
            gradients in ``reduce_dtype``, return ``output_dtype`` (master shards keep the
            parameters' dtype).
        sync_module_states: broadcast parameters and buffers from group rank 0 first.
        tp_plan: ``None`` (every layer rotates on its own), ``"auto"`` (the model's
            ``config.base_model_tp_plan``, else built-in rules for q/k/v/o and gate/up/down)
            or a dict of name pattern -> ``"colwise"`` / ``"rowwise"`` (torch's
            ``parallelize_module`` vocabulary). Column-split layers and the row-split layer
            they feed, under one parent (an attention block, an MLP), become one rotation
            unit: their shards travel in one buffer (:mod:`._units.rotation_unit`). With a dict, a
            pairing that cannot form a unit raises.
        unit_recompute: with True, units recompute their forward in backward and keep only
            their inputs (activation checkpointing built into the unit: less memory, one more
            forward of every unit); by default they keep their activations from forward, as
            much activation memory as the unsharded model and FSDP2 (never their weights).
        sync_replicated: average the gradients of the parameters left whole during every
            backward (default); with False the caller does it (``torch_rsdp.plan`` syncs
            them with its other replicated parameters).
        checkpoint_hooks: hook ``model.state_dict()`` and any optimizer's (copies, loads of
            whole tensors, a clear error for a shard a checkpoint cannot describe; default);
            ``torch_rsdp.plan`` installs its own for the whole model.
    """
    if getattr(model, "_rsdp_root", None) is not None:
        raise ValueError("shard() was already applied to this module")
    if isinstance(linear_split, str) and linear_split not in ("out", "in", "none"):
        raise ValueError(f"linear_split must be 'out', 'in', 'none' or a callable, "
                         f"got {linear_split!r}")
    if tp_plan is not None and tp_plan != "auto" and not isinstance(tp_plan, dict):
        raise ValueError(f"tp_plan must be None, 'auto' or a dict of name pattern -> "
                         f"'colwise' / 'rowwise', got {type(tp_plan).__name__}")
    if mp_policy is not None and not isinstance(mp_policy, MixedPrecisionPolicy):
        raise TypeError(f"torch_rsdp.rsdp.shard: mp_policy must be a torch.distributed.fsdp."
                        f"MixedPrecisionPolicy, got {type(mp_policy).__name__}")
    ring = Ring(group)
    if sync_module_states:
        broadcast_module_states(model, group)
    full_numel = sum(p.numel() for p in model.parameters())

    def split_of(name, mod):
        split = linear_split(name, mod) if callable(linear_split) else linear_split
        if split not in ("out", "in", "none"):
            raise ValueError(f"linear_split({name!r}) returned {split!r}; expected 'out', "
                             f"'in' or 'none'")
        return split

    def accept(name, mod, numel):
        """None when ``mod`` may be sharded, else the reason it stays whole."""
        if filter is not None and not filter(name, mod):
            return FILTERED
        if numel < min_numel:
            return f"{TOO_SMALL} ({numel} weight elements < min_numel={min_numel})"
        return None

    ties = find_ties(model)
    why: Dict[str, str] = {}  # module name -> why it stays whole
    sharded: Dict[str, nn.Module] = {}
    not_units = _shard_units(model, tp_plan, ties, ring, mp_policy, accept, sharded,
                             unit_recompute)
    done = set()  # ids of modules already decided (members of a tied group)
    local, n_seen = set(), 0
    for name, mod in list(model.named_modules()):
        if id(mod) in done or getattr(mod, "_rsdp", None) is not None:
            continue
        if len(sharded) != n_seen:  # refresh the ids of the parameters sharded so far
            local, n_seen = _local_ids(sharded), len(sharded)
        if any(id(p) in local for p in mod.parameters(recurse=False)):
            continue  # a part of a sharded module (an attention's out_proj, a unit's layer)
        rule, reason = classify(mod)
        tied = [ties[id(p)] for p in mod.parameters(recurse=False) if id(p) in ties]
        if tied:
            _shard_tied(tied, ring, mp_policy, accept, split_of, sharded, why, done)
            continue
        if rule is None:
            if reason:
                why[name] = reason
            continue
        weight = mod.in_proj_weight if rule == "attention" else mod.weight
        reason = accept(name, mod, weight.numel())
        if reason is None and rule in ("linear", "conv1d"):
            split = split_of(name, mod)
            reason = None if split != "none" else "linear_split chose 'none'"
        if reason is not None:
            why[name] = reason
        elif rule == "linear":
            sharded[name] = shard_linear(mod, ring, split, mp_policy)
        elif rule == "conv1d":
            sharded[name] = shard_conv1d(mod, ring, split, mp_policy)
        elif rule == "embedding":
            sharded[name] = shard_embedding(mod, ring, mp_policy)
        else:
            sharded[name] = shard_attention(mod, ring, mp_policy)

    for name, mod in sharded.items():
        mod._rsdp_name = name  # for error messages
    # Block gathers and units computed whole decide from the group's token count, agreed
    # once per forward of the root ([Note: block gathers], [Note: small units computed whole])
    small = SmallLayers(ring)
    units = [m for m in sharded.values() if getattr(m, "_rsdp_unit", None) is not None]
    for unit in units:
        unit._rsdp_unit.small = small
    make_unit_blocks(model, sharded, ring, small)  # [Note: unit blocks]
    if make_blocks(model, sharded, ring, small) or units:
        model.register_forward_pre_hook(small.new_forward)
    # Submodules an earlier shard() call sharded (a deeper unit of a torch_rsdp.plan) hold
    # shards too: neither replicated nor left whole here.
    earlier = {n: m for n, m in model.named_modules()
               if getattr(m, "_rsdp", None) is not None and n not in sharded}
    local = _local_ids(sharded) | _local_ids(earlier)
    replicated, seen = [], set()
    for p in model.parameters():
        if id(p) not in local and id(p) not in seen and p.requires_grad:
            seen.add(id(p))
            replicated.append(p)
    whole = coverage.left_whole(model, local, why)
    _warn_undecomposable(whole, ring, min_numel)
    sync = None
    if sync_replicated and replicated:
        # Replicas as Replicate() DTensors, like the shards: torch's tools then see one kind of
        # parameter (torch_rsdp._dtensor_params)
        new = replicate_params(model, replicated,
                               mesh_of_group(group, replicated[0].device.type))
        replicated = [new.get(id(p), p) for p in replicated]
        sync = GradSync(replicated, group, root=model,
                        reduce_dtype=mp_policy.reduce_dtype if mp_policy else None)
    model._rsdp_root = RSDPState(ring, sharded, replicated, sync, whole, full_numel, model,
                                 not_units)
    refuse_ddp(model)
    guard_apply(model)  # model.to() would swap the parameters away from their hooks
    if checkpoint_hooks:
        _install_checkpoint_hooks(model)
    return model


def _install_checkpoint_hooks(model: nn.Module) -> None:
    """State-dict hooks (:mod:`torch_rsdp._checkpoint_hooks`): copies, loads of any form, and
    a clear error for a shard a checkpoint cannot describe (:func:`._state_dict.shard_dim`)."""

    def refusal(key):
        try:
            shard_dim(model, key)
        except ValueError as e:
            return f"{e} (torch_rsdp.rsdp.shard)"
        return None

    keys = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    _checkpoint_hooks.install(model, keys, refusal)


def _shard_units(model, tp_plan, ties, ring, mp, accept, sharded, recompute) -> Dict[str, str]:
    """Shards the rotation units ``tp_plan`` pairs up; layers that cannot form one are left
    to the per-layer rules (or, for an explicit plan, raise). Returns, for ``"auto"``, why
    each unit it named was not formed (module name -> reason)."""
    not_units: Dict[str, str] = {}
    styles = resolve_plan(model, tp_plan)
    for parent, kids in group_units(styles).items():
        unit = model.get_submodule(parent)
        members = [(k.rpartition(".")[2], model.get_submodule(k), styles[k]) for k in kids]
        problem = unit_problem(unit, members, ring.world)
        if problem is None and any(id(p) in ties for _, m, _ in members for p in m.parameters()):
            problem = "a layer's parameter is tied to another module"
        if problem is None:
            numel = sum(m.weight.numel() for _, m, _ in members)
            if any(accept(n, m, numel) is not None for n, m in
                   [(parent, unit)] + [(k, model.get_submodule(k)) for k in kids]):
                continue  # filtered / too small: the per-layer rules decide and record why
            sharded[parent] = shard_unit(unit, members, ring, mp, parent, recompute)
        elif isinstance(tp_plan, dict):
            raise ValueError(f"tp_plan: {parent or '<root>'} cannot be a rotation unit: "
                             f"{problem}")
        elif problem != "already sharded":  # (by an earlier shard(): not ours to report)
            not_units[parent or "<root>"] = problem
    return not_units


def _local_ids(sharded: Dict[str, nn.Module]) -> set:
    """ids of the sharded parameters of ``sharded``'s modules."""
    return {id(m._rsdp.param(n)) for m in sharded.values() for n in m._rsdp.names}


def _shard_tied(tied, ring, mp, accept, split_of, sharded, why, done) -> None:
    """Shards a module's tied group (an embedding and its heads) on one shard, or records why
    all of its members stay whole."""
    uses = [u for group in tied for u in group]
    members = {id(m): (n, m) for n, m, _ in uses}
    done.update(members)
    group, reason = tied_group(tied[0]) if len(tied) == 1 else (None, "tied more than once")
    if group is not None:
        for n, m in group.members:
            reason = accept(n, m, m.weight.numel())
            if reason is None and m is not group.embedding[1] and split_of(n, m) == "none":
                reason = "linear_split chose 'none'"
            if reason is not None:
                reason = f"{reason} (for {n or '<root>'}, tied: kept whole with its partners)"
                break
    if group is None or reason is not None:
        for n, _ in members.values():
            why[n] = reason
        return
    ename, emb = group.embedding
    sharded[ename] = shard_embedding(emb, ring, mp)
    for n, m in group.heads:
        sharded[n] = tie_linear(m, emb._rsdp, ename)


def _warn_undecomposable(whole: List[LeftWhole], ring: Ring, min_numel: int) -> None:
    """A matrix RSDP could not decompose is likely a layer the user expected to be sharded."""
    big = [e for e in whole if e.reason.startswith(NOT_DECOMPOSABLE) and len(e.shape) >= 2
           and e.numel >= min_numel]
    if big and ring.rank == 0:
        listed = ", ".join(f"{e.name} {e.shape}" for e in big[:5])
        more = f" and {len(big) - 5} more" if len(big) > 5 else ""
        warnings.warn(f"torch_rsdp.rsdp.shard: kept whole on every rank (no RSDP rule): "
                      f"{listed}{more}; see rsdp_state(model).report()", stacklevel=3)

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
   ``min_numel`` weight elements) is sharded in place: its class becomes ``RSDPLinear`` /
   ``RSDPConv1D`` / ``RSDPEmbedding`` / ``RSDPMultiheadAttention`` (split by heads;
   :mod:`._layers`) and its parameters become this rank's shards; the full tensors are dropped.
   An embedding and the output head(s) tied to it (one Parameter) share one shard: the head
   is split by input features, which is the embedding's split by embedding dimension, and
   stays tied (:mod:`._tied`). Other shared parameters stay whole.
   With ``tp_plan``, first the planned pairs of column-split layers and the row-split layer
   they feed (attention q/k/v -> o, MLP gate/up -> down) become rotation units that keep all
   their shards in one buffer (:mod:`._units.tp_plan`, :mod:`._units.rotation_unit`).
   Small units (no larger than their activations) and, from 3 ranks on one node, the small
   sharded layers of one block (an element of an ``nn.ModuleList`` / ``nn.Sequential``) do
   not run shard by shard (:mod:`._units.unit_whole`, :mod:`._layers.block_gather`,
   :mod:`._units.unit_block`); which are small is decided from the group's token count,
   agreed once per forward, so that every rank makes the same passes.
4. All other parameters stay replicated; their gradients are averaged over the group during
   every backward (:class:`torch_rsdp._grad_sync.GradSync`, bucketed as DDP does), unless
   ``sync_replicated=False`` leaves that to the caller. ``rsdp_state(model).left_whole`` lists
   each with its size and the reason (:mod:`._coverage`); a module with a matrix RSDP cannot
   decompose also raises a warning on group rank 0.
5. The model gets its state (``rsdp_state(model)``), tells ``DistributedDataParallel`` to
   leave it alone, guards ``model.to()`` and the like (:mod:`torch_rsdp._apply_guard`) and,
   with ``checkpoint_hooks``, hooks its ``state_dict()`` (:mod:`torch_rsdp._checkpoint_hooks`).

Sharded gradients arrive at their owner already averaged over the group, so one optimiser
step equals DDP's on the same global batch. Buffers (e.g. BatchNorm statistics) are only
synchronised once, at step 2.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy

from .. import _checkpoint_hooks
from .._apply_guard import guard_apply
from .._dtensor_params import mesh_of_group, refuse_ddp, replicate_params
from .._grad_sync import GradSync
from .._host_staging import has_backend
from .._materialize import refuse_forward_on_meta
from .._utils import broadcast_module_states
from . import _coverage as coverage
from ._layers.block_gather import SmallLayers, make_blocks
from ._coverage import (ADAPTER, FILTERED, NOT_DECOMPOSABLE, TOO_SMALL, LeftWhole, classify,
                        is_adapter)
from ._state_dict import shard_dim
from ._rotation.ring_order import Ring
from ._units.rotation_unit import shard_unit, unit_problem
from ._layers.sharded_attention import shard_attention
from ._layers.sharded_conv1d import shard_conv1d
from ._layers.sharded_embedding import shard_embedding
from ._layers.sharded_linear import shard_linear, tie_linear
from ._tied import find_ties, tied_group
from ._units.tp_plan import group_units, resolve_plan
from ._units.unit_adapters import unit_member
from ._units.unit_block import make_unit_blocks
from ._state import RSDPState

__all__ = ["shard"]

Filter = Callable[[str, nn.Module], bool]
ADAPTER_WHOLE = f"{ADAPTER}: kept whole, its gradients averaged in one bucket with the others"


def shard(model: nn.Module, group: Optional[dist.ProcessGroup] = None, *,
          linear_split: str | Callable[[str, nn.Module], str] = "out",
          min_numel: int = 0, filter: Optional[Filter] = None,
          mp_policy: Optional[MixedPrecisionPolicy] = None,
          sync_module_states: bool = True, tp_plan=None,
          unit_recompute: bool = False, sync_replicated: bool = True,
          checkpoint_hooks: bool = True,
          offload_policy: Optional[OffloadPolicy] = None) -> nn.Module:
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
            unit: their shards travel in one buffer (:mod:`._units.rotation_unit`); peft's
            LoRA layers pair up like the layers they wrap, their adapters whole
            (:mod:`._units.unit_adapters`). With a dict, a pairing that cannot form a unit
            raises.
        unit_recompute: with True, units recompute their forward in backward and keep only
            their inputs (activation checkpointing built into the unit: less memory, one more
            forward of every unit); by default they keep their activations from forward, as
            much activation memory as the unsharded model and FSDP2 (never their weights).
            torch's activation checkpointing (Hugging Face's switch, ``checkpoint_wrapper``)
            works either way and rotates nothing again ([Note: checkpointing without a second
            rotation] in :mod:`._rotation.outer_checkpoint`).
        sync_replicated: average the gradients of the parameters left whole during every
            backward (default); with False the caller does it (``torch_rsdp.plan`` syncs
            them with its other replicated parameters).
        checkpoint_hooks: hook ``model.state_dict()`` and any optimizer's (copies, loads of
            whole tensors, a clear error for a shard a checkpoint cannot describe; default);
            ``torch_rsdp.plan`` installs its own for the whole model.
        offload_policy: FSDP2's ``CPUOffloadPolicy`` keeps every shard, its gradient and so
            its optimizer state in host memory (pinned with ``pin_memory`` when the model
            computes on CUDA); the ring rotates host buffers and only the shard in hand is
            copied to the device the layer computes on ([Note: shards offloaded to host
            memory] in :mod:`._rotation.device_copies`). What stays whole stays where the
            model is. ``OffloadPolicy()`` (the default) offloads nothing.
    """
    _check_arguments(model, group, linear_split, tp_plan, mp_policy, offload_policy)
    # Collective, on every rank in this order; the broadcast needs the model still whole
    ring = Ring(group)
    if sync_module_states:
        broadcast_module_states(model, group)
    s = _Sharding(model, group, ring, mp_policy=mp_policy, linear_split=linear_split,
                  filter=filter, min_numel=min_numel)
    # Units first: the per-layer rules then skip the layers a unit holds
    _shard_units(s, tp_plan, unit_recompute)
    _shard_layers(s)
    _share_small_layers(s)
    _find_replicated(s)
    _offload(s, offload_policy)
    _warn_undecomposable(s)
    if sync_replicated:
        _sync_replicated(s)
    _attach(s, checkpoint_hooks)
    return model


def _check_arguments(model: nn.Module, group, linear_split, tp_plan, mp_policy,
                     offload_policy) -> None:
    """Raises for an argument :func:`shard` cannot use: on every rank alike, before any rank
    waits in a collective."""
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
    if offload_policy is not None and not isinstance(offload_policy, OffloadPolicy):
        raise TypeError(f"torch_rsdp.rsdp.shard: offload_policy must be a torch.distributed."
                        f"fsdp.CPUOffloadPolicy or OffloadPolicy, got "
                        f"{type(offload_policy).__name__}")
    host = torch.device("cpu")
    if isinstance(offload_policy, CPUOffloadPolicy) and not has_backend(group, host):
        # the ring rotates host buffers ([Note: shards offloaded to host memory])
        raise ValueError("torch_rsdp.rsdp.shard: offload_policy=CPUOffloadPolicy() keeps the "
                         "shards in host memory and rotates them there, but the group has no "
                         "backend for CPU tensors: initialise it with one, e.g. "
                         "init_process_group('cpu:rsdp,cuda:nccl') or 'cpu:gloo,cuda:nccl'")


@dataclass
class _Sharding:
    """One :func:`shard` call: the options its phases decide from, and what they decided."""

    model: nn.Module
    group: Optional[dist.ProcessGroup]
    ring: Ring
    mp_policy: Optional[MixedPrecisionPolicy]
    linear_split: str | Callable[[str, nn.Module], str]
    filter: Optional[Filter]
    min_numel: int
    # Both taken at creation, before any layer is sharded: sharding replaces the parameters
    full_numel: int = field(init=False)  # parameter elements of the unsharded model
    ties: Dict[int, list] = field(init=False)  # id(parameter) -> its uses, if more than one
    sharded: Dict[str, nn.Module] = field(default_factory=dict)  # qualified name -> module
    why: Dict[str, str] = field(default_factory=dict)  # module name -> why it stays whole
    done: set = field(default_factory=set)  # ids of the modules decided with their tied group
    not_units: Dict[str, str] = field(default_factory=dict)  # see RSDPState.not_units
    replicated: List[nn.Parameter] = field(default_factory=list)  # whole, needing a gradient
    left_whole: List[LeftWhole] = field(default_factory=list)
    grad_sync: Optional[GradSync] = None

    def __post_init__(self):
        self.full_numel = sum(p.numel() for p in self.model.parameters())
        self.ties = find_ties(self.model)

    def split_of(self, name: str, mod: nn.Module) -> str:
        """How ``linear_split`` splits the Linear / Conv1D ``mod``."""
        split = (self.linear_split(name, mod) if callable(self.linear_split)
                 else self.linear_split)
        if split not in ("out", "in", "none"):
            raise ValueError(f"linear_split({name!r}) returned {split!r}; expected 'out', "
                             f"'in' or 'none'")
        return split

    def accept(self, name: str, mod: nn.Module, numel: int) -> Optional[str]:
        """None when ``mod`` may be sharded, else the reason it stays whole."""
        if self.filter is not None and not self.filter(name, mod):
            return FILTERED
        if is_adapter(self.model, name):  # [Note: adapters stay whole]
            return ADAPTER_WHOLE
        if numel < self.min_numel:
            return f"{TOO_SMALL} ({numel} weight elements < min_numel={self.min_numel})"
        return None


def _shard_units(s: _Sharding, tp_plan, recompute: bool) -> None:
    """Shards the rotation units ``tp_plan`` pairs up; layers that cannot form one are left
    to the per-layer rules (or, for an explicit plan, raise). For ``"auto"``, records why
    each unit it named was not formed in ``s.not_units`` (module name -> reason)."""
    model = s.model
    styles = resolve_plan(model, tp_plan)
    for parent, kids in group_units(styles).items():
        unit = model.get_submodule(parent)
        # a peft LoRA layer's member is its base layer ([Note: adapters inside a unit])
        found = [unit_member(k.rpartition(".")[2], model.get_submodule(k), styles[k])
                 for k in kids]
        members = [m for m, _ in found]
        problem = next((p for _, p in found if p is not None), None)
        if problem is None or getattr(unit, "_rsdp", None) is not None:
            problem = unit_problem(unit, members, s.ring.world)
        if problem is None and any(id(p) in s.ties for _, m, _ in members
                                   for p in m.parameters()):
            problem = "a layer's parameter is tied to another module"
        if problem is None:
            numel = sum(m.weight.numel() for _, m, _ in members)
            if any(s.accept(n, m, numel) is not None for n, m in
                   [(parent, unit)] + [(k, model.get_submodule(k)) for k in kids]):
                continue  # filtered / too small: the per-layer rules decide and record why
            s.sharded[parent] = shard_unit(unit, members, s.ring, s.mp_policy, parent,
                                           recompute)
        elif isinstance(tp_plan, dict):
            raise ValueError(f"tp_plan: {parent or '<root>'} cannot be a rotation unit: "
                             f"{problem}")
        elif problem != "already sharded":  # (by an earlier shard(): not ours to report)
            s.not_units[parent or "<root>"] = problem


def _shard_layers(s: _Sharding) -> None:
    """Shards every module an RSDP rule decomposes and the options accept (a tied group on one
    shard), and records why each other module with parameters of its own stays whole."""
    sharded_ids, n_seen = set(), 0
    for name, mod in list(s.model.named_modules()):
        if id(mod) in s.done or getattr(mod, "_rsdp", None) is not None:
            continue  # decided with its tied group, a unit, or sharded by an earlier shard()
        if len(s.sharded) != n_seen:  # refresh the ids of the parameters sharded so far
            sharded_ids, n_seen = _local_ids(s.sharded), len(s.sharded)
        if any(id(p) in sharded_ids for p in mod.parameters(recurse=False)):
            continue  # a part of a sharded module (an attention's out_proj, a unit's layer)
        tied = [s.ties[id(p)] for p in mod.parameters(recurse=False) if id(p) in s.ties]
        if tied:
            _shard_tied(s, tied)
        else:
            _shard_layer(s, name, mod)
    for name, mod in s.sharded.items():
        mod._rsdp_name = name  # for error messages


def _shard_layer(s: _Sharding, name: str, mod: nn.Module) -> None:
    """Shards one untied module by its RSDP rule, or records why it stays whole."""
    rule, reason = classify(mod)
    if rule is None:
        if reason:  # (none for a module without parameters of its own)
            # an adapter a rotation unit slices is no plain Linear any more
            s.why[name] = ADAPTER_WHOLE if is_adapter(s.model, name) else reason
        return
    weight = mod.in_proj_weight if rule == "attention" else mod.weight
    reason = s.accept(name, mod, weight.numel())
    split = s.split_of(name, mod) if reason is None and rule in ("linear", "conv1d") else None
    if split == "none":
        reason = "linear_split chose 'none'"
    if reason is not None:
        s.why[name] = reason
    elif rule == "linear":
        s.sharded[name] = shard_linear(mod, s.ring, split, s.mp_policy)
    elif rule == "conv1d":
        s.sharded[name] = shard_conv1d(mod, s.ring, split, s.mp_policy)
    elif rule == "embedding":
        s.sharded[name] = shard_embedding(mod, s.ring, s.mp_policy)
    else:
        s.sharded[name] = shard_attention(mod, s.ring, s.mp_policy)


def _shard_tied(s: _Sharding, tied) -> None:
    """Shards a module's tied group (an embedding and its heads) on one shard, or records why
    all of its members stay whole."""
    uses = [u for group in tied for u in group]
    members = {id(m): (n, m) for n, m, _ in uses}
    s.done.update(members)  # decided here together, whatever the outcome
    group, reason = tied_group(tied[0]) if len(tied) == 1 else (None, "tied more than once")
    if group is not None:
        for n, m in group.members:
            reason = s.accept(n, m, m.weight.numel())
            if reason is None and m is not group.embedding[1] and s.split_of(n, m) == "none":
                reason = "linear_split chose 'none'"
            if reason is not None:
                reason = f"{reason} (for {n or '<root>'}, tied: kept whole with its partners)"
                break
    if group is None or reason is not None:
        for n, _ in members.values():
            s.why[n] = reason
        return
    ename, emb = group.embedding
    s.sharded[ename] = shard_embedding(emb, s.ring, s.mp_policy)
    for n, m in group.heads:
        s.sharded[n] = tie_linear(m, emb._rsdp, ename)


def _share_small_layers(s: _Sharding) -> None:
    """Block gathers ([Note: block gathers]), unit blocks ([Note: unit blocks]) and units
    computed whole, all deciding from one :class:`SmallLayers`."""
    # They decide from the group's token count, agreed once per forward of the root
    # ([Note: block gathers], [Note: small units computed whole])
    small = SmallLayers(s.ring)
    units = [m for m in s.sharded.values() if getattr(m, "_rsdp_unit", None) is not None]
    for unit in units:
        unit._rsdp_unit.small = small
    make_unit_blocks(s.model, s.sharded, s.ring, small)
    if make_blocks(s.model, s.sharded, s.ring, small) or units:
        s.model.register_forward_pre_hook(small.new_forward)


def _find_replicated(s: _Sharding) -> None:
    """The parameters no shard holds: ``s.replicated`` (those that need a gradient) and
    ``s.left_whole`` (every one, with the reason)."""
    # Submodules an earlier shard() call sharded (a deeper unit of a torch_rsdp.plan) hold
    # shards too: neither replicated nor left whole here.
    earlier = {n: m for n, m in s.model.named_modules()
               if getattr(m, "_rsdp", None) is not None and n not in s.sharded}
    sharded_ids = _local_ids(s.sharded) | _local_ids(earlier)
    seen = set()
    for p in s.model.parameters():
        if id(p) not in sharded_ids and id(p) not in seen and p.requires_grad:
            seen.add(id(p))
            s.replicated.append(p)
    s.left_whole = coverage.left_whole(s.model, sharded_ids, s.why)


def _warn_undecomposable(s: _Sharding) -> None:
    """A matrix RSDP could not decompose is likely a layer the user expected to be sharded."""
    big = [e for e in s.left_whole if e.reason.startswith(NOT_DECOMPOSABLE)
           and len(e.shape) >= 2 and e.numel >= s.min_numel]
    if big and s.ring.rank == 0:
        listed = ", ".join(f"{e.name} {e.shape}" for e in big[:5])
        more = f" and {len(big) - 5} more" if len(big) > 5 else ""
        # stacklevel: called by shard() itself, so the warning names shard()'s caller
        warnings.warn(f"torch_rsdp.rsdp.shard: kept whole on every rank (no RSDP rule): "
                      f"{listed}{more}; see rsdp_state(model).report()", stacklevel=3)


def _offload(s: _Sharding, policy: Optional[OffloadPolicy]) -> None:
    """Every flat shard storage in host memory under a ``CPUOffloadPolicy``."""
    if not isinstance(policy, CPUOffloadPolicy):
        return
    states = {id(m._rsdp): m._rsdp for m in s.sharded.values()}
    for st in states.values():
        st.offload(policy.pin_memory)


def _sync_replicated(s: _Sharding) -> None:
    """Averages the replicated parameters' gradients over the group during every backward."""
    if not s.replicated:
        return
    # Replicas as Replicate() DTensors, like the shards: torch's tools then see one kind of
    # parameter (torch_rsdp._dtensor_params)
    new = replicate_params(s.model, s.replicated,
                           mesh_of_group(s.group, s.replicated[0].device.type))
    s.replicated = [new.get(id(p), p) for p in s.replicated]
    s.grad_sync = GradSync(s.replicated, s.group, root=s.model,
                           reduce_dtype=s.mp_policy.reduce_dtype if s.mp_policy else None)


def _attach(s: _Sharding, checkpoint_hooks: bool) -> None:
    """Gives the model its :class:`RSDPState` and the guards a sharded model needs."""
    model = s.model
    model._rsdp_root = RSDPState(s.ring, s.sharded, s.replicated, s.grad_sync, s.left_whole,
                                 s.full_numel, model, s.not_units)
    refuse_ddp(model)
    guard_apply(model)  # model.to() would swap the parameters away from their hooks
    refuse_forward_on_meta(model)  # until to_empty allocates it
    if checkpoint_hooks:
        _install_checkpoint_hooks(model)


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


def _local_ids(sharded: Dict[str, nn.Module]) -> set:
    """ids of the sharded parameters of ``sharded``'s modules."""
    return {id(m._rsdp.param(n)) for m in sharded.values() for n in m._rsdp.names}

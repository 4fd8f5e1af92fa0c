"""``model.to_empty(device=...)`` on a model sharded while its parameters were on ``meta``.

FSDP2's way of building a model no rank can hold whole, which torch_rsdp follows:

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    rsdp.shard(model)                      # decides the shards; allocates nothing
    model.to_empty(device="cpu")           # allocates this rank's shards and what stays whole
    rsdp.load_pretrained(model, path)      # a save_pretrained directory, this rank's rows

``nn.Module.to_empty`` goes through ``_apply`` (:mod:`torch_rsdp._apply_guard`), which hands a
conversion that turns *only* ``meta`` tensors into tensors of the same shape and dtype to
:func:`materialize`. Each sharded module's flat storage (:class:`~torch_rsdp.rsdp._layers.
shard_state.ShardState`) is allocated once, as one tensor on the device, and its parameters
are made views of it again; every other parameter (replicated) and buffer gets the
conversion's fresh tensor. Non-persistent buffers (rotary tables), which no checkpoint holds,
are computed by a Hugging Face model's own ``_init_weights``, as ``from_pretrained`` does. Parameters keep their Python identity
(``torch.utils.swap_tensors``): the gradient buckets, the RSDP state and anything else
holding them see the new storage. Their gradient hooks are re-registered by their owners
(:meth:`torch_rsdp._grad_sync.GradSync.rehook`).

[Note: replicas agree after materialisation]
``to_empty`` leaves memory uninitialised, and what comes next is the user's: a loader writes
every value alike on every rank, but a random ``init_weights`` on the CPU draws each rank's
values from its own generator (DTensor keeps random ops consistent over a mesh only on
accelerators), and shards of unequal sizes shift every later draw. A replicated parameter
that differs between ranks is never averaged back together: every rank would silently train
its own model. So the first forward after materialisation broadcasts every replicated
parameter and buffer from group rank 0 (:func:`sync_replicas_before_first_forward`): small
(norms, biases), once, and a no-op in value after a loader. Shards are each rank's own; to
draw them independently, seed each rank differently before initialising
(``torch.manual_seed(seed + rank)``): the broadcast then makes the replicas agree.

Before ``to_empty``, a forward raises (:func:`refuse_forward_on_meta`): the ring would rotate
tensors with no data.
"""
from __future__ import annotations

import warnings
from typing import Callable, Iterable, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.tensor import DTensor, Replicate

from ._dtensor_params import dtensor_param, local, mesh_of_group
from ._host_staging import broadcast_coalesced
from ._utils import group_rank0

__all__ = ["allocates", "materialize", "init_non_persistent_buffers", "has_meta", "refuse_forward_on_meta"]


def has_meta(module: nn.Module) -> bool:
    """Whether any parameter or buffer of ``module`` (a DTensor's local tensor included) is on
    ``meta``."""
    return any(local(t).is_meta for t in _tensors(module))


def allocates(fn: Callable[[torch.Tensor], torch.Tensor], t: torch.Tensor) -> bool:
    """Whether the conversion ``fn`` turns the ``meta`` tensor ``t`` into a tensor of its
    dtype elsewhere (``to_empty``), judged on an empty stand-in: nothing of ``t``'s size is
    allocated to find out."""
    out = fn(local(t).new_empty(0))
    return isinstance(out, torch.Tensor) and not out.is_meta and out.dtype == t.dtype


def materialize(module: nn.Module, fn: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Allocates every ``meta`` parameter and buffer of ``module`` where ``fn`` (the
    ``to_empty`` conversion) puts them; sharded modules' flat storages first, one tensor each.
    See the module's docstring."""
    probe = fn(torch.empty(0, device="meta"))
    device = probe.device
    done, fresh_buffers = set(), []
    for mod in module.modules():
        st = _flat_state(mod)
        if st is not None and st.flat.is_meta:
            st.materialize(device)
            done.update(id(st.param(n)) for n in st.names)
    for mod in module.modules():
        for name, p in list(mod._parameters.items()):
            if p is None or id(p) in done or not local(p).is_meta:
                continue
            done.add(id(p))  # a tied parameter, met again under another module, is done
            fresh = fn(local(p))
            if isinstance(p, DTensor):
                mesh = mesh_of_group(p.device_mesh.get_group(), device.type)
                new = dtensor_param(fresh, mesh, p.placements, p.shape, p.requires_grad)
            else:
                new = nn.Parameter(fresh, requires_grad=p.requires_grad)
            swap_keeping_attributes(p, new)
        for name, b in list(mod._buffers.items()):
            if b is not None and b.is_meta:
                mod._buffers[name] = fn(b)
                if name in mod._non_persistent_buffers_set:
                    fresh_buffers.append((mod, name))
    init_non_persistent_buffers(module, fresh_buffers)
    for owner in _gradient_owners(module):
        owner.rehook()
    for hook in getattr(module, "_rsdp_meta_hooks", []):
        hook.remove()
    module._rsdp_meta_hooks = []
    group = _group_of(module)
    if group is not None:
        # [Note: loading a materialised model in place] in torch_rsdp._checkpoint_hooks
        module._rsdp_unloaded = True
        sync_replicas_before_first_forward(module, group)


def init_non_persistent_buffers(root: nn.Module, fresh) -> None:
    """Computes the non-persistent buffers ``fresh`` (``(module, name)`` pairs) of ``root``.

    Non-persistent buffers (rotary embeddings' frequency tables) are in no checkpoint: no
    loader will fill them. A Hugging Face model knows how to compute them (its
    ``_init_weights`` of their module, what ``from_pretrained`` runs after materialising from
    meta); any other module's are named in a warning, since what they hold is the model's
    to say."""
    if not fresh:
        return
    hf = next((m for m in root.modules() if callable(getattr(m, "_init_weights", None))), None)
    left = []
    for mod in dict.fromkeys(m for m, _ in fresh):
        names = [n for m, n in fresh if m is mod]
        if hf is not None:
            with torch.no_grad():
                hf._init_weights(mod)
        else:
            left += [f"{type(mod).__name__}.{n}" for n in names]
    if left:
        rank = dist.get_rank() if dist.is_initialized() else 0
        warnings.warn(f"torch_rsdp: rank {rank}: to_empty allocated non-persistent buffers no "
                      f"checkpoint holds, uninitialised: {', '.join(left[:5])}; compute them "
                      f"before the first forward", stacklevel=4)


def swap_keeping_attributes(p: nn.Parameter, new: nn.Parameter) -> None:
    """``p`` becomes ``new`` in place (same Python object, so every holder sees it), keeping
    the attributes torch_rsdp and others set on it (``torch.utils.swap_tensors`` swaps
    ``__dict__`` too)."""
    kept = {k: v for k, v in p.__dict__.items() if k != "_is_param"}
    torch.utils.swap_tensors(p, new)
    p.__dict__.update(kept)


def refuse_forward_on_meta(model: nn.Module) -> None:
    """Until ``to_empty`` materialises it, a forward of ``model`` raises, naming the rank and a
    parameter still on ``meta``."""
    if not has_meta(model):
        return

    def refuse(module, args):
        name = next((n for n, t in _named_tensors(module) if local(t).is_meta), None)
        if name is None:
            return
        rank = dist.get_rank() if dist.is_initialized() else 0
        raise RuntimeError(
            f"torch_rsdp: rank {rank}: forward of a model sharded on the meta device "
            f"({name!r} has no data yet): call model.to_empty(device=...) and load or "
            f"initialise its weights first")

    model._rsdp_meta_hooks = [model.register_forward_pre_hook(refuse)]


def sync_replicas_before_first_forward(model: nn.Module, group) -> None:
    """[Note: replicas agree after materialisation]: the next forward of ``model`` first
    broadcasts its replicated parameters and buffers from group rank 0, once."""
    def sync(module, args):
        handle.remove()
        module._rsdp_unloaded = False
        tensors = [local(t).detach() for t in _replicas(module)]
        if tensors and dist.get_world_size(group) > 1:
            with torch.no_grad():
                broadcast_coalesced(group, tensors, 250 << 20, group_rank0(group))

    handle = model.register_forward_pre_hook(sync)


def _replicas(model: nn.Module) -> List[torch.Tensor]:
    """Every tensor of ``model`` each rank holds whole: buffers, and parameters that are not
    sharded (plain, or DTensors placed ``Replicate`` on every mesh dimension)."""
    # a sharded parameter whose layout no placement describes is a plain tensor: skip by id
    seen = {id(st.param(n)) for m in model.modules() for st in [_flat_state(m)]
            if st is not None for n in st.names}
    out = []
    for t in _tensors(model):
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, DTensor) and not all(isinstance(pl, Replicate) for pl in t.placements):
            continue
        out.append(t)
    return out


def _flat_state(mod: nn.Module):
    """The flat shard storage a module holds (``rsdp``'s ``ShardState``: ``flat``, ``names``,
    ``param(name)``, ``materialize(device)``), else None. Found by what it offers: this
    module sits below :mod:`torch_rsdp.rsdp`, which it must not import."""
    st = getattr(mod, "_rsdp", None)
    return st if callable(getattr(st, "materialize", None)) else None


def _named_tensors(module: nn.Module):
    yield from module.named_parameters(remove_duplicate=False)
    yield from module.named_buffers(remove_duplicate=False)


def _tensors(module: nn.Module):
    return (t for _, t in _named_tensors(module) if t is not None)


def _gradient_owners(module: nn.Module) -> List:
    """What holds gradient hooks on ``module``'s parameters (the RSDP or plan state's bucketed
    gradient averaging)."""
    owners = []
    for state in (getattr(module, "_rsdp_root", None), getattr(module, "_rsdp_plan", None)):
        gs = getattr(state, "grad_sync", None) or getattr(state, "_grad_sync", None)
        if gs is not None:
            owners.append(gs)
    return owners


def _group_of(module: nn.Module) -> Optional[dist.ProcessGroup]:
    """The process group of the RSDP or plan state on ``module`` (None: not a root)."""
    rsdp_root = getattr(module, "_rsdp_root", None)
    if rsdp_root is not None:
        return rsdp_root.ring.group or dist.group.WORLD
    plan = getattr(module, "_rsdp_plan", None)
    if plan is not None:
        return plan.group or dist.group.WORLD
    return None

"""Parameters torch understands: every shard and every replica a ``DTensor``.

FSDP2 makes each sharded parameter an ``nn.Parameter`` holding a ``DTensor`` (``Shard(0)`` on a
mesh of its group), which is why torch's own tools are right for it without special cases:
``torch.nn.utils.clip_grad_norm_`` reduces a sharded gradient's norm over the mesh,
``torch.distributed.checkpoint`` writes each piece once at its offsets, optimizers keep
DTensor state, and ``model.parameters()`` shows global shapes. RSDP's shards (``rsdp.shard``,
the plan's ``rotate``) and ``split:k``'s pieces are made the same kind of object here, with
``Shard(dim)`` over their group. Parameters a strategy keeps whole are ``Replicate()`` DTensors
on the plan's mesh: torch's clipping stacks the norms of all gradients, and a stack that mixes
DTensors with plain tensors raises, so a model whose sharded parameters are DTensors needs all
of them to be.

[Note: computing with local tensors]
A module computes with plain tensors: an ``nn.LayerNorm`` whose weight is a DTensor would turn
its output into one (or raise on a plain input). FSDP2 swaps unsharded plain tensors into its
modules around each forward; a replica needs no gathering, so :func:`compute_with_locals`
does less: the module's class gains a ``__getattr__`` that, while a forward of the model or
of a module holding replicas runs (forward hooks count them), returns ``p.to_local()`` for
its replicated DTensor parameters, and the parameter itself otherwise (so ``a.weight is
b.weight`` still tells a tie). ``to_local`` is differentiable: the gradient flows back to the
DTensor parameter as a ``Replicate()`` DTensor holding this rank's gradient (the plan's
gradient sync then averages its local tensor in place). ``named_parameters``, ``state_dict``
and optimizers read ``_parameters`` directly and see the DTensors. RSDP's own layers pass
their DTensor shards to autograd functions that compute from the flat storage and return
DTensor gradients (:meth:`torch_rsdp.rsdp._layers.shard_state.ShardState.grads_from`).

Neutral ground (torch only): ``rsdp`` and ``plan`` both use it.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Dict, Iterable, Optional, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement, Replicate, Shard

__all__ = ["dtensor_param", "local", "computing", "local_grad", "set_grad", "wrap_like", "like_param",
           "mesh_of_group", "compute_with_locals", "replicate_params", "refuse_ddp", "Shard",
           "Replicate"]

_MESHES: Dict[Tuple[int, str], DeviceMesh] = {}


def mesh_of_group(group: Optional[dist.ProcessGroup], device_type: str) -> DeviceMesh:
    """The 1-D mesh over ``group`` (default: world), one per group and device type."""
    g = group if group is not None else dist.group.WORLD
    key = (id(g), device_type)
    mesh = _MESHES.get(key)
    if mesh is None or mesh.get_group() is not g:
        mesh = _MESHES[key] = DeviceMesh.from_group(g, device_type)
    return mesh


def _contiguous_stride(shape: Sequence[int]) -> Tuple[int, ...]:
    stride, s = [], 1
    for d in reversed(tuple(shape)):
        stride.append(s)
        s *= max(int(d), 1)
    return tuple(reversed(stride))


def dtensor_param(local_tensor: torch.Tensor, mesh: DeviceMesh,
                  placements: Sequence[Placement], shape: Sequence[int],
                  requires_grad: bool = True) -> nn.Parameter:
    """An ``nn.Parameter`` holding a DTensor whose local tensor *is* ``local_tensor`` (no copy:
    a view of a flat storage stays one)."""
    dt = DTensor.from_local(local_tensor.detach(), mesh, list(placements), run_check=False,
                            shape=torch.Size(shape), stride=_contiguous_stride(shape))
    return nn.Parameter(dt, requires_grad=requires_grad)


def local(t: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """This rank's tensor of ``t`` (a DTensor's local tensor, outside autograd), else ``t``."""
    if isinstance(t, DTensor):
        with torch.no_grad():
            return t.to_local()
    return t


def local_grad(p: torch.Tensor) -> Optional[torch.Tensor]:
    """This rank's tensor of ``p.grad`` (``None`` if there is none)."""
    return local(p.grad)


def wrap_like(p: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """``t``, this rank's part of a tensor shaped like ``p``, as a DTensor of ``p``'s
    placements when ``p`` is a DTensor (else ``t`` itself). No communication."""
    if not isinstance(p, DTensor) or isinstance(t, DTensor):
        return t
    if _same_layout(p, t) and not t.requires_grad:
        return DTensor(t, p._spec, requires_grad=False)  # [Note: DTensors built directly]
    return DTensor.from_local(t, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())


def _same_layout(p: DTensor, t: torch.Tensor) -> bool:
    """Whether ``t`` is laid out as ``p``'s local tensor (shape, strides, dtype), so that
    ``p``'s own spec describes a DTensor over ``t``."""
    mine = p._local_tensor
    return t.shape == mine.shape and t.stride() == mine.stride() and t.dtype == mine.dtype


class _ReplicaLocal(torch.autograd.Function):
    """[Note: DTensors built directly]
    ``p.to_local()`` for a ``Replicate()`` DTensor parameter ``p``, whose backward wraps the
    gradient in ``p``'s own spec. torch's ``to_local`` makes a new ``DTensorSpec`` for every
    gradient in backward (its metadata, then hashing) and ``DTensor.from_local`` checks and
    records more: for the norms of a small Llama, many small gradients, that bookkeeping is a
    visible share of a step (the RSDP-against-FSDP2 benchmark, docs/benchmarks.md). A spec
    describes a tensor's placement, shape, strides and dtype, all of which a gradient laid out
    as the parameter shares, so the parameter's spec serves; a gradient laid out otherwise is
    copied into the parameter's layout first."""

    @staticmethod
    def forward(ctx, p):
        ctx.p = p
        return p._local_tensor.view_as(p._local_tensor)

    @staticmethod
    def backward(ctx, g):
        p = ctx.p
        if not _same_layout(p, g):
            g = torch.empty_like(p._local_tensor).copy_(g)
        return DTensor(g, p._spec, requires_grad=g.requires_grad)


def _local_for_compute(value: DTensor) -> torch.Tensor:
    if all(isinstance(pl, Replicate) for pl in value.placements):
        return _ReplicaLocal.apply(value)
    return value.to_local()


def set_grad(p: torch.Tensor, g: Optional[torch.Tensor]) -> None:
    """``p.grad = g`` for a plain ``g`` that is this rank's gradient (wrapped like ``p``)."""
    p.grad = None if g is None else wrap_like(p, g)


def like_param(p: torch.Tensor, value, what: str):
    """``value`` in the form ``p`` holds, for ``load_state_dict``: for a DTensor ``p``, a
    DTensor of its placements made from a DTensor, the whole tensor (this rank's
    ``torch.chunk`` pieces taken) or this rank's part; for a plain ``p``, ``value`` as it is.
    Raises ``ValueError`` naming ``what`` for a shape that is neither."""
    if not isinstance(p, DTensor) or not isinstance(value, torch.Tensor):
        return value
    if isinstance(value, DTensor):
        if value.device_mesh == p.device_mesh and tuple(value.placements) == tuple(p.placements):
            return value
        value = value.full_tensor()  # another layout: every rank loads the same keys
    mine = local(p)
    if tuple(value.shape) == tuple(p.shape):
        part = value
        coord = p.device_mesh.get_coordinate()
        for mdim, pl in enumerate(p.placements):
            if isinstance(pl, Shard):
                part = torch.chunk(part, p.device_mesh.size(mdim), pl.dim)[coord[mdim]]
    elif tuple(value.shape) == tuple(mine.shape):
        part = value
    else:
        raise ValueError(f"torch_rsdp rank {dist.get_rank()}: {what} has shape "
                         f"{tuple(value.shape)}; the model holds it as {tuple(p.shape)} "
                         f"({tuple(mine.shape)} on this rank)")
    if part.stride() != mine.stride():  # a chunk along a later dim is strided: optimizers'
        # fused kernels take every state tensor laid out as its parameter (as zeros_like makes it)
        part = torch.empty_like(mine, dtype=part.dtype).copy_(part)
    return DTensor.from_local(part, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())


# ------------------------------------------------------------------ [Note: computing with local tensors]
_DEPTH = threading.local()  # forwards of modules holding replicas under way, on this thread


def _computing() -> bool:
    return getattr(_DEPTH, "n", 0) > 0


@contextlib.contextmanager
def computing():
    """Replicas read as their local tensors inside this block, as inside a forward: for a
    module's forward run again outside the model's (a rotation unit's backward recomputes
    its shards' calls)."""
    _enter(None, None)
    try:
        yield
    finally:
        _leave(None, None, None)


def _enter(module, args):
    _DEPTH.n = getattr(_DEPTH, "n", 0) + 1


def _leave(module, args, output):
    _DEPTH.n -= 1


class _LocalCompute:
    """Mixin: inside a forward, the DTensor parameters named in ``_rsdp_local`` read as their
    local tensors; outside one they read as themselves (so ``a.weight is b.weight`` still
    tells a tie)."""

    def __getattr__(self, name):
        value = super().__getattr__(name)
        if (isinstance(value, DTensor) and _computing()
                and name in self.__dict__.get("_rsdp_local", ())):
            return _local_for_compute(value)
        return value


_CLASSES: Dict[type, type] = {}


def compute_with_locals(module: nn.Module, names: Iterable[str]) -> None:
    """Makes ``module`` read its DTensor parameters ``names`` (its own, not dotted) as their
    local tensors while it computes ([Note: computing with local tensors])."""
    names = set(names)
    if not names:
        return
    cls = type(module)
    if not issubclass(cls, _LocalCompute):
        new = _CLASSES.get(cls)
        if new is None:
            # Same name, so that reprs and class-name checks (HF's _no_split_modules) still read
            # as the user's class.
            new = _CLASSES[cls] = type(cls.__name__, (_LocalCompute, cls),
                                       {"__module__": cls.__module__,
                                        "__qualname__": cls.__qualname__})
        module.__class__ = new
    computes_locally(module)
    module.__dict__.setdefault("_rsdp_local", set()).update(names)


def computes_locally(module: nn.Module) -> None:
    """Marks ``module``'s forward as a place where replicas read as local tensors (the
    modules that hold them, and the root, whose forward may read any of them)."""
    if not module.__dict__.get("_rsdp_compute_hooks", False):
        module._rsdp_compute_hooks = True
        module.register_forward_pre_hook(_enter)
        module.register_forward_hook(_leave, always_call=True)


def replicate_params(model: nn.Module, params: Iterable[nn.Parameter], mesh: DeviceMesh
                     ) -> Dict[int, nn.Parameter]:
    """Re-registers each of ``params`` (plain, held whole on every rank) as a ``Replicate()``
    DTensor parameter on ``mesh`` over the same data, wherever ``model`` holds it (a tied
    parameter everywhere it is tied), and makes its holders compute with the local tensor.
    Returns id(old) -> new."""
    wanted = {id(p): p for p in params if not isinstance(p, DTensor)}
    new: Dict[int, nn.Parameter] = {}
    for mod in model.modules():
        own = [(n, p) for n, p in mod._parameters.items() if p is not None and id(p) in wanted]
        for n, p in own:
            q = new.get(id(p))
            if q is None:
                q = new[id(p)] = dtensor_param(p.data, mesh, [Replicate()] * mesh.ndim,
                                               p.shape, p.requires_grad)
                if p.grad is not None:
                    set_grad(q, p.grad)
            mod._parameters[n] = q
        compute_with_locals(mod, [n for n, _ in own])
    if new:
        computes_locally(model)
    return new


def refuse_ddp(model: nn.Module) -> None:
    """Tells ``DistributedDataParallel`` to leave every parameter and buffer of ``model`` alone
    (torch's ``_ddp_params_and_buffers_to_ignore``): a sharded model synchronises itself, and
    DDP's start-up broadcast would overwrite every rank's shards with rank 0's. DDP then finds
    nothing to synchronise and raises at construction, on every rank ("DistributedDataParallel
    is not needed when a module doesn't have any parameter that requires a gradient")."""
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in model.named_buffers(remove_duplicate=False)]
    model._ddp_params_and_buffers_to_ignore = names

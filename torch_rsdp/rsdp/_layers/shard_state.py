"""Per-module sharding state: the flat local storage and the Parameters that view it.

:class:`ShardState` takes a module's full parameters, keeps only this rank's shard of each in
one padded flat storage (see :mod:`.._rotation.flat_shard`) and re-registers each as an ``nn.Parameter``
whose data is a *view* of that storage. Where the shards are the pieces ``torch.chunk`` gives
each rank along one dimension, the parameter is a ``DTensor`` (``Shard(dim)`` over the ring's
group, :mod:`torch_rsdp._dtensor_params`) whose local tensor is that view: torch's clipping,
checkpoints and optimizers see a piece of a global tensor, and the gradients the ring brings
home come back as DTensors of the same placement (:meth:`ShardState.grads_from`). Other
layouts (``nn.MultiheadAttention``'s packed heads) stay plain local tensors; a rotation unit
whose heads do not divide evenly is not formed ([Note: units split evenly] in
:mod:`.._units.rotation_unit`). Any optimiser works, its state sharded too, while a whole shard can
be sent with a single ring op straight from the storage, with no copy.

If something rebinds a parameter's ``.data`` (``module.to(...)``, manual assignment), the next
:meth:`ShardState.local_flat` notices and rebuilds the storage from the parameters.
"""
from __future__ import annotations

from typing import Callable, Dict, Optional

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.distributed.tensor import DTensor

from ..._dtensor_params import Shard, dtensor_param, local, mesh_of_group
from ..._materialize import swap_keeping_attributes
from .._rotation.flat_shard import FlatLayout, chunk_sizes
from .._rotation.memory import alloc_buffer, release_buffers
from .._rotation.ring_feedback import RingFeedback
from .._rotation.ring_order import Ring

__all__ = ["ShardState", "grads_like_params", "owner_of"]


class ShardState:
    """Sharding state of one module.

    ``full``: name -> full parameter (``None`` entries are skipped);
    ``take(name, full, j)``: rank ``j``'s shard of ``full`` (a slice);
    ``dims``: name -> the dimension the parameter is split along (to reassemble it);
    ``assemble(name, shards)`` (optional) rebuilds a full parameter from every rank's shard
    when it is not simply their concatenation along ``dims[name]``.
    Names may be dotted (``"out_proj.weight"``): the parameter then lives on a submodule.
    """

    def __init__(self, module: nn.Module, ring: Ring, full: Dict[str, torch.Tensor],
                 take: Callable[[str, torch.Tensor, int], torch.Tensor],
                 dims: Dict[str, int], mp: Optional[MixedPrecisionPolicy] = None,
                 assemble: Optional[Callable[[str, list], torch.Tensor]] = None):
        self.ring = ring
        # Error feedback of the gradients' quantised hops between nodes; None turns it off.
        self.feedback: Optional[RingFeedback] = RingFeedback()
        self._assemble = assemble
        self.take = take
        self.dims = dims
        self.mp = mp or MixedPrecisionPolicy()
        self.names = [n for n, t in full.items() if t is not None]
        W, r = ring.world, ring.rank
        self.layout = FlatLayout({n: [tuple(take(n, full[n], j).shape) for j in range(W)]
                                  for n in self.names})
        ref = full[self.names[0]]
        self.flat = torch.zeros(self.layout.numel, dtype=ref.dtype, device=ref.device)
        # [Note: shards offloaded to host memory] in .._rotation.device_copies
        self.offloaded = False
        self.pin_memory = False
        mesh = mesh_of_group(ring.group, ref.device.type)
        with torch.no_grad():
            for n in self.names:
                old = full[n]
                view = self.layout.view(self.flat, n, r)
                view.copy_(take(n, old, r))
                requires_grad = old.requires_grad if isinstance(old, nn.Parameter) else True
                owner, attr = owner_of(module, n)
                lay = self.chunk_layout(n)
                p = (nn.Parameter(view, requires_grad=requires_grad) if lay is None else
                     dtensor_param(view, mesh, [Shard(lay[0])], lay[1], requires_grad))
                setattr(owner, attr, p)
        self.module_ref = module

    def chunk_layout(self, name: str):
        """``(dim, global shape)`` when every rank's shard of ``name`` is the piece
        ``torch.chunk`` gives it along ``dim`` (DTensor's ``Shard(dim)``), else None."""
        shapes, d, W = self.layout.shapes[name], self.dims.get(name), self.ring.world
        if d is None:
            return None
        total = sum(s[d] for s in shapes)
        ref = max(shapes, key=lambda s: s[d])
        regular = (self._assemble is None and [s[d] for s in shapes] == chunk_sizes(total, W)
                   and all(s[:d] + s[d + 1:] == ref[:d] + ref[d + 1:] for s in shapes))
        return (d, ref[:d] + (total,) + ref[d + 1:]) if regular else None

    def materialize(self, device: torch.device) -> None:
        """Allocates the flat storage of a module sharded on ``meta`` on ``device`` (zeros,
        padding included; host memory when offloaded) and makes every parameter a view of it
        again, each keeping its Python identity (:mod:`torch_rsdp._materialize`)."""
        self._place(self._host(device), copy=False)

    def offload(self, pin_memory: bool) -> None:
        """Keeps the flat storage in host memory from now on, moving it there if it is on a
        device ([Note: shards offloaded to host memory] in :mod:`.._rotation.device_copies`);
        ``pin_memory`` pins it when the model computes on CUDA."""
        self.offloaded, self.pin_memory = True, pin_memory
        if not self.flat.is_meta and self.flat.device.type != "cpu":
            self._place(self._host(self.flat.device), copy=True)
        for n in self.names:  # model.to(device) leaves it here (torch_rsdp._apply_guard)
            self.param(n)._rsdp_offloaded = True

    def _host(self, device: torch.device) -> torch.device:
        return torch.device("cpu") if self.offloaded else device

    def _place(self, device: torch.device, copy: bool) -> None:
        """A new flat storage on ``device`` (this one's values if ``copy``, else zeros), every
        parameter made a view of it, keeping its identity."""
        flat = torch.zeros(self.layout.numel, dtype=self.flat.dtype, device=device)
        if copy:
            flat.copy_(self.flat)
        if self.pin_memory and torch.cuda.is_available():
            flat = flat.pin_memory()
        self.flat = flat
        mesh = mesh_of_group(self.ring.group, device.type)
        for n in self.names:
            p = self.param(n)
            view = self.layout.view(self.flat, n, self.ring.rank)
            new = (dtensor_param(view, mesh, p.placements, p.shape, p.requires_grad)
                   if isinstance(p, DTensor) else nn.Parameter(view, p.requires_grad))
            swap_keeping_attributes(p, new)

    # ----------------------------------------------------------------------------------------
    def param(self, name: str) -> nn.Parameter:
        # through the owners resolved once: a module moved in the tree (peft's
        # merge_and_unload puts a LoRA layer's base layer in its place) still holds it
        for n, owner, attr in self._owners():
            if n == name:
                return getattr(owner, attr)
        raise KeyError(name)

    def assemble(self, name: str, shards: list) -> torch.Tensor:
        """The full parameter ``name`` from every rank's shard of it (in rank order)."""
        if self._assemble is not None:
            return self._assemble(name, shards)
        return torch.cat(shards, dim=self.dims[name])

    def _owners(self):
        """``[(name, module holding it, attribute)]``, resolved once."""
        owners = self.__dict__.get("_owner_list")
        if owners is None:
            owners = self._owner_list = [(n, *owner_of(self.module_ref, n)) for n in self.names]
        return owners

    def local_flat(self) -> torch.Tensor:
        """This rank's flat storage, rebuilt first if a parameter no longer views it."""
        flat = self.flat
        lay, r = self.layout, self.ring.rank
        stale = False
        for n, owner, attr in self._owners():
            p = owner._parameters[attr]
            t = p._local_tensor if isinstance(p, DTensor) else p
            off = lay.offsets[n]
            if (t.dtype != flat.dtype or t.device != flat.device
                    or tuple(t.shape) != lay.shapes[n][r]
                    or (t.numel() and t.data_ptr() != flat.data_ptr() + off * flat.itemsize)):
                stale = True
                break
        if stale:
            p0 = local(self.param(self.names[0]))
            flat = torch.zeros(self.layout.numel, dtype=p0.dtype, device=p0.device)
            with torch.no_grad():
                for n in self.names:
                    p = self.param(n)
                    v = self.layout.view(flat, n, r)
                    v.copy_(local(p))
                    if isinstance(p, DTensor):
                        p._local_tensor = v  # keeps the Parameter (the optimizer holds it)
                    else:
                        p.data = v
            self.flat = flat
        return self.flat

    def compute_flat(self) -> torch.Tensor:
        """The flat shard to rotate: the storage itself, or a ``param_dtype`` copy of it."""
        flat = self.local_flat()
        pdt = self.mp.param_dtype
        if pdt is None or pdt == flat.dtype:
            return flat
        buf = alloc_buffer(flat.numel(), pdt, flat.device)
        buf.copy_(flat)
        return buf

    def release(self, src: torch.Tensor) -> None:
        """Done with a tensor returned by :meth:`compute_flat` (a no-op for the storage)."""
        if src is not self.flat:
            release_buffers(src)

    @property
    def grad_dtype(self) -> torch.dtype:
        return self.mp.reduce_dtype or self.flat.dtype

    def grads_from(self, acc: torch.Tensor) -> Dict[str, torch.Tensor]:
        """Per-parameter gradients (views of ``acc``, averaged over the group like DDP), cast
        to the parameter dtype."""
        return grads_like_params(acc, self.ring, self.flat.dtype, self.layout, self._owners())


def grads_like_params(acc: torch.Tensor, ring: Ring, dtype: torch.dtype, layout: FlatLayout,
                      owners) -> Dict[str, torch.Tensor]:
    """``acc`` (a flat gradient sum over ``ring``, laid out as ``layout``) averaged and cast to
    ``dtype``, as one gradient per ``(name, module, attribute)`` of ``owners``: a view of
    ``acc`` of that parameter's kind."""
    acc.div_(ring.world)
    if acc.dtype != dtype:
        acc = acc.to(dtype)
    out = {}
    for n, owner, attr in owners:
        # autograd wants a gradient of the parameter's kind: a DTensor of the parameter's
        # spec, built directly (DTensor.from_local's checks and autograd node cost more
        # than the rest of a small layer's bookkeeping)
        p = owner._parameters[attr]
        v = layout.view(acc, n, ring.rank)
        out[n] = DTensor(v, p._spec, requires_grad=False) if isinstance(p, DTensor) else v
    return out


def owner_of(module: nn.Module, name: str):
    """(module holding parameter ``name``, its attribute name) for a possibly dotted name."""
    path, _, attr = name.rpartition(".")
    return (module.get_submodule(path) if path else module), attr

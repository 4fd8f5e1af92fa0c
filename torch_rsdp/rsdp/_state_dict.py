"""State dicts of a sharded model.

* Sharded: ``model.state_dict()`` already is one - the same keys as the unwrapped model, each
  shard a DTensor over the group (``Shard(dim)``), so ``torch.distributed.checkpoint`` writes
  each piece once and reshards on load (:mod:`torch_rsdp._checkpoint_hooks`);
  ``model.load_state_dict(sd)`` takes DTensors, whole tensors or this rank's shards and
  copies them in place (the parameters keep viewing the flat storage).
* Full: :class:`FullTensors` gathers every sharded parameter (one module at a time) into the
  unwrapped model's tensor on group rank 0 (or every rank), and :func:`local_shard_of` cuts a
  whole tensor to this rank's slices; :class:`~._state.RSDPState` offers both, and
  ``torch_rsdp.plan.full_state_dict`` / ``load_full_state_dict`` (for a model ``shard`` made
  as for a planned one) loop over a state dict with them.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from .._utils import group_rank0
from ._layers.shard_state import ShardState

__all__ = ["local_shard_of", "sharded_owner", "FullTensors", "shard_dim"]


def sharded_owner(model: nn.Module, key: str) -> Optional[Tuple[ShardState, str]]:
    """(ShardState, local name) when ``key`` names a sharded parameter, else None.

    The state may sit on an ancestor of the parameter's module (an attention module owns its
    ``out_proj.weight``), so every split of ``key`` into module path and name is tried. A
    parameter whose module moved since sharding (peft's ``merge_and_unload`` puts a LoRA
    layer's base layer in its place inside a rotation unit) is found by identity."""
    parts = key.split(".")
    param = None
    for cut in range(len(parts) - 1, -1, -1):
        mod_name, pname = ".".join(parts[:cut]), ".".join(parts[cut:])
        try:
            mod = model.get_submodule(mod_name) if mod_name else model
        except AttributeError:
            continue
        st = getattr(mod, "_rsdp", None)
        if not isinstance(st, ShardState):
            continue
        if pname in st.names:
            return st, pname
        if param is None:
            try:
                param = model.get_parameter(key)
            except AttributeError:
                return None  # a buffer
        for name in st.names:
            if st.param(name) is param:
                return st, name
    return None


def shard_dim(model: nn.Module, key: str) -> Optional[Tuple[int, Tuple[int, ...]]]:
    """How ``key`` is sharded, for checkpoints: ``(dim, global shape)`` when every rank holds
    the piece ``torch.chunk`` gives it along ``dim`` (DTensor's ``Shard(dim)`` over the
    group); ``None`` when ``key`` is not sharded. Raises ``ValueError`` for a layout that is
    not one chunk per rank (``nn.MultiheadAttention``'s packed heads), naming the key."""
    owner = sharded_owner(model, key)
    if owner is None:
        return None
    st, name = owner
    lay = st.chunk_layout(name)
    if lay is None:
        raise ValueError(f"torch_rsdp.rsdp: {key!r} is sharded in a layout a checkpoint cannot "
                         f"describe as one torch.chunk piece per rank (shapes per rank "
                         f"{st.layout.shapes[name]}); save it with "
                         f"torch_rsdp.plan.full_state_dict, or shard that module another way")
    return lay


def local_shard_of(model: nn.Module, key: str, full: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``full`` (the unwrapped model's value for ``key``)."""
    owner = sharded_owner(model, key)
    if owner is None:
        return full
    st, name = owner
    return st.take(name, full, st.ring.rank)


class FullTensors:
    """Whole values of a sharded model's sharded parameters, one key at a time.

    ``full(key)`` assembles the unwrapped model's tensor for ``key`` on group rank 0 (``None``
    on the other ranks) or, with ``rank0_only=False``, on every rank. Collective: every rank
    asks for the same keys in the same order. The keys of one module come one after another in
    a state dict, so every rank's flat storage of a module is gathered once and kept until a
    key of another module is asked for: the peak is one module's shards from every rank.
    """

    def __init__(self, model: nn.Module, rank0_only: bool = True):
        self.model = model
        self.rank0_only = rank0_only
        self._state_id = None
        self._parts = None  # every rank's flat storage of the module being assembled

    def owns(self, key: str) -> bool:
        """Whether ``key`` names a sharded parameter."""
        return sharded_owner(self.model, key) is not None

    @torch.no_grad()
    def full(self, key: str) -> Optional[torch.Tensor]:
        owner = sharded_owner(self.model, key)
        if owner is None:
            raise KeyError(f"torch_rsdp.rsdp: {key!r} is not a sharded parameter")
        st, name = owner
        if id(st) != self._state_id:  # free the previous module's storages first
            self._parts = None
            self._state_id, self._parts = id(st), _gather_flat(st, self.rank0_only)
        if self._parts is None:
            return None
        return st.assemble(name, [st.layout.view(self._parts[j], name, j)
                                  for j in range(st.ring.world)])


def _gather_flat(st: ShardState, rank0_only: bool):
    """Every rank's flat storage of ``st`` (on rank 0 only when ``rank0_only``)."""
    ring, flat = st.ring, st.local_flat()
    with record_function("RSDP::state_dict_gather"):
        if ring.world == 1:
            return [flat]
        if rank0_only:
            parts = ([torch.empty_like(flat) for _ in range(ring.world)]
                     if ring.rank == 0 else None)
            dist.gather(flat, parts, dst=group_rank0(ring.group), group=ring.group)
            return parts
        parts = [torch.empty_like(flat) for _ in range(ring.world)]
        dist.all_gather(parts, flat, group=ring.group)
        return parts

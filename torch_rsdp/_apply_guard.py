"""``model.to(...)``, ``.cpu()``, ``.float()`` ... on a sharded model: a no-op, or a refusal.

``nn.Module._apply`` (behind every one of those) replaces each parameter that is a tensor
subclass, DTensor included, by a fresh ``Parameter`` through ``torch.utils.swap_tensors``,
*even when the conversion changes nothing* (a CPU model moved to the CPU, as the Hugging Face
``Trainer`` does to every model it is given). The swap takes the hooks that torch_rsdp keeps on
the parameter objects with it (the replicated parameters' gradient all-reduce,
:mod:`torch_rsdp._grad_sync`): gradients then silently stop being averaged, and every rank
trains its own model.

So every module of a sharded model gets an ``_apply`` that first asks the conversion what it
would do to each parameter and buffer, one at a time: if it returns each of them as it is, or
an equal copy (the usual case: same device, same dtype), nothing is swapped and the model is
left alone (an offloaded shard that it would only move to the device stays in host memory);
if it would move or cast one, it raises before touching anything, naming the rank and the tensor, since a sharded
parameter's storage is the one the ring or the plan's buckets hold (cast or move the model
before sharding it; ``plan.apply(mixed_precision=...)`` computes in lower precision).
"""
from __future__ import annotations

import types

import torch
import torch.distributed as dist
import torch.nn as nn

from ._dtensor_params import local
from ._materialize import allocates, materialize

__all__ = ["guard_apply"]


def _kind(t: torch.Tensor) -> type:
    """A tensor's class, a plain ``Parameter`` counting as a plain tensor: the copy a
    conversion returns of one is a plain tensor (the Trainer's move to its device, under
    torchrun, copies a rotation unit's plain shard parameters)."""
    return torch.Tensor if type(t) is nn.Parameter else type(t)


def _unchanged(t: torch.Tensor, out) -> bool:
    """``out`` is ``t`` or equal to it in every respect but identity (``.to()`` returns a
    copy where the device and dtype already match in some contexts: the Trainer's move to its
    device is one)."""
    if out is t:
        return True
    if not isinstance(out, torch.Tensor) or _kind(out) is not _kind(t):
        return False
    if getattr(t, "placements", None) != getattr(out, "placements", None):
        return False
    a, b = local(t), local(out)
    return (a.dtype == b.dtype and a.device == b.device and a.shape == b.shape
            and out.shape == t.shape and (a.data_ptr() == b.data_ptr() or torch.equal(a, b)))


def _stays_on_host(t: torch.Tensor, out) -> bool:
    """``t`` is an offloaded shard (``_rsdp_offloaded``, set by its owner) that ``out`` would
    only move: it stays in host memory, where offload keeps it ([Note: shards offloaded to host
    memory] in ``rsdp/_rotation/device_copies.py``), so the Trainer's move of the model to its
    device is a no-op for it."""
    if not getattr(t, "_rsdp_offloaded", False) or not isinstance(out, torch.Tensor):
        return False
    a, b = local(t), local(out)
    return a.dtype == b.dtype and a.shape == b.shape and out.shape == t.shape


def _guarded_apply(self: nn.Module, fn, recurse: bool = True):
    tensors = list(self.named_parameters(recurse=recurse, remove_duplicate=False))
    tensors += list(self.named_buffers(recurse=recurse, remove_duplicate=False))
    meta = 0
    for name, t in tensors:
        if t is None:
            continue
        if local(t).is_meta and allocates(fn, t):
            meta += 1  # to_empty of a model sharded on meta: allocated below
            continue
        out = fn(t)
        if not (_unchanged(t, out) or _stays_on_host(t, out)):
            rank = dist.get_rank() if dist.is_initialized() else 0
            what = (f"{t.dtype} on {t.device} -> {out.dtype} on {out.device}"
                    if hasattr(out, "dtype") else "a new tensor")
            raise ValueError(
                f"torch_rsdp: rank {rank}: converting a sharded model ({type(self).__name__}."
                f"to(), .cpu(), .half(), ...) would replace {name!r} ({what}); torch_rsdp "
                f"holds its parameters in place (shards and gradient buckets), so move or "
                f"cast the model before sharding it (plan.apply(mixed_precision=...) computes "
                f"in lower precision)")
    if meta:
        materialize(self, fn)
    return self


def guard_apply(model: nn.Module) -> None:
    """Gives every module of ``model`` the guarded ``_apply`` (see the module's docstring)."""
    for m in model.modules():
        m._apply = types.MethodType(_guarded_apply, m)

"""Ring redistribution: the primitive RSDP is built on.

Every rank of the group passes a tensor to its ring successor while receiving
its predecessor's (``direction=-1`` reverses the ring). The ring is node-aware:
ranks of one node are adjacent, so a rotation crosses each node boundary once
(and only those hops are quantised when the group compresses ring shifts).
After ``group.size()`` shifts every tensor has visited every rank and is back
home.
"""
from typing import Optional

import torch
import torch.distributed as dist

from . import _C

__all__ = ["ring_shift", "ring_shift_reduce", "ring_neighbours", "rsdp_backend"]


def rsdp_backend(group: Optional[dist.ProcessGroup] = None, device: Optional[torch.device] = None):
    """The BackendRSDP object of ``group`` (default: world) serving ``device``.

    Without a device: the one serving CPU tensors, else the one serving CUDA
    tensors (e.g. ``init_process_group("cpu:gloo,cuda:rsdp")``).
    """
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    devices = [torch.device(device).type] if device is not None else ["cpu", "cuda"]
    found = []
    for dev in devices:
        try:
            backend = pg._get_backend(torch.device(dev))
        except RuntimeError:  # no backend registered for this device
            continue
        if isinstance(backend, _C.BackendRSDP):
            return backend
        found.append(f"{type(backend).__name__} on {dev}")
    raise TypeError(
        f"torch_rsdp: this operation needs a process group on the 'rsdp' backend, "
        f"got {', '.join(found) or 'no backend'}; use init_process_group('rsdp') / "
        f"new_group(backend='rsdp')"
    )


def ring_neighbours(group=None, direction: int = 1):
    """(group rank this rank sends to, group rank it receives from)."""
    send_to, recv_from = rsdp_backend(group).ring_neighbours(direction)
    return send_to, recv_from


def _run(work, out, async_op):
    if async_op:
        return work
    work.wait()
    return out


def ring_shift(tensor: torch.Tensor, out: Optional[torch.Tensor] = None, *, group=None,
               direction: int = 1, async_op: bool = False):
    """Sends ``tensor`` along the ring and receives the neighbour's into ``out``.

    ``out`` defaults to a new tensor like ``tensor``; it may be ``tensor`` itself
    (the send side is staged first, so an in-place rotation needs no second
    buffer). All ranks must pass the same shape, dtype and direction. Returns
    ``out``, or a Work when ``async_op`` (``work.get_future()`` yields ``[out]``).
    """
    if out is None:
        out = torch.empty_like(tensor)
    work = rsdp_backend(group, tensor.device).ring_shift(tensor, out, direction, None, async_op)
    return _run(work, out, async_op)


def ring_shift_reduce(tensor: torch.Tensor, local: torch.Tensor,
                      out: Optional[torch.Tensor] = None, *, group=None, direction: int = 1,
                      async_op: bool = False, residual: Optional[torch.Tensor] = None):
    """Like :func:`ring_shift`, then adds ``local``: ``out = neighbour's tensor + local``.

    This is the fused step that carries gradients home: if every rank starts
    with its own contribution to some shard's gradient and, at every hop, adds
    its contribution to the shard whose accumulator just arrived, then after
    ``size - 1`` hops each accumulator holds the sum over all ranks.
    float16/bfloat16 are added in float32 and rounded once.

    Under the group's ``ring_shift_reduce`` compression
    (:func:`torch_rsdp.set_compression`) a hop between nodes carries block-quantised
    values; ``residual`` (float32, ``tensor``'s size, kept by the caller between calls) is
    then error feedback: what quantising this rank's send lost is stored in it and added to
    the next send. It is left as it is where this rank's send stays exact.
    """
    if out is None:
        out = torch.empty_like(tensor)
    work = rsdp_backend(group, tensor.device).ring_shift(tensor, out, direction, local, async_op,
                                                         residual)
    return _run(work, out, async_op)

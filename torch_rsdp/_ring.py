"""Ring redistribution: the primitive RSDP is built on.

Every rank of the group passes a tensor to its ring successor while receiving
its predecessor's (``direction=-1`` reverses the ring). The ring is node-aware:
ranks of one node are adjacent, so a rotation crosses each node boundary once
(and only those hops are quantised when the group compresses ring shifts).
After ``group.size()`` shifts every tensor has visited every rank and is back
home.

It runs on a group of any backend: the rsdp backend's fused ring step where
the group is on rsdp, torch's batched point-to-point ops elsewhere
(:mod:`._p2p_ring`), with the same semantics and the same results.
"""
import weakref
import zlib
from typing import Optional

import torch
import torch.distributed as dist

from . import _C
from ._p2p_ring import P2PRing, RingShiftWork

__all__ = ["ring_shift", "ring_shift_reduce", "ring_neighbours", "rsdp_backend", "backend_of",
           "ring_transport", "check_shift", "FIX", "P2PRing"]

#: How to get the rsdp backend, for every refusal of a feature that needs it.
FIX = ("init_process_group('rsdp'), or init_process_group('cpu:rsdp,cuda:nccl') to keep NCCL "
       "for CUDA tensors (new_group(backend=...) likewise for a subgroup)")

_P2P: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _pg(group):
    return group if group is not None else dist.distributed_c10d._get_default_group()


def backend_of(group: Optional[dist.ProcessGroup] = None,
               device: Optional[torch.device] = None):
    """The BackendRSDP of ``group`` serving ``device`` (without one: CPU tensors, else CUDA
    tensors), or None where that is another backend."""
    pg = _pg(group)
    devices = [torch.device(device).type] if device is not None else ["cpu", "cuda"]
    for dev in devices:
        try:
            backend = pg._get_backend(torch.device(dev))
        except RuntimeError:  # no backend registered for this device
            continue
        if isinstance(backend, _C.BackendRSDP):
            return backend
    return None


def _describe_backends(pg) -> str:
    found = []
    for dev in ("cpu", "cuda"):
        try:
            backend = pg._get_backend(torch.device(dev))
        except RuntimeError:
            continue
        name = backend.name() if hasattr(backend, "name") else type(backend).__name__
        found.append(f"{name} for {dev} tensors")
    return ", ".join(found) or "no backend"


def rsdp_backend(group: Optional[dist.ProcessGroup] = None, device: Optional[torch.device] = None,
                 feature: str = "this operation"):
    """The BackendRSDP object of ``group`` (default: world) serving ``device``.

    Without a device: the one serving CPU tensors, else the one serving CUDA
    tensors (e.g. ``init_process_group("cpu:gloo,cuda:rsdp")``). A group on
    another backend gets a ``TypeError`` naming ``feature``, the group's backend
    and how to get rsdp.
    """
    backend = backend_of(group, device)
    if backend is not None:
        return backend
    where = f" for {torch.device(device).type} tensors" if device is not None else ""
    raise TypeError(
        f"torch_rsdp: {feature} needs a process group on the 'rsdp' backend{where}; this "
        f"group (rank {dist.get_rank()}) has {_describe_backends(_pg(group))}. Use {FIX}")


def ring_transport(group: Optional[dist.ProcessGroup] = None,
                   device: Optional[torch.device] = None):
    """What shifts ``group``'s ring for tensors on ``device``: its BackendRSDP, or a
    :class:`~._p2p_ring.P2PRing` on any other backend (built once per group; collective the
    first time, where the node map needs gathering)."""
    backend = backend_of(group, device)
    if backend is not None:
        return backend
    pg = _pg(group)
    ring = _P2P.get(pg)
    if ring is None:
        # rsdp's ring where the group has rsdp for the other device ("cpu:rsdp,cuda:nccl"):
        # the same order either way, this one without gathering anything
        other = backend_of(pg)
        order = list(other.ring_order) if other is not None else None
        ring = _P2P[pg] = P2PRing(pg, order)
    return ring


def ring_neighbours(group=None, direction: int = 1):
    """(group rank this rank sends to, group rank it receives from)."""
    # the same method on both transports (P2PRing names it as BackendRSDP does)
    send_to, recv_from = ring_transport(group).ring_neighbours(direction)
    return send_to, recv_from


def _describe(t: torch.Tensor) -> str:
    return f"{list(t.shape)} {t.dtype}"


def check_shift(op: str, tensor: torch.Tensor, out: torch.Tensor, direction: int,
                local: Optional[torch.Tensor]) -> None:
    """This rank's arguments of a ring op on a non-rsdp group, checked as the rsdp backend
    checks them (a ValueError naming the rank, the op and the offending tensor)."""
    me = f"rank {dist.get_rank()}: {op}"
    if direction not in (1, -1):
        raise ValueError(f"{me}: direction must be +1 or -1, got {direction}")
    if out.dtype != tensor.dtype:
        raise ValueError(f"{me}: output {_describe(out)} must have the tensor's dtype "
                         f"({_describe(tensor)})")
    if out.numel() != tensor.numel():
        raise ValueError(f"{me}: output {_describe(out)} must have as many elements as the "
                         f"tensor {_describe(tensor)}")
    if out.device != tensor.device:
        raise ValueError(f"{me}: output on {out.device}, tensor on {tensor.device}")
    if local is not None and (local.dtype != tensor.dtype or local.numel() != tensor.numel()
                              or local.device != tensor.device):
        raise ValueError(f"{me}: local contribution {_describe(local)} must match the tensor "
                         f"{_describe(tensor)}")


def _dtype_code(dtype: torch.dtype) -> int:
    """The same number for the same dtype on every rank (not an order of first use)."""
    return zlib.crc32(str(dtype).encode())


def _agree(group, op: str, tensor: torch.Tensor, direction: int) -> None:
    """Raises on every rank where the ranks of ``group`` disagree on the op, direction, dtype
    or element count of this ring op: a mismatch on a point-to-point ring would otherwise
    hang until the group's timeout, or pair buffers of different sizes. One small all-gather
    on the tensor's device (the public functions only; RSDP's schedules are the same on every
    rank by construction)."""
    pg = _pg(group)
    code = _dtype_code(tensor.dtype)
    mine = torch.tensor([1 if op == "ring_shift" else 2, direction, code, tensor.numel()],
                        dtype=torch.int64, device=tensor.device)
    world = dist.get_world_size(pg)
    every = torch.empty(world * 4, dtype=torch.int64, device=tensor.device)
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # 2.13's name
    gather(every, mine, group=pg)
    rows = every.view(world, 4).tolist()
    if all(r == rows[0] for r in rows):
        return
    names = {_dtype_code(d): str(d).replace("torch.", "") for d in vars(torch).values()
             if isinstance(d, torch.dtype)}

    def show(r):
        kind = "ring_shift" if r[0] == 1 else "ring_shift_reduce"
        return f"{kind} direction {r[1]:+d}, {r[3]} x {names.get(r[2], '?')}"

    calls = "; ".join(f"group rank {q}: {show(r)}" for q, r in enumerate(rows))
    raise RuntimeError(f"rank {dist.get_rank()}: {op}: the ranks' calls mismatch ({calls}); "
                       f"every rank must pass the same direction, element count and dtype")


def _issue(op: str, tensor, out, direction, local, residual, group, async_op):
    transport = ring_transport(group, tensor.device)
    if not isinstance(transport, P2PRing):
        work = transport.ring_shift(tensor, out, direction, local, async_op, residual)
        return _run(work, out, async_op)
    check_shift(op, tensor, out, direction, local)
    if transport.world > 1:
        _agree(group, op, tensor, direction)
    # ``residual`` is error feedback of a quantised send; sends on this backend are exact
    # (compression needs rsdp), so it stays as it is, as rsdp leaves it on exact hops.
    work: RingShiftWork = transport.shift(tensor, out, direction, local)
    return _run(work, out, async_op)

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

    Any backend: the rsdp backend's fused ring step, or on another backend (gloo,
    NCCL) torch's ``batch_isend_irecv``, after one small all-gather that checks
    the ranks agree on direction, count and dtype (a mismatch raises on every
    rank instead of hanging).
    """
    if out is None:
        out = torch.empty_like(tensor)
    return _issue("ring_shift", tensor, out, direction, None, None, group, async_op)


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
    return _issue("ring_shift_reduce", tensor, out, direction, local, residual, group, async_op)

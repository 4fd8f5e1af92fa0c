"""The two ring schedules every RSDP layer runs: rotate (forward) and counter-rotate (backward).

Forward, :func:`rotate`: each rank starts with its own flat shard ``src`` (no copy) and, for
``t = 0 .. W-1``, first issues the async shift that brings the next shard and then computes
with the shard in hand, so communication overlaps compute. The last shift is skipped (shards
need not come home: the owner still holds its parameter). Buffers: two flat shards for
``W >= 3`` (in hand + in flight), one for ``W == 2``, none for ``W == 1``.

Backward, :func:`counter_rotate`, direction -1 by default. Two rings run interleaved:

* weights (only if the layer needs them, e.g. for grad_input): one buffer rotated *in place*;
  ``visit`` runs on the shard in hand *before* the in-place shift is issued;
* gradient accumulators: every rank starts the accumulator of shard ``origin(d, 1)`` with its
  own contribution; at hop ``h`` it receives the accumulator of shard ``origin(d, h + 1)`` and
  ``ring_shift_reduce`` adds its contribution for that shard; after ``W - 1`` hops the
  accumulator of this rank's own shard (``origin(d, W) == rank``) holds the sum over all ranks.

Under the group's ``ring_shift_reduce`` compression the accumulators leave a node quantised,
with error feedback in the layer's ``feedback`` (:class:`.ring_feedback.RingFeedback`, or None
for none).

Each ring's compute overlaps the other ring's communication (ops of one group run in issue
order: w0, g1, w1, g2, ...; waiting for w_t lets the visit of t+1 overlap g_{t+1}, and the
contribution for g_{t+2} overlaps w_{t+1}). Buffers: weight (1), accumulator (1, becomes the
gradient) and contribution (1): at most two beyond the gradient itself.

With ``device`` (the device the layer computes on) other than the shards' own, the shards
live in host memory and only the one in hand is on the device: [Note: shards offloaded to
host memory] in :mod:`.device_copies`.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .device_copies import DeviceCopies
from .memory import alloc_buffer, release_buffers
from .ring_feedback import RingFeedback
from .ring_order import Pending, Ring

__all__ = ["rotate", "counter_rotate", "rotate_accumulate"]

Visit = Callable[[int, torch.Tensor], None]


def rotate(ring: Ring, src: torch.Tensor, visit: Visit, *, direction: int = 1,
           label: str = "RSDP::rotate", device: Optional[torch.device] = None) -> None:
    """Calls ``visit(j, shard_j)`` once for every group rank ``j``, own shard first.

    ``src`` is this rank's flat shard and is only read. ``visit`` must not keep references
    to the buffer it is given (it is reused and freed when this returns).
    """
    W = ring.world
    on = DeviceCopies(src, device)
    bufs: list = []
    cur = src
    for t in range(W):
        pending: Optional[Pending] = None
        if t < W - 1:
            if len(bufs) < 2 and t == len(bufs):
                bufs.append(alloc_buffer(src.numel(), src.dtype, src.device))
            nxt = bufs[t % 2]
            pending = ring.shift(cur, nxt, direction, label)
        on.visit(visit, ring.origin(direction, t), cur)
        if pending is not None:
            pending.wait()
            cur = nxt
    release_buffers(*bufs)
    on.close()


def counter_rotate(ring: Ring, src: torch.Tensor, *, visit: Optional[Visit] = None,
                   contribute: Optional[Visit] = None, grad_dtype: Optional[torch.dtype] = None,
                   direction: int = -1, label: str = "RSDP::counter_rotate",
                   feedback: Optional[RingFeedback] = None,
                   device: Optional[torch.device] = None) -> Optional[torch.Tensor]:
    """Backward schedule; returns the flat gradient *sum* of this rank's own shard, or None.

    ``visit(j, shard_j)`` (optional) is called for every shard, own first; ``contribute(j, buf)``
    (optional) must overwrite shard ``j``'s region of ``buf`` (per the layout) with this rank's
    contribution to shard ``j``'s gradient. ``grad_dtype`` defaults to ``src.dtype``.
    """
    W = ring.world
    d = direction
    on = DeviceCopies(src, device)
    gdt = grad_dtype or src.dtype
    acc = local = w = None
    pw: Optional[Pending] = None
    pg: Optional[Pending] = None
    if contribute is not None:
        acc = alloc_buffer(src.numel(), gdt, src.device, zero=True)
        on.fill(contribute, ring.origin(d, 1), acc)  # hop 0: start the accumulator headed for origin(d, 1)
    for t in range(W):
        if visit is not None:
            if t == 0:
                cur = src
            else:
                pw.wait()
                cur = w
            on.visit(visit, ring.origin(d, t), cur)
            if t < W - 1:
                if w is None:
                    w = alloc_buffer(src.numel(), src.dtype, src.device)
                pw = ring.shift(cur, w, d, label + "::weights")  # in place from t = 1 on
        if contribute is not None and t < W - 1:
            if pg is not None:
                pg.wait()  # `local` is read by the op in flight
            if local is None:
                local = alloc_buffer(src.numel(), gdt, src.device, zero=True)
            on.fill(contribute, ring.origin(d, t + 2), local)
            pg = ring.shift_reduce(acc, local, acc, d, label + "::grads",
                                   feedback and feedback.row(ring, d, t, W - 1, acc))
    if pg is not None:
        pg.wait()
    if pw is not None:
        pw.wait()
    release_buffers(w, local)
    on.close()
    return acc


def rotate_accumulate(ring: Ring, src: torch.Tensor, step: Callable[[int, torch.Tensor,
                                                                          torch.Tensor], None],
                      *, grad_dtype: Optional[torch.dtype] = None, direction: int = -1,
                      label: str = "RSDP::rotate_accumulate",
                      feedback: Optional[RingFeedback] = None,
                      device: Optional[torch.device] = None) -> torch.Tensor:
    """Backward schedule for layers whose gradient contribution to shard ``j`` needs shard
    ``j`` itself (attention: the weights enter the gradient through the softmax). Returns the
    flat gradient *sum* of this rank's own shard.

    ``step(j, shard_j, out)`` runs once per shard, own first, and must overwrite shard ``j``'s
    region of ``out`` with this rank's contribution. The accumulator *trails* the weights: it
    travels in the same direction, one op behind, so the rank that holds shard ``j`` also holds
    ``j``'s accumulator and adds to it right after using the weights. After ``W - 1`` hops the
    accumulator holds every rank's contribution and one last hop takes it to its owner (``W``
    hops instead of :func:`counter_rotate`'s ``W - 1``). Weights rotate in place, so buffers
    are weight (1), accumulator (1, becomes the gradient) and contribution (1).
    """
    W = ring.world
    d = direction
    on = DeviceCopies(src, device)
    gdt = grad_dtype or src.dtype
    acc = alloc_buffer(src.numel(), gdt, src.device, zero=True)
    local = w = None
    pw: Optional[Pending] = None
    pg: Optional[Pending] = None
    for t in range(W):
        if t == 0:
            cur = src
        else:
            pw.wait()
            cur = w
        if t == 0:
            on.step(step, ring.origin(d, 0), cur, acc)
        else:
            if pg is not None:
                pg.wait()  # `local` is read by the accumulator op in flight
            if local is None:
                local = alloc_buffer(src.numel(), gdt, src.device, zero=True)
            on.step(step, ring.origin(d, t), cur, local)
        if t < W - 1:
            if w is None:
                w = alloc_buffer(src.numel(), src.dtype, src.device)
            pw = ring.shift(cur, w, d, label + "::weights")  # in place from t = 1 on
        if t > 0:
            pg = ring.shift_reduce(acc, local, acc, d, label + "::grads",
                                   feedback and feedback.row(ring, d, t - 1, W, acc))
    if W > 1:
        pg.wait()
        if ring.compresses_sums():
            # The last hop carries a sum too: as a shift-reduce of nothing it is quantised
            # (and fed back) like the other sums, not like the weights.
            local.zero_()
            ring.shift_reduce(acc, local, acc, d, label + "::home",
                              feedback and feedback.row(ring, d, W - 1, W, acc)).wait()
        else:
            ring.shift(acc, acc, d, label + "::home").wait()
    release_buffers(w, local)
    on.close()
    return acc

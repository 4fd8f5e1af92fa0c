"""Gradient averaging for replicated parameters, bucketed and overlapped with backward, as DDP
does: the one mechanism for every parameter a strategy keeps whole (``plan``'s ``no_shard`` and
``shard_optim`` units, the biases and norms of ``split:k`` and ``rotate`` units, and the
parameters :func:`torch_rsdp.rsdp.shard` leaves whole).

[Note: bucket order]
Parameters are put in buckets of about ``bucket_bytes`` in *reverse* registration order, the
order in which backward usually produces their gradients. A post-accumulate-grad hook copies a
parameter's gradient into its bucket's flat buffer as soon as it is ready (``.grad`` becomes a
view of the bucket, so gradients are held once); when every parameter of the next bucket to
launch is ready, the bucket is all-reduced asynchronously while backward goes on. Buckets are
launched strictly in index order on every rank, so ranks issue the same collectives in the same
order even when their backward passes produce gradients in different orders. At the end of
the backward (an autograd-engine callback queued by the first hook), the buckets not launched
yet (parameters that got no gradient on this rank) are launched with zeros in their place, then
every bucket is waited on and averaged in place.

[Note: buckets per unit]
A bucket's flat buffer is allocated when its first gradient arrives, so a bucket that spanned
several of the plan's units would hold the gradients of units whose backward has not run yet,
next to their activations. ``unit_of`` keeps buckets inside one unit: a unit's gradients then
appear when its own backward runs, as the planner's memory walk counts them (measured with
torch's MemTracker on 4 ranks: a Llama whose 4 no_shard layers shared one 25 MiB bucket peaked
at 156.3 MiB where the walk said 138.2; with a bucket per unit, at 137.7). The planner's profile
times each unit with buckets of its own, too.

[Note: syncing at the end of backward]
With ``root`` (how :func:`torch_rsdp.rsdp.shard` uses it) no gradient hook is registered: a
forward hook on the root hooks the root's outputs, the first of those to fire in a backward
queues the end-of-backward callback, and the callback copies every parameter's gradient into
its bucket and all-reduces the buckets then. Two reasons: RSDP rotation units recompute and
replay each shard's graph *inside* their own backward, so a parameter's gradient hook would
fire there, once per ring step and into a nested backward's callback queue; and every backward
through the root then synchronises on every rank, even a rank on which no parameter got a
gradient (it contributes zeros), where hooks on the parameters alone would leave the other
ranks waiting on its all-reduce until the timeout. The price is no overlap with backward, which
matters little for what RSDP leaves whole (norms, biases).

Each bucket carries one extra element per parameter saying "this rank had a gradient", so a
parameter unused on every rank keeps ``grad=None`` (the optimizer then skips it) while one used
on some ranks gets the average over all ranks (the others contributing zeros), like DDP.

[Note: compressed buckets]
A unit whose gradients cross nodes compressed (``compressed``: unit name -> (group, error
feedback), :mod:`torch_rsdp.plan._plan_compression`) all-reduces its buckets' gradients on that
unit's compressing group, with :class:`torch_rsdp._compression.FeedbackAllReduce` when it keeps
error feedback (its residuals stay with the bucket from step to step); the "had a gradient"
flags go on an exact all-reduce of their own, as a quantised block mixing counts with gradients
would lose the gradients.

Contract: every rank runs the same number of backward passes through these parameters (with
``root``: through the root's outputs).
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function
from torch.utils._pytree import tree_flatten

from ._dtensor_params import local, local_grad, set_grad
from ._compression import FeedbackAllReduce
from ._host_staging import collective_device

__all__ = ["GradSync", "pack_buckets", "DEFAULT_BUCKET_BYTES"]

DEFAULT_BUCKET_BYTES = 25 << 20


class _Bucket:
    __slots__ = ("params", "index", "offsets", "ready", "work", "flat", "dtype", "comp",
                 "flags_work", "feedback")

    def __init__(self, params, index, dtype, comp=None):
        self.params: List[nn.Parameter] = params
        self.index = {id(p): i for i, p in enumerate(params)}
        self.offsets, off = [], 0
        for p in params:
            self.offsets.append(off)
            off += p.numel()
        self.ready = 0
        self.work = None
        self.flat: Optional[torch.Tensor] = None
        self.dtype = dtype
        self.comp: Optional[Tuple[dist.ProcessGroup, bool]] = comp  # [Note: compressed buckets]
        self.flags_work = None
        self.feedback = None  # FeedbackAllReduce, kept across steps


def pack_buckets(params: List[nn.Parameter], bucket_bytes: int,
                 key: Callable[[nn.Parameter], object]) -> List[List[nn.Parameter]]:
    """Consecutive parameters with equal ``key`` (a dtype, a device), up to ``bucket_bytes`` a
    bucket; a parameter larger than that is a bucket alone."""
    out: List[List[nn.Parameter]] = []
    size, last = 0, None
    for p in params:
        nb, k = p.numel() * p.element_size(), key(p)
        if not out or k != last or size + nb > bucket_bytes:
            out.append([])
            size = 0
        out[-1].append(p)
        size, last = size + nb, k
    return out


class GradSync:
    """Averages ``params``' gradients over ``group`` during every backward (unless disabled)."""

    def __init__(self, params: List[nn.Parameter], group: Optional[dist.ProcessGroup] = None, *,
                 reduce_dtype: Optional[torch.dtype] = None,
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES,
                 unit_of: Optional[Dict[int, str]] = None, root: Optional[nn.Module] = None,
                 compressed: Optional[Dict[str, Tuple[dist.ProcessGroup, bool]]] = None):
        """
        Args:
            params: the parameters to average (those not requiring a gradient are skipped).
            group: the process group (default: world).
            reduce_dtype: the dtype gradients are all-reduced in (default: each parameter's).
            bucket_bytes: the size of a bucket.
            unit_of: id(parameter) -> the name of its unit; buckets never span two units
                ([Note: buckets per unit]).
            root: synchronise at the end of every backward through ``root``'s outputs instead
                of overlapped with it ([Note: syncing at the end of backward]).
            compressed: unit name -> (its compressing group, error feedback) for the units
                whose gradients cross nodes quantised ([Note: compressed buckets]).
        """
        self.group = group
        self.world = dist.get_world_size(group)
        self.enabled = True
        self.params = [p for p in params if p.requires_grad]
        self.buckets: List[_Bucket] = []
        self._bucket_of = {}
        unit_of, compressed = unit_of or {}, compressed or {}
        for ps in pack_buckets(list(reversed(self.params)), bucket_bytes,
                               key=lambda p: (reduce_dtype or p.dtype, unit_of.get(id(p)))):
            self._add_bucket(ps, reduce_dtype or ps[0].dtype,
                             compressed.get(unit_of.get(id(ps[0]))))
        self._next = 0
        self._queued = False
        self._seen = set()
        self._at_end = root is not None
        self._handles: list = []
        if not self._at_end:
            self._handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                             for p in self.params]
        elif self.params:
            self._handles = [root.register_forward_hook(self._on_root_forward)]

    def _add_bucket(self, params, dtype, comp=None) -> None:
        b = _Bucket(params, len(self.buckets), dtype, comp)
        for p in params:
            self._bucket_of[id(p)] = b
        self.buckets.append(b)

    def remove(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def rehook(self) -> None:
        """Registers the parameters' gradient hooks again, after their contents were swapped
        (``torch.utils.swap_tensors`` moves hooks with the contents: :mod:`torch_rsdp.
        _materialize`); the buckets are allocated at the first gradient, on its device."""
        if not self._at_end:
            self.remove()
            self._handles = [p.register_post_accumulate_grad_hook(self._on_grad)
                             for p in self.params]

    # ----------------------------------------------------------------------------------------
    def _queue_finish(self) -> None:
        if not self._queued:
            self._queued = True
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)

    def _on_root_forward(self, module, args, output) -> None:
        if not torch.is_grad_enabled() or not self.enabled:
            return
        for t in tree_flatten(output)[0]:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                t.register_hook(self._on_output_grad)

    def _on_output_grad(self, grad):
        if self.enabled:
            self._queue_finish()
        return grad

    @torch.no_grad()
    def _on_grad(self, p: nn.Parameter) -> None:
        if not self.enabled:
            return
        self._queue_finish()
        if id(p) in self._seen:  # a second accumulation in one backward: already counted
            return
        self._seen.add(id(p))
        b = self._bucket_of[id(p)]
        self._copy_in(b, p)
        b.ready += 1
        while (self._next < len(self.buckets)
               and self.buckets[self._next].ready == len(self.buckets[self._next].params)):
            self._launch(self.buckets[self._next])
            self._next += 1

    def _copy_in(self, b: _Bucket, p: nn.Parameter) -> None:
        """Moves ``p``'s gradient into its bucket as soon as it is ready, and makes ``.grad`` a
        view of the bucket (DDP's ``gradient_as_bucket_view``): the gradient then exists once,
        and only one parameter's is ever held twice."""
        if b.flat is None:
            n = sum(q.numel() for q in b.params)
            b.flat = torch.zeros(n + len(b.params), dtype=b.dtype,
                                 device=collective_device(self.group, p.device))
        i = b.index[id(p)]
        off = b.offsets[i]
        dst = b.flat[off:off + p.numel()]
        g = local_grad(p)
        dst.copy_(g.reshape(-1))
        b.flat[b.flat.numel() - len(b.params) + i] = 1
        if g.dtype == b.dtype and g.device == dst.device:
            set_grad(p, dst.view(g.shape))

    def _launch(self, b: _Bucket) -> None:
        if b.flat is None:  # no parameter of the bucket had a gradient on this rank
            n = sum(q.numel() for q in b.params)
            b.flat = torch.zeros(n + len(b.params), dtype=b.dtype,
                                 device=collective_device(self.group, b.params[0].device))
        if self.world == 1:
            return
        with record_function("RSDP::plan::grad_all_reduce"):
            if b.comp is None:
                b.work = dist.all_reduce(b.flat, group=self.group, async_op=True)
                return
            group, feedback = b.comp
            n = b.flat.numel() - len(b.params)
            b.flags_work = dist.all_reduce(b.flat[n:], group=self.group, async_op=True)
            if feedback:
                if b.feedback is None:
                    b.feedback = FeedbackAllReduce(group)
                b.work = b.feedback.start(b.flat[:n])
            else:
                b.work = dist.all_reduce(b.flat[:n], group=group, async_op=True)

    @torch.no_grad()
    def _finish(self) -> None:
        self._queued = False
        self._seen.clear()
        while self._next < len(self.buckets):
            b = self.buckets[self._next]
            if self._at_end:  # gradients are complete now: copy them in
                for p in b.params:
                    if p.grad is not None:
                        self._copy_in(b, p)
            self._launch(b)
            self._next += 1
        self._next = 0
        for b in self.buckets:
            with record_function("RSDP::plan::grad_all_reduce::wait"):
                for w in (b.work, b.flags_work):
                    if w is not None:
                        w.wait()
            self._write_back(b)
            b.work, b.flags_work, b.flat, b.ready = None, None, None, 0

    def _write_back(self, b: _Bucket) -> None:
        n = b.flat.numel() - len(b.params)
        b.flat[:n].div_(self.world)
        off = 0
        for i, p in enumerate(b.params):
            g = b.flat[off:off + p.numel()].view(local(p).shape)
            if b.flat[n + i] == 0:
                p.grad = None  # no rank had a gradient: the optimizer skips it
            elif (p.grad is None or local_grad(p).device != g.device
                  or local_grad(p).data_ptr() != g.data_ptr()):
                set_grad(p, g.to(dtype=p.dtype, device=local(p).device))
            off += p.numel()

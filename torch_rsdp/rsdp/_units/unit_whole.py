"""A rotation unit no larger than its activations computes whole: one call of its forward.

[Note: small units computed whole]
A rotation unit (:mod:`.rotation_unit`) runs its module's own forward once per shard: at 4
ranks an attention block's Python forward (rotary embeddings, the attention kernel, reshapes)
four times on a quarter of the heads, and in backward four ``autograd.grad`` calls, each
recomputing its shard's part unless ``unit_recompute=False``. Where the unit's weights are no
larger than the activations it reads and writes (``sum in*out <= tokens * sum(in+out)`` over
its layers: the rule of [Note: whole small layers] in :mod:`.._layers.sharded_linear`, summed), that
per-shard work, not the arithmetic, is what a step costs (units measured 0.66-0.76x FSDP2's
throughput where activations dominate, ``benchmarks/bench_rsdp_fsdp2.py``).

Such a unit rotates the same flat shard as before (``W - 1`` hops forward), but copies each
shard as it passes into one buffer of the unit's whole parameters and then runs its forward
once, on every head, and drops the buffer. Backward gathers the whole parameters again (``W -
1`` hops), runs one ``autograd.grad`` (recomputing the forward first unless
``unit_recompute=False``, whose recorded graph saves the weights as references into the
gathered buffer: :class:`.unit_call.WeightRefs`) and sends every shard its gradient in one
counter-rotation (``W - 1`` hops). The whole unit lives only while it computes, like a block
FSDP2 gathers (the forward's last gather until its backward: [Note: the last gather stays for
backward]), and only where it is no larger than its activations; a unit larger than that
(weights dominate) still rotates shard by shard and is never whole. From 3 ranks on the whole
units of one block gather together instead ([Note: unit blocks] in :mod:`.unit_block`), and at
2 ranks its layers rotate one by one ([Note: small units layer by layer at two ranks] in
:mod:`.unit_layers`); this module's :class:`WholeUnitFn` serves the rest (a unit alone in its
block; at 2 ranks a unit that recomputes or casts to a ``param_dtype``).

Which units compute whole decides the ring's schedule in backward, so every rank decides from
the token count the group agreed on (:class:`.._layers.block_gather.SmallLayers`, one all-reduce per
forward of the sharded root). CPU and one node only, as block gathers: across nodes the
counter-rotation of a compressed ring feeds its error back per hop, and the shard-by-shard
schedule makes one hop more. Dropout inside a whole unit draws one mask over all heads, not one
per shard: the same distribution, and backward replays it.
"""
from __future__ import annotations

import math
from typing import Dict, Tuple

import torch

from .._layers.block_copies import copies_of, whole_shape
from .._rotation.memory import alloc_buffer, release_buffers
from .._rotation.outer_checkpoint import drop_output, keep_output, take_output
from .._rotation.rotation import counter_rotate, rotate
from .._layers.shard_state import ShardState
from .unit_call import (Call, WeightRefs, check_graph_kept, fill_caches, replica_grads,
                        replica_returns, rng_state, run_part, set_rng_state, stub)

__all__ = ["MODE", "computes_whole", "small_at", "call_whole", "grads_whole", "WholeUnitFn"]

#: ``"auto"``: units no larger than their activations compute whole; ``"never"``: every unit
#: rotates shard by shard (for comparison); ``"always"``: every unit computes whole on CPU
#: and one node, whatever its size (for tests, whose models are tiny and whose inputs are few).
MODE = "auto"


def computes_whole(unit, leaves) -> bool:
    """Whether this call of ``unit`` (inputs flattened into ``leaves``) computes whole; the
    same answer on every rank (a collective on the first unit of a forward)."""
    u, st = unit._rsdp_unit, unit._rsdp
    if MODE == "never" or u.small is None or st.ring.world < 2 or not st.ring.one_node:
        return False
    x = next((t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()
              and t.dim() >= 2 and t.shape[-1] == u.fin), None)
    if x is None or x.device.type != "cpu":
        return False
    return MODE == "always" or small_at(u, u.small.agreed(x.numel() // u.fin))


def small_at(u, tokens: int) -> bool:
    """Whether unit ``u`` (its ``_rsdp_unit``) is no larger than its activations at ``tokens``
    (or :data:`MODE` says every unit computes whole)."""
    return MODE == "always" or u.weight_numel <= tokens * u.features


def _gather(st: ShardState) -> Tuple[torch.Tensor, Dict[str, torch.Tensor]]:
    """The unit's whole parameters, views of one buffer (one storage, so that a recorded
    graph can save them as references), filled by one rotation of the unit's shard."""
    src = st.compute_flat()
    shapes = {n: whole_shape(st, n) for n in st.names}
    flat = alloc_buffer(sum(math.prod(s) for s in shapes.values()), src.dtype, src.device)
    whole, off = {}, 0
    for n in st.names:
        k = math.prod(shapes[n])
        whole[n] = flat[off:off + k].view(shapes[n])
        off += k

    copies = _copies(st)  # [Note: block copies in one call]
    targets = copies.targets([whole[n] for _, n in copies.entries])

    def visit(j, buf):
        copies.to_whole(j, buf, targets)

    rotate(st.ring, src, visit, direction=1, label="RSDP::unit_whole_gather")
    st.release(src)
    return flat, whole


class _Kept:
    """A unit's forward gather, kept for its backward ([Note: the last gather stays for
    backward] in :mod:`.._layers.block_gather`)."""

    def __init__(self, flat, whole):
        self.flat, self.whole = flat, whole

    def drop_kept(self) -> None:
        if self.flat is not None:
            release_buffers(self.flat)
        self.flat = self.whole = None

    def take(self):
        got = (self.flat, self.whole)
        self.flat = self.whole = None
        return got


def call_whole(ctx, unit, call: Call, ins, whole: Dict[str, torch.Tensor], buffers: dict,
               keep: bool) -> torch.Tensor:
    """Forward of ``unit`` once, on its whole parameters ``whole`` (views into ``buffers``:
    key -> buffer), for a Function's ``ctx``. With ``keep`` the graph is recorded and its
    weights saved as references into ``buffers``; otherwise backward recomputes. Fills the
    caches; returns the row-split layer's output (bias excluded)."""
    u = unit._rsdp_unit
    device = next(iter(whole.values())).device
    ctx.rng = rng_state(device)
    everything = slice(0, u.atoms)
    ctx.refs = ctx.leaves_in = ctx.graph = None
    if keep:  # record the graph; its weights are saved as references into ``buffers``
        ctx.refs = WeightRefs()
        ctx.refs.save_by_reference(buffers)
        ctx.leaves_in = [t.detach().requires_grad_(t.requires_grad) for t in ins]
        leaves_w = {n: w.detach().requires_grad_() for n, w in whole.items()}
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                ctx.refs.pack, ctx.refs.unpack):
            y = run_part(unit, call, ctx.leaves_in, leaves_w, 0, everything, record=True)
        for w in leaves_w.values():  # gradient targets only: let go of the whole weights
            w.data = stub(w)
        ctx.graph = (y, leaves_w)
        y = y.detach()
    else:
        y = run_part(unit, call, ins, whole, 0, everything, record=True)
    fill_caches(call)
    call.kv = {}
    ctx.unit, ctx.call = unit, call
    ctx.save_for_backward(*([] if keep else ins))
    ctx.in_meta = [(t.dtype, t.shape, t.device) for t in ins]
    return y.to(unit._rsdp.mp.output_dtype or y.dtype)


def grads_whole(ctx, dy, whole: Dict[str, torch.Tensor], buffers: dict, need_in, need_w,
                extras=()):
    """Backward of :func:`call_whole`, the whole parameters gathered again into ``buffers``
    (``whole``: their views): (gradients of the inputs, of the whole parameters in
    ``names`` order or None when ``need_w`` is False, of the unit's own replicas ``extras``:
    [Note: a unit's own replicas] in :mod:`.unit_call`)."""
    unit, call = ctx.unit, ctx.call
    st, u = unit._rsdp, unit._rsdp_unit
    if ctx.refs is not None:  # run the recorded graph, its weights resolved in ``buffers``
        y, leaves_w = ctx.graph
        leaves_in = ctx.leaves_in
        ctx.refs.bwd = buffers
    else:  # recompute the forward, replaying its random draws
        device = next(iter(whole.values())).device
        leaves_in = [t.detach().requires_grad_(w) for t, w in zip(ctx.saved_tensors, need_in)]
        leaves_w = {n: w.detach().requires_grad_(need_w) for n, w in whole.items()}
        with torch.enable_grad(), torch.random.fork_rng(
                devices=[device] if device.type == "cuda" else []):
            set_rng_state(ctx.rng, device)
            y = run_part(unit, call, leaves_in, leaves_w, 0, slice(0, u.atoms), record=False)
    wanted = [t for t, w in zip(leaves_in, need_in) if w and t.requires_grad]
    wl = [leaves_w[n] for n in st.names] if need_w else []
    with torch.enable_grad():
        got = list(torch.autograd.grad(y, wanted + wl + list(extras), dy.to(y.dtype),
                                       allow_unused=True))
    ctx.graph = ctx.leaves_in = None
    if ctx.refs is not None:
        ctx.refs.bwd = {}
    gins = []
    for t, w, (dt, shape, dev) in zip(leaves_in, need_in, ctx.in_meta):
        g = got.pop(0) if w and t.requires_grad else None
        if w and g is None:
            g = torch.zeros(shape, dtype=dt, device=dev)
        gins.append(g.to(dt) if g is not None else None)
    return gins, (got[:len(wl)] if need_w else None), got[len(wl):]


class WholeUnitFn(torch.autograd.Function):
    """The unit's output (row-split bias excluded) from its whole parameters; the inputs and
    signature of :class:`.rotation_unit._UnitFn`."""

    @staticmethod
    def forward(ctx, unit, call: Call, *tensors):
        u = unit._rsdp_unit
        ins = tensors[:len(call.grad_idx)]
        y = take_output(unit, call.tensors())  # [Note: checkpointing without a second rotation]
        if y is not None:
            ctx.save_for_backward(*ins)  # what the first forward saved, in the same order
            return y
        u.small.drop()
        flat, whole = _gather(unit._rsdp)
        y = call_whole(ctx, unit, call, ins, whole, {0: flat},
                       keep=not (u.recompute or call.checkpointed)
                       and any(ctx.needs_input_grad[2:]))
        keep_output(ctx, unit, call.tensors(), y, any(ctx.needs_input_grad[2:]))
        ctx.kept = None
        if any(ctx.needs_input_grad[2:]):  # [Note: the last gather stays for backward]
            ctx.kept = _Kept(flat, whole)
            u.small.keep(ctx.kept)
        else:
            release_buffers(flat)
        return y

    @staticmethod
    def backward(ctx, dy):
        unit = ctx.unit
        st: ShardState = unit._rsdp
        if ctx.refs is not None:
            check_graph_kept(unit, ctx.graph)
        n_in, n_w = len(ctx.in_meta), len(st.names)
        need_in = ctx.needs_input_grad[2:2 + n_in]
        need_w = any(ctx.needs_input_grad[2 + n_in:2 + n_in + n_w])
        extras = replica_grads(ctx, 2 + n_in + n_w)
        flat, whole = ctx.kept.take() if ctx.kept is not None else (None, None)
        if flat is None:  # the forward's gather is gone: gather again
            flat, whole = _gather(st)
        gins, gws, gxs = grads_whole(ctx, dy, whole, {0: flat}, need_in, need_w, extras)
        drop_output(ctx)  # after the saved tensors: a checkpoint's recompute takes it there
        ctx.kept = None
        release_buffers(flat)
        del flat, whole
        grads = {}
        if need_w:
            gw = dict(zip(st.names, gws))
            copies = _copies(st)  # [Note: block copies in one call]
            # a run is a piece of the flattened gradient: a gradient laid out otherwise is
            # copied; a parameter the unit's forward did not use gets zeros
            targets = copies.targets([
                (gw[n] if gw[n] is not None else torch.zeros(whole_shape(st, n), dtype=dy.dtype,
                                                             device=dy.device)).contiguous()
                for _, n in copies.entries])

            def contribute(j, buf):
                copies.from_whole(j, buf, targets)

            # counter_rotate reads only the size, dtype and device of ``src`` when it only sums
            gdt = st.grad_dtype
            shape_of = torch.empty(1, dtype=gdt, device=dy.device).expand(st.layout.numel)
            acc = counter_rotate(st.ring, shape_of, contribute=contribute, grad_dtype=gdt,
                                 label="RSDP::unit_whole_reduce", feedback=st.feedback)
            grads = st.grads_from(acc)
        return (None, None, *gins, *[grads.get(n) for n in st.names],
                *replica_returns(ctx, 2 + n_in + n_w, gxs))


def _copies(st: ShardState):
    """The unit's copies between its rotating shard and its whole parameters."""
    unit = st.module_ref
    return copies_of(st, [unit], {unit: 0}, st.layout.numel, st.ring.world)

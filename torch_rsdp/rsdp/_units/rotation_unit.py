"""Rotation units: an attention block or an MLP whose layers' shards travel as one flat buffer.

A unit is a module (``self_attn``, ``mlp``) whose column-split layers (q/k/v, gate/up: split
by output features) feed per-head / per-column computation into one row-split layer (o, down:
split by input features), as in Megatron tensor parallelism (:mod:`.tp_plan` says which).
Rank ``r`` holds *atom group* ``chunk r``: KV-head groups for attention (a KV head and the
query heads that share it, so GQA stays intact) or columns of the MLP, i.e. the matching
rows of every column-split layer (and their biases) and columns of the row-split layer. All
of them live in one flat shard (:class:`.._layers.shard_state.ShardState` with dotted names), so a transformer
layer costs two rotations instead of seven.

Forward: at each ring step the unit's *own* ``forward`` runs on the shard in hand (its
layers compute with that shard's weights, e.g. Hugging Face's attention with rotary
embeddings, GQA and its attention kernel, on that shard's heads), and the row-split layer's
partial outputs are summed over the ring; the row-split bias (whole) is added once. Every
shard's call starts from the same RNG state, so dropout after the row-split layer masks
every partial sum alike. Backward (:func:`.._rotation.rotation.rotate_accumulate`) recomputes each
shard's part while its weights are in hand and sends its weight gradient home; with
``recompute=False`` it instead runs each shard's autograd graph recorded in forward, whose
saved weights are references into the rotation buffer (:class:`.unit_call.WeightRefs`), so
activations are kept but weights never are. A unit no larger than its activations skips the
per-shard calls and computes whole while it is gathered ([Note: small units computed whole]
in :mod:`.unit_whole`).

Contract: the unit's forward must return (first, if a tuple) the row-split layer's output
*as is* (checked on every call: a forward that adds a residual or a norm after it cannot be
split this way); other outputs (attention weights) come back as ``None``. A KV cache is
filled once per forward (all heads); decoding reads each shard's heads from Hugging Face's
``DynamicCache`` (other cache layouts raise once they hold a past).
"""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy
from torch.utils._pytree import tree_flatten, tree_unflatten

from ..._utils import is_conv1d, swap_class
from .._rotation.flat_shard import chunk_sizes, chunk_starts
from .._rotation.ring_order import Ring
from .._rotation.outer_checkpoint import drop_output, keep_output, take_output, under_checkpoint
from .._rotation.rotation import counter_rotate, rotate, rotate_accumulate
from .._layers.shard_state import ShardState
from .tp_plan import COL, ROW
from .unit_adapters import attach_adapters
from .unit_call import (CACHE_KWARGS, Call, WeightRefs, add_grads, check_graph_kept, fill_caches,
                        is_cache, own_replicas, replica_grads, replica_returns, rng_state,
                        run_part, set_rng_state, stub)
from .unit_block import member_forward
from .unit_layers import by_layers, layer_forward, layers_forward, make_layer_views
from .unit_whole import WholeUnitFn, computes_whole

__all__ = ["unit_problem", "shard_unit", "RSDPUnitMixin"]

def _io(m: nn.Module) -> Tuple[int, int]:
    return (m.nx, m.nf) if is_conv1d(m) else (m.in_features, m.out_features)


def _atoms(unit: nn.Module, members) -> int:
    """How many indivisible groups the unit splits into: KV heads when the unit has a
    ``head_dim`` that divides its layers, else the gcd of the split dimensions."""
    col_outs = [_io(m)[1] for _, m, s in members if s == COL]
    row_in = [_io(m)[0] for _, m, s in members if s == ROW][0]
    if _by_heads(unit, members):
        return min(col_outs) // unit.head_dim
    return math.gcd(*col_outs, row_in)


def _by_heads(unit: nn.Module, members) -> bool:
    """Whether the unit splits by (KV) heads: it has a ``head_dim`` dividing its layers."""
    dims = [_io(m)[1] for _, m, s in members if s == COL]
    dims += [_io(m)[0] for _, m, s in members if s == ROW]
    hd = getattr(unit, "head_dim", None)
    return isinstance(hd, int) and hd > 0 and all(d % hd == 0 for d in dims)


def unit_problem(unit: nn.Module, members, world: int = 1) -> Optional[str]:
    """None when ``members`` (``(attribute, module, style)`` of ``unit``'s children) can form a
    rotation unit over ``world`` ranks, else why not.

    [Note: units split evenly]
    A unit's shards are whole heads (or column groups), ``torch.chunk`` of them over the ranks.
    When they divide evenly, each layer's shard is also the piece ``torch.chunk`` gives of its
    rows (columns), so it is a ``Shard`` DTensor like every other RSDP shard. When they do not
    (2 KV heads over 3 ranks), the pieces are not ``torch.chunk``'s, no DTensor placement
    describes them, and plain tensors beside DTensors break torch's own ``clip_grad_norm_``
    (the HF Trainer's default) at the first step. Such layers are left to the per-layer rules
    instead, whose pieces are ``torch.chunk``'s whatever the sizes."""
    if getattr(unit, "_rsdp", None) is not None:
        return "already sharded"
    for key, m, _ in members:
        if type(m) is not nn.Linear and not is_conv1d(m):
            return f"{key} is a {type(m).__name__}, not an nn.Linear or Conv1D"
    cols = [m for _, m, s in members if s == COL]
    rows = [m for _, m, s in members if s == ROW]
    if len(rows) != 1 or not cols:
        return "a unit needs column-split layers and exactly one row-split layer"
    if len({_io(m)[0] for m in cols}) != 1:
        return "its column-split layers have different input widths"
    if _io(rows[0])[0] not in [_io(m)[1] for m in cols]:
        return (f"the row-split layer reads {_io(rows[0])[0]} features, which no column-split "
                f"layer produces")
    atoms = _atoms(unit, members)
    if atoms < 1 or any(_io(m)[1] % atoms for m in cols) or _io(rows[0])[0] % atoms:
        return "its layers do not split into whole heads / columns"
    if atoms % world:
        what = "heads" if _by_heads(unit, members) else "column groups"
        return (f"its {atoms} {what} do not split evenly over {world} ranks (its shards would "
                f"not be DTensors; [Note: units split evenly])")
    return None


class _Unit:
    """Per-unit geometry and members (kept on the unit module as ``_rsdp_unit``)."""

    def __init__(self, name, members, atoms, world, base_forward, recompute):
        self.name = name
        self.recompute = recompute
        self.members = members  # [(attribute, module, style)]
        self.row = [m for _, m, s in members if s == ROW][0]
        self.sizes, self.starts = chunk_sizes(atoms, world), chunk_starts(atoms, world)
        self.atoms = atoms
        self.base_forward = base_forward
        ios = [_io(m) for _, m, _ in members]
        self.fin = [fi for (fi, _), (_, _, s) in zip(ios, members) if s == COL][0]
        # the unit's weight elements and activation features per token, for
        # [Note: small units computed whole] in .unit_whole
        self.weight_numel = sum(fi * fo for fi, fo in ios)
        self.features = sum(fi + fo for fi, fo in ios)
        self.small = None  # the group's SmallLayers (set by rsdp.shard)
        self.block = None  # its UnitBlock, when it shares gathers with its block's units
        # member -> LayerView where it computes layer by layer when small (two ranks):
        # [Note: small units layer by layer at two ranks] in .unit_layers
        self.layers = None

    def heads(self, j: int) -> slice:
        """Shard ``j``'s atoms (the KV heads of a unit with a cache)."""
        return slice(self.starts[j], self.starts[j] + self.sizes[j])


def _views(st: ShardState, buf: torch.Tensor, j: int, leaves: bool) -> Dict[str, torch.Tensor]:
    """Shard ``j``'s parameters inside ``buf`` (as leaves that require grad when ``leaves``:
    their gradients come out per parameter, with no scatter into a whole flat buffer)."""
    views = {n: st.layout.view(buf, n, j) for n in st.names}
    if leaves:
        views = {n: v.detach().requires_grad_() for n, v in views.items()}
    return views


class _UnitFn(torch.autograd.Function):
    """Sum over shards of the unit's row-split partial outputs (row bias excluded)."""

    @staticmethod
    def forward(ctx, unit, call: Call, *tensors):
        st: ShardState = unit._rsdp
        u: _Unit = unit._rsdp_unit
        n_in = len(call.grad_idx)
        ins = tensors[:n_in]
        y = take_output(unit, call.tensors())  # [Note: checkpointing without a second rotation]
        if y is not None:
            ctx.save_for_backward(*ins)  # what the first forward saved, in the same order
            return y
        keep = not (u.recompute or call.checkpointed) and any(ctx.needs_input_grad[2:])
        src = st.compute_flat()
        dev = call.device(src)
        rng = rng_state(dev)
        acc, graphs = [], {}
        refs = WeightRefs() if keep else None
        leaves_in = [t.detach().requires_grad_(t.requires_grad) for t in ins] if keep else ins

        def visit(j, buf):
            if not u.sizes[j]:
                return
            set_rng_state(rng, dev)  # every shard draws the same dropout masks
            if keep:  # record this shard's graph; its weights are saved as references
                refs.save_by_reference({0: buf})
                weights = _views(st, buf, j, leaves=True)
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                        refs.pack, refs.unpack):
                    y = run_part(unit, call, leaves_in, weights, j, u.heads(j), record=True)
                # the leaves are only gradient targets now: let go of the rotation buffer
                for w in weights.values():
                    w.data = stub(w)
                graphs[j] = (y, weights)
                y = y.detach()
            else:
                y = run_part(unit, call, ins, _views(st, buf, j, leaves=False), j,
                             u.heads(j), record=True)
            if acc:
                acc[0].add_(y)
            else:
                acc.append(y.clone())

        with torch.no_grad():
            rotate(st.ring, src, visit, direction=1, label="RSDP::unit_forward", device=dev)
        st.release(src)
        del src, visit
        fill_caches(call)
        call.kv = {}
        ctx.unit, ctx.call, ctx.rng = unit, call, rng
        ctx.graphs, ctx.refs, ctx.leaves_in = graphs, refs, leaves_in if keep else None
        ctx.save_for_backward(*([] if keep else ins))
        ctx.in_meta = [(t.dtype, t.shape, t.device) for t in ins]
        y = acc[0].to(st.mp.output_dtype or acc[0].dtype)
        keep_output(ctx, unit, call.tensors(), y, any(ctx.needs_input_grad[2:]))
        return y

    @staticmethod
    def backward(ctx, dy):
        unit, call = ctx.unit, ctx.call
        st: ShardState = unit._rsdp
        u: _Unit = unit._rsdp_unit
        keep = ctx.refs is not None
        if keep:
            check_graph_kept(unit, ctx.graphs)
        n_in, names = len(ctx.in_meta), st.names
        need_in = ctx.needs_input_grad[2:2 + n_in]
        need_w = any(ctx.needs_input_grad[2 + n_in:2 + n_in + len(names)])
        extras = replica_grads(ctx, 2 + n_in + len(names))  # [Note: a unit's own replicas]
        ins = ctx.leaves_in if keep else ctx.saved_tensors
        drop_output(ctx)  # after the saved tensors: a checkpoint's recompute takes it there
        src = st.compute_flat()
        dev = dy.device
        dy = dy.to(src.dtype)
        grads_in = [torch.zeros(shape, dtype=dt, device=dev) if w else None
                    for (dt, shape, dev), w in zip(ctx.in_meta, need_in)]
        grads_x = [None] * len(extras)

        def step(j, buf, out):
            if not u.sizes[j]:
                return
            if keep:  # run the graph recorded in forward, weights resolved in ``buf``
                y, weights = ctx.graphs.pop(j)
                leaves_in = ins
                ctx.refs.bwd = {0: buf}
            else:  # recompute this shard's part while its weights are in hand
                leaves_in = [t.detach().requires_grad_(w) for t, w in zip(ins, need_in)]
                weights = _views(st, buf, j, leaves=need_w)
                with torch.enable_grad(), torch.random.fork_rng(
                        devices=[dev] if dev.type == "cuda" else []):
                    set_rng_state(ctx.rng, dev)
                    y = run_part(unit, call, leaves_in, weights, j, u.heads(j), record=False)
            wanted = [t for t, w in zip(leaves_in, need_in) if w and t.requires_grad]
            wl = [weights[n] for n in names] if need_w else []
            with torch.enable_grad():
                got = list(torch.autograd.grad(y, wanted + wl + extras, dy.to(y.dtype),
                                               allow_unused=True))
            for i, (t, w) in enumerate(zip(leaves_in, need_in)):
                if w and t.requires_grad:
                    g = got.pop(0)
                    if g is not None:
                        grads_in[i].add_(g)
            add_grads(grads_x, got[len(wl):])
            for n, g in zip(names if wl else [], got):
                dst = st.layout.view(out, n, j)
                if g is None:
                    dst.zero_()
                else:
                    dst.copy_(g)

        if need_w:
            acc = rotate_accumulate(st.ring, src, step, grad_dtype=st.grad_dtype,
                                    label="RSDP::unit_backward", feedback=st.feedback,
                                    device=dev)
        else:  # a frozen unit: its weights rotate, no gradient travels
            acc = counter_rotate(st.ring, src, visit=lambda j, buf: step(j, buf, None),
                                 label="RSDP::unit_backward", device=dev)
        st.release(src)
        del src
        ctx.graphs = ctx.leaves_in = None
        if keep:  # the buffer the graph's weights were resolved in: not beyond this backward
            ctx.refs.bwd = {}
        grads = st.grads_from(acc) if need_w else {}
        del acc
        gins = [g.to(dt) if g is not None else None
                for g, (dt, _, _) in zip(grads_in, ctx.in_meta)]
        return (None, None, *gins, *[grads.get(n) for n in names],
                *replica_returns(ctx, 2 + n_in + len(names), grads_x))


@torch.compiler.disable  # [Note: ring steps under torch.compile] in .ring_order
def unit_forward(unit: nn.Module, args, kwargs):
    st: ShardState = unit._rsdp
    u: _Unit = unit._rsdp_unit
    kwargs = dict(kwargs)
    caches = {k: kwargs.pop(k) for k in list(kwargs)
              if kwargs[k] is not None and (k in CACHE_KWARGS or is_cache(kwargs[k]))}
    leaves, spec = tree_flatten((args, kwargs))
    cdt = st.mp.param_dtype
    if cdt is not None:  # compute dtype for every float input (activations, rotary tables)
        leaves = [t.to(cdt) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                  for t in leaves]
    _check_width(unit, leaves)
    grad_idx = [i for i, t in enumerate(leaves)
                if isinstance(t, torch.Tensor) and t.requires_grad]
    extras = own_replicas(unit)  # [Note: a unit's own replicas]
    call = Call(leaves, spec, grad_idx, caches, extras)
    # Under torch's checkpoint a unit keeps only its inputs (the checkpoint drops them) and
    # its output, and computes in its own function, which the recompute can skip
    # ([Note: checkpointing without a second rotation])
    call.checkpointed = ckpt = under_checkpoint()
    params = [st.param(n) for n in st.names]
    ins = [leaves[i] for i in grad_idx]
    whole = computes_whole(unit, leaves)
    y = None
    # [Note: unit blocks] in .unit_block, [Note: small units layer by layer at two ranks]
    if whole and not (u.recompute or ckpt) and (u.block is not None or by_layers(unit)):
        out = _forward_direct(unit, leaves, spec, caches, cdt is not None, args, kwargs)
        if out is not None:
            return out
    elif whole and u.block is not None and not ckpt:
        y = u.block.forward(unit, call, ins)
    if y is None:  # alone
        y = (WholeUnitFn if whole else _UnitFn).apply(unit, call, *ins, *params, *extras)
    for i in grad_idx:  # backward gets these from the saved tensors; do not keep them twice
        call.leaves[i] = None
    if u.row.bias is not None:
        y = y + u.row.bias.to(y.dtype)
    n = unit._rsdp_out_len
    return (y,) + (None,) * (n - 1) if n else y


def _forward_direct(unit: nn.Module, leaves, spec, caches, cast: bool, args, kwargs):
    """The unit's output by its own forward, run once in the caller's graph, its layers
    computing in its block's pass ([Note: units in their block's pass] in :mod:`.unit_block`)
    or one by one ([Note: small units layer by layer at two ranks] in :mod:`.unit_layers`),
    or None (the pass left it out)."""
    u: _Unit = unit._rsdp_unit
    if cast:  # the compute dtype's copies of the float inputs
        args, kwargs = tree_unflatten(leaves, spec)
    kwargs = dict(kwargs, **caches)
    try:
        out = (u.block.forward_direct(unit, args, kwargs) if u.block is not None
               else layers_forward(unit, args, kwargs))
        row_out = u.row._rsdp_last
    finally:
        u.row._rsdp_last = None
    if out is None:
        return None
    y = out[0] if isinstance(out, (tuple, list)) else out
    if y is not row_out or y is None:
        raise RuntimeError(f"rotation unit {u.name or type(unit).__name__}: its forward must "
                           f"return its row-split layer's output as is (it changes it after "
                           f"the layer); shard it without tp_plan")
    y = y.to(unit._rsdp.mp.output_dtype or y.dtype)
    if u.row.bias is not None:
        y = y + u.row.bias.to(y.dtype)
    if isinstance(out, (tuple, list)):  # the forward ran once, over every head: its other
        return (y,) + tuple(out[1:])  # outputs (attention weights) are whole too
    return y


def _check_width(unit: nn.Module, leaves) -> None:
    """Refuses, before any ring op, a call none of whose floating-point inputs ends with the
    width the unit's column-split layers read: it would fail inside the unit's own forward
    with torch's bare shape error (naming neither rank nor unit), on this rank only, while the
    other ranks wait for it in the unit's rotation."""
    u: _Unit = unit._rsdp_unit
    floats = [t for t in leaves if isinstance(t, torch.Tensor) and t.is_floating_point()]
    if any(t.dim() >= 1 and t.shape[-1] == u.fin for t in floats):
        return
    cols = [k for k, _, s in u.members if s == COL]
    where = repr(u.name) if u.name else "at the model's root"
    raise ValueError(f"torch_rsdp.rsdp rank {unit._rsdp.ring.rank}: rotation unit {where} "
                     f"({type(unit).__name__.removeprefix('RSDPUnit')}): its "
                     f"column-split layers {cols} read in_features={u.fin}, but none of its "
                     f"floating-point inputs ends with {u.fin} (input shapes: "
                     f"{[tuple(t.shape) for t in floats]})")


class RSDPUnitMixin:
    """Forward of a rotation unit; mixed into a subclass of the unit module's own class."""

    def forward(self, *args, **kwargs):
        return unit_forward(self, args, kwargs)


class RSDPUnitMemberMixin:
    """A layer of a rotation unit: computes with whichever shard the unit has in hand."""

    _rsdp_hand = None
    _rsdp_last = None
    _rsdp_pass = None  # (pass, unit, whole parameters): [Note: units in their block's pass]
    _rsdp_layer = None  # its LayerView: [Note: small units layer by layer at two ranks]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._rsdp_pass is not None or self._rsdp_layer is not None:
            y = (member_forward(self, x) if self._rsdp_pass is not None
                 else layer_forward(self, x))
            if self._rsdp_style == ROW:
                self._rsdp_last = y
            return y
        hand = self._rsdp_hand
        if hand is None:
            raise RuntimeError(f"{type(self).__name__} {self._rsdp_key!r} is a layer of a "
                               f"rotation unit and only runs inside its unit's forward")
        w = hand[self._rsdp_key + ".weight"]
        if self._rsdp_transposed:
            w = w.t()
        b = None
        if self._rsdp_style == COL and self.bias is not None:
            b = hand[self._rsdp_key + ".bias"]
        y = F.linear(x.to(w.dtype), w, b)
        if self._rsdp_style == ROW:
            self._rsdp_last = y
        return y

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, rsdp_unit={self._rsdp_style}, "
                f"local_weight={tuple(self.weight.shape)}")


def shard_unit(unit: nn.Module, members: List[tuple], ring: Ring,
               mp: Optional[MixedPrecisionPolicy] = None, name: str = "",
               recompute: bool = False) -> nn.Module:
    """Shards ``unit`` (its planned children ``members``: ``(attribute, module, style)``) as
    one rotation unit, in place, and returns it.

    ``recompute``: backward recomputes each shard's part while its weights are in hand (the
    unit keeps only its inputs, like activation checkpointing); ``False`` (default) keeps each
    shard's activations from forward instead (as much activation memory as the unsharded
    block, no recomputation; weights are still never kept, see
    :class:`.unit_call.WeightRefs`)."""
    problem = unit_problem(unit, members, ring.world)
    if problem is not None:
        raise ValueError(f"rotation unit {name or type(unit).__name__}: {problem}")
    atoms = _atoms(unit, members)
    sizes, starts = chunk_sizes(atoms, ring.world), chunk_starts(atoms, ring.world)
    full, dims, info = {}, {}, {}
    for key, m, style in members:
        fin, fout = _io(m)
        tr = is_conv1d(m)
        per = (fout if style == COL else fin) // atoms  # features per atom
        # the weight dimension that is split: out features (COL) / in features (ROW)
        wdim = (0 if style == COL else 1) if not tr else (1 if style == COL else 0)
        full[f"{key}.weight"], dims[f"{key}.weight"] = m.weight, wdim
        info[f"{key}.weight"] = (wdim, per)
        if style == COL and m.bias is not None:
            full[f"{key}.bias"], dims[f"{key}.bias"] = m.bias, 0
            info[f"{key}.bias"] = (0, per)

    def take(n, t, j):
        d, per = info[n]
        return t.narrow(d, starts[j] * per, sizes[j] * per)

    base = type(unit)
    unit._rsdp = ShardState(unit, ring, full, take, dims, mp)
    unit._rsdp_unit = _Unit(name, members, atoms, ring.world, base.forward, recompute)
    unit._rsdp_out_len = 0
    for key, m, style in members:
        m._rsdp_key, m._rsdp_style, m._rsdp_transposed = key, style, is_conv1d(m)
        # its geometry as a sharded Linear's ([Note: small units layer by layer at two ranks])
        (m._rsdp_in, m._rsdp_out), m._rsdp_split = _io(m), "out" if style == COL else "in"
        swap_class(m, RSDPUnitMemberMixin, "RSDPUnit" + type(m).__name__)
    unit._rsdp_unit.layers = make_layer_views(unit, members, ring)
    attach_adapters(unit, members)  # [Note: adapters inside a unit]
    swap_class(unit, RSDPUnitMixin, "RSDPUnit" + base.__name__)
    return unit

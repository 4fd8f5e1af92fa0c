"""Rotation units: an attention block or an MLP whose layers' shards travel as one flat buffer.

A unit is a module (``self_attn``, ``mlp``) whose column-split layers (q/k/v, gate/up: split
by output features) feed per-head / per-column computation into one row-split layer (o, down:
split by input features), as in Megatron tensor parallelism (:mod:`.tp_plan` says which).
Rank ``r`` holds *atom group* ``chunk r``: KV-head groups for attention (a KV head and the
query heads that share it, so GQA stays intact) or columns of the MLP, i.e. the matching
rows of every column-split layer (and their biases) and columns of the row-split layer. All
of them live in one flat shard (:class:`.ShardState` with dotted names), so a transformer
layer costs two rotations instead of seven.

Forward: at each ring step the unit's *own* ``forward`` runs on the shard in hand (its
layers compute with that shard's weights, e.g. Hugging Face's attention with rotary
embeddings, GQA and its attention kernel, on that shard's heads), and the row-split layer's
partial outputs are summed over the ring; the row-split bias (whole) is added once. Every
shard's call starts from the same RNG state, so dropout after the row-split layer masks
every partial sum alike. Backward (:func:`.rotation.rotate_accumulate`) recomputes each
shard's part while its weights are in hand and sends its weight gradient home; with
``recompute=False`` it instead runs each shard's autograd graph recorded in forward, whose
saved weights are references into the rotation buffer (:class:`_WeightRefs`), so activations
are kept but weights never are.

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

from .._utils import is_conv1d, swap_class
from .flat_shard import chunk_sizes, chunk_starts
from .ring_order import Ring
from .rotation import rotate, rotate_accumulate
from .shard_state import ShardState
from .tp_plan import COL, ROW

__all__ = ["unit_problem", "shard_unit", "RSDPUnitMixin"]

# The KV cache's keyword in Hugging Face attention forwards (it was renamed twice); any other
# keyword whose value is a cache (``_is_cache``) is taken too: a cache passed on to every
# shard's forward would collect each shard's keys one after another, silently wrong.
_CACHE_KWARGS = ("past_key_values", "past_key_value", "cache")


def _is_cache(value) -> bool:
    return (not isinstance(value, torch.Tensor) and callable(getattr(value, "update", None))
            and callable(getattr(value, "get_seq_length", None)))


def _io(m: nn.Module) -> Tuple[int, int]:
    return (m.nx, m.nf) if is_conv1d(m) else (m.in_features, m.out_features)


def _atoms(unit: nn.Module, members) -> int:
    """How many indivisible groups the unit splits into: KV heads when the unit has a
    ``head_dim`` that divides its layers, else the gcd of the split dimensions."""
    col_outs = [_io(m)[1] for _, m, s in members if s == COL]
    row_in = [_io(m)[0] for _, m, s in members if s == ROW][0]
    hd = getattr(unit, "head_dim", None)
    if isinstance(hd, int) and hd > 0 and all(d % hd == 0 for d in col_outs + [row_in]):
        return min(col_outs) // hd
    return math.gcd(*col_outs, row_in)


def unit_problem(unit: nn.Module, members) -> Optional[str]:
    """None when ``members`` (``(attribute, module, style)`` of ``unit``'s children) can form a
    rotation unit, else why not."""
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
    return None


class _Unit:
    """Per-unit geometry and members (kept on the unit module as ``_rsdp_unit``)."""

    def __init__(self, name, members, atoms, world, base_forward, recompute):
        self.name = name
        self.recompute = recompute
        self.members = members  # [(attribute, module, style)]
        self.row = [m for _, m, s in members if s == ROW][0]
        self.sizes, self.starts = chunk_sizes(atoms, world), chunk_starts(atoms, world)
        self.base_forward = base_forward


class _Call:
    """One call's inputs: the flattened (args, kwargs), which leaves carry gradients, caches."""

    def __init__(self, leaves, spec, grad_idx, caches):
        self.leaves, self.spec, self.grad_idx, self.caches = leaves, spec, grad_idx, caches
        self.kv: dict = {}  # cache kwarg -> {shard: (keys, values, layer_idx, args, kwargs)}
        self.past: dict = {}  # cache kwarg -> {layer_idx: cached length before this call}


class _CacheShard:
    """Stands in for a KV cache during one shard's call. ``update`` hands back what the real
    cache would for this shard's KV heads (its past keys / values, then the new ones) without
    storing anything; in forward it keeps the new ones, so that the real cache is updated once
    with every head (:func:`_fill_caches`). Backward's recomputation sees the past as the
    forward saw it (``past``: cached length per layer when the forward ran)."""

    def __init__(self, real, store: Optional[dict], past: dict, heads: slice, j: int):
        self._real, self._store, self._past, self._heads, self._j = real, store, past, heads, j

    def update(self, keys, values, layer_idx, *args, **kwargs):
        if self._store is not None:  # forward: remember how much was cached before
            self._past.setdefault(layer_idx, self._real.get_seq_length(layer_idx))
            self._store[self._j] = (keys, values, layer_idx, args, kwargs)
        n = self._past.get(layer_idx, 0)
        if n == 0:
            return keys, values
        layer = self._real.layers[layer_idx] if hasattr(self._real, "layers") else None
        if type(layer).__name__ != "DynamicLayer":
            raise NotImplementedError(f"torch_rsdp.rsdp rotation units: decoding with a "
                                      f"filled {type(layer).__name__} is not supported (only "
                                      f"DynamicCache's full layers); shard without tp_plan")
        return (torch.cat([layer.keys[:, self._heads, :n], keys], dim=-2),
                torch.cat([layer.values[:, self._heads, :n], values], dim=-2))

    def __getattr__(self, name):
        return getattr(self._real, name)


def _fill_caches(call: _Call) -> None:
    for key, per_shard in call.kv.items():
        if per_shard:
            parts = [per_shard[j] for j in sorted(per_shard)]
            _, _, layer_idx, args, kwargs = parts[0]
            call.caches[key].update(torch.cat([p[0] for p in parts], dim=1),
                                    torch.cat([p[1] for p in parts], dim=1), layer_idx,
                                    *args, **kwargs)


def _views(st: ShardState, buf: torch.Tensor, j: int, leaves: bool) -> Dict[str, torch.Tensor]:
    """Shard ``j``'s parameters inside ``buf`` (as leaves that require grad when ``leaves``:
    their gradients come out per parameter, with no scatter into a whole flat buffer)."""
    views = {n: st.layout.view(buf, n, j) for n in st.names}
    if leaves:
        views = {n: v.detach().requires_grad_() for n, v in views.items()}
    return views


def _run_shard(unit, call: _Call, ins, weights: Dict[str, torch.Tensor], j: int,
               record: bool) -> torch.Tensor:
    """The unit's own forward on shard ``j`` (its parameters: ``weights``); returns the
    row-split layer's partial output."""
    u: _Unit = unit._rsdp_unit
    leaves = list(call.leaves)
    for i, t in zip(call.grad_idx, ins):
        leaves[i] = t
    args, kwargs = tree_unflatten(leaves, call.spec)
    heads = slice(u.starts[j], u.starts[j] + u.sizes[j])  # atoms of a unit with a cache: KV heads
    for key, real in call.caches.items():
        kwargs[key] = _CacheShard(real, call.kv.setdefault(key, {}) if record else None,
                                  call.past.setdefault(key, {}), heads, j)
    for _, m, _ in u.members:
        m._rsdp_hand = weights
    try:
        out = u.base_forward(unit, *args, **kwargs)
        row_out = u.row._rsdp_last
    finally:
        for _, m, _ in u.members:
            m._rsdp_hand = None
        u.row._rsdp_last = None
    y = out[0] if isinstance(out, (tuple, list)) else out
    if y is not row_out or y is None:
        raise RuntimeError(f"rotation unit {u.name or type(unit).__name__}: its forward must "
                           f"return its row-split layer's output as is (it changes it after "
                           f"the layer); shard it without tp_plan")
    unit._rsdp_out_len = len(out) if isinstance(out, (tuple, list)) else 0
    return y


def _rng_state(device: torch.device):
    """The CPU generator's state and, for a CUDA unit, the device's (dropout draws there)."""
    return (torch.get_rng_state(),
            torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _stub(t: torch.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s shape and dtype over one element (stride 0)."""
    return torch.zeros((), dtype=t.dtype, device=t.device).expand(t.shape)


class _WeightRefs:
    """[Note: keeping activations without keeping weights]
    With ``recompute=False`` each shard's forward is recorded by autograd while its weights
    are in hand. Autograd would save those weights (``grad_input = dy @ W`` needs them), i.e.
    keep every shard of the layer alive until backward. These saved-tensor hooks save a
    tensor living in the rotation buffer as a *reference* (offset, shape, strides) instead,
    and backward resolves it in whichever buffer holds that shard when its graph is run."""

    def __init__(self):
        self.fwd_ptr = None  # storage of the buffer in hand during forward
        self.bwd_buf = None  # the buffer in hand during backward

    def pack(self, t):
        if (self.fwd_ptr is not None and t.device.type != "meta"
                and t.untyped_storage().data_ptr() == self.fwd_ptr):
            return ("rsdp_weight", t.storage_offset(), tuple(t.shape), t.stride(),
                    t.requires_grad)
        return t

    def unpack(self, packed):
        if isinstance(packed, tuple) and packed and packed[0] == "rsdp_weight":
            _, off, shape, stride, _ = packed
            return self.bwd_buf.as_strided(shape, stride, off)
        return packed


class _UnitFn(torch.autograd.Function):
    """Sum over shards of the unit's row-split partial outputs (row bias excluded)."""

    @staticmethod
    def forward(ctx, unit, call: _Call, *tensors):
        st: ShardState = unit._rsdp
        u: _Unit = unit._rsdp_unit
        n_in = len(call.grad_idx)
        ins = tensors[:n_in]
        keep = not u.recompute and any(ctx.needs_input_grad[2:])
        src = st.compute_flat()
        rng = _rng_state(src.device)
        acc, graphs = [], {}
        refs = _WeightRefs() if keep else None
        leaves_in = [t.detach().requires_grad_(t.requires_grad) for t in ins] if keep else ins

        def visit(j, buf):
            if not u.sizes[j]:
                return
            _set_rng_state(rng, src.device)  # every shard draws the same dropout masks
            if keep:  # record this shard's graph; its weights are saved as references
                refs.fwd_ptr = buf.untyped_storage().data_ptr()
                weights = _views(st, buf, j, leaves=True)
                with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                        refs.pack, refs.unpack):
                    y = _run_shard(unit, call, leaves_in, weights, j, record=True)
                # the leaves are only gradient targets now: let go of the rotation buffer
                for w in weights.values():
                    w.data = _stub(w)
                graphs[j] = (y, weights)
                y = y.detach()
            else:
                y = _run_shard(unit, call, ins, _views(st, buf, j, leaves=False), j,
                               record=True)
            if acc:
                acc[0].add_(y)
            else:
                acc.append(y.clone())

        with torch.no_grad():
            rotate(st.ring, src, visit, direction=1, label="RSDP::unit_forward")
        st.release(src)
        del src, visit
        _fill_caches(call)
        call.kv = {}
        ctx.unit, ctx.call, ctx.rng = unit, call, rng
        ctx.graphs, ctx.refs, ctx.leaves_in = graphs, refs, leaves_in if keep else None
        ctx.save_for_backward(*([] if keep else ins))
        ctx.in_meta = [(t.dtype, t.shape, t.device) for t in ins]
        y = acc[0]
        return y.to(st.mp.output_dtype or y.dtype)

    @staticmethod
    def backward(ctx, dy):
        unit, call = ctx.unit, ctx.call
        st: ShardState = unit._rsdp
        u: _Unit = unit._rsdp_unit
        keep = ctx.refs is not None
        n_in = len(ctx.in_meta)
        need_in = ctx.needs_input_grad[2:2 + n_in]
        need_w = any(ctx.needs_input_grad[2 + n_in:])
        ins = ctx.leaves_in if keep else ctx.saved_tensors
        src = st.compute_flat()
        dy = dy.to(src.dtype)
        grads_in = [torch.zeros(shape, dtype=dt, device=dev) if w else None
                    for (dt, shape, dev), w in zip(ctx.in_meta, need_in)]
        names = st.names

        def step(j, buf, out):
            if not u.sizes[j]:
                return
            if keep:  # run the graph recorded in forward, weights resolved in ``buf``
                y, weights = ctx.graphs.pop(j)
                leaves_in = ins
                ctx.refs.bwd_buf = buf
            else:  # recompute this shard's part while its weights are in hand
                leaves_in = [t.detach().requires_grad_(w) for t, w in zip(ins, need_in)]
                weights = _views(st, buf, j, leaves=True)
                with torch.enable_grad(), torch.random.fork_rng(
                        devices=[src.device] if src.device.type == "cuda" else []):
                    _set_rng_state(ctx.rng, src.device)
                    y = _run_shard(unit, call, leaves_in, weights, j, record=False)
            wanted = [t for t, w in zip(leaves_in, need_in) if w and t.requires_grad]
            wl = [weights[n] for n in names] if need_w else []
            with torch.enable_grad():
                got = list(torch.autograd.grad(y, wanted + wl, dy.to(y.dtype),
                                               allow_unused=True))
            for i, (t, w) in enumerate(zip(leaves_in, need_in)):
                if w and t.requires_grad:
                    g = got.pop(0)
                    if g is not None:
                        grads_in[i].add_(g)
            for n, g in zip(names if need_w else [], got):
                dst = st.layout.view(out, n, j)
                if g is None:
                    dst.zero_()
                else:
                    dst.copy_(g)

        acc = rotate_accumulate(st.ring, src, step, grad_dtype=st.grad_dtype,
                                label="RSDP::unit_backward", feedback=st.feedback)
        st.release(src)
        del src
        ctx.graphs = ctx.leaves_in = None
        grads = st.grads_from(acc) if need_w else {}
        del acc
        gins = [g.to(dt) if g is not None else None
                for g, (dt, _, _) in zip(grads_in, ctx.in_meta)]
        return (None, None, *gins, *[grads.get(n) for n in names])


@torch.compiler.disable  # [Note: ring steps under torch.compile] in .ring_order
def unit_forward(unit: nn.Module, args, kwargs):
    st: ShardState = unit._rsdp
    u: _Unit = unit._rsdp_unit
    kwargs = dict(kwargs)
    caches = {k: kwargs.pop(k) for k in list(kwargs)
              if kwargs[k] is not None and (k in _CACHE_KWARGS or _is_cache(kwargs[k]))}
    leaves, spec = tree_flatten((args, kwargs))
    cdt = st.mp.param_dtype
    if cdt is not None:  # compute dtype for every float input (activations, rotary tables)
        leaves = [t.to(cdt) if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                  for t in leaves]
    grad_idx = [i for i, t in enumerate(leaves)
                if isinstance(t, torch.Tensor) and t.requires_grad]
    call = _Call(leaves, spec, grad_idx, caches)
    params = [st.param(n) for n in st.names]
    y = _UnitFn.apply(unit, call, *[leaves[i] for i in grad_idx], *params)
    for i in grad_idx:  # backward gets these from the saved tensors; do not keep them twice
        call.leaves[i] = None
    if u.row.bias is not None:
        y = y + u.row.bias.to(y.dtype)
    n = unit._rsdp_out_len
    return (y,) + (None,) * (n - 1) if n else y


class RSDPUnitMixin:
    """Forward of a rotation unit; mixed into a subclass of the unit module's own class."""

    def forward(self, *args, **kwargs):
        return unit_forward(self, args, kwargs)


class RSDPUnitMemberMixin:
    """A layer of a rotation unit: computes with whichever shard the unit has in hand."""

    _rsdp_hand = None
    _rsdp_last = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
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
               recompute: bool = True) -> nn.Module:
    """Shards ``unit`` (its planned children ``members``: ``(attribute, module, style)``) as
    one rotation unit, in place, and returns it.

    ``recompute``: backward recomputes each shard's part while its weights are in hand (the
    unit keeps only its inputs, like activation checkpointing); ``False`` keeps each shard's
    activations from forward instead (as much activation memory as the unsharded block, no
    recomputation; weights are still never kept, see :class:`_WeightRefs`)."""
    problem = unit_problem(unit, members)
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
        swap_class(m, RSDPUnitMemberMixin, "RSDPUnit" + type(m).__name__)
    swap_class(unit, RSDPUnitMixin, "RSDPUnit" + base.__name__)
    return unit

"""nn.Linear with a sharded weight, computed by rotating the shards around the ring.

Output split (default): rank ``r`` holds rows ``chunk r`` of ``W`` and of ``b``. Forward: each
rank multiplies its own batch ``x`` by every shard as it passes and writes the output columns
of that shard; after ``W`` steps it has its full output ``y = x W^T + b``. Backward: the shards
counter-rotate; ``grad_x += dy[:, cols_j] @ W_j`` for every shard ``j``; the contribution
``dy[:, cols_j]^T x`` (and ``dy[:, cols_j].sum(0)`` for the bias) rides the accumulator ring
home to ``j`` (see :mod:`.._rotation.rotation`). Gradients are averaged over the group, like DDP.

Input split: rank ``r`` holds columns ``chunk r`` of ``W``; the output is the sum over shards of
``x[:, cols_j] @ W_j^T``; the bias is small and stays replicated (added outside the ring).

transformers' ``Conv1D`` (GPT-2; weight stored ``[in, out]``, ``y = x W + b``) runs the same code
on the transposed view (:mod:`.sharded_conv1d`). An output head tied to a sharded embedding
shares the embedding's shard (:func:`tie_linear`).

Shapes that do not divide by the world size work: shards are padded to the largest one in the
flat buffers (:mod:`.._rotation.flat_shard`); padding never enters the arithmetic.

Contract: all ranks of the group call forward / backward of the sharded layers in the same
order (like FSDP); every rank's input may have its own batch size.
"""
from __future__ import annotations

import weakref

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from ... import _C
from .block_gather import is_small
from .._rotation.flat_shard import chunk_sizes, chunk_starts
from .._rotation.memory import alloc_buffer, release_buffers
from .._rotation.outer_checkpoint import drop_output, keep_output, take_output, under_checkpoint
from .._rotation.rotation import counter_rotate, rotate
from .._rotation.ring_order import Ring
from .shard_state import ShardState

__all__ = ["RSDPLinear", "shard_linear", "shard_linear_like", "tie_linear", "sharded_linear_forward"]


def _into(dst: torch.Tensor, fn, *args) -> None:
    """``fn(*args, out=dst)``, or through a temporary when dtypes differ (mixed precision)."""
    if args[0].dtype == dst.dtype:
        fn(*args, out=dst)
    else:
        dst.copy_(fn(*args))


def _geometry(mod):
    """(in_features, out_features, split, transposed) of a sharded linear-like module.

    ``transposed``: the weight is stored ``[in, out]`` (transformers' ``Conv1D``,
    ``y = x W + b``) instead of ``nn.Linear``'s ``[out, in]``. The arithmetic below always
    works on ``w_io``, the shard seen as ``[in_j, out]`` / ``[in, out_j]``."""
    return mod._rsdp_in, mod._rsdp_out, mod._rsdp_split, mod._rsdp_transposed


# [Note: native schedules]
# On one node, for CPU tensors of one dtype, a layer's whole forward or backward ring schedule
# runs in C++ (csrc/rotation/linear_schedule.cpp: the same hops and matmuls as the Python
# schedules below, with the hops as ring steps on this thread): in Python each hop cost as
# much interpreter and dispatch time as a small layer's matmul. The buffers are still made by
# alloc_buffer (MemoryTracker sees them). Elsewhere (across nodes: compressed hops and their
# error feedback; mixed precision; a group on another backend than rsdp, whose hops are
# torch's point-to-point ops) the Python schedules run. ``NATIVE = False`` forces them.
NATIVE = True
_GEOMETRY: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _native(st: ShardState, src: torch.Tensor, device: torch.device, grad_dtype=None):
    """The C++ extension if ``st``'s schedules can run natively on ``src`` for a layer
    computing on ``device``, else None."""
    if not (NATIVE and st.ring.one_node and src.device.type == "cpu" and device == src.device
            and st.ring.fused(src)
            and (grad_dtype is None or grad_dtype == src.dtype)):
        return None
    return _C


def _state(mod):
    """The state ``mod``'s shards are read from: its own, or, for a rotation unit's layer
    computing on its own ([Note: small units layer by layer at two ranks] in
    :mod:`.._units.unit_layers`), a view of its unit's."""
    view = getattr(mod, "_rsdp_layer", None)
    return view if view is not None else mod._rsdp


def _native_geometry(C, mod, st):
    geo = _GEOMETRY.get(mod)
    if geo is None:
        fin, fout, split, tr = _geometry(mod)
        W = st.ring.world
        n = fout if split == "out" else fin
        lay = st.layout
        geo = _GEOMETRY[mod] = C.LinearGeometry(
            split_out=split == "out", transposed=tr, fin=fin, fout=fout,
            sizes=chunk_sizes(n, W), starts=chunk_starts(n, W), w_off=lay.offsets["weight"],
            b_off=lay.offsets["bias"] if "bias" in lay.shapes else -1)
    return geo


#: Small layers compute whole in the native schedules (``_whole``); ``False`` keeps every
#: layer shard by shard.
WHOLE_SMALL = True


def _whole(world: int, tokens: int, fin: int, fout: int) -> bool:
    """[Note: whole small layers] (csrc/rotation/linear_schedule.cpp)
    A product computed shard by shard reads all of the layer's input (forward, weight
    gradient) or output gradient (input gradient) once per shard, and the matmul library packs
    it again each time: for a layer smaller than its activations that costs more than the
    arithmetic. There the native schedules copy the passing shards into one whole weight and
    compute the output and the input gradient in one matmul each, and this rank's contribution
    to the whole weight's gradient in one matmul whose parts ride home: temporaries as large as
    the layer, no larger than the input and output it already holds. Layers larger than their
    activations (the case RSDP is for) never make one, so no large layer is ever whole.
    With two shards the split costs about what the copies do (``bench_rsdp_fsdp2.py``, variant
    ``rsdp-pershard``: 0.95-0.99x FSDP2 whole against 0.97-1.02x shard by shard at 2 ranks,
    0.89-0.98x against 0.85-0.95x at 4), so two ranks keep every layer shard by shard."""
    return WHOLE_SMALL and world > 2 and is_small(fin, fout, tokens)


def _grads(ctx, st: ShardState, acc, gx, dy, fin: int):
    """backward's return: the weight / bias gradients from the accumulator ``acc`` (None where
    not needed), the input gradient in the input's shape and dtype."""
    grads = st.grads_from(acc) if acc is not None else {}
    gw = grads.get("weight") if ctx.needs_input_grad[1] else None
    gb = grads.get("bias") if ctx.needs_input_grad[2] else None
    if gx is not None:
        gx = gx.view(*dy.shape[:-1], fin).to(ctx.x_dtype)
    return gx, gw, gb, None


class _LinearFn(torch.autograd.Function):
    """``y = linear(x, W, b)`` with ``W`` / ``b`` this rank's shards of a sharded Linear
    (or ``Conv1D``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, mod):
        st: ShardState = _state(mod)
        ctx.st = st
        ring, lay = st.ring, st.layout
        fin, fout, split, tr = _geometry(mod)
        if x.shape[-1] != fin:  # before any buffer is taken
            name = getattr(mod, "_rsdp_name", "")
            raise ValueError(f"torch_rsdp.rsdp rank {ring.rank}: {type(mod).__name__} {name!r}: "
                             f"input of shape {tuple(x.shape)} "
                             f"does not end with in_features={fin}")
        y = take_output(mod, (x,))  # [Note: checkpointing without a second rotation]
        if y is not None:  # save what the first forward saved
            ctx.save_for_backward(x.reshape(-1, fin).to(st.mp.param_dtype or st.local_flat().dtype))
            return y
        y = _LinearFn._forward(ctx, st, mod, x)
        keep_output(ctx, mod, (x,), y, any(ctx.needs_input_grad[:3]))
        return y

    @staticmethod
    def _forward(ctx, st: ShardState, mod, x):
        ring, lay = st.ring, st.layout
        fin, fout, split, tr = _geometry(mod)
        src = st.compute_flat()
        x2 = x.reshape(-1, fin).to(src.dtype)
        C = _native(st, src, x2.device)
        if C is not None:
            W = ring.world
            whole = _whole(W, x2.shape[0], fin, fout)
            bufs = [alloc_buffer(src.numel(), src.dtype, src.device) for _ in range(min(2, W - 1))]
            y = C._rsdp_linear_forward(ring.backend(src), _native_geometry(C, mod, st), x2, src,
                                       bufs, ring.origin_lists[1][:W], whole)
            release_buffers(*bufs)
            ring.hops += W - 1
            st.release(src)
            del src, bufs
            ctx.mod = mod
            ctx.x_dtype = x.dtype
            ctx.save_for_backward(x2)
            return y.view(*x.shape[:-1], fout).to(st.mp.output_dtype or y.dtype)

        def w_io(buf, j):
            w = lay.view(buf, "weight", j)
            return w if tr else w.t()

        if split == "out":
            sizes, starts = chunk_sizes(fout, ring.world), chunk_starts(fout, ring.world)
            y = x2.new_empty(x2.shape[0], fout)

            def visit(j, buf):
                if sizes[j]:
                    cols = y[:, starts[j]:starts[j] + sizes[j]]
                    if "bias" in lay.shapes:
                        torch.addmm(lay.view(buf, "bias", j), x2, w_io(buf, j), out=cols)
                    else:
                        torch.mm(x2, w_io(buf, j), out=cols)
        else:
            sizes, starts = chunk_sizes(fin, ring.world), chunk_starts(fin, ring.world)
            y = x2.new_zeros(x2.shape[0], fout)

            def visit(j, buf):
                if sizes[j]:
                    y.addmm_(x2[:, starts[j]:starts[j] + sizes[j]], w_io(buf, j))

        rotate(ring, src, visit, direction=1, label="RSDP::linear_forward", device=x2.device)
        st.release(src)
        del src, visit
        ctx.mod = mod
        ctx.x_dtype = x.dtype
        ctx.save_for_backward(x2)
        return y.view(*x.shape[:-1], fout).to(st.mp.output_dtype or y.dtype)

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        drop_output(ctx)  # after the saved tensors: a checkpoint's recompute takes it there
        mod = ctx.mod
        st: ShardState = ctx.st
        ring, lay = st.ring, st.layout
        fin, fout, split, tr = _geometry(mod)
        need_x = ctx.needs_input_grad[0]
        need_w = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        if not (need_x or need_w):
            return None, None, None, None
        src = st.compute_flat() if need_x else st.local_flat()
        dy2 = dy.reshape(-1, fout).to(x2.dtype)
        C = _native(st, src, dy2.device, st.grad_dtype)
        if C is not None:
            W = ring.world
            n, dt, dev = src.numel(), src.dtype, src.device
            wbuf = alloc_buffer(n, dt, dev) if need_x and W > 1 else None
            acc = alloc_buffer(n, dt, dev, zero=True) if need_w else None
            local = alloc_buffer(n, dt, dev, zero=True) if need_w and W > 1 else None
            gx = C._rsdp_linear_backward(ring.backend(src), _native_geometry(C, mod, st), x2, dy2,
                                         src if need_x else None, wbuf, acc, local,
                                         ring.origin_lists[-1], need_x,
                                         _whole(W, x2.shape[0], fin, fout))
            release_buffers(wbuf, local)
            ring.hops += (W - 1) * (int(need_x) + int(need_w))
            st.release(src)
            del src, wbuf, local
            return _grads(ctx, st, acc, gx, dy, fin)
        gx = torch.zeros_like(x2) if need_x else None
        has_bias = "bias" in lay.shapes
        n_split = fout if split == "out" else fin
        sizes, starts = chunk_sizes(n_split, ring.world), chunk_starts(n_split, ring.world)

        def w_io(buf, j):
            w = lay.view(buf, "weight", j)
            return w if tr else w.t()

        def grad_w(buf, j, xs, d):
            """Overwrites shard j's weight region of ``buf`` with ``xs^T d`` in its layout."""
            if tr:
                _into(lay.view(buf, "weight", j), torch.mm, xs.t(), d)
            else:
                _into(lay.view(buf, "weight", j), torch.mm, d.t(), xs)

        if split == "out":
            def visit(j, buf):
                if sizes[j]:
                    gx.addmm_(dy2[:, starts[j]:starts[j] + sizes[j]], w_io(buf, j).t())

            def contribute(j, buf):
                if sizes[j]:
                    d = dy2[:, starts[j]:starts[j] + sizes[j]]
                    grad_w(buf, j, x2, d)
                    if has_bias:
                        _into(lay.view(buf, "bias", j), torch.sum, d, 0)
        else:
            def visit(j, buf):
                if sizes[j]:
                    torch.mm(dy2, w_io(buf, j).t(), out=gx[:, starts[j]:starts[j] + sizes[j]])

            def contribute(j, buf):
                if sizes[j]:
                    grad_w(buf, j, x2[:, starts[j]:starts[j] + sizes[j]], dy2)

        acc = counter_rotate(ring, src, visit=visit if need_x else None,
                             contribute=contribute if need_w else None,
                             grad_dtype=st.grad_dtype, label="RSDP::linear_backward",
                             feedback=st.feedback, device=dy2.device)
        st.release(src)
        del src
        return _grads(ctx, st, acc, gx, dy, fin)


@torch.compiler.disable  # [Note: ring steps under torch.compile] in .ring_order
def sharded_linear_forward(mod, x: torch.Tensor) -> torch.Tensor:
    """Forward of a sharded linear-like module (output split: the bias is sharded with the
    rows and added inside the ring; input split: the replicated bias is added afterwards).
    A small layer of a block computes in its block's pass ([Note: block gathers])."""
    block = getattr(mod, "_rsdp_block", None)
    # under torch's checkpoint every call computes alone, so that its recompute can take the
    # output it kept ([Note: checkpointing without a second rotation])
    if block is not None and not under_checkpoint():
        y = block.forward(mod, x)
        if y is not None:
            return y
    if mod._rsdp_split == "out":
        return _LinearFn.apply(x, mod.weight, mod.bias, mod)
    y = _LinearFn.apply(x, mod.weight, None, mod)
    return y if mod.bias is None else y + mod.bias.to(y.dtype)


class RSDPLinear(nn.Linear):
    """An ``nn.Linear`` whose ``weight`` (and, split by output, ``bias``) are this rank's shard.

    ``in_features`` / ``out_features`` keep the logical (full) sizes. Created by
    :func:`shard_linear` (which swaps the class of an existing ``nn.Linear`` in place).
    """

    _rsdp: ShardState
    _rsdp_split: str

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sharded_linear_forward(self, x)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, rsdp_split={self._rsdp_split}, "
                f"local_weight={tuple(self.weight.shape)}")


def shard_linear(module: nn.Linear, ring: Ring, split: str = "out",
                 mp: MixedPrecisionPolicy | None = None) -> RSDPLinear:
    """Shards ``module`` in place (its class becomes :class:`RSDPLinear`) and returns it.

    ``split="out"`` shards rows of ``W`` and ``b``; ``split="in"`` shards columns of ``W`` and
    leaves ``b`` a replicated parameter.
    """
    if type(module) is not nn.Linear:
        raise TypeError(f"shard_linear expects an nn.Linear, got {type(module).__name__}")
    shard_linear_like(module, ring, split, mp, module.in_features, module.out_features,
                      transposed=False)
    module.__class__ = RSDPLinear
    return module


def shard_linear_like(module: nn.Module, ring: Ring, split: str, mp, fin: int, fout: int,
                      transposed: bool) -> None:
    """Replaces ``module.weight`` (``[out, in]``, or ``[in, out]`` when ``transposed``) and, for
    the output split, ``module.bias`` by this rank's shards; the caller swaps the class."""
    if split not in ("out", "in"):
        raise ValueError(f"split must be 'out' or 'in', got {split!r}")
    expect = (fin, fout) if transposed else (fout, fin)
    if tuple(module.weight.shape) != expect:
        raise ValueError(f"{type(module).__name__}: weight shape {tuple(module.weight.shape)}, "
                         f"expected {expect}")
    W = ring.world
    n = fout if split == "out" else fin
    sizes, starts = chunk_sizes(n, W), chunk_starts(n, W)
    # the dimension of the weight that is split: rows of [out, in] for the output split...
    wdim = (0 if split == "out" else 1) if not transposed else (1 if split == "out" else 0)

    def take(name, t, j):
        sl = slice(starts[j], starts[j] + sizes[j])
        return t.narrow(wdim if name == "weight" else 0, sl.start, sl.stop - sl.start)

    full = {"weight": module.weight}
    if split == "out":
        full["bias"] = module.bias
    dims = {"weight": wdim, "bias": 0}
    module._rsdp = ShardState(module, ring, full, take, dims, mp)
    _set_geometry(module, split, fin, fout, transposed)


def _set_geometry(module, split, fin, fout, transposed):
    module._rsdp_split = split
    module._rsdp_in, module._rsdp_out = fin, fout
    module._rsdp_transposed = transposed


def tie_linear(module: nn.Linear, state: ShardState, owner: str = "the embedding"
               ) -> RSDPLinear:
    """Makes ``module`` (an output head whose weight *is* a sharded embedding's weight) an
    input-split :class:`RSDPLinear` on that embedding's :class:`ShardState`.

    An embedding ``[vocab, dim]`` split by embedding dimension holds columns ``chunk r`` of
    ``dim``; the head's weight ``[vocab, dim]`` split by input features holds the same columns,
    so one flat shard serves both and the tie (one Parameter object) survives. Each use
    returns its own averaged gradient for the shared shard; autograd adds them."""
    if type(module) is not nn.Linear:
        raise TypeError(f"tie_linear expects an nn.Linear, got {type(module).__name__}")
    shapes = state.layout.shapes["weight"]
    full_shape = (shapes[0][0], sum(s[1] for s in shapes))
    if full_shape != (module.out_features, module.in_features) or state.dims["weight"] != 1:
        raise ValueError(f"tie_linear: head weight {(module.out_features, module.in_features)} "
                         f"does not match {owner}'s column-split weight {full_shape}")
    module.weight = state.param("weight")
    module._rsdp = state
    _set_geometry(module, "in", module.in_features, module.out_features, False)
    module.__class__ = RSDPLinear
    return module

"""nn.Linear with a sharded weight, computed by rotating the shards around the ring.

Output split (default): rank ``r`` holds rows ``chunk r`` of ``W`` and of ``b``. Forward: each
rank multiplies its own batch ``x`` by every shard as it passes and writes the output columns
of that shard; after ``W`` steps it has its full output ``y = x W^T + b``. Backward: the shards
counter-rotate; ``grad_x += dy[:, cols_j] @ W_j`` for every shard ``j``; the contribution
``dy[:, cols_j]^T x`` (and ``dy[:, cols_j].sum(0)`` for the bias) rides the accumulator ring
home to ``j`` (see :mod:`.rotation`). Gradients are averaged over the group, like DDP.

Input split: rank ``r`` holds columns ``chunk r`` of ``W``; the output is the sum over shards of
``x[:, cols_j] @ W_j^T``; the bias is small and stays replicated (added outside the ring).

Shapes that do not divide by the world size work: shards are padded to the largest one in the
flat buffers (:mod:`.flat_shard`); padding never enters the arithmetic.

Contract: all ranks of the group call forward / backward of the sharded layers in the same
order (like FSDP); every rank's input may have its own batch size.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from .flat_shard import chunk_sizes, chunk_starts
from .rotation import counter_rotate, rotate
from .ring_plan import RingPlan
from .shard_state import MixedPrecision, ShardState

__all__ = ["RSDPLinear", "shard_linear"]


def _into(dst: torch.Tensor, fn, *args) -> None:
    """``fn(*args, out=dst)``, or through a temporary when dtypes differ (mixed precision)."""
    if args[0].dtype == dst.dtype:
        fn(*args, out=dst)
    else:
        dst.copy_(fn(*args))


class _LinearFn(torch.autograd.Function):
    """``y = linear(x, W, b)`` with ``W`` / ``b`` this rank's shards of a sharded Linear."""

    @staticmethod
    def forward(ctx, x, weight, bias, mod: "RSDPLinear"):
        st: ShardState = mod._rsdp
        plan, lay, split = st.plan, st.layout, mod._rsdp_split
        src = st.compute_flat()
        x2 = x.reshape(-1, mod.in_features).to(src.dtype)
        if split == "out":
            sizes, starts = chunk_sizes(mod.out_features, plan.world), chunk_starts(
                mod.out_features, plan.world)
            y = x2.new_empty(x2.shape[0], mod.out_features)

            def visit(j, buf):
                if sizes[j]:
                    cols = y[:, starts[j]:starts[j] + sizes[j]]
                    w = lay.view(buf, "weight", j)
                    if "bias" in lay.shapes:
                        torch.addmm(lay.view(buf, "bias", j), x2, w.t(), out=cols)
                    else:
                        torch.mm(x2, w.t(), out=cols)
        else:
            sizes, starts = chunk_sizes(mod.in_features, plan.world), chunk_starts(
                mod.in_features, plan.world)
            y = x2.new_zeros(x2.shape[0], mod.out_features)

            def visit(j, buf):
                if sizes[j]:
                    y.addmm_(x2[:, starts[j]:starts[j] + sizes[j]], lay.view(buf, "weight", j).t())

        rotate(plan, src, visit, direction=1, label="RSDP::linear_forward")
        st.release(src)
        del src, visit
        ctx.mod = mod
        ctx.x_dtype = x.dtype
        ctx.save_for_backward(x2)
        return y.view(*x.shape[:-1], mod.out_features).to(st.mp.output_dtype or y.dtype)

    @staticmethod
    def backward(ctx, dy):
        (x2,) = ctx.saved_tensors
        mod: RSDPLinear = ctx.mod
        st: ShardState = mod._rsdp
        plan, lay, split = st.plan, st.layout, mod._rsdp_split
        need_x = ctx.needs_input_grad[0]
        need_w = ctx.needs_input_grad[1] or ctx.needs_input_grad[2]
        if not (need_x or need_w):
            return None, None, None, None
        src = st.compute_flat() if need_x else st.local_flat()
        dy2 = dy.reshape(-1, mod.out_features).to(x2.dtype)
        gx = torch.zeros_like(x2) if need_x else None
        has_bias = "bias" in lay.shapes
        n_split = mod.out_features if split == "out" else mod.in_features
        sizes, starts = chunk_sizes(n_split, plan.world), chunk_starts(n_split, plan.world)

        if split == "out":
            def visit(j, buf):
                if sizes[j]:
                    gx.addmm_(dy2[:, starts[j]:starts[j] + sizes[j]], lay.view(buf, "weight", j))

            def contribute(j, buf):
                if sizes[j]:
                    d = dy2[:, starts[j]:starts[j] + sizes[j]]
                    _into(lay.view(buf, "weight", j), torch.mm, d.t(), x2)
                    if has_bias:
                        _into(lay.view(buf, "bias", j), torch.sum, d, 0)
        else:
            def visit(j, buf):
                if sizes[j]:
                    torch.mm(dy2, lay.view(buf, "weight", j),
                             out=gx[:, starts[j]:starts[j] + sizes[j]])

            def contribute(j, buf):
                if sizes[j]:
                    _into(lay.view(buf, "weight", j), torch.mm, dy2.t(),
                          x2[:, starts[j]:starts[j] + sizes[j]])

        acc = counter_rotate(plan, src, visit=visit if need_x else None,
                             contribute=contribute if need_w else None,
                             grad_dtype=st.grad_dtype, label="RSDP::linear_backward")
        st.release(src)
        del src
        grads = st.grads_from(acc) if acc is not None else {}
        del acc
        gw = grads.get("weight") if ctx.needs_input_grad[1] else None
        gb = grads.get("bias") if ctx.needs_input_grad[2] else None
        if gx is not None:
            gx = gx.view(*dy.shape[:-1], mod.in_features).to(ctx.x_dtype)
        return gx, gw, gb, None


class RSDPLinear(nn.Linear):
    """An ``nn.Linear`` whose ``weight`` (and, split by output, ``bias``) are this rank's shard.

    ``in_features`` / ``out_features`` keep the logical (full) sizes. Created by
    :func:`shard_linear` (which swaps the class of an existing ``nn.Linear`` in place).
    """

    _rsdp: ShardState
    _rsdp_split: str

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._rsdp_split == "out":
            return _LinearFn.apply(x, self.weight, self.bias, self)
        y = _LinearFn.apply(x, self.weight, None, self)
        return y if self.bias is None else y + self.bias.to(y.dtype)

    def extra_repr(self) -> str:
        return (f"{super().extra_repr()}, rsdp_split={self._rsdp_split}, "
                f"local_weight={tuple(self.weight.shape)}")


def shard_linear(module: nn.Linear, plan: RingPlan, split: str = "out",
                 mp: MixedPrecision | None = None) -> RSDPLinear:
    """Shards ``module`` in place (its class becomes :class:`RSDPLinear`) and returns it.

    ``split="out"`` shards rows of ``W`` and ``b``; ``split="in"`` shards columns of ``W`` and
    leaves ``b`` a replicated parameter.
    """
    if split not in ("out", "in"):
        raise ValueError(f"split must be 'out' or 'in', got {split!r}")
    if type(module) is not nn.Linear:
        raise TypeError(f"shard_linear expects an nn.Linear, got {type(module).__name__}")
    W = plan.world
    n = module.out_features if split == "out" else module.in_features
    sizes, starts = chunk_sizes(n, W), chunk_starts(n, W)

    def take(name, t, j):
        sl = slice(starts[j], starts[j] + sizes[j])
        return t[sl] if split == "out" else t[:, sl]

    full = {"weight": module.weight}
    if split == "out":
        full["bias"] = module.bias
    dims = {"weight": 0 if split == "out" else 1, "bias": 0}
    module._rsdp = ShardState(module, plan, full, take, dims, mp)
    module._rsdp_split = split
    module.__class__ = RSDPLinear
    return module

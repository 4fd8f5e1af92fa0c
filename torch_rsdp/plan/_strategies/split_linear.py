"""OSDP's operator splitting (``split:k``): a Linear computed in ``k`` slices, each slice fully
sharded and gathered only while it is being used.

The weight ``W`` (``out x in``) is cut along its input features into ``k`` slices
``W[:, cols_s]``. Every slice is sharded by rows over the group, so rank ``r`` holds rows
``rows_r`` of every slice, which together are simply ``W[rows_r, :]``: the local parameter is a
2-D row shard of the weight, named and shaped like the ``"out"`` split of RSDP, and a full state
dict is the concatenation of the row shards.

Forward, for ``s = 0 .. k-1``: all-gather slice ``s`` (``out x in/k``), add
``x[:, cols_s] @ W_s^T`` to the output, free the slice. Backward, for every slice: gather it
again, ``grad_x[:, cols_s] = dy @ W_s``, and reduce-scatter ``dy^T x[:, cols_s]`` so each rank
receives the gradient of its own rows (averaged over the group, as FSDP does). So the peak of
gathered weights is one slice, ``1/k`` of the layer, where FSDP gathers the whole layer; the
price is ``k`` smaller collectives instead of one.

The bias (``out`` elements) stays replicated; the caller synchronises its gradient with the
other replicated parameters. Under ``no_sync`` the slice gradients are accumulated unsharded
(like FSDP2 without gradient sync) and reduce-scattered, summed, by the first backward that
synchronises again.

``transformers``' ``Conv1D`` (GPT-2) is a Linear stored transposed (``in x out``); it is split
the same way, its local parameter being the transposed row shard.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Optional

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.profiler import record_function

from ..._utils import all_gather_tensor, is_conv1d, reduce_scatter_tensor, swap_class
from ..._dtensor_params import Shard, dtensor_param, local, mesh_of_group, wrap_like
from ..._utils import chunk_sizes, chunk_starts

__all__ = ["SplitState", "split_linear", "is_splittable", "is_split", "in_features",
           "SplitLinearMixin", "full_weight", "local_rows_of", "set_sync_grads",
           "split_layout"]


def is_splittable(mod: nn.Module) -> bool:
    """An ``nn.Linear`` (exactly) or a ``transformers`` ``Conv1D``."""
    return type(mod) is nn.Linear or is_conv1d(mod)


@dataclass
class SplitState:
    group: Optional[dist.ProcessGroup]
    world: int
    rank: int
    k: int
    out_features: int
    in_features: int
    transposed: bool                 # Conv1D: the parameter is stored (in, out)
    rows: int                        # padded rows per rank (ceil(out / world))
    col_sizes: List[int]
    col_starts: List[int]
    param_dtype: Optional[torch.dtype] = None
    reduce_dtype: Optional[torch.dtype] = None
    output_dtype: Optional[torch.dtype] = None
    sync_grads: bool = True
    # Unsharded slice gradients accumulated while sync_grads is off (no_sync).
    pending: List[Optional[torch.Tensor]] = field(default_factory=list)

    @property
    def local_rows(self) -> int:
        return max(0, min(self.rows, self.out_features - self.rank * self.rows))


def _logical(weight: torch.Tensor, st: SplitState) -> torch.Tensor:
    """The local shard as (rows, in), whatever the module's storage orientation."""
    return weight.t() if st.transposed else weight


def _gather_slice(weight: torch.Tensor, st: SplitState, s: int, dtype) -> torch.Tensor:
    """Slice ``s`` of the full weight, ``(out, in_s)``, in ``dtype``."""
    lo, n = st.col_starts[s], st.col_sizes[s]
    send = weight.new_zeros(st.rows, n, dtype=dtype)
    send[:st.local_rows].copy_(_logical(weight, st)[:, lo:lo + n])
    if st.world == 1:
        return send[:st.out_features]
    full = weight.new_empty(st.world * st.rows, n, dtype=dtype)
    with record_function("OSDP::split_all_gather"):
        all_gather_tensor(full, send, group=st.group)
    return full[:st.out_features]


def _reduce_slice_grad(g: torch.Tensor, st: SplitState, dtype) -> torch.Tensor:
    """This rank's rows of the group-averaged slice gradient ``g`` (``out x in_s``)."""
    padded = g.new_zeros(st.world * st.rows, g.shape[1], dtype=dtype)
    padded[:st.out_features].copy_(g)
    if st.world == 1:
        return padded[:st.local_rows]
    mine = g.new_empty(st.rows, g.shape[1], dtype=dtype)
    with record_function("OSDP::split_reduce_scatter"):
        reduce_scatter_tensor(mine, padded, op=dist.ReduceOp.SUM, group=st.group)
    mine.div_(st.world)
    return mine[:st.local_rows]


class _SplitFn(torch.autograd.Function):
    """``weight`` is the module's DTensor parameter: the arithmetic runs on its local rows
    and the gradient returns as a DTensor of its placement."""

    @staticmethod
    def forward(ctx, x, param, st: SplitState):
        weight = local(param)
        ctx.param = param
        pdt = st.param_dtype or weight.dtype
        x2 = x.reshape(-1, st.in_features).to(pdt)
        y = x2.new_zeros(x2.shape[0], st.out_features)
        for s in range(st.k):
            lo, n = st.col_starts[s], st.col_sizes[s]
            if n == 0:
                continue
            w = _gather_slice(weight, st, s, pdt)
            y.addmm_(x2[:, lo:lo + n], w.t())
            del w  # one gathered slice alive at a time
        ctx.st = st
        ctx.x_dtype = x.dtype
        ctx.save_for_backward(x2, weight)
        return y.view(*x.shape[:-1], st.out_features)

    @staticmethod
    def backward(ctx, dy):
        x2, weight = ctx.saved_tensors
        st: SplitState = ctx.st
        pdt = x2.dtype
        rdt = st.reduce_dtype or weight.dtype
        dy2 = dy.reshape(-1, st.out_features).to(pdt)
        need_x, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        gx = torch.zeros_like(x2) if need_x else None
        gw = None
        if need_w and st.sync_grads:
            gw = torch.zeros(st.local_rows, st.in_features, dtype=weight.dtype,
                             device=weight.device)
        if need_w and not st.pending:
            st.pending = [None] * st.k
        for s in range(st.k):
            lo, n = st.col_starts[s], st.col_sizes[s]
            if n == 0:
                continue
            if need_x:
                w = _gather_slice(weight, st, s, pdt)
                torch.mm(dy2, w, out=gx[:, lo:lo + n])
                del w
            if need_w:
                g = (dy2.t() @ x2[:, lo:lo + n]).to(rdt)
                if st.pending[s] is not None:
                    g += st.pending[s]
                if st.sync_grads:
                    st.pending[s] = None
                    gw[:, lo:lo + n] = _reduce_slice_grad(g, st, rdt).to(weight.dtype)
                else:
                    st.pending[s] = g
                del g
        if gx is not None:
            gx = gx.view(*dy.shape[:-1], st.in_features).to(ctx.x_dtype)
        if gw is not None and st.transposed:
            gw = gw.t()
        if gw is not None:
            gw = wrap_like(ctx.param, gw)
        return gx, gw, None


class SplitLinearMixin:
    """Forward of a split Linear / Conv1D (the class of the module is swapped to a subclass of
    its own class and this mixin, so ``isinstance(m, nn.Linear)`` still holds)."""

    _split: SplitState

    @torch.compiler.disable  # collectives per slice: a graph break, like RSDP's ring steps
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        st = self._split
        y = _SplitFn.apply(x, self.weight, st)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.to(st.output_dtype) if st.output_dtype is not None else y

    def extra_repr(self) -> str:
        st = self._split
        return (f"in_features={st.in_features}, out_features={st.out_features}, "
                f"split={st.k}, local_weight={tuple(local(self.weight).shape)}")


def split_linear(mod: nn.Module, k: int, group: Optional[dist.ProcessGroup] = None, *,
                 param_dtype=None, reduce_dtype=None, output_dtype=None) -> nn.Module:
    """Splits ``mod`` (an ``nn.Linear`` or ``Conv1D``) in place into ``k`` input-feature slices,
    each sharded by rows over ``group``, and returns it. Not collective (no communication)."""
    if not is_splittable(mod):
        raise TypeError(f"torch_rsdp.plan: split:k applies to nn.Linear / Conv1D, "
                        f"got {type(mod).__name__}")
    transposed = is_conv1d(mod)
    full = mod.weight.detach()
    out_f, in_f = (full.shape[1], full.shape[0]) if transposed else tuple(full.shape)
    if k > in_f:
        raise ValueError(f"torch_rsdp.plan: split:{k} of a layer with {in_f} input features "
                         f"(at most split:{in_f})")
    W, r = dist.get_world_size(group), dist.get_rank(group)
    rows = -(-out_f // W)
    st = SplitState(group, W, r, k, out_f, in_f, transposed, rows,
                    chunk_sizes(in_f, k), chunk_starts(in_f, k),
                    param_dtype, reduce_dtype, output_dtype)
    logical = full.t() if transposed else full
    local_w = logical[r * rows:r * rows + st.local_rows].clone()
    local_w = local_w.t().contiguous() if transposed else local_w
    mod._split = st
    dim, shape = split_layout(mod)
    mod.weight = dtensor_param(local_w, mesh_of_group(group, local_w.device.type), [Shard(dim)],
                               shape, requires_grad=mod.weight.requires_grad)
    return swap_class(mod, SplitLinearMixin, f"Split{type(mod).__name__}")


def is_split(mod: nn.Module) -> bool:
    """Whether ``mod`` was split by :func:`split_linear`."""
    return isinstance(mod, SplitLinearMixin)


def in_features(mod: nn.Module) -> int:
    """Input features of an ``nn.Linear`` or ``Conv1D`` (stored ``in x out``)."""
    return mod.weight.shape[0] if is_conv1d(mod) else mod.in_features


def set_sync_grads(mod: nn.Module, enabled: bool) -> None:
    """Turns the reduce-scatter of a split module's slice gradients off (accumulate them
    unsharded, as under ``no_sync``) or on."""
    mod._split.sync_grads = enabled


def full_weight(mod: nn.Module) -> torch.Tensor:
    """The whole weight of a split module, assembled on every rank. Collective."""
    st: SplitState = mod._split
    w = local(mod.weight)
    parts = [_gather_slice(w, st, s, w.dtype) for s in range(st.k)]
    w = torch.cat(parts, dim=1)
    return w.t().contiguous() if st.transposed else w


def split_layout(mod: nn.Module):
    """``(dim, global shape)`` of the local weight: rows of the logical ``(out, in)`` weight,
    ``ceil(out / W)`` a rank as ``torch.chunk`` cuts them (dim 1 of a ``Conv1D``'s storage)."""
    st: SplitState = mod._split
    return (1, (st.in_features, st.out_features)) if st.transposed else \
        (0, (st.out_features, st.in_features))


def local_rows_of(mod: nn.Module, full: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a full weight (in the module's storage orientation)."""
    st: SplitState = mod._split
    logical = full.t() if st.transposed else full
    local = logical[st.rank * st.rows:st.rank * st.rows + st.local_rows]
    return local.t() if st.transposed else local

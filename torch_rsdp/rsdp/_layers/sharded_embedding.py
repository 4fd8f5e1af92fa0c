"""nn.Embedding sharded by embedding dimension, computed by rotating the shards.

Rank ``r`` holds columns ``chunk r`` of the ``[num_embeddings, dim]`` table. Forward: each rank
looks its own indices up in every shard as it passes, filling that shard's output columns.
Backward: no weight rotation is needed (indices have no gradient); each rank's contribution to
shard ``j`` (``dy[:, cols_j]`` scattered into rows ``idx``) rides the accumulator ring home to
``j`` and arrives averaged over the group, like DDP.

``padding_idx`` and ``scale_grad_by_freq`` are honoured; ``max_norm`` (renormalises the table
in place during forward) and ``sparse`` gradients are not supported: such modules stay
replicated (see :func:`can_shard_embedding`).
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy

from .._rotation.flat_shard import chunk_sizes, chunk_starts
from .._rotation.rotation import counter_rotate, rotate
from .._rotation.ring_order import Ring
from .shard_state import ShardState

__all__ = ["RSDPEmbedding", "shard_embedding", "can_shard_embedding"]


class _EmbeddingFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, idx, weight, mod: "RSDPEmbedding"):
        st: ShardState = mod._rsdp
        ring, lay = st.ring, st.layout
        sizes = chunk_sizes(mod.embedding_dim, ring.world)
        starts = chunk_starts(mod.embedding_dim, ring.world)
        src = st.compute_flat()
        flat_idx = idx.reshape(-1)
        y = torch.empty(flat_idx.numel(), mod.embedding_dim, dtype=src.dtype, device=idx.device)

        def visit(j, buf):
            if sizes[j]:
                y[:, starts[j]:starts[j] + sizes[j]] = F.embedding(flat_idx,
                                                                   lay.view(buf, "weight", j))

        rotate(ring, src, visit, direction=1, label="RSDP::embedding_forward",
               device=idx.device)
        st.release(src)
        del src, visit
        ctx.mod = mod
        ctx.save_for_backward(flat_idx)
        return y.view(*idx.shape, mod.embedding_dim).to(st.mp.output_dtype or y.dtype)

    @staticmethod
    def backward(ctx, dy):
        (idx,) = ctx.saved_tensors
        mod: RSDPEmbedding = ctx.mod
        st: ShardState = mod._rsdp
        ring, lay = st.ring, st.layout
        if not ctx.needs_input_grad[1]:
            return None, None, None
        sizes = chunk_sizes(mod.embedding_dim, ring.world)
        starts = chunk_starts(mod.embedding_dim, ring.world)
        dy2 = dy.reshape(-1, mod.embedding_dim).to(st.mp.param_dtype or dy.dtype)
        if mod.scale_grad_by_freq:
            counts = torch.bincount(idx, minlength=mod.num_embeddings)
            dy2 = dy2 / counts[idx].unsqueeze(1).to(dy2.dtype)
        gdt = st.grad_dtype

        def contribute(j, buf):
            if sizes[j]:
                g = lay.view(buf, "weight", j)
                g.zero_()
                g.index_add_(0, idx, dy2[:, starts[j]:starts[j] + sizes[j]].to(gdt))
                if mod.padding_idx is not None:
                    g[mod.padding_idx].zero_()

        acc = counter_rotate(ring, st.local_flat(), contribute=contribute, grad_dtype=gdt,
                             label="RSDP::embedding_backward", feedback=st.feedback,
                             device=dy2.device)
        grads = st.grads_from(acc)
        return None, grads["weight"], None


class RSDPEmbedding(nn.Embedding):
    """An ``nn.Embedding`` whose ``weight`` is this rank's column shard ``[num, dim_r]``.

    ``embedding_dim`` keeps the logical (full) size. Created by :func:`shard_embedding`.
    """

    _rsdp: ShardState

    @torch.compiler.disable  # [Note: ring steps under torch.compile] in .ring_order
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return _EmbeddingFn.apply(idx, self.weight, self)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, rsdp_local_weight={tuple(self.weight.shape)}"


def can_shard_embedding(module: nn.Module) -> bool:
    """True for plain ``nn.Embedding`` modules without ``max_norm`` / ``sparse``."""
    return type(module) is nn.Embedding and module.max_norm is None and not module.sparse


def shard_embedding(module: nn.Embedding, ring: Ring,
                    mp: MixedPrecisionPolicy | None = None) -> RSDPEmbedding:
    """Shards ``module`` by embedding dimension, in place, and returns it."""
    if not can_shard_embedding(module):
        raise TypeError("shard_embedding needs a plain nn.Embedding without max_norm / sparse")
    sizes = chunk_sizes(module.embedding_dim, ring.world)
    starts = chunk_starts(module.embedding_dim, ring.world)

    def take(name, t, j):
        return t[:, starts[j]:starts[j] + sizes[j]]

    module._rsdp = ShardState(module, ring, {"weight": module.weight}, take, {"weight": 1}, mp)
    module.__class__ = RSDPEmbedding
    return module

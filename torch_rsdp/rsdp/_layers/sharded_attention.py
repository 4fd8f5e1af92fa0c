"""nn.MultiheadAttention sharded by heads, computed by rotating the head groups.

Rank ``r`` holds head group ``chunk r`` (``torch.chunk`` of the heads): the q, k and v rows of
``in_proj_weight`` / ``in_proj_bias`` for those heads (stored as ``[q_r; k_r; v_r]``) and the
matching columns of ``out_proj.weight``. ``out_proj.bias`` is small and stays replicated.
Forward: as head group ``j`` passes, each rank projects its own q/k/v inputs with it, runs
attention for those heads and adds their share of the output projection, so after ``W`` steps
it has the full output; no rank ever holds more than two head groups.

Backward (:func:`.._rotation.rotation.rotate_accumulate`): the gradient of group ``j``'s projections goes
through the softmax, which needs group ``j``'s weights, so each group's attention is recomputed
while its weights are in hand (activation recomputation per head group, with the forward's RNG
state when dropout is on) and the contribution joins ``j``'s accumulator, which trails the
weights home.

Supported: self- and cross-attention with ``kdim == vdim == embed_dim``, ``batch_first`` either
way, unbatched inputs, ``attn_mask`` (2-D or per-head 3-D, bool or float), ``key_padding_mask``,
``need_weights`` / ``average_attn_weights`` (the returned weights carry no gradient), dropout
and uneven head counts. ``add_bias_kv`` / ``add_zero_attn`` / separate ``kdim``/``vdim``
modules stay replicated (:func:`can_shard_attention`).
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.fsdp import MixedPrecisionPolicy

from .._rotation.flat_shard import chunk_sizes, chunk_starts
from .._rotation.ring_order import Ring
from .._rotation.rotation import rotate, rotate_accumulate
from .shard_state import ShardState

__all__ = ["RSDPMultiheadAttention", "shard_attention", "can_shard_attention"]

_IN_W, _IN_B, _OUT_W = "in_proj_weight", "in_proj_bias", "out_proj.weight"


def can_shard_attention(mod: nn.Module) -> bool:
    return (type(mod) is nn.MultiheadAttention and mod._qkv_same_embed_dim
            and mod.bias_k is None and not mod.add_zero_attn)


def _additive(mask, dtype):
    """MHA masks (bool: True = masked out; float: added) as a float mask to add to scores."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype).masked_fill_(mask, float("-inf"))
    return mask.to(dtype)


def _merged_mask(attn_mask, key_padding_mask, B, H, Tq, Tk, dtype):
    """One float mask broadcastable to ``[B, H, Tq, Tk]`` (or None)."""
    m = _additive(attn_mask, dtype)
    if m is not None:
        m = m.view(1, 1, Tq, Tk) if m.dim() == 2 else m.view(B, H, Tq, Tk)
    kp = _additive(key_padding_mask, dtype)
    if kp is not None:
        kp = kp.view(B, 1, 1, Tk)
        m = kp if m is None else m + kp
    return m


class _Group:
    """Per-call geometry shared by forward and backward."""

    def __init__(self, mod, B, Tq, Tk, mask, self_attn, need_weights, dropout_p):
        self.heads = chunk_sizes(mod.num_heads, mod._rsdp.ring.world)
        self.first = chunk_starts(mod.num_heads, mod._rsdp.ring.world)
        self.hd = mod.head_dim
        self.B, self.Tq, self.Tk = B, Tq, Tk
        self.mask = mask
        self.self_attn = self_attn
        self.need_weights = need_weights
        self.dropout_p = dropout_p

    def mask_of(self, j):
        m = self.mask
        if m is not None and m.shape[1] > 1:
            m = m[:, self.first[j]:self.first[j] + self.heads[j]]
        return m

    def output(self, lay, buf, j, q, k, v):
        """(this group's share of the output projection, its attention weights or None)."""
        hn, hd, B, Tq, Tk = self.heads[j], self.hd, self.B, self.Tq, self.Tk
        w_in = lay.view(buf, _IN_W, j)
        b_in = lay.view(buf, _IN_B, j) if _IN_B in lay.shapes else None
        if self.self_attn:
            qkv = F.linear(q, w_in, b_in)
            qj, kj, vj = qkv.split(hn * hd, dim=-1)
        else:
            ws = w_in.split(hn * hd)
            bs = b_in.split(hn * hd) if b_in is not None else (None, None, None)
            qj, kj, vj = F.linear(q, ws[0], bs[0]), F.linear(k, ws[1], bs[1]), F.linear(v, ws[2],
                                                                                        bs[2])
        qj = qj.reshape(B, Tq, hn, hd).transpose(1, 2)
        kj = kj.reshape(B, Tk, hn, hd).transpose(1, 2)
        vj = vj.reshape(B, Tk, hn, hd).transpose(1, 2)
        mask, probs = self.mask_of(j), None
        if self.need_weights:
            scores = qj @ kj.transpose(-2, -1) / math.sqrt(hd)
            if mask is not None:
                scores = scores + mask
            probs = torch.softmax(scores, dim=-1)
            if self.dropout_p:
                probs = F.dropout(probs, p=self.dropout_p)
            o = probs @ vj
        else:
            o = F.scaled_dot_product_attention(qj, kj, vj, attn_mask=mask,
                                               dropout_p=self.dropout_p)
        o = o.transpose(1, 2).reshape(B, Tq, hn * hd)
        return F.linear(o, lay.view(buf, _OUT_W, j)), probs


class _AttentionFn(torch.autograd.Function):
    """``y = sum_j out_proj_j(attention_j(q, k, v))`` over head groups ``j`` (no out bias)."""

    @staticmethod
    def forward(ctx, q, k, v, w_in, b_in, w_out, mod: "RSDPMultiheadAttention", geo: _Group):
        st: ShardState = mod._rsdp
        src = st.compute_flat()
        cdt = src.dtype
        qc, kc, vc = q.to(cdt), k.to(cdt), v.to(cdt)
        y = qc.new_zeros(geo.B, geo.Tq, mod.embed_dim)
        weights = (qc.new_zeros(geo.B, mod.num_heads, geo.Tq, geo.Tk)
                   if geo.need_weights else None)
        rng = {}

        def visit(j, buf):
            if not geo.heads[j]:
                return
            if geo.dropout_p:
                rng[j] = torch.get_rng_state()
            out, probs = geo.output(st.layout, buf, j, qc, kc, vc)
            y.add_(out)
            if weights is not None:
                weights[:, geo.first[j]:geo.first[j] + geo.heads[j]] = probs

        with torch.no_grad():
            rotate(st.ring, src, visit, direction=1, label="RSDP::attention_forward",
                   device=qc.device)
        st.release(src)
        del src, visit
        ctx.mod, ctx.geo, ctx.rng = mod, geo, rng
        ctx.dtypes = (q.dtype, k.dtype, v.dtype)
        ctx.save_for_backward(qc, kc, vc)
        if weights is not None:
            ctx.mark_non_differentiable(weights)
        return y.to(st.mp.output_dtype or y.dtype), weights

    @staticmethod
    def backward(ctx, dy, _dweights):
        qc, kc, vc = ctx.saved_tensors
        mod, geo = ctx.mod, ctx.geo
        st: ShardState = mod._rsdp
        need_in = ctx.needs_input_grad[:3]
        need_w = any(ctx.needs_input_grad[3:6])
        src = st.compute_flat()
        dy = dy.to(src.dtype)
        inputs = [qc] if geo.self_attn else [qc, kc, vc]
        wants = [any(need_in)] if geo.self_attn else list(need_in)
        grads_in = [torch.zeros_like(t) if w else None for t, w in zip(inputs, wants)]
        names = [n for n in (_IN_W, _IN_B, _OUT_W) if n in st.layout.shapes]

        def step(j, buf, out):
            if not geo.heads[j]:
                return
            with torch.enable_grad():
                leaves_in = [t.detach().requires_grad_(w) for t, w in zip(inputs, wants)]
                wbuf = buf.detach().requires_grad_(need_w)
                with torch.random.fork_rng(devices=[]):
                    if j in ctx.rng:
                        torch.set_rng_state(ctx.rng[j])
                    q, k, v = (leaves_in * 3) if geo.self_attn else leaves_in
                    y, _ = geo.output(st.layout, wbuf, j, q, k, v)
                leaves = [t for t in leaves_in if t.requires_grad]
                if need_w:
                    leaves.append(wbuf)
                got = list(torch.autograd.grad(y, leaves, dy))
            for gi, t in zip(range(len(grads_in)), leaves_in):
                if t.requires_grad:
                    grads_in[gi].add_(got.pop(0))
            if need_w:
                gbuf = got.pop(0)
                for n in names:
                    st.layout.view(out, n, j).copy_(st.layout.view(gbuf, n, j))

        acc = rotate_accumulate(st.ring, src, step, grad_dtype=st.grad_dtype,
                                label="RSDP::attention_backward", feedback=st.feedback,
                                device=dy.device)
        st.release(src)
        del src
        grads = st.grads_from(acc) if need_w else {}
        del acc
        if geo.self_attn:
            g = grads_in[0]
            gq = g.to(ctx.dtypes[0]) if g is not None else None
            gk = gv = None
        else:
            gq, gk, gv = (g.to(dt) if g is not None else None
                          for g, dt in zip(grads_in, ctx.dtypes))
        return (gq, gk, gv, grads.get(_IN_W), grads.get(_IN_B), grads.get(_OUT_W), None, None)


class RSDPMultiheadAttention(nn.MultiheadAttention):
    """An ``nn.MultiheadAttention`` whose projections are this rank's head group.

    ``embed_dim`` / ``num_heads`` keep the logical sizes. Created by :func:`shard_attention`.
    """

    _rsdp: ShardState

    @torch.compiler.disable  # [Note: ring steps under torch.compile] in .ring_order
    def forward(self, query, key, value, key_padding_mask=None, need_weights=True,
                attn_mask=None, average_attn_weights=True, is_causal=False):
        if is_causal and attn_mask is None:
            raise RuntimeError("RSDPMultiheadAttention: is_causal is a hint and needs attn_mask "
                               "(as for nn.MultiheadAttention)")
        unbatched = query.dim() == 2
        self_attn = query is key and key is value
        if unbatched:
            query, key, value = (t.unsqueeze(1) for t in (query, key, value))
            if key_padding_mask is not None:
                key_padding_mask = key_padding_mask.unsqueeze(0)
        if self.batch_first and not unbatched:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        # Internally [batch, time, embed].
        q, k, v = (t.transpose(0, 1) for t in (query, key, value))
        if self_attn:
            k = v = q
        B, Tq, Tk = q.shape[0], q.shape[1], k.shape[1]
        if q.shape[-1] != self.embed_dim or k.shape != v.shape:
            raise ValueError(f"RSDPMultiheadAttention: query {tuple(query.shape)} / key "
                             f"{tuple(key.shape)} / value {tuple(value.shape)} do not fit "
                             f"embed_dim {self.embed_dim}")
        cdt = self._rsdp.mp.param_dtype or self._rsdp.flat.dtype
        mask = _merged_mask(attn_mask, key_padding_mask, B, self.num_heads, Tq, Tk, cdt)
        geo = _Group(self, B, Tq, Tk, mask, self_attn, need_weights,
                     self.dropout if self.training else 0.0)
        y, weights = _AttentionFn.apply(q, k, v, self.in_proj_weight, self.in_proj_bias,
                                        self.out_proj.weight, self, geo)
        if self.out_proj.bias is not None:
            y = y + self.out_proj.bias.to(y.dtype)
        y = y.transpose(0, 1)  # [time, batch, embed]
        if self.batch_first and not unbatched:
            y = y.transpose(0, 1)
        if unbatched:
            y = y.squeeze(1)
        if weights is not None:
            if average_attn_weights:
                weights = weights.mean(dim=1)
            if unbatched:
                weights = weights.squeeze(0)
        return y, weights


def shard_attention(module: nn.MultiheadAttention, ring: Ring,
                    mp: MixedPrecisionPolicy | None = None) -> RSDPMultiheadAttention:
    """Shards ``module`` by heads in place (its class becomes :class:`RSDPMultiheadAttention`)."""
    if not can_shard_attention(module):
        raise TypeError("shard_attention expects an nn.MultiheadAttention with kdim == vdim == "
                        "embed_dim and without add_bias_kv / add_zero_attn")
    W, E, hd = ring.world, module.embed_dim, module.head_dim
    heads, first = chunk_sizes(module.num_heads, W), chunk_starts(module.num_heads, W)

    def rows(j):  # this head group's rows inside one of q / k / v
        return slice(first[j] * hd, (first[j] + heads[j]) * hd)

    def take(name, t, j):
        if name == _OUT_W:
            return t[:, rows(j)]
        return torch.cat([t[i * E:(i + 1) * E][rows(j)] for i in range(3)])

    def assemble(name, shards):
        if name == _OUT_W:
            return torch.cat(shards, dim=1)
        # shard j is [q_j; k_j; v_j]: regroup as [q_0..q_W; k_0..; v_0..]
        per = [s.reshape(3, heads[j] * hd, *s.shape[1:]) for j, s in enumerate(shards)]
        return torch.cat([torch.cat([p[i] for p in per]) for i in range(3)])

    full = {_IN_W: module.in_proj_weight, _IN_B: module.in_proj_bias,
            _OUT_W: module.out_proj.weight}
    dims = {_IN_W: 0, _IN_B: 0, _OUT_W: 1}
    module._rsdp = ShardState(module, ring, full, take, dims, mp, assemble=assemble)
    module.__class__ = RSDPMultiheadAttention
    # nn.TransformerEncoderLayer's inference fast path reads the projections as whole
    # tensors; it is only taken for modules that report packed q/k/v, so report otherwise.
    module._qkv_same_embed_dim = False
    return module

"""RSDP (torch_rsdp.rsdp): rotated sharded layers must compute exactly what DDP computes.

Every check compares a sharded model against the *same* model in one process: forward outputs
of each rank's own batch, the gradient of each rank's input, and each parameter's gradient at
its owner, which must equal the owner's slice of the reference gradient of the DDP loss
(mean over ranks of each rank's loss; ranks use different batch sizes). fp32, atol/rtol 1e-5.
Training (Adam, several steps, ranks start from different weights) must match the reference
trained on the DDP loss, with replicated parameters bit-identical on every rank. A memory test
bounds the bytes of parameters + gradients + rotation buffers alive per rank.

One launch per world size (1, 2, 3, 4) runs every family inside one process group (see
tests/support/harness.py); each family is reported as its own test (test_rsdp[<family>-ws<W>]).
tests/cuda/test_cuda.py runs the forward/backward families on a GPU: a worker that sets ``ctx.device``
(and ``ctx.tols``) gets models, inputs and the reference there (see _device / _tols / _on).
"""

from __future__ import annotations

import copy
import time
import zlib

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from support.harness import assert_family, launch, launch_families, run_families

WORLD_SIZES = (1, 2, 3, 4)
ATOL = RTOL = 1e-5


# --------------------------------------------------------------------------------------------
# Helpers (run inside workers)
# --------------------------------------------------------------------------------------------


def _device(ctx):
    """The device the families run on: ``ctx.device`` when the caller set one (tests/cuda/test_cuda.py
    runs some of them on a GPU), otherwise the CPU."""
    return getattr(ctx, "device", None) or torch.device("cpu")


def _tols(ctx):
    """(atol, rtol): ``ctx.tols`` when the caller set them, otherwise ATOL, RTOL."""
    return getattr(ctx, "tols", None) or (ATOL, RTOL)


def _on(x, dev):
    """``x`` on ``dev`` as a leaf with the same requires_grad (``x`` itself when already there)."""
    if x.device == dev:
        return x
    return x.detach().to(dev).requires_grad_(x.requires_grad)


def _loc(t):
    """A DTensor's local tensor (shards and replicas are DTensors), else ``t``."""
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def _close(got, exp, what, atol=ATOL, rtol=RTOL):
    got, exp = _loc(got), _loc(exp)
    assert got is not None and exp is not None, f"{what}: missing ({got is None}, {exp is None})"
    assert got.shape == exp.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(exp.shape)}"
    if not torch.allclose(got, exp, atol=atol, rtol=rtol):
        raise AssertionError(f"{what}: max abs diff {(got - exp).abs().max().item():.3e}")


def _gen(*key):
    """A generator seeded by `key` (the same in every process, unlike hash())."""
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _loss(y, r, step=0):
    """Rank r's loss: a fixed random projection of its output, averaged over its batch."""
    c = torch.randn(y.shape, generator=_gen("loss", r, step, tuple(y.shape))).to(y.device)
    return (y * c).sum() / y.shape[0]


def _ddp_reference(ref, inputs, W, step=0):
    """Backward of the DDP loss (mean over ranks) through `ref`; returns each rank's output."""
    outs = [ref(x) for x in inputs]
    total = sum(_loss(y, r, step) for r, y in enumerate(outs)) / W
    total.backward()
    return outs


def _check_grads(model, ref, what, atol=ATOL, rtol=RTOL):
    """Every local parameter's gradient equals its owner's slice of the reference gradient."""
    import torch_rsdp.rsdp as rsdp

    ref_params = dict(ref.named_parameters())
    for name, p in model.named_parameters():
        exp = rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad)
        _close(p.grad, exp, f"{what}: grad of {name}", atol, rtol)


def _shard(model, **kw):
    import torch_rsdp.rsdp as rsdp

    return rsdp.shard(model, **kw)


def _check_layer(ctx, make, make_input, what, **shard_kw):
    """Forward, input gradient and parameter gradients of one model vs the reference."""
    r, W = ctx.rank, ctx.world_size
    dev, (atol, rtol) = _device(ctx), _tols(ctx)
    torch.manual_seed(0)
    ref = make().to(dev)
    model = _shard(copy.deepcopy(ref), **shard_kw)
    inputs = [_on(make_input(q), dev) for q in range(W)]
    ref_inputs = [x.detach().clone().requires_grad_(x.requires_grad) for x in inputs]
    x = inputs[r]
    y = model(x)
    _loss(y, r).backward()  # the local loss: RSDP averages gradients over ranks itself
    ref_out = _ddp_reference(ref, ref_inputs, W)
    _close(y, ref_out[r].detach(), f"{what}: output", atol, rtol)
    if x.requires_grad:
        # the reference gradient of x_r is d(mean loss)/dx_r: rank r's own gradient / W
        _close(x.grad, ref_inputs[r].grad * W, f"{what}: input gradient", atol, rtol)
    _check_grads(model, ref, what, atol, rtol)
    return model, ref


def _float_input(shape_fn):
    def make(q):
        return torch.randn(*shape_fn(q), generator=_gen("x", q)).requires_grad_()
    return make


# --------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------


def fam_linear(ctx, rec):
    import torch_rsdp.rsdp as rsdp
    from torch_rsdp.rsdp._layers.sharded_linear import RSDPLinear

    cases = [
        ("out 7->10 bias", 7, 10, True, "out", lambda q: (2 + q, 7)),
        ("out 7->10 nobias", 7, 10, False, "out", lambda q: (3, 7)),
        ("out 5->2 (fewer rows than ranks)", 5, 2, True, "out", lambda q: (1 + q, 5)),
        ("out 6->9 3-d input", 6, 9, True, "out", lambda q: (2, 1 + q, 6)),
        ("in 10->6 bias", 10, 6, True, "in", lambda q: (2 + q, 10)),
        ("in 3->4 nobias", 3, 4, False, "in", lambda q: (2, 3)),
        # layers smaller than their activations compute whole at 3 or more ranks ([Note:
        # whole small layers]); here rank 0 computes shard by shard and the others whole, in
        # the same ring
        ("out 7->10 bias, whole on ranks > 0", 7, 10, True, "out", lambda q: (4 + 8 * q, 7)),
        ("out 6->9 nobias, whole", 6, 9, False, "out", lambda q: (12, 6)),
        ("in 10->6 bias, whole on ranks > 0", 10, 6, True, "in", lambda q: (3 + 12 * q, 10)),
        ("in 5->7 nobias, whole", 5, 7, False, "in", lambda q: (2, 6, 5)),
    ]
    for name, fin, fout, bias, split, shape in cases:
        with rec.case(name):
            model, _ = _check_layer(ctx, lambda: nn.Linear(fin, fout, bias=bias),
                                    _float_input(shape), name, linear_split=split)
            assert isinstance(model, RSDPLinear), type(model)
            n = fout if split == "out" else fin
            m = -(-n // ctx.world_size)
            expect = max(0, min(m, n - ctx.rank * m))
            got = _loc(model.weight).shape[0 if split == "out" else 1]
            assert got == expect, f"{name}: local shard has {got} rows/cols, expected {expect}"
            # one accumulator per layer: weight and bias gradients share its storage
            if bias and split == "out":
                assert (_loc(model.weight.grad).untyped_storage().data_ptr()
                        == _loc(model.bias.grad).untyped_storage().data_ptr())
    with rec.case("input of the wrong width raises, naming the rank, the layer and the shape"):
        model = _shard(nn.Sequential(nn.Linear(8, 6)))
        try:
            model(torch.randn(5, 7))
        except ValueError as e:
            msg = str(e)
        else:
            raise AssertionError("a (5, 7) input to Linear(8, 6) did not raise")
        assert f"rank {ctx.rank}" in msg and "'0'" in msg and "(5, 7)" in msg, msg
        model(torch.randn(4 + 8 * ctx.rank, 8)).sum().backward()  # the group is still usable
    with rec.case("input without grad (no weight rotation in backward)"):
        _check_layer(ctx, lambda: nn.Linear(4, 6),
                     lambda q: torch.randn(3, 4, generator=_gen("x", q)), "nograd-input")


def fam_embedding(ctx, rec):
    def idx(num):
        return lambda q: torch.randint(0, num, (2 + q, 3), generator=_gen("idx", q))

    cases = [
        ("13x10", lambda: nn.Embedding(13, 10), idx(13)),
        ("13x3 padding_idx=0", lambda: nn.Embedding(13, 3, padding_idx=0), idx(4)),
        ("9x5 scale_grad_by_freq", lambda: nn.Embedding(9, 5, scale_grad_by_freq=True), idx(4)),
    ]
    for name, make, make_idx in cases:
        with rec.case(name):
            _check_layer(ctx, make, make_idx, name)


class Attn(nn.Module):
    """nn.MultiheadAttention used as self- or cross-attention, with optional masks."""

    def __init__(self, E, H, bias=True, batch_first=True, cross=False, masks=False):
        super().__init__()
        self.mha = nn.MultiheadAttention(E, H, bias=bias, batch_first=batch_first)
        self.cross, self.masks, self.bf = cross, masks, batch_first

    def inputs(self, x):
        q = x[:, :-1] * 0.5 + 0.1 if self.cross else x  # shorter, different queries
        if not self.bf:
            q, x = q.transpose(0, 1), x.transpose(0, 1)
        B, Tk = (x.shape[1], x.shape[0]) if not self.bf else (x.shape[0], x.shape[1])
        Tq = (q.shape[1] if self.bf else q.shape[0])
        kpm = am = None
        if self.masks:
            kpm = torch.zeros(B, Tk, dtype=torch.bool, device=x.device)
            kpm[0, -1] = True
            am = torch.ones(Tq, Tk, dtype=torch.bool, device=x.device).triu(2)
        return q, x, kpm, am

    def forward(self, x, need_weights=False):
        q, kv, kpm, am = self.inputs(x)
        y, w = self.mha(q, kv, kv, key_padding_mask=kpm, attn_mask=am, need_weights=need_weights)
        return (y, w) if need_weights else y


def fam_attention(ctx, rec):
    import torch_rsdp.plan as plan
    from torch_rsdp.rsdp._layers.sharded_attention import RSDPMultiheadAttention

    E = 12
    x = _float_input(lambda q: (2 + q % 2, 5, E))
    cases = [
        ("self 6 heads batch_first", lambda: Attn(E, 6)),
        ("self 3 heads seq-first (a rank without heads at W=4)", lambda: Attn(E, 3, batch_first=False)),
        ("self no bias", lambda: Attn(E, 4, bias=False)),
        ("cross with key padding + causal masks", lambda: Attn(E, 4, cross=True, masks=True)),
    ]
    for name, make in cases:
        with rec.case(name):
            model, ref = _check_layer(ctx, make, x, name)
            assert isinstance(model.mha, RSDPMultiheadAttention), type(model.mha)
            H = model.mha.num_heads
            m = -(-H // ctx.world_size)
            heads = max(0, min(m, H - ctx.rank * m))
            assert model.mha.in_proj_weight.shape == (3 * heads * E // H, E)
            assert model.mha.out_proj.weight.shape == (E, heads * E // H)
            with torch.no_grad():
                xi = _on(x(ctx.rank), _device(ctx))
                (y, w), (ry, rw) = model(xi, True), ref(xi, True)
                _close(y, ry, f"{name}: output with need_weights", *_tols(ctx))
                _close(w, rw, f"{name}: attention weights (averaged over heads)", *_tols(ctx))
    with rec.case("TransformerEncoderLayer (attention + MLP sharded) and full state dict"):
        def make():
            return nn.TransformerEncoderLayer(E, 4, dim_feedforward=20, dropout=0.0,
                                              batch_first=True)
        model, ref = _check_layer(ctx, make, x, "encoder layer")
        assert isinstance(model.self_attn, RSDPMultiheadAttention)
        full = plan.full_state_dict(model, rank0_only=False)
        for k, v in ref.state_dict().items():
            assert torch.equal(full[k].to(v.device), v), f"full state dict: {k} differs"
        model.eval()
        with torch.no_grad():  # the inference fast path must not bypass the sharded module
            xi = _on(x(ctx.rank), _device(ctx))
            _close(model(xi), ref.eval()(xi), "encoder layer eval", *_tols(ctx))


class Block(nn.Module):
    def __init__(self, d, h):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, h)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.ln(x))))


class Tiny(nn.Module):
    """Embedding + 2 pre-LN MLP blocks + LayerNorm + head (uneven sizes over 3 and 4 ranks)."""

    def __init__(self, vocab=17, d=10, h=18, out=7):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.Sequential(Block(d, h), Block(d, h))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, out)

    def forward(self, idx):
        return self.head(self.ln_f(self.blocks(self.emb(idx))))


def _tokens(q, step=0):
    return torch.randint(0, 17, (2 + q % 2, 5), generator=_gen("tok", q, step))


def _replicated_identical(ctx, model, what, grads=True):
    """Replicated parameters (and their gradients) are bit-identical on every rank."""
    import torch_rsdp.rsdp as rsdp

    st = rsdp.rsdp_state(model)
    mine = [(p.detach().clone().cpu(),
             None if p.grad is None or not grads else p.grad.clone().cpu())
            for p in st.replicated_parameters()]
    assert mine, f"{what}: expected replicated parameters"
    allv = [None] * ctx.world_size
    dist.all_gather_object(allv, mine)
    for q in range(ctx.world_size):
        for i, ((p, g), (p0, g0)) in enumerate(zip(allv[q], mine)):
            assert torch.equal(p, p0), f"{what}: replicated param {i} differs on rank {q}"
            assert (g is None) == (g0 is None) and (g is None or torch.equal(g, g0)), (
                f"{what}: replicated grad {i} differs on rank {q}")


def fam_transformer(ctx, rec):
    import torch_rsdp.rsdp as rsdp

    with rec.case("forward/backward"):
        model, _ = _check_layer(ctx, Tiny, _tokens, "tiny transformer")
        st = rsdp.rsdp_state(model)
        assert set(st.sharded) == {"emb", "blocks.0.fc1", "blocks.0.fc2", "blocks.1.fc1",
                                   "blocks.1.fc2", "head"}, sorted(st.sharded)
        _replicated_identical(ctx, model, "tiny transformer")
    with rec.case("min_numel keeps small layers replicated"):
        model, _ = _check_layer(ctx, Tiny, _tokens, "min_numel", min_numel=171)
        assert set(rsdp.rsdp_state(model).sharded) == {"blocks.0.fc1", "blocks.0.fc2",
                                                       "blocks.1.fc1", "blocks.1.fc2"}


def _train(ctx, model, steps, micro=1):
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(steps):
        for k in range(micro):
            y = model(_tokens(ctx.rank, (step, k)))
            (_loss(y, ctx.rank, (step, k)) / micro).backward()
        opt.step()
        opt.zero_grad()
    return model


def _train_reference(W, steps, micro=1):
    torch.manual_seed(0)
    ref = Tiny()
    opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    for step in range(steps):
        for k in range(micro):
            outs = [ref(_tokens(q, (step, k))) for q in range(W)]
            loss = sum(_loss(y, q, (step, k)) for q, y in enumerate(outs)) / (W * micro)
            loss.backward()
        opt.step()
        opt.zero_grad()
    return ref


def fam_adam(ctx, rec):
    import torch_rsdp.plan as plan

    W = ctx.world_size
    for micro in (1, 2):
        with rec.case(f"adam 4 steps, {micro} micro-batch(es)"):
            torch.manual_seed(ctx.rank)  # different init per rank: shard() broadcasts rank 0's
            model = _train(ctx, _shard(Tiny() if ctx.rank else _seeded_tiny()), 4, micro)
            ref = _train_reference(W, 4, micro)
            full = plan.full_state_dict(model, rank0_only=False)
            init = _seeded_tiny().state_dict()
            for k, v in ref.state_dict().items():
                assert (v - init[k]).abs().max() > 1e-3, f"{k} did not move"
                _close(full[k], v, f"trained {k}")
            _replicated_identical(ctx, model, "after training", grads=False)


def _seeded_tiny():
    torch.manual_seed(0)
    return Tiny()


def fam_memory(ctx, rec):
    """Peak (params + grads + RSDP buffers) <= (params + grads) / W + 2 largest shard buffers."""
    import torch_rsdp.rsdp as rsdp
    from torch_rsdp.rsdp._rotation.memory import MemoryTracker

    W = ctx.world_size
    for name, dims in (("divisible", (24, 36, 36, 12)), ("uneven", (10, 7, 13, 5))):
        with rec.case(name):
            torch.manual_seed(0)
            layers = [nn.Linear(a, b) for a, b in zip(dims, dims[1:])]
            full_bytes = sum(p.numel() * 4 for lay in layers for p in lay.parameters())
            model = _shard(nn.Sequential(*layers))
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            states = [m._rsdp for m in rsdp.rsdp_state(model).sharded.values()]
            max_buf = max(s.layout.numel * 4 for s in states)
            local = sum(s.flat.untyped_storage().nbytes() for s in states)
            with MemoryTracker(model) as tr:
                for step in range(2):
                    x = torch.randn(4, dims[0], generator=_gen("mx", ctx.rank, step),
                                    requires_grad=True)
                    model(x).square().mean().backward()
                    opt.step()
                    opt.zero_grad()
                # the backend's worker thread drops its references to a ring op's tensors
                # shortly *after* the op's Work completes: give it a moment
                for _ in range(100):
                    left = len(tr.live_buffers())  # a count: holding the list would keep them
                    if not left:
                        break
                    time.sleep(0.01)
            assert not left, f"{left} RSDP buffers still alive after the step"
            if W > 1:
                assert tr.n_allocs > 0, "the tracker saw no allocation"
            # padded local shards: params and grads each take `local` bytes
            bound = 2 * local + 2 * max_buf
            info = (f"peak {tr.peak} B (buffers {tr.peak_buffers} B, incl. late backend "
                    f"release {tr.peak_alive} B), largest buffer {max_buf} B, local {local} B")
            assert tr.peak <= bound, f"{info} > bound {bound} B"
            if name == "divisible":
                strict = 2 * full_bytes // W + 2 * max_buf
                assert tr.peak <= strict, f"{info} > (P+G)/W + 2 buffers = {strict} B"
            # what the process really holds: the backend keeps a finished op's tensors until
            # its worker thread moves on, at most one op's worth (two buffers) per group
            assert tr.peak_alive <= bound + 2 * max_buf, f"{info}: alive > {bound + 2 * max_buf}"
            print(f"memory {name} ws={W} rank {ctx.rank}: {info}, bound {bound} B")


class TinyCheckpointed(Tiny):
    """Tiny with every block under non-reentrant activation checkpointing."""

    reentrant = False

    def forward(self, idx):
        from torch.utils.checkpoint import checkpoint

        x = self.emb(idx)
        for blk in self.blocks:
            x = checkpoint(blk, x, use_reentrant=self.reentrant)
        return self.head(self.ln_f(x))


class TinyReentrant(TinyCheckpointed):
    """Reentrant checkpointing: each block's backward follows its recomputed forward."""

    reentrant = True


class _TransposedReplica(nn.Module):
    """A sharded layer, then a replicated weight read twice, once through a concatenation
    (its gradient there arrives strided: a slice of the concatenation's) and once through an
    index, and a replicated norm."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(12, 16)
        self.proj = nn.Parameter(torch.randn(6, 16) / 4)
        self.ln = nn.LayerNorm(6)

    def forward(self, x):
        h = self.fc(x)
        w = torch.cat([self.proj, torch.ones(6, 4)], dim=1)
        return self.ln(h @ w[:, :16].t()) + h[..., :6] * self.proj[:, 0]


def fam_extras(ctx, rec):
    import torch_rsdp.plan as plan
    import torch_rsdp.rsdp as rsdp
    from torch.distributed.tensor import DTensor, Replicate

    r, W = ctx.rank, ctx.world_size
    with rec.case("replicated parameters: Replicate DTensor gradients, whatever their layout"):
        torch.manual_seed(0)
        ref = _TransposedReplica()
        model = _shard(copy.deepcopy(ref), min_numel=150)
        assert set(rsdp.rsdp_state(model).sharded) == {"fc"}
        xs = [torch.randn(3, 12, generator=_gen("rep", q)) for q in range(W)]
        for _ in range(2):  # the second backward accumulates into the first's gradients
            y = model(xs[r])
            _loss(y, r).backward()
            _ddp_reference(ref, xs, W)
        _close(y, ref(xs[r]).detach(), "output")
        for name in ("proj", "ln.weight", "ln.bias"):
            p = model.get_parameter(name)
            assert isinstance(p.grad, DTensor) and p.grad.placements == (Replicate(),), name
            assert p.grad.to_local().stride() == p.to_local().stride(), name
        _check_grads(model, ref, "replicas")
        _replicated_identical(ctx, model, "replicas")
    with rec.case("activation checkpointing"):
        torch.manual_seed(0)
        ref = Tiny()
        model = _shard(_as_ckpt(copy.deepcopy(ref)))
        y = model(_tokens(r))
        _loss(y, r).backward()
        ref_out = _ddp_reference(ref, [_tokens(q) for q in range(W)], W)
        _close(y, ref_out[r].detach(), "checkpointed output")
        _check_grads(model, ref, "checkpointed")
    with rec.case("bf16 compute, fp32 master shards and gradients"):
        torch.manual_seed(0)
        ref = Tiny()
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                 output_dtype=torch.float32)
        model = _shard(copy.deepcopy(ref), mp_policy=mp)
        y = model(_tokens(r))
        _loss(y, r).backward()
        ref_out = _ddp_reference(ref, [_tokens(q) for q in range(W)], W)
        assert y.dtype == torch.float32
        _close(y, ref_out[r].detach(), "bf16 output", atol=5e-2, rtol=5e-2)
        for n, p in model.named_parameters():
            assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, n
        _check_grads(model, ref, "bf16", atol=5e-2, rtol=5e-2)
    with rec.case("sharded state_dict round trip"):
        torch.manual_seed(0)
        model = _shard(Tiny())
        saved = {k: v.clone() for k, v in model.state_dict().items()}
        _train(ctx, model, 1)
        model.load_state_dict(saved)
        for k, v in model.state_dict().items():
            assert torch.equal(v, saved[k]), k
        for m in rsdp.rsdp_state(model).sharded.values():  # still views of the flat storage
            st = m._rsdp
            for n in st.names:
                v = st.layout.view(st.flat, n, r)
                assert v.numel() == 0 or _loc(st.param(n)).data_ptr() == v.data_ptr(), n
    with rec.case("full state_dict on rank 0 loads into the unwrapped model"):
        model = _shard(_seeded_tiny())
        _train(ctx, model, 2)
        full = plan.full_state_dict(model)
        x = _tokens(r, "sd")
        y = model(x).detach()
        if r == 0:
            plain = Tiny()
            plain.load_state_dict(full)  # strict: same keys and shapes as the unwrapped model
            _close(plain(x), y, "unwrapped model with the gathered state dict")
        else:
            assert full == {}, sorted(full)
        other = _seeded_tiny()
        with torch.no_grad():
            for p in other.parameters():
                p.mul_(-0.5)
        plan.load_full_state_dict(model, other.state_dict())
        back = plan.full_state_dict(model, rank0_only=False)
        for k, v in other.state_dict().items():
            assert torch.equal(back[k], v), k


class ConvBlock(nn.Module):
    """A GPT-2 MLP (transformers' transposed ``Conv1D``) and an input-split Linear."""

    def __init__(self, d=10, h=14):
        super().__init__()
        from transformers.pytorch_utils import Conv1D

        self.c_fc, self.c_proj = Conv1D(h, d), Conv1D(d, h)
        self.mix = nn.Linear(d, d)

    def forward(self, x):
        return self.mix(x + self.c_proj(torch.tanh(self.c_fc(x))))


class ConvStack(nn.Module):
    def __init__(self):
        super().__init__()
        self.h = nn.ModuleList([ConvBlock(), ConvBlock()])

    def forward(self, x):
        for blk in self.h:
            x = blk(x)
        return x


def _hops(model, x, r):
    """Ring hops of one forward and backward of ``model`` on ``x``."""
    import torch_rsdp.rsdp as rsdp

    ring = rsdp.rsdp_state(model).ring
    before = ring.hops
    _loss(model(x), r).backward()
    return ring.hops - before


def fam_blocks(ctx, rec):
    """[Note: block gathers]: the small layers of a block rotate together from 3 ranks on."""
    import torch_rsdp.rsdp as rsdp
    from torch_rsdp.rsdp._rotation.memory import MemoryTracker
    from torch_rsdp.rsdp._layers import block_gather

    r, W = ctx.rank, ctx.world_size
    with rec.case("a block's small layers share one pass, with fewer hops, same values"):
        model, _ = _check_layer(ctx, Tiny, _tokens, "blocks")
        b0, b1 = (model.blocks[i].fc1.__dict__.get("_rsdp_block") for i in (0, 1))
        if W < 3:
            assert b0 is None and b1 is None, "two ranks keep every layer on its own"
        else:
            assert b0 is not None and b0 is model.blocks[0].fc2._rsdp_block and b1 is not b0
            assert len(b0.current.mods) == 2, b0.current.mods
            together = _hops(model, _tokens(r, 1), r)
            block_gather.ENABLED = False
            try:
                alone = _hops(model, _tokens(r, 1), r)
            finally:
                block_gather.ENABLED = True
            # fc1 and fc2 of each block: 3 (W - 1) hops together instead of 6 (W - 1), and
            # the last block's backward takes its forward's gather ([Note: the last gather
            # stays for backward]): W - 1 fewer
            assert alone - together == 2 * 3 * (W - 1) + (W - 1), (together, alone)
    with rec.case("Conv1D and input-split Linear layers in a ModuleList"):
        model, _ = _check_layer(ctx, ConvStack, _float_input(lambda q: (3 + q, 4, 10)),
                                "conv blocks",
                                linear_split=lambda n, m: "in" if n.endswith("mix") else "out")
        if W >= 3:
            blk = model.h[1]
            assert blk.c_fc._rsdp_block.current.mods == [blk.c_fc, blk.c_proj, blk.mix]
    with rec.case("a rank with too few tokens turns the passes off on every rank"):
        # fc1 (10 -> 18) is small from 7 tokens on: rank 0 feeds 5, the others 10 or 15
        def few(q):
            return torch.randint(0, 17, (1 if q == 0 else 2 + q % 2, 5), generator=_gen("few", q))

        model, _ = _check_layer(ctx, Tiny, few, "few tokens")
        if W >= 3:
            assert model.blocks[0].fc1._rsdp_block.current.mods == [], "rank disagrees"
    with rec.case("a frozen layer in a block, a second backward, and no_grad"):
        torch.manual_seed(0)
        ref = Tiny()
        model = _shard(copy.deepcopy(ref))
        for m in (ref, model):
            m.blocks[0].fc1.requires_grad_(False)
        x = _tokens(r)
        y = model(x)
        loss = _loss(y, r)
        loss.backward(retain_graph=True)
        loss.backward()  # the block gathers again: every gradient doubles
        outs = [ref(_tokens(q)) for q in range(W)]
        (2 * sum(_loss(o, q) for q, o in enumerate(outs)) / W).backward()
        _close(y, outs[r].detach(), "frozen: output")
        ref_params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            if "blocks.0.fc1" in name:
                assert p.grad is None, name
            else:
                _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad),
                       f"frozen: grad of {name}")
        with torch.no_grad():
            _close(model(x), ref(x), "no_grad forward")
    with rec.case("checkpointed blocks, reentrant or not (a recomputed pass's gather is kept)"):
        for cls in (TinyCheckpointed, TinyReentrant):
            torch.manual_seed(0)
            ref = Tiny()
            model = copy.deepcopy(ref)
            model.__class__ = cls
            model = _shard(model)
            y = model(_tokens(r))
            _loss(y, r).backward()
            ref_out = _ddp_reference(ref, [_tokens(q) for q in range(W)], W)
            _close(y, ref_out[r].detach(), f"{cls.__name__} output")
            _check_grads(model, ref, cls.__name__)
    with rec.case("whole weights live only while their block computes"):
        torch.manual_seed(0)
        model = _shard(Tiny())
        with MemoryTracker(model) as tr:
            # a forward whose backward never comes: its kept gather goes at the next forward
            model(_tokens(r))
            _loss(model(_tokens(r)), r).backward()
            for _ in range(100):
                left = len(tr.live_buffers())
                if not left:
                    break
                time.sleep(0.01)
        assert not left, f"{left} RSDP buffers alive after the step"
        if W >= 3:  # the two blocks' whole layers were never alive at once
            block = sum(p.numel() * 4 for p in Tiny().blocks[0].parameters()
                        if p.dim() == 2 or p.numel() == 18)
            assert tr.peak_buffers < 2 * block + 4096, (tr.peak_buffers, block)


def _as_ckpt(model):
    model.__class__ = TinyCheckpointed
    return model


FAMILIES = {
    "linear": fam_linear,
    "embedding": fam_embedding,
    "attention": fam_attention,
    "transformer": fam_transformer,
    "adam": fam_adam,
    "memory": fam_memory,
    "extras": fam_extras,
    "blocks": fam_blocks,
}


def families_worker(ctx, names):
    torch.set_num_threads(1)  # up to 4 ranks share 2 cores
    return run_families(ctx, FAMILIES, names)


# --------------------------------------------------------------------------------------------
# pytest side
# --------------------------------------------------------------------------------------------

PARAMS = [pytest.param(ws, fam, id=f"{fam}-ws{ws}") for ws in WORLD_SIZES for fam in FAMILIES]
_BATCH: dict = {}


def _batch(ws, request):
    """One launch per world size for every selected family; a crash charges the family the
    ranks were running and the rest run in a new launch."""
    if ws in _BATCH:
        return _BATCH[ws]
    names = [f for f in FAMILIES if any(
        getattr(it, "originalname", None) == "test_rsdp" and it.callspec.params == {
            "ws": ws, "family": f} for it in request.session.items)]
    results, errors, _ = launch_families(
        lambda batch: launch(families_worker, ws, (batch,), deadline=300, pg_timeout=60), names, ws)
    _BATCH[ws] = (results, errors)
    return _BATCH[ws]


@pytest.mark.parametrize("ws,family", PARAMS)
def test_rsdp(ws, family, request):
    results, errors = _batch(ws, request)
    assert_family(results, errors, family, f"world size {ws}")

"""RSDP on Hugging Face ``transformers`` models (built from small configs; nothing downloaded).

Models: Llama (GQA) untied and with tied embeddings, Qwen2 (q/k/v biases), GPT-2 (``Conv1D``,
tied embeddings; once more with its ``c_proj`` layers split by input features). Each is
checked against the same model in one process trained on the DDP loss (the mean over ranks of
each rank's Hugging Face language-model loss; ranks use different batch sizes), fp32,
atol/rtol 1e-5:

* parity: loss, logits and every parameter's gradient at its owner; a tied head is still the
  embedding's Parameter object; resident parameters per rank <= 1/W of the model + 5%;
  ``report()`` lists exactly the parameters left whole;
* adamw: three AdamW steps, and two steps of two accumulated micro-batches;
* state_dict: ``full_state_dict`` loads into a fresh model of the same class with
  ``strict=True`` and computes the same logits; ``load_full_state_dict`` round trip;
* mixed_precision: bf16 compute and rotation, fp32 master shards and gradients;
* coverage: what stays whole is listed with the reason (filter, min_numel, no rule, ties
  RSDP cannot share), a matrix without a rule warns, bad input names the module.

One launch per world size (2, 3, 4) runs every family (tests/harness.py ``run_families``).
Needs ``transformers`` (scripts/setup.sh installs it).
"""

from __future__ import annotations

import copy
import warnings
import zlib

import pytest
import torch
import torch.nn as nn

from harness import assert_family, launch, launch_families, run_families

WORLD_SIZES = (2, 3, 4)
ATOL = RTOL = 1e-5
VOCAB, SEQ = 100, 7


# --------------------------------------------------------------------------------------------
# Models and data (run inside workers)
# --------------------------------------------------------------------------------------------


def _config(kind):
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                  bos_token_id=0, eos_token_id=1, pad_token_id=None)
    if kind in ("llama_u", "qwen2_u"):  # 12 KV heads (GQA 2): whole KV groups for 2, 3, 4 ranks
        common.update(hidden_size=96, num_attention_heads=24, num_key_value_heads=12)
        cls = tf.LlamaForCausalLM if kind == "llama_u" else tf.Qwen2ForCausalLM
        cfg = tf.LlamaConfig if kind == "llama_u" else tf.Qwen2Config
        return cls, cfg(tie_word_embeddings=kind == "llama_u", **common)
    if kind in ("llama", "llama_tied"):
        return tf.LlamaForCausalLM, tf.LlamaConfig(tie_word_embeddings=kind == "llama_tied",
                                                   **common)
    if kind == "qwen2":
        return tf.Qwen2ForCausalLM, tf.Qwen2Config(tie_word_embeddings=False, **common)
    if kind in ("gpt2", "gpt2_in"):
        return tf.GPT2LMHeadModel, tf.GPT2Config(
            vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1)
    raise ValueError(kind)


MODELS = ("llama", "llama_tied", "qwen2", "gpt2", "gpt2_in")
TIED = {"llama_tied": ("lm_head", "model.embed_tokens"), "llama_u": ("lm_head", "model.embed_tokens"), "gpt2": ("lm_head", "transformer.wte"),
        "gpt2_in": ("lm_head", "transformer.wte")}


def _shard_kw(kind):
    if kind == "gpt2_in":  # Conv1D split by input features (bias kept whole) for the c_proj's
        return {"linear_split": lambda name, m: "in" if name.endswith("c_proj") else "out"}
    return {}


def _make(kind, seed=0):
    cls, cfg = _config(kind)
    torch.manual_seed(seed)
    return cls(cfg)


def _gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _ids(q, step=0):
    """Rank q's token ids (rank-dependent batch size)."""
    return torch.randint(0, VOCAB, (1 + q % 3, SEQ), generator=_gen("ids", q, step))


def _loss(model, q, step=0):
    ids = _ids(q, step)
    out = model(input_ids=ids, labels=ids)
    return out.loss, out.logits


def _close(got, exp, what, atol=ATOL, rtol=RTOL):
    assert got is not None and exp is not None, f"{what}: missing ({got is None}, {exp is None})"
    assert got.shape == exp.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(exp.shape)}"
    if not torch.allclose(got.float(), exp.float(), atol=atol, rtol=rtol):
        raise AssertionError(f"{what}: max abs diff {(got.float() - exp.float()).abs().max():.3e}")


def _sharded(kind, **kw):
    import torch_rsdp.rsdp as rsdp

    ref = _make(kind)
    model = rsdp.shard(copy.deepcopy(ref), **dict(_shard_kw(kind), **kw))
    return model, ref


def _check_tie(model, kind):
    if kind in TIED:
        head, emb = (model.get_submodule(n) for n in TIED[kind])
        assert head.weight is emb.weight, f"{kind}: the head is no longer tied to the embedding"
        shard = emb.weight
        model.tie_weights()  # Hugging Face's own re-tying keeps the one (sharded) Parameter
        assert head.weight is emb.weight is shard, f"{kind}: tie_weights() replaced the shard"


# --------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------


def fam_parity(ctx, rec):
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    for kind in MODELS:
        with rec.case(kind):
            model, ref = _sharded(kind)
            _check_tie(model, kind)
            loss, logits = _loss(model, r)
            loss.backward()
            ref_losses = []
            for q in range(W):
                lq, gq = _loss(ref, q)
                ref_losses.append(lq)
                if q == r:
                    _close(logits, gq.detach(), f"{kind}: logits")
                    _close(loss, lq.detach(), f"{kind}: loss")
            (sum(ref_losses) / W).backward()
            ref_params = dict(ref.named_parameters())
            names = [n for n, _ in model.named_parameters()]
            assert names == list(ref_params), f"{kind}: parameter names differ"
            for name, p in model.named_parameters():
                exp = rsdp.local_shard_of(model, name, ref_params[name].grad)
                _close(p.grad, exp, f"{kind}: grad of {name}")
            st = rsdp.rsdp_state(model)
            full = sum(p.numel() for p in ref.parameters())
            resident = sum(p.numel() for p in model.parameters())
            assert st.full_numel == full and st.resident_numel() == resident
            frac = resident / full
            print(f"resident {kind} ws={W} rank {r}: {resident}/{full} = {frac:.4f}")
            assert frac <= 1 / W + 0.05, f"{kind}: rank {r} holds {frac:.3f} of the model"
            # report(): exactly the parameters left whole, each with a reason
            whole = {e.name: e for e in st.left_whole}
            exp_whole = {n for n, p in model.named_parameters() if p.shape == ref_params[n].shape
                         and rsdp.local_shard_of(model, n, ref_params[n]) is ref_params[n]}
            assert set(whole) == exp_whole, f"{kind}: left_whole {sorted(whole)} vs {exp_whole}"
            for e in whole.values():
                assert e.reason and e.numel == ref_params[e.name].numel(), e
            text = st.report()
            assert all(n in text for n in whole), text
            if kind == "gpt2_in":
                assert "transformer.h.0.attn.c_proj.bias" in whole, sorted(whole)
                assert whole["transformer.h.0.attn.c_proj.bias"].reason.startswith("too small")


def _train(model, params, r, W, steps, micro, reference):
    # eps 1e-6, not 1e-8: GPT-2's key biases get a gradient that is zero up to rounding
    # (softmax ignores a shift of every score), and Adam would blow that noise up to ~lr / 100
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, eps=1e-6)
    for step in range(steps):
        for k in range(micro):
            if reference:
                loss = sum(_loss(model, q, (step, k))[0] for q in range(W)) / (W * micro)
            else:
                loss = _loss(model, r, (step, k))[0] / micro
            loss.backward()
        opt.step()
        opt.zero_grad()


def fam_adamw(ctx, rec):
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    for kind, steps, micro in (("llama", 3, 1), ("llama_tied", 3, 1), ("qwen2", 3, 1),
                               ("gpt2", 3, 1), ("llama_tied", 2, 2), ("gpt2", 2, 2)):
        with rec.case(f"{kind} {steps} steps x {micro} micro-batch(es)"):
            model, ref = _sharded(kind)
            init = {k: v.detach().clone() for k, v in ref.named_parameters()}
            _train(model, model.parameters(), r, W, steps, micro, reference=False)
            _train(ref, ref.parameters(), r, W, steps, micro, reference=True)
            _check_tie(model, kind)
            full = rsdp.full_state_dict(model, rank0_only=False)
            for k, v in ref.named_parameters():
                assert (v - init[k]).abs().max() > 1e-4, f"{kind}: {k} did not move"
            for k, v in ref.state_dict().items():
                _close(full[k], v, f"{kind}: trained {k}")


def fam_state_dict(ctx, rec):
    import torch_rsdp.rsdp as rsdp

    r = ctx.rank
    for kind in ("llama_tied", "qwen2", "gpt2"):
        with rec.case(kind):
            model, _ = _sharded(kind)
            _train(model, model.parameters(), r, ctx.world_size, 1, 1, reference=False)
            full = rsdp.full_state_dict(model)
            ids = _ids(r, "sd")
            with torch.no_grad():
                logits = model(input_ids=ids).logits
            if r == 0:
                fresh = _make(kind, seed=123)
                fresh.load_state_dict(full, strict=True)
                with torch.no_grad():
                    _close(fresh(input_ids=ids).logits, logits, f"{kind}: fresh model")
            else:
                assert full == {}, sorted(full)
            other = _make(kind, seed=7)
            rsdp.load_full_state_dict(model, other.state_dict())
            _check_tie(model, kind)
            back = rsdp.full_state_dict(model, rank0_only=False)
            for k, v in other.state_dict().items():
                assert torch.equal(back[k], v), f"{kind}: {k} after load_full_state_dict"


def fam_mixed_precision(ctx, rec):
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    mp = rsdp.MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                             output_dtype=torch.float32)
    for kind in ("llama_tied", "gpt2"):
        with rec.case(kind):
            model, ref = _sharded(kind, mp_policy=mp)
            loss, logits = _loss(model, r)
            loss.backward()
            (sum(_loss(ref, q)[0] for q in range(W)) / W).backward()
            _close(logits, _loss(ref, r)[1].detach(), f"{kind}: bf16 logits", 5e-2, 5e-2)
            ref_params = dict(ref.named_parameters())
            for name, p in model.named_parameters():
                assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, name
                exp = rsdp.local_shard_of(model, name, ref_params[name].grad)
                _close(p.grad, exp, f"{kind}: bf16 grad of {name}", 2e-2, 5e-2)


class Custom(nn.Module):
    """A matrix with no RSDP rule, a filtered Linear, a tiny Linear, two Linears sharing one
    weight (not an embedding/head pair) and a Conv1D-like class outside transformers."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(20, 8)
        self.table = nn.Parameter(torch.randn(8, 8))
        self.keep = nn.Linear(8, 8)
        self.tiny = nn.Linear(8, 2)
        self.a = nn.Linear(8, 8, bias=False)
        self.b = nn.Linear(8, 8, bias=False)
        self.b.weight = self.a.weight
        self.head = nn.Linear(8, 20)

    def forward(self, idx):
        x = self.emb(idx) @ self.table
        x = self.b(self.a(self.keep(x)))
        return self.head(x) + self.tiny(x).sum(-1, keepdim=True)


def fam_coverage(ctx, rec):
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    with rec.case("reasons, warning, parity"):
        torch.manual_seed(0)
        ref = Custom()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = rsdp.shard(copy.deepcopy(ref), min_numel=20,
                               filter=lambda name, m: name != "keep")
        st = rsdp.rsdp_state(model)
        assert set(st.sharded) == {"emb", "head"}, sorted(st.sharded)
        why = {e.name: e.reason for e in st.left_whole}
        assert set(why) == {"table", "keep.weight", "keep.bias", "tiny.weight", "tiny.bias",
                            "a.weight"}, sorted(why)
        assert why["table"].startswith("not decomposable: no RSDP rule for Custom"), why
        assert why["keep.weight"] == why["keep.bias"] == "excluded by filter", why
        assert why["tiny.weight"].startswith("too small (16 weight elements < min_numel=20)"), why
        assert why["a.weight"].startswith("tied (a, b)"), why
        assert model.a.weight is model.b.weight
        msgs = [str(w.message) for w in caught]
        if r == 0:
            assert any("table (8, 8)" in m for m in msgs), msgs
        else:
            assert not any("kept whole" in m for m in msgs), msgs
        assert "table" in st.report() and "excluded by filter" in st.report()
        idx = torch.randint(0, 20, (2 + r, 3), generator=_gen("cov", r))
        y = model(idx)
        (y * y).mean().backward()
        sum(((ref(torch.randint(0, 20, (2 + q, 3), generator=_gen("cov", q))) ** 2).mean()
             for q in range(W))).div(W).backward()
        refp = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            _close(p.grad, rsdp.local_shard_of(model, name, refp[name].grad), f"grad {name}")
    with rec.case("tied head with linear_split 'none' keeps the pair whole"):
        torch.manual_seed(0)
        m = nn.Sequential(nn.Embedding(10, 6), nn.Linear(6, 10))
        m[1].weight = m[0].weight
        rsdp.shard(m, linear_split=lambda name, mod: "none")
        why = {e.name: e.reason for e in rsdp.rsdp_state(m).left_whole}
        assert "0.weight" in why and "linear_split chose 'none'" in why["0.weight"], why
        assert m[1].weight is m[0].weight and m[0].weight.shape == (10, 6)
    with rec.case("bad input names the module"):
        model, _ = _sharded("gpt2")
        try:
            model.transformer.h[0].mlp.c_fc(torch.randn(2, 5))
        except ValueError as e:
            assert "RSDPConv1D" in str(e) and "in_features=48" in str(e), str(e)
        else:
            raise AssertionError("a wrong input width was accepted")
        try:
            rsdp.shard(nn.Linear(3, 3), linear_split="rows")
        except ValueError as e:
            assert "rows" in str(e), str(e)
        else:
            raise AssertionError("linear_split='rows' was accepted")


def _count_shifts(model, fn):
    """(ring shifts issued while ``fn()`` runs, its result)."""
    import torch_rsdp.rsdp as rsdp

    plan = rsdp.rsdp_state(model).plan
    n = [0]
    orig = plan.shift

    def counting(*a, **kw):
        n[0] += 1
        return orig(*a, **kw)

    plan.shift = counting
    try:
        out = fn()
    finally:
        del plan.shift
    return n[0], out


def _explicit_plan():
    """The Llama plan in torch's parallelize_module vocabulary, full names, style objects."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    base = "model.layers.*."
    plan = {base + f"self_attn.{n}_proj": ColwiseParallel() for n in "qkv"}
    plan[base + "self_attn.o_proj"] = RowwiseParallel()
    plan.update({base + "mlp.gate_proj": "colwise", base + "mlp.up_proj": "colwise",
                 base + "mlp.down_proj": "rowwise"})
    return plan


class GatedMLP(nn.Module):
    """Llama-style names and no config: the built-in rules make it a unit."""

    def __init__(self, d=12, h=24, residual=False):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(d, h), nn.Linear(d, h)
        self.down_proj = nn.Linear(h, d)
        self.residual = residual

    def forward(self, x):
        y = self.down_proj(torch.nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))
        return x + y if self.residual else y


def fam_units(ctx, rec):
    """Rotation units from a tensor-parallel plan: one buffer per attention block / MLP."""
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    cases = [("llama_u", "auto", True), ("qwen2_u", "auto", True),
             ("llama_u", _explicit_plan(), True), ("llama_u", "auto", False),
             ("qwen2_u", "auto", False),
             ("llama", "auto", True)]  # the last: 2 KV heads over 3-4 ranks leave ranks without
    for kind, tp, recompute in cases:
        with rec.case(f"{kind} tp_plan={'auto' if tp == 'auto' else 'explicit'} "
                      f"recompute={recompute}"):
            model, ref = _sharded(kind, tp_plan=tp, unit_recompute=recompute)
            _check_tie(model, kind)
            st = rsdp.rsdp_state(model)
            units = [n for n in st.sharded if n.endswith(("self_attn", "mlp"))]
            assert len(units) == 4 and len(st.sharded) == 6, sorted(st.sharded)
            nshift, _ = _count_shifts(model, lambda: model(input_ids=_ids(r)))
            assert nshift == 6 * (W - 1), f"{kind}: {nshift} forward shifts, expected 6 per hop"
            loss, logits = _loss(model, r)
            loss.backward()
            ref_losses = [_loss(ref, q) for q in range(W)]
            (sum(lq for lq, _ in ref_losses) / W).backward()
            _close(logits, ref_losses[r][1].detach(), f"{kind}: logits")
            ref_params = dict(ref.named_parameters())
            for name, p in model.named_parameters():
                exp = rsdp.local_shard_of(model, name, ref_params[name].grad)
                _close(p.grad, exp, f"{kind}: grad of {name}")
            if kind != "llama":
                frac = st.resident_numel() / st.full_numel
                assert frac <= 1 / W + 0.05, f"{kind}: rank {r} holds {frac:.3f} of the model"
    with rec.case("eager attention, left padding mask"):
        cls, cfg = _config("llama_u")
        cfg._attn_implementation = "eager"
        torch.manual_seed(0)
        ref = cls(cfg)
        model = rsdp.shard(copy.deepcopy(ref), tp_plan="auto", unit_recompute=False)

        def batch(q):
            ids = _ids(q, "pad")
            mask = torch.ones_like(ids)
            mask[0, :2] = 0  # the first sequence is left-padded
            return ids, mask

        ids, mask = batch(r)
        out = model(input_ids=ids, attention_mask=mask, labels=ids)
        out.loss.backward()
        refs = [ref(input_ids=i, attention_mask=m, labels=i) for i, m in map(batch, range(W))]
        (sum(o.loss for o in refs) / W).backward()
        _close(out.logits, refs[r].logits.detach(), "eager padded logits")
        ref_params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            _close(p.grad, rsdp.local_shard_of(model, name, ref_params[name].grad),
                   f"eager padded grad of {name}")
    with rec.case("Hugging Face gradient checkpointing around units"):
        for recompute in (True, False):
            model, ref = _sharded("llama_u", tp_plan="auto", unit_recompute=recompute)
            model.gradient_checkpointing_enable()
            model.train()
            _loss(model, r)[0].backward()
            (sum(_loss(ref, q)[0] for q in range(W)) / W).backward()
            ref_params = dict(ref.named_parameters())
            for name, p in model.named_parameters():
                _close(p.grad, rsdp.local_shard_of(model, name, ref_params[name].grad),
                       f"checkpointed (recompute={recompute}) grad of {name}")
    with rec.case("llama_u adamw 3 steps + 2x2 accumulated, full state dict into a fresh model"):
        for steps, micro, recompute in ((3, 1, True), (2, 2, False)):
            model, ref = _sharded("llama_u", tp_plan="auto", unit_recompute=recompute)
            _train(model, model.parameters(), r, W, steps, micro, reference=False)
            _train(ref, ref.parameters(), r, W, steps, micro, reference=True)
            full = rsdp.full_state_dict(model, rank0_only=False)
            for k, v in ref.state_dict().items():
                _close(full[k], v, f"units trained {k} ({steps}x{micro})")
        fresh = _make("llama_u", seed=5)
        fresh.load_state_dict(full, strict=True)
    with rec.case("recompute=False keeps activations, not weights"):
        model, _ = _sharded("llama_u", tp_plan="auto", unit_recompute=False)
        loss, _ = _loss(model, r)
        nodes, seen, todo = [], set(), [loss.grad_fn]
        while todo:  # every unit's backward node, with what it keeps for backward
            fn = todo.pop()
            if fn is None or fn in seen:
                continue
            seen.add(fn)
            if type(fn).__name__ == "_UnitFnBackward":
                nodes.append(fn)
            todo.extend(f for f, _ in fn.next_functions)
        assert len(nodes) == 4, len(nodes)
        for fn in nodes:
            held = [w for _, weights in fn.graphs.values() for w in weights.values()]
            assert held and all(w.untyped_storage().nbytes() <= w.element_size() for w in held), (
                "a kept graph holds weight storage: "
                f"{max(w.untyped_storage().nbytes() for w in held)} B")
        loss.backward()
    with rec.case("bf16 compute"):
        mp = rsdp.MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                 output_dtype=torch.float32)
        model, ref = _sharded("llama_u", tp_plan="auto", mp_policy=mp)
        loss, logits = _loss(model, r)
        loss.backward()
        (sum(_loss(ref, q)[0] for q in range(W)) / W).backward()
        _close(logits, _loss(ref, r)[1].detach(), "units bf16 logits", 5e-2, 5e-2)
        ref_params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            assert p.grad.dtype == torch.float32, name
            _close(p.grad, rsdp.local_shard_of(model, name, ref_params[name].grad),
                   f"units bf16 grad of {name}", 2e-2, 5e-2)
    with rec.case("KV cache filled once with every head; decoding raises"):
        model, ref = _sharded("llama_u", tp_plan="auto")
        ids = _ids(r, "kv")
        with torch.no_grad():
            got = model(input_ids=ids, use_cache=True).past_key_values
            exp = ref(input_ids=ids, use_cache=True).past_key_values
            for li in range(2):
                _close(got.layers[li].keys, exp.layers[li].keys, f"cache keys {li}")
                _close(got.layers[li].values, exp.layers[li].values, f"cache values {li}")
            try:
                model(input_ids=ids[:, :1], past_key_values=got, use_cache=True)
            except NotImplementedError as e:
                assert "KV cache" in str(e), str(e)
            else:
                raise AssertionError("decoding with a filled cache was accepted")
    with rec.case("built-in rules on a plain module (biases: column ones sharded, row one whole)"):
        torch.manual_seed(0)
        ref = nn.Sequential(GatedMLP(), nn.LayerNorm(12), GatedMLP())
        model = rsdp.shard(copy.deepcopy(ref), tp_plan="auto")
        assert sorted(rsdp.rsdp_state(model).sharded) == ["0", "2"]
        xs = [torch.randn(2 + q, 3, 12, generator=_gen("mlp", q)) for q in range(W)]
        x = xs[r].clone().requires_grad_()
        y = model(x)
        (y ** 2).mean().backward()
        xr = [t.clone().requires_grad_() for t in xs]
        (sum((ref(t) ** 2).mean() for t in xr) / W).backward()
        _close(y, ref(xs[r]).detach(), "gated mlp output")
        _close(x.grad, xr[r].grad * W, "gated mlp input gradient")
        refp = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            _close(p.grad, rsdp.local_shard_of(model, name, refp[name].grad), f"grad {name}")
    with rec.case("a unit whose forward changes the row-split output raises"):
        model = rsdp.shard(GatedMLP(residual=True), tp_plan="auto")
        try:
            model(torch.randn(2, 12))
        except RuntimeError as e:
            assert "row-split layer's output as is" in str(e), str(e)
        else:
            raise AssertionError("a residual inside a unit was accepted")
    with rec.case("bad plans are named"):
        bad = {"model.layers.*.mlp.gate_proj": "colwise", "model.layers.*.mlp.up_proj": "rowwise",
               "model.layers.*.mlp.down_proj": "rowwise"}
        try:
            rsdp.shard(_make("llama"), tp_plan=bad)
        except ValueError as e:
            assert "model.layers.0.mlp" in str(e) and "row-split" in str(e), str(e)
        else:
            raise AssertionError("a unit with two row-split layers was accepted")


FAMILIES = {
    "parity": fam_parity,
    "adamw": fam_adamw,
    "state_dict": fam_state_dict,
    "mixed_precision": fam_mixed_precision,
    "coverage": fam_coverage,
    "units": fam_units,
}


def families_worker(ctx, names):
    torch.set_num_threads(1)  # up to 4 ranks share 2 cores
    import transformers  # noqa: F401  (fail early and clearly if it is missing)

    transformers.logging.set_verbosity_error()
    return run_families(ctx, FAMILIES, names)


# --------------------------------------------------------------------------------------------
# pytest side
# --------------------------------------------------------------------------------------------

PARAMS = [pytest.param(ws, fam, id=f"{fam}-ws{ws}") for ws in WORLD_SIZES for fam in FAMILIES]
_BATCH: dict = {}


def _batch(ws, request):
    """One launch per world size for every selected family."""
    if ws in _BATCH:
        return _BATCH[ws]
    names = [f for f in FAMILIES if any(
        getattr(it, "originalname", None) == "test_rsdp_hf" and it.callspec.params == {
            "ws": ws, "family": f} for it in request.session.items)]
    results, errors, _ = launch_families(
        lambda todo: launch(families_worker, ws, (todo,), deadline=600, pg_timeout=120), names,
        ws)
    _BATCH[ws] = (results, errors)
    return _BATCH[ws]


@pytest.mark.parametrize("ws,family", PARAMS)
def test_rsdp_hf(ws, family, request):
    results, errors = _batch(ws, request)
    assert_family(results, errors, family, f"world size {ws}")

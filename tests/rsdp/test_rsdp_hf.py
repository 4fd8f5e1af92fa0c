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
  RSDP cannot share), a matrix without a rule warns, bad input names the module;
* units: rotation units from a tensor-parallel plan (tests/support/rsdp_unit_families.py).

Models and shared helpers: tests/support/hf_models.py.

One launch per world size (2, 3, 4) runs every family (tests/support/harness.py ``run_families``).
Needs ``transformers`` (scripts/setup.sh installs it).
"""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from support.harness import assert_family, launch, launch_families, run_families
from support.hf_models import (MODELS, _check_tie, _close, _gen, _loc, _ids, _loss, _make, _sharded,
                       _train)
from support.rsdp_unit_families import fam_units, fam_units_whole

WORLD_SIZES = (2, 3, 4)
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
                exp = rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad)
                _close(p.grad, exp, f"{kind}: grad of {name}")
            # torch's own clipping (what trainers call) sees one process's gradient: every
            # parameter is a DTensor, so it reduces the shards' norms over the group
            want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.01)
            got = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            got = got.full_tensor() if hasattr(got, "full_tensor") else got
            assert want > 0.01 and abs(got - want) <= 1e-5 * want, (kind, got, want)
            for name, p in model.named_parameters():
                _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad),
                       f"{kind}: clipped grad of {name}")
            assert sum(p.numel() for p in model.parameters()) == sum(
                p.numel() for p in ref.parameters()), f"{kind}: global shapes"
            st = rsdp.rsdp_state(model)
            full = sum(p.numel() for p in ref.parameters())
            resident = sum(_loc(p).numel() for p in model.parameters())
            assert st.full_numel == full and st.resident_numel() == resident
            frac = resident / full
            print(f"resident {kind} ws={W} rank {r}: {resident}/{full} = {frac:.4f}")
            assert frac <= 1 / W + 0.05, f"{kind}: rank {r} holds {frac:.3f} of the model"
            # report(): exactly the parameters left whole, each with a reason
            whole = {e.name: e for e in st.left_whole}
            exp_whole = {n for n, p in model.named_parameters() if _loc(p).shape == ref_params[n].shape
                         and rsdp.rsdp_state(model).local_shard_of(n, ref_params[n]) is ref_params[n]}
            assert set(whole) == exp_whole, f"{kind}: left_whole {sorted(whole)} vs {exp_whole}"
            for e in whole.values():
                assert e.reason and e.numel == ref_params[e.name].numel(), e
            text = st.report()
            assert all(n in text for n in whole), text
            if kind == "gpt2_in":
                assert "transformer.h.0.attn.c_proj.bias" in whole, sorted(whole)
                assert whole["transformer.h.0.attn.c_proj.bias"].reason.startswith("too small")


def fam_adamw(ctx, rec):
    import torch_rsdp.plan as plan

    r, W = ctx.rank, ctx.world_size
    for kind, steps, micro in (("llama", 3, 1), ("llama_tied", 3, 1), ("qwen2", 3, 1),
                               ("gpt2", 3, 1), ("llama_tied", 2, 2), ("gpt2", 2, 2)):
        with rec.case(f"{kind} {steps} steps x {micro} micro-batch(es)"):
            model, ref = _sharded(kind)
            init = {k: v.detach().clone() for k, v in ref.named_parameters()}
            _train(model, model.parameters(), r, W, steps, micro, reference=False)
            _train(ref, ref.parameters(), r, W, steps, micro, reference=True)
            _check_tie(model, kind)
            full = plan.full_state_dict(model, rank0_only=False)
            for k, v in ref.named_parameters():
                assert (v - init[k]).abs().max() > 1e-4, f"{kind}: {k} did not move"
            for k, v in ref.state_dict().items():
                _close(full[k], v, f"{kind}: trained {k}")


def fam_state_dict(ctx, rec):
    import torch_rsdp.plan as plan

    r = ctx.rank
    for kind in ("llama_tied", "qwen2", "gpt2"):
        with rec.case(kind):
            model, _ = _sharded(kind)
            _train(model, model.parameters(), r, ctx.world_size, 1, 1, reference=False)
            full = plan.full_state_dict(model)
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
            plan.load_full_state_dict(model, other.state_dict())
            _check_tie(model, kind)
            back = plan.full_state_dict(model, rank0_only=False)
            for k, v in other.state_dict().items():
                assert torch.equal(back[k], v), f"{kind}: {k} after load_full_state_dict"


def fam_mixed_precision(ctx, rec):
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
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
                exp = rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad)
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
            _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, refp[name].grad), f"grad {name}")
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
            assert "RSDPConv1D 'transformer.h.0.mlp.c_fc'" in str(e), str(e)
            assert "(2, 5)" in str(e) and "in_features=48" in str(e), str(e)
        else:
            raise AssertionError("a wrong input width was accepted")
        try:
            rsdp.shard(nn.Linear(3, 3), linear_split="rows")
        except ValueError as e:
            assert "rows" in str(e), str(e)
        else:
            raise AssertionError("linear_split='rows' was accepted")


FAMILIES = {
    "parity": fam_parity,
    "adamw": fam_adamw,
    "state_dict": fam_state_dict,
    "mixed_precision": fam_mixed_precision,
    "coverage": fam_coverage,
    "units": fam_units,
    "units_whole": fam_units_whole,
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
        lambda batch: launch(families_worker, ws, (batch,), deadline=600, pg_timeout=120), names,
        ws)
    _BATCH[ws] = (results, errors)
    return _BATCH[ws]


@pytest.mark.parametrize("ws,family", PARAMS)
def test_rsdp_hf(ws, family, request):
    results, errors = _batch(ws, request)
    assert_family(results, errors, family, f"world size {ws}")

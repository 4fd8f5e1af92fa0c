"""Test families for RSDP rotation units (``shard(model, tp_plan=...)``): one flat buffer per
attention block / MLP. Run by tests/rsdp/test_rsdp_hf.py in the same launches as the other
Hugging Face families (``fam_units``).
"""

from __future__ import annotations

import copy

import torch
import torch.nn as nn
from torch.distributed.fsdp import MixedPrecisionPolicy

from .hf_models import _check_tie, _close, _config, _gen, _ids, _loss, _make, _sharded, _train

def _count_shifts(model, fn):
    """(ring shifts issued while ``fn()`` runs, its result)."""
    import torch_rsdp.rsdp as rsdp

    ring = rsdp.rsdp_state(model).ring
    before = ring.hops
    out = fn()
    return ring.hops - before, out


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


def _unit_nodes(loss):
    """Every rotation unit's backward node in ``loss``'s graph (shard by shard or whole)."""
    nodes, seen, pending = [], set(), [loss.grad_fn]
    while pending:
        fn = pending.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        name = type(fn).__name__
        if name in ("_UnitFnBackward", "WholeUnitFnBackward", "_BlockUnitFnBackward",
                    "UnitMemberLinearBackward") or (
                name == "_LinearFnBackward" and hasattr(fn.mod, "_rsdp_style")):  # a unit's
            nodes.append(fn)  # layer on its own, not a sharded Linear such as the head
        pending.extend(f for f, _ in fn.next_functions)
    return nodes


def _whole_node(W, recompute=False):
    """The backward node of a unit computed whole: from 3 ranks on in its block's pass
    ([Note: unit blocks]), its layers' own ([Note: units in their block's pass]) unless it
    recomputes; at 2 its layers' own as sharded Linears ([Note: small units layer by layer at
    two ranks]) unless it recomputes, then alone."""
    if W < 3:
        return "WholeUnitFnBackward" if recompute else "_LinearFnBackward"
    return "_BlockUnitFnBackward" if recompute else "UnitMemberLinearBackward"


def _in_block_pass(W):
    """Whether this family's units compute in their block's pass (``fam_units_whole``)."""
    from torch_rsdp.rsdp._units import unit_whole

    return unit_whole.MODE == "always" and W >= 3


def _by_layers(W, recompute=False):
    """Whether this family's units compute layer by layer (``fam_units_whole`` at 2 ranks)."""
    from torch_rsdp.rsdp._units import unit_whole

    return unit_whole.MODE == "always" and W == 2 and not recompute


def _node_name(W, recompute=False):
    """The backward node units make in this family: whole (``fam_units_whole``) or not."""
    from torch_rsdp.rsdp._units import unit_whole

    return _whole_node(W, recompute) if unit_whole.MODE == "always" else "_UnitFnBackward"


def fam_units_whole(ctx, rec):
    """Units computed whole ([Note: small units computed whole]): every case of
    :func:`fam_units` with every unit whole (the models here are tiny and their inputs few,
    so the size rule alone would never pick them), then the rule itself."""
    import torch_rsdp.rsdp as rsdp
    from torch_rsdp.rsdp._units import unit_whole

    r, W = ctx.rank, ctx.world_size
    unit_whole.MODE = "always"
    try:
        fam_units(ctx, rec)
    finally:
        unit_whole.MODE = "auto"
    with rec.case("backward hops: whole units gather and reduce by block, the last gather kept"):
        # per shard a unit's backward makes W - 1 weight hops and W gradient hops: 4 units,
        # 4 (2 W - 1). Whole, from 3 ranks on, each of the 2 blocks gathers (W - 1) and
        # reduces (W - 1) for both its units, and the last block of the forward does not
        # gather again ([Note: the last gather stays for backward]): 3 (W - 1). At 2 ranks
        # each of the 14 layers of the units gathers and reduces on its own: 28 (W - 1).
        hops = {}
        for mode in ("never", "always"):
            unit_whole.MODE = mode
            try:
                model, _ = _sharded("llama_u", tp_plan="auto")
                ring = rsdp.rsdp_state(model).ring
                loss = _loss(model, r)[0]
                before = ring.hops
                loss.backward()
                hops[mode] = ring.hops - before
            finally:
                unit_whole.MODE = "auto"
        whole = 3 * (W - 1) if W >= 3 else 28 * (W - 1)
        assert hops["never"] - hops["always"] == 4 * (2 * W - 1) - whole, hops
    with rec.case("a frozen layer of a whole unit: no gradient for it, the others one process's"):
        unit_whole.MODE = "always"
        try:
            model, ref = _sharded("llama_u", tp_plan="auto", unit_recompute=False)
            for m in (model, ref):  # as LoRA-style fine-tuning leaves a projection frozen
                m.model.layers[0].self_attn.q_proj.weight.requires_grad_(False)
            loss, logits = _loss(model, r)
            loss.backward()
        finally:
            unit_whole.MODE = "auto"
        (sum(_loss(ref, q)[0] for q in range(W)) / W).backward()
        refp = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            if not p.requires_grad:
                assert p.grad is None, f"frozen {name} got a gradient"
                continue
            _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, refp[name].grad), f"grad {name}")
    with rec.case("the size rule: long batches compute whole, one short rank keeps all per shard"):
        # llama_u's attention unit is small from 42 tokens on, its MLP from 48: every rank
        # feeds 3 x 24 tokens (whole everywhere) or, in the second round, rank 0 only 1 x 24
        # (the agreed minimum: per shard everywhere)
        for short, want in ((False, _whole_node(W)), (True, "_UnitFnBackward")):
            model, ref = _sharded("llama_u", tp_plan="auto", unit_recompute=False)

            def ids(q):
                n = 1 if (short and q == 0) else 3
                return torch.randint(0, 100, (n, 24), generator=_gen("rule", q, short))

            out = model(input_ids=ids(r), labels=ids(r))
            got = {type(n).__name__ for n in _unit_nodes(out.loss)}
            assert got == {want}, f"short={short}: rank {r} made {got}, expected {want}"
            out.loss.backward()
            refs = [ref(input_ids=ids(q), labels=ids(q)) for q in range(W)]
            (sum(o.loss for o in refs) / W).backward()
            _close(out.logits, refs[r].logits.detach(), f"rule logits (short={short})")
            refp = dict(ref.named_parameters())
            for name, p in model.named_parameters():
                _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, refp[name].grad),
                       f"rule grad {name} (short={short})")


def fam_units(ctx, rec):
    """Rotation units from a tensor-parallel plan: one buffer per attention block / MLP."""
    import torch_rsdp.plan as plan
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    cases = [("llama_u", "auto", True), ("qwen2_u", "auto", True),
             ("llama_u", _explicit_plan(), True), ("llama_u", "auto", False),
             ("qwen2_u", "auto", False),
             # parameters inside a unit that no shard holds ([Note: a unit's own replicas])
             ("qwen3_u", "auto", True), ("qwen3_u", "auto", False),
             ("llama", "auto", True)]  # the last: 2 KV heads, uneven over 3-4 ranks
    for kind, tp, recompute in cases:
        with rec.case(f"{kind} tp_plan={'auto' if tp == 'auto' else 'explicit'} "
                      f"recompute={recompute}"):
            model, ref = _sharded(kind, tp_plan=tp, unit_recompute=recompute)
            _check_tie(model, kind)
            st = rsdp.rsdp_state(model)
            units = [n for n in st.sharded if n.endswith(("self_attn", "mlp"))]
            # heads that do not split evenly leave attention to the per-layer rules (q, k, v,
            # o sharded one by one: [Note: units split evenly])
            even = kind != "llama" or W == 2
            n_attn = 2 if even else 0
            assert len(units) == 2 + n_attn, sorted(st.sharded)
            # the report says which units "auto" could not form, and why
            rep = st.report()
            if even:
                assert "not rotation units" not in rep and not st.not_units, rep
            elif tp == "auto":
                assert sorted(st.not_units) == [f"model.layers.{i}.self_attn" for i in (0, 1)]
                why = f"model.layers.1.self_attn  its 2 heads do not split evenly over {W}"
                assert why in rep, rep
            # and the embedding, the head (and q, k, v, o of both layers when uneven)
            assert len(st.sharded) == (6 if even else 12), sorted(st.sharded)
            nshift, _ = _count_shifts(model, lambda: model(input_ids=_ids(r)))
            # 4 units, the embedding and the head; the units of a block in one pass; or
            # the units' 14 layers one by one
            rot = 4 if _in_block_pass(W) else 16 if _by_layers(W, recompute) else 6
            if even:
                assert nshift == rot * (W - 1), f"{kind}: {nshift} shifts, expected {rot} a hop"
            loss, logits = _loss(model, r)
            loss.backward()
            ref_losses = [_loss(ref, q) for q in range(W)]
            (sum(lq for lq, _ in ref_losses) / W).backward()
            _close(logits, ref_losses[r][1].detach(), f"{kind}: logits")
            ref_params = dict(ref.named_parameters())
            for name, p in model.named_parameters():
                exp = rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad)
                _close(p.grad, exp, f"{kind}: grad of {name}")
            # every shard a DTensor, so torch's own clipping (what the trainers call) sees the
            # whole model's norm; the reference's gradient is the mean of the ranks' losses'
            # as the sharded model's is
            want = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.01)
            got = torch.nn.utils.clip_grad_norm_(model.parameters(), 0.01)
            _close(got, want, f"{kind}: torch's clip_grad_norm_")
            for name, p in model.named_parameters():
                exp = rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad)
                _close(p.grad, exp, f"{kind}: clipped grad of {name}")
            if kind != "llama":
                frac = st.resident_numel() / st.full_numel
                assert frac <= 1 / W + 0.05, f"{kind}: rank {r} holds {frac:.3f} of the model"
    if W > 2:
        with rec.case("an explicit plan whose heads do not split evenly: refused"):
            try:
                _sharded("llama", tp_plan=_explicit_plan())
            except ValueError as e:
                msg = str(e)
                assert "self_attn" in msg and f"2 heads do not split evenly over {W}" in msg, msg
            else:
                raise AssertionError("a unit of 2 heads over 3+ ranks was accepted")
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
            _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad),
                   f"eager padded grad of {name}")
        if _in_block_pass(W) or _by_layers(W):  # the unit's forward ran once: its
            # attention weights are whole
            with torch.no_grad():
                got = model(input_ids=ids, attention_mask=mask, output_attentions=True)
                exp = ref(input_ids=ids, attention_mask=mask, output_attentions=True)
            for li, (a, b) in enumerate(zip(got.attentions, exp.attentions)):
                _close(a, b, f"attention weights of layer {li}")
    with rec.case("attention dropout: recomputation replays the forward's masks"):
        cls, cfg = _config("llama_u")
        cfg.attention_dropout = 0.3
        got = []
        for recompute in (False, True):  # False keeps the forward's graphs: the masks it drew
            torch.manual_seed(0)
            model = rsdp.shard(cls(cfg), tp_plan="auto", unit_recompute=recompute).train()
            torch.manual_seed(100 + r)
            loss, logits = _loss(model, r)
            loss.backward()
            got.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
        _close(got[1][0], got[0][0], "dropout logits")
        for n, g in got[0][1].items():
            _close(got[1][1][n], g, f"dropout grad of {n} (recomputed vs kept)")
    with rec.case("Hugging Face gradient checkpointing around units"):
        for recompute in (True, False):
            model, ref = _sharded("llama_u", tp_plan="auto", unit_recompute=recompute)
            model.gradient_checkpointing_enable()
            model.train()
            _loss(model, r)[0].backward()
            (sum(_loss(ref, q)[0] for q in range(W)) / W).backward()
            ref_params = dict(ref.named_parameters())
            for name, p in model.named_parameters():
                _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad),
                       f"checkpointed (recompute={recompute}) grad of {name}")
    with rec.case("under torch's MemTracker and FlopCounterMode (module hooks on every input)"):
        # their module tracker hooks each module's inputs' gradients: a unit's backward, an
        # autograd.grad per shard, must still run and give one process's gradients
        from torch.distributed._tools.mem_tracker import MemTracker
        from torch.utils.flop_counter import FlopCounterMode

        for recompute in (True, False):
            model, ref = _sharded("llama_u", tp_plan="auto", unit_recompute=recompute)
            mt = MemTracker()
            mt.track_external(model)
            with mt, FlopCounterMode(display=False) as flops:
                _loss(model, r)[0].backward()
            assert mt.get_tracker_snapshot("peak") and flops.get_total_flops() > 0
            (sum(_loss(ref, q)[0] for q in range(W)) / W).backward()
            ref_params = dict(ref.named_parameters())
            for name, p in model.named_parameters():
                _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad),
                       f"tracked (recompute={recompute}) grad of {name}")
    with rec.case("llama_u adamw 3 steps + 2x2 accumulated, full state dict into a fresh model"):
        for steps, micro, recompute in ((3, 1, True), (2, 2, False)):
            model, ref = _sharded("llama_u", tp_plan="auto", unit_recompute=recompute)
            _train(model, model.parameters(), r, W, steps, micro, reference=False)
            _train(ref, ref.parameters(), r, W, steps, micro, reference=True)
            full = plan.full_state_dict(model, rank0_only=False)
            for k, v in ref.state_dict().items():
                _close(full[k], v, f"units trained {k} ({steps}x{micro})")
        fresh = _make("llama_u", seed=5)
        fresh.load_state_dict(full, strict=True)
    with rec.case("recompute=False keeps activations, not weights"):
        model, _ = _sharded("llama_u", tp_plan="auto", unit_recompute=False)
        loss, logits = _loss(model, r)
        nodes = _unit_nodes(loss)
        if _in_block_pass(W) or _by_layers(W):  # every layer of the 4 units saves its
            # input and nothing else
            assert len(nodes) == 14 and {type(n).__name__ for n in nodes} == {_node_name(W)}, (
                nodes)
            tokens = logits.shape[0] * logits.shape[1]
            for fn in nodes:
                saved = [tuple(t.shape) for t in fn.saved_tensors]
                assert saved == [(tokens, fn.mod.in_features)], (fn.mod, saved)
            nodes = []
        else:
            assert len(nodes) == 4 and {type(n).__name__ for n in nodes} == {_node_name(W)}, (
                nodes)
        for fn in nodes:
            graphs = fn.graphs.values() if hasattr(fn, "graphs") else [fn.graph]
            held = [w for _, weights in graphs for w in weights.values()]
            assert held and all(w.untyped_storage().nbytes() <= w.element_size() for w in held), (
                "a kept graph holds weight storage: "
                f"{max(w.untyped_storage().nbytes() for w in held)} B")
        loss.backward()
    with rec.case("a second backward: recomputing units double, kept graphs refuse loudly"):
        for recompute in (True, False):
            model, _ = _sharded("llama_u", tp_plan="auto", unit_recompute=recompute)
            loss = _loss(model, r)[0]
            loss.backward(retain_graph=True)
            first = {n: p.grad.clone() for n, p in model.named_parameters()}
            # in a block's pass units gather again, layer by layer they rotate again
            if recompute or _in_block_pass(W) or _by_layers(W):
                loss.backward()
                for n, p in model.named_parameters():
                    _close(p.grad, 2 * first[n], f"second backward, grad of {n}")
                continue
            try:
                loss.backward()
            except RuntimeError as e:
                assert "second backward" in str(e) and "unit_recompute=True" in str(e), str(e)
            else:
                raise AssertionError("a second backward through kept unit graphs was accepted")
    with rec.case("bf16 compute"):
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                 output_dtype=torch.float32)
        model, ref = _sharded("llama_u", tp_plan="auto", mp_policy=mp)
        loss, logits = _loss(model, r)
        loss.backward()
        (sum(_loss(ref, q)[0] for q in range(W)) / W).backward()
        _close(logits, _loss(ref, r)[1].detach(), "units bf16 logits", 5e-2, 5e-2)
        ref_params = dict(ref.named_parameters())
        for name, p in model.named_parameters():
            assert p.grad.dtype == torch.float32, name
            _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, ref_params[name].grad),
                   f"units bf16 grad of {name}", 2e-2, 5e-2)
    with rec.case("KV cache: filled once with every head, decoding, generate()"):
        model, ref = _sharded("llama_u", tp_plan="auto")
        model.eval(), ref.eval()
        ids = _ids(r, "kv")
        with torch.no_grad():
            got = model(input_ids=ids, use_cache=True).past_key_values
            exp = ref(input_ids=ids, use_cache=True).past_key_values
            for li in range(2):
                _close(got.layers[li].keys, exp.layers[li].keys, f"cache keys {li}")
                _close(got.layers[li].values, exp.layers[li].values, f"cache values {li}")
            nxt = ids[:, -1:]
            step = model(input_ids=nxt, past_key_values=got, use_cache=True).logits
            _close(step, ref(input_ids=nxt, past_key_values=exp, use_cache=True).logits,
                   "decoding step logits")
            assert got.get_seq_length(0) == ids.shape[1] + 1
            kw = dict(max_new_tokens=4, do_sample=False, pad_token_id=1)
            out = model.generate(ids, **kw)
            assert torch.equal(out, ref.generate(ids, **kw)), "generate() differs"
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
            _close(p.grad, rsdp.rsdp_state(model).local_shard_of(name, refp[name].grad), f"grad {name}")
    with rec.case("a unit whose forward changes the row-split output raises"):
        model = rsdp.shard(GatedMLP(residual=True), tp_plan="auto")
        try:
            model(torch.randn(2, 12))
        except RuntimeError as e:
            assert "row-split layer's output as is" in str(e), str(e)
        else:
            raise AssertionError("a residual inside a unit was accepted")
    with rec.case("a wrong-width input is refused before any ring op, naming rank and unit"):
        torch.manual_seed(0)
        ref = GatedMLP()
        model = rsdp.shard(copy.deepcopy(ref), tp_plan="auto")
        ring = rsdp.rsdp_state(model).ring
        before = ring.hops
        try:
            model(torch.randn(2, 3, 10))
        except ValueError as e:
            msg = str(e)
            assert (f"rank {r}:" in msg and "GatedMLP" in msg and "in_features=12" in msg
                    and "(2, 3, 10)" in msg), msg
        else:
            raise AssertionError("a 10-wide input into a 12-wide unit was accepted")
        assert ring.hops == before, f"{ring.hops - before} ring shifts before the refusal"
        x = torch.randn(2, 3, 12, generator=_gen("width", 0))
        with torch.no_grad():  # the group is still usable
            _close(model(x), ref(x), "output after a refused call")
    with rec.case("bad plans are named"):
        bad = {"model.layers.*.mlp.gate_proj": "colwise", "model.layers.*.mlp.up_proj": "rowwise",
               "model.layers.*.mlp.down_proj": "rowwise"}
        try:
            rsdp.shard(_make("llama"), tp_plan=bad)
        except ValueError as e:
            assert "model.layers.0.mlp" in str(e) and "row-split" in str(e), str(e)
        else:
            raise AssertionError("a unit with two row-split layers was accepted")

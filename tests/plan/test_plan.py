"""torch_rsdp.plan: every strategy alone and all seven mixed train like one process.

One launch per world size runs the selected families (tests/support/harness.py ``run_families``):

* ``strategies``: each strategy alone and the seven-way mix (tests/support/plan_cases.py ``MIX``), SGD
  with momentum and AdamW, three steps, full state dict against one process (fp32, tight);
* ``hf``: Hugging Face Llama (GQA; tied and untied embeddings) and GPT-2 (``Conv1D``, tied
  embeddings) under mixed plans, and the unwrapped model loading the gathered state dict with
  ``strict=True``;
* ``accumulate``: two micro-batches (the first under ``plan.no_sync``) equal one batch;
* ``activation_checkpointing``: blocks recomputed in backward (torch's composable
  ``checkpoint``) under every kind of strategy;
* ``mixed_precision``: bf16 compute in every strategy, fp32 master weights and gradients;
* ``checkpoint``: a checkpoint taken under one plan loads under another and training continues
  identically;
* ``report``: per-unit resident bytes follow each strategy (1/W for sharded units, optimizer
  state 1/W for shard_optim);
* ``root_and_buckets``: FSDP units under a replicated root share one FSDP2 root; shard_optim
  broadcasts in several buckets, and a rank owning no parameter still steps;
* ``clip``: torch's own ``clip_grad_norm_`` under every strategy, the mix and a Llama plan
  gives one process's norm and clipped steps on every rank (``plan.clip_grad_norm_`` agrees);
* ``user_optimizer``: ``torch.optim.AdamW(model.parameters())`` built by the user trains like
  one process, and shard_optim's state is sharded all the same (state on one rank each);
* ``compile_and_ddp``: ``torch.compile`` of rotate and the mix trains like one process;
  ``DistributedDataParallel`` around a planned model raises on every rank, shards untouched;
* ``errors``: bad plans raise a clear ValueError on every rank before anything changes, and
  the group stays usable.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from support import plan_cases as pc
from support.harness import assert_family, backend_under_test, launch, launch_families, run_families

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="the rotate strategy needs the rsdp backend")

TIGHT = 2e-5


def _apply(model, p, **kw):
    import torch_rsdp.plan as plan
    return plan.apply(model, p, **kw)


def _full(model):
    import torch_rsdp.plan as plan
    return plan.full_state_dict(model, rank0_only=False)


def fam_strategies(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for opt_name in ("sgd", "adamw"):
        for p in pc.ALONE + ["mix"]:
            with rec.case(f"{p} {opt_name}"):
                base = pc.make_net()
                want = pc.reference(base, opt_name, W, 3)
                model = _apply(pc.make_net(seed=r), pc.MIX if p == "mix" else p)  # rank 0's wins
                opt = pc.plan_optim(model, opt_name)
                pc.train(model, opt, r, W, 3)
                pc.assert_close_sd(_full(model), want, TIGHT, f"{p}/{opt_name}")


def fam_hf(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    # GPT-2's key bias has a gradient that is zero up to rounding (softmax ignores it), which
    # Adam's normalisation would turn into full-size steps of noise: SGD for GPT-2.
    cases = [("llama", lambda s: pc.make_llama(s), pc.LLAMA_PLAN, "adamw"),
             ("llama_tied", lambda s: pc.make_llama(s, tied=True), pc.LLAMA_PLAN, "adamw"),
             ("gpt2", pc.make_gpt2, pc.GPT2_PLAN, "sgd"),
             # tied embedding and head in one rotate unit: RSDP shares one shard
             ("llama_tied_rotate", lambda s: pc.make_llama(s, tied=True), "rotate", "adamw"),
             ("gpt2_rotate", pc.make_gpt2, "rotate", "sgd")]
    for name, make, p, opt_name in cases:
        with rec.case(name):
            want = pc.reference(make(0), opt_name, W, 3)
            model = _apply(make(0), p)
            if name != "llama":  # tied: both uses still see one parameter
                emb = model.get_input_embeddings().weight
                assert model.get_output_embeddings().weight is emb, "tied weights came apart"
            pc.train(model, pc.plan_optim(model, opt_name), r, W, 3)
            got = _full(model)
            pc.assert_close_sd(got, want, TIGHT, name)
            fresh = make(5)
            fresh.load_state_dict(got, strict=True)


def fam_accumulate(ctx, rec):
    W, r = ctx.world_size, ctx.rank
    for p in ("mix", "full_shard", "split:2", "rotate", "no_shard"):
        with rec.case(p):
            want = pc.reference(pc.make_net(), "sgd", W, 2)
            model = _apply(pc.make_net(), pc.MIX if p == "mix" else p)
            pc.train(model, pc.plan_optim(model, "sgd"), r, W, 2, micro=2)
            pc.assert_close_sd(_full(model), want, TIGHT, f"{p} with no_sync")


def fam_activation_checkpointing(ctx, rec):
    from torch.distributed._composable import checkpoint
    W, r = ctx.world_size, ctx.rank
    for p in ("mix", "rotate", "split:2"):
        with rec.case(p):
            want = pc.reference(pc.make_net(), "sgd", W, 2)
            net = pc.make_net()
            for blk in net.blocks:
                checkpoint(blk)  # recompute each block's activations in backward
            model = _apply(net, pc.MIX if p == "mix" else p)
            pc.train(model, pc.plan_optim(model, "sgd"), r, W, 2)
            pc.assert_close_sd(_full(model), want, TIGHT, f"{p} with activation checkpointing")


def fam_mixed_precision(ctx, rec):
    from torch.distributed.fsdp import MixedPrecisionPolicy
    W, r = ctx.world_size, ctx.rank
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                              output_dtype=torch.float32)
    with rec.case("mix bf16"):
        want = pc.reference(pc.make_net(), "adamw", W, 3)
        model = _apply(pc.make_net(), pc.MIX, mp_policy=mp)
        seen = {}

        def note(name):
            def hook(mod, args, out):
                seen[name] = (args[0].dtype if args[0].is_floating_point() else None, out.dtype)
            return hook
        for name in ("emb", "blocks.0.fc1", "blocks.1.fc1", "blocks.2.fc1", "blocks.3.fc1",
                     "blocks.4.fc1", "blocks.5.fc1", "blocks.6.fc2", "head"):
            model.get_submodule(name).register_forward_hook(note(name))
        opt = pc.plan_optim(model, "adamw")
        pc.train(model, opt, r, W, 3)
        for name, (din, dout) in seen.items():
            assert din in (None, torch.bfloat16), f"{name} computed from {din} inputs"
        for n, p_ in model.named_parameters():
            assert p_.dtype == torch.float32, f"{n} master weights became {p_.dtype}"
        got = _full(model)
        pc.assert_close_sd(got, want, 3e-2, "mix bf16 (bf16 compute)")
        out = model(pc.batch(0, W)[0][:1])
        assert out.dtype == torch.float32, f"output_dtype not honoured: {out.dtype}"


def fam_checkpoint(ctx, rec):
    import torch_rsdp.plan as plan
    W, r = ctx.world_size, ctx.rank
    plan_b = {"emb": "full_shard", "blocks.*": "rotate", "blocks.2": "split:2",
              "head": "shard_optim"}
    with rec.case("plan A -> plan B"):
        a = _apply(pc.make_net(), pc.MIX)
        pc.train(a, pc.plan_optim(a, "adamw"), r, W, 2)
        ckpt = plan.full_state_dict(a)  # rank 0 only
        assert (len(ckpt) > 0) == (r == 0)
        objs = [ckpt]
        dist.broadcast_object_list(objs, src=0)
        ckpt = objs[0]
        plain = pc.make_net(seed=9)
        plain.load_state_dict(ckpt, strict=True)
        want = pc.reference(plain, "adamw", W, 2, start=2)
        b = _apply(pc.make_net(seed=7), plan_b)
        plan.load_full_state_dict(b, ckpt)
        pc.assert_close_sd(_full(b), ckpt, 0.0, "loaded under plan B")
        pc.train(b, pc.plan_optim(b, "adamw"), r, W, 2, start=2)
        pc.assert_close_sd(_full(b), want, TIGHT, "plan B continued")


def fam_report(ctx, rec):
    import torch_rsdp.plan as plan
    W, r = ctx.world_size, ctx.rank
    with rec.case("resident bytes"):
        model = _apply(pc.make_net(), {"blocks.0": "full_shard", "blocks.1": "shard_optim",
                                       "blocks.2": "rotate", "blocks.3": "split:2"})
        opt = pc.plan_optim(model, "adamw")
        pc.train(model, opt, r, W, 1)
        rep = {u.name: u for u in plan.report(model, opt).units}
        full = 4 * rep["blocks.0"].numel
        assert str(rep["blocks.0"]) and rep["blocks.0"].strategy == "full_shard"
        assert rep["blocks.0"].param_bytes * W <= 1.2 * full, rep["blocks.0"]  # rank 0 rounds up
        assert rep["blocks.1"].param_bytes == full, rep["blocks.1"]
        # AdamW keeps two moments per parameter; shard_optim keeps them for its own share
        assert rep["blocks.1"].optim_bytes < 2 * full * (0.75 if W > 1 else 1.01), rep["blocks.1"]
        assert rep[""].optim_bytes >= 2 * 4 * rep[""].numel, rep[""]
        assert rep["blocks.2"].param_bytes < full * (0.75 if W > 1 else 1.01), rep["blocks.2"]
        assert "blocks.2.ln.weight" in rep["blocks.2"].left_whole
        assert "blocks.3.fc1.bias" in rep["blocks.3"].left_whole
        text = str(plan.report(model, opt))
        assert "split:2" in text and "shard_optim" in text, text


def fam_root_and_buckets(ctx, rec):
    import torch_rsdp.plan as plan
    from torch_rsdp.plan._optim import optimizer_sharding
    from torch.distributed.fsdp import FSDPModule
    W, r = ctx.world_size, ctx.rank
    with rec.case("FSDP units under a replicated root share one FSDP2 root"):
        model = _apply(pc.make_net(), {"blocks.0": "full_shard", "blocks.1": "shard_grad_op",
                                       "blocks.2": "rotate"})  # the root stays no_shard
        assert isinstance(model, FSDPModule), type(model)
        assert not any(pl.is_shard() for p_ in model.head.parameters()
                       for pl in getattr(p_, "placements", ())), "the root sharded its own params"
        pc.train(model, pc.plan_optim(model, "sgd"), r, W, 1)
        root = model._get_fsdp_state()
        for name in ("blocks.0", "blocks.1"):
            st = model.get_submodule(name)._get_fsdp_state()
            # one communication context: a unit's reduce-scatter is freed by the next one's,
            # not held until the end of backward by a root of its own
            assert st._comm_ctx is root._comm_ctx and not st._is_root, name
    with rec.case("gradient buckets never span two units"):
        # the whole net is far below one 25 MiB bucket: without unit boundaries every
        # replicated parameter would share one bucket, allocated at the first gradient
        model = _apply(pc.make_net(), {"blocks.*": "no_shard", "blocks.3": "split:2"})
        st = plan.plan_state(model)
        unit_of = {id(p_): u.name for u in st.units.values() for p_ in u.params.values()}
        buckets = [{unit_of[id(p_)] for p_ in b.params} for b in st.grad_sync.buckets]
        assert all(len(b) == 1 for b in buckets), buckets
        # head, blocks.6 .. blocks.0, emb: the root's two are not neighbours in backward
        assert len(buckets) == 9 and len({u for b in buckets for u in b}) == 8, buckets
        pc.train(model, pc.plan_optim(model, "sgd"), r, W, 2)
        pc.assert_close_sd(_full(model), pc.reference(pc.make_net(), "sgd", W, 2), TIGHT,
                           "buckets per unit")
    with rec.case("shard_optim: many buckets, and ranks that own nothing"):
        base = pc.make_net()
        want = pc.reference(base, "adamw", W, 2)
        model = _apply(pc.make_net(seed=r), {"blocks.*": "shard_optim", "blocks.6.ln": "no_shard",
                                             "head": "shard_optim"})
        cls, kw = pc.OPTIMS["adamw"]
        opt = plan.make_optimizer(model, cls, bucket_bytes=600, **kw)  # a few params a bucket
        sh = optimizer_sharding(opt)
        assert len(sh.buckets(sh.owned[r])) >= 2 or not sh.owned[r]
        pc.train(model, opt, r, W, 2)
        pc.assert_close_sd(_full(model), want, TIGHT, "shard_optim bucketed")
        lone = _apply(pc.make_net(), {"blocks.6.ln": "shard_optim"})  # 2 params for W ranks
        opt = pc.plan_optim(lone, "adamw")
        pc.train(lone, opt, r, W, 1)
        want = pc.reference(pc.make_net(), "adamw", W, 1)
        pc.assert_close_sd(_full(lone), want, TIGHT, "shard_optim, 2 params")


def fam_errors(ctx, rec):
    import torch_rsdp.plan as plan
    W, r = ctx.world_size, ctx.rank
    bad = [("unknown strategy", {"blocks.0": "fully_shard"}, "unknown strategy 'fully_shard'"),
           ("no module", {"blocks.9": "full_shard"}, "match no module"),
           ("split:0", {"blocks.0": "split:0"}, "k >= 1"),
           ("split too fine", {"blocks.0.fc1": "split:99"}, "only 16 input features"),
           ("different plans", {"blocks.0": "full_shard" if r == 0 else "rotate"},
            "different plans"),
           ("bad on one rank", {"blocks.0": "full_shard" if r == 0 else "rotat"},
            "rotat" if r else "rank 1 rejected")]
    for name, p, words in bad:
        with rec.case(name):
            model = pc.make_net()
            before = {k: v.clone() for k, v in model.state_dict().items()}
            try:
                plan.apply(model, p)
            except ValueError as e:
                assert words in str(e), f"{name}: {e}"
            else:
                raise AssertionError(f"{name}: apply accepted {p}")
            assert not hasattr(model, "_rsdp_plan")
            for k, v in model.state_dict().items():
                assert torch.equal(v, before[k]), f"{name}: {k} changed"
    with rec.case("group usable afterwards"):
        t = torch.ones(3)
        dist.all_reduce(t)
        assert t.tolist() == [W] * 3
    with rec.case("applied twice"):
        model = _apply(pc.make_net(), "no_shard")
        try:
            plan.apply(model, "no_shard")
        except ValueError as e:
            assert "already" in str(e)
        else:
            raise AssertionError("apply twice accepted")


def fam_clip(ctx, rec):
    """torch's own clip_grad_norm_ over model.parameters() (what every trainer calls) gives
    the norm one process computes and clips alike on every rank, under every strategy, the
    mix and a Hugging Face Llama plan: every parameter is a DTensor (shards Shard(dim),
    replicas Replicate()). plan.clip_grad_norm_ agrees with it."""
    import torch_rsdp.plan as plan
    W, r = ctx.world_size, ctx.rank
    cases = [(p, pc.make_net, pc.MIX if p == "mix" else p) for p in pc.ALONE + ["mix"]]
    cases.append(("llama", lambda: pc.make_llama(0), pc.LLAMA_PLAN))
    for name, make, p in cases:
        with rec.case(name):
            want_norms, got_norms = [], []
            want = pc.reference(make(), "adamw", W, 3, clip=0.05, norms=want_norms)
            model = _apply(make(), p)
            pc.train(model, pc.plan_optim(model, "adamw"), r, W, 3, clip=0.05, norms=got_norms)
            assert min(want_norms) > 0.05, f"clipping never acted: {want_norms}"
            worst = max(abs(a - b) / b for a, b in zip(got_norms, want_norms))
            assert worst <= 1e-5, f"{name}: norms {got_norms} vs one process {want_norms}"
            pc.assert_close_sd(_full(model), want, TIGHT, f"{name} clipped")
            every = [torch.zeros(()) for _ in range(W)]
            dist.all_gather(every, torch.tensor(got_norms[-1]))
            assert len({float(t) for t in every}) == 1, f"{name}: ranks differ: {every}"
    with rec.case("plan.clip_grad_norm_ equals torch's"):
        model = _apply(pc.make_net(), pc.MIX)
        x, y = pc.batch(0, W)
        pc.loss_of(model, x[r * pc.PER_RANK:(r + 1) * pc.PER_RANK],
                   y[r * pc.PER_RANK:(r + 1) * pc.PER_RANK]).backward()
        ours = plan.grad_norm(model)
        theirs = pc.full(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
        assert abs(float(ours) - float(theirs)) <= 1e-5 * float(ours), (ours, theirs)


def fam_user_optimizer(ctx, rec):
    """The optimizer a trainer builds itself, ``torch.optim.AdamW(model.parameters())``,
    trains every strategy and the mix like one process, and the state of shard_optim
    parameters is sharded all the same (ZeRO-1 attached at its first step): each such
    parameter has state on exactly one rank."""
    import torch_rsdp.plan as plan
    from torch_rsdp.plan._optim import optimizer_sharding
    W, r = ctx.world_size, ctx.rank
    cls, kw = pc.OPTIMS["adamw"]
    for p in ["shard_optim", "rotate", "split:2", "mix"]:
        with rec.case(p):
            want = pc.reference(pc.make_net(), "adamw", W, 3)
            model = _apply(pc.make_net(), pc.MIX if p == "mix" else p)
            opt = cls(model.parameters(), **kw)
            pc.train(model, opt, r, W, 3)
            pc.assert_close_sd(_full(model), want, TIGHT, f"{p} with the user's AdamW")
            zero1 = plan.plan_state(model).shard_optim_params
            held = torch.tensor([sum(1 for q in zero1 if opt.state.get(q))])
            dist.all_reduce(held)
            assert held.item() == len(zero1), (p, held.item(), len(zero1))
            assert optimizer_sharding(opt) is not None or not zero1 or W == 1


def fam_compile_and_ddp(ctx, rec):
    """``torch.compile`` of a planned model (graph breaks at the ring steps and split
    layers) trains like one process; ``DistributedDataParallel`` around a planned model raises
    at construction on every rank and changes no shard (it never broadcasts over them)."""
    W, r = ctx.world_size, ctx.rank
    for p in ["rotate", "mix"]:
        with rec.case(f"torch.compile {p}"):
            want = pc.reference(pc.make_net(), "adamw", W, 2)
            model = _apply(pc.make_net(), pc.MIX if p == "mix" else p)
            compiled = torch.compile(model)
            pc.train(compiled, pc.plan_optim(model, "adamw"), r, W, 2)
            pc.assert_close_sd(_full(model), want, 1e-4, f"compiled {p}")
    with rec.case("DDP around a sharded model refuses"):
        model = _apply(pc.make_net(seed=r), "rotate")
        before = _full(model)
        try:
            torch.nn.parallel.DistributedDataParallel(model)
        except RuntimeError as e:
            assert "DistributedDataParallel is not needed" in str(e), e
        else:
            raise AssertionError("DDP accepted a sharded model")
        after = _full(model)
        assert all(torch.equal(before[k], after[k]) for k in before), "DDP changed a shard"


FAMILIES = {"clip": fam_clip, "compile_and_ddp": fam_compile_and_ddp, "user_optimizer": fam_user_optimizer, "strategies": fam_strategies, "hf": fam_hf, "accumulate": fam_accumulate,
            "activation_checkpointing": fam_activation_checkpointing,
            "mixed_precision": fam_mixed_precision, "checkpoint": fam_checkpoint,
            "report": fam_report, "errors": fam_errors, "root_and_buckets": fam_root_and_buckets}

# World size -> families: every size trains every strategy; the rest are spread so that each
# runs on an even and an odd size where it matters, keeping four launches in all.
BATCHES = {1: ["strategies"],
           2: ["strategies", "errors", "hf", "report", "compile_and_ddp"],
           3: ["strategies", "accumulate", "activation_checkpointing", "checkpoint",
               "mixed_precision", "report", "root_and_buckets", "clip", "user_optimizer"],
           4: ["strategies", "hf"]}


def families_worker(ctx, names):
    torch.set_num_threads(1)  # up to 4 ranks share 2 cores
    return run_families(ctx, FAMILIES, names)


PARAMS = [pytest.param(ws, fam, id=f"{fam}-ws{ws}") for ws, fams in BATCHES.items()
          for fam in fams]
_RESULTS: dict = {}


def _batch(ws, request):
    if ws not in _RESULTS:
        names = [f for f in BATCHES[ws] if any(
            getattr(it, "originalname", None) == "test_plan" and it.callspec.params == {
                "ws": ws, "family": f} for it in request.session.items)]
        _RESULTS[ws] = launch_families(
            lambda batch: launch(families_worker, ws, (batch,), deadline=600, pg_timeout=120),
            names, ws)[:2]
    return _RESULTS[ws]


@pytest.mark.parametrize("ws,family", PARAMS)
def test_plan(ws, family, request):
    results, errors = _batch(ws, request)
    assert_family(results, errors, family, f"world size {ws}")


def test_plan_spec_local():
    """Plan parsing, resolution and JSON round trip (no process group)."""
    import torch_rsdp.plan as plan
    from torch_rsdp.plan._spec import resolve
    p = plan.Plan({"blocks.*": "full_shard", "blocks.1*": "rotate", "blocks.2": "split:4",
                   "blocks.2.fc1": "no_shard"}, default="shard_optim")
    assert plan.Plan.from_json(p.to_json()) == p and p.digest() == plan.Plan.from_json(
        p.to_json()).digest()
    assert plan.Plan({"a": "rotate", "b": "no_shard"}).digest() == \
        plan.Plan({"b": "no_shard", "a": "rotate"}).digest()
    res = resolve(pc.make_net(), p)
    assert str(res.strategy_of_module("blocks.0.fc1")) == "full_shard"
    assert str(res.strategy_of_module("blocks.1.ln")) == "rotate"      # more literal characters
    assert str(res.strategy_of_module("blocks.2.fc2")) == "split:4"    # exact beats pattern
    assert str(res.strategy_of_module("blocks.2.fc1")) == "no_shard"   # deeper key wins
    assert str(res.strategy_of_module("head")) == "shard_optim"        # the default
    with pytest.raises(ValueError, match="equally"):
        resolve(pc.make_net(), plan.Plan({"blocks.?": "rotate", "blocks.*": "no_shard"}))
    for bad in ("split:0", "split:-2", "zero3", "split:x"):
        with pytest.raises(ValueError, match="strategy|k >= 1"):
            plan.Plan({"head": bad})
    with pytest.raises(TypeError):
        plan.Plan({"head": 3})

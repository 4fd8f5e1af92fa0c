"""Fine-tuning a pretrained model under RSDP: built on ``meta``, loaded shard by shard, LoRA
adapters on a frozen base (docs/finetuning.md).

Families, each against the same model built whole in one process (fp32, atol/rtol 1e-5):

* meta_loaders: a Llama (untied and tied) built on ``meta``, sharded, ``to_empty``, then loaded
  by each of the three loaders: ``set_model_state_dict(full_state_dict=True,
  broadcast_from_rank0=True)`` (rank 0 holds the model's state dict), ``dcp.load`` of a
  ``torch.distributed.checkpoint`` directory, and ``rsdp.load_pretrained`` of a
  ``save_pretrained`` directory split over several safetensors files: every shard, replica
  and buffer (the rotary tables no checkpoint holds included) equals the model built whole,
  and so do the logits (training from there is the parity tests' subject, tests/rsdp);
* meta_refusals: a forward before ``to_empty`` raises naming the rank; a checkpoint whose
  shapes differ names the rank, the tensor and both shapes; one that lacks a tensor names it;
  ``plan.apply`` refuses a meta model;
* replicas_agree: after ``to_empty``, replicated parameters that differ between ranks (a
  random init on the CPU draws each rank's own) are equal on every rank after the first
  forward;
* lora: peft LoRA on every projection, then ``rsdp.shard``: the adapters stay whole (reason
  "adapter"), ``report()`` counts trainable and frozen elements apart, three AdamW steps on the DDP loss give the adapters of one process, the frozen
  base's shards never hold a gradient; peft's ``merge_and_unload`` then gives the merged
  model of one process, and its ``full_state_dict`` loads into the plain architecture;
* lora_plans: the same under every strategy of ``torch_rsdp.plan`` (each alone on every
  block): the adapters equal one process's, the frozen base unchanged and without gradients;
* lora_meta: the same model built on ``meta``, wrapped by peft, sharded, materialised and
  loaded with ``load_pretrained``: it starts as the checkpoint (``lora_B`` zeros), its
  adapters agree on every rank, it trains, and ``save_pretrained`` on rank 0 of
  ``plan.full_state_dict`` writes an adapter that ``PeftModel.from_pretrained`` loads onto the
  base for the same logits.
* lora_units: LoRA inside rotation units (``tp_plan="auto"``, both ``unit_recompute``): the
  units form, the adapters stay whole and train as one process's, merge_and_unload works;
* checkpointing: Hugging Face's switch, ``checkpoint_wrapper`` and ``torch.utils.checkpoint``
  over units with LoRA, per-layer layers trained whole and with LoRA, and two forwards then
  one backward: the gradients of the run without checkpointing, at most 1.02x its bytes
  (``comm_stats``), and no output kept for a recompute left after backward.

One launch per world size (2, 3) runs every family; one more runs the adapter families over
gloo at 2 ranks. Needs ``transformers`` and ``peft``
(scripts/setup.sh installs them).
"""

from __future__ import annotations

import copy
import os

import pytest
import torch

from support.harness import assert_family, launch, launch_families, run_families
from support.hf_models import (LORA_TARGETS, _close, _lora, _loc, _loss, _make, _on_meta,
                               _saved_adapter)

WORLD_SIZES = (2, 3)

def _assert_equal_to(model, ref, what):
    """Every parameter (this rank's shard of it) and buffer of ``model`` equals ``ref``'s."""
    import torch_rsdp.rsdp as rsdp

    st = rsdp.rsdp_state(model)
    ref_sd = ref.state_dict()
    for key, p in model.named_parameters():
        want = st.local_shard_of(key, ref_sd[key].detach())
        _close(_loc(p).detach(), want, f"{what}: {key}", atol=0, rtol=0)
    ref_bufs = dict(ref.named_buffers())
    for key, b in model.named_buffers():
        _close(b, ref_bufs[key], f"{what}: buffer {key}", atol=0, rtol=0)


def fam_meta_loaders(ctx, rec, paths):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    import torch_rsdp.rsdp as rsdp

    r = ctx.rank
    for kind in ("llama", "llama_tied"):
        ref = _make(kind)
        dcp_dir = os.path.join(paths["work"], f"dcp-{kind}")
        dcp.save(rsdp.shard(copy.deepcopy(ref)).state_dict(), checkpoint_id=dcp_dir)
        for loader in ("broadcast_from_rank0", "dcp", "load_pretrained"):
            with rec.case(f"{kind} {loader}"):
                model = rsdp.shard(_on_meta(kind))
                model.to_empty(device="cpu")
                if loader == "broadcast_from_rank0":
                    sd = ref.state_dict() if dist.get_rank() == 0 else {}
                    set_model_state_dict(model, sd, options=StateDictOptions(
                        full_state_dict=True, broadcast_from_rank0=True))
                elif loader == "dcp":
                    sd = model.state_dict()
                    dcp.load(sd, checkpoint_id=dcp_dir)
                    model.load_state_dict(sd)
                else:
                    rsdp.load_pretrained(model, paths[kind])
                _assert_equal_to(model, ref, f"{kind} {loader}")
                _close(_loss(model, r)[1], _loss(ref, r)[1], f"{kind} {loader}: logits")


def fam_meta_refusals(ctx, rec, paths):
    import torch_rsdp.plan as plan
    import torch_rsdp.rsdp as rsdp

    r = ctx.rank
    with rec.case("forward before to_empty"):
        model = rsdp.shard(_on_meta("llama"))
        with pytest.raises(RuntimeError, match=rf"rank {r}: forward of a model sharded on "
                                               rf"the meta device \('model.embed_tokens"):
            _loss(model, r)
    with rec.case("shapes differ"):
        model.to_empty(device="cpu")
        with pytest.raises(ValueError, match=rf"rank {r}: 'model.layers.0.mlp.gate_proj.weight' "
                                             rf"has shape \[96, 48\] in the model but "
                                             rf"\[64, 48\] in the checkpoint"):
            rsdp.load_pretrained(model, paths["narrow"])
    with rec.case("a tensor missing"):
        with pytest.raises(ValueError, match=rf"rank {r}: the checkpoint .* has no "
                                             rf"'lm_head.weight'"):
            rsdp.load_pretrained(model, paths["llama_tied"])
    with rec.case("plan on meta"):
        with pytest.raises(ValueError, match="parameters on the meta device"):
            plan.apply(_on_meta("llama"), "rotate")


def fam_replicas_agree(ctx, rec, paths):
    import torch.distributed as dist

    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    with rec.case("llama"):
        model = rsdp.shard(_on_meta("llama"))
        model.to_empty(device="cpu")
        rsdp.load_pretrained(model, paths["llama"])
        norm = model.model.norm.weight
        with torch.no_grad():
            _loc(norm).add_(r)  # as a random init on the CPU would: each rank its own values
        _loss(model, r)
        got = [torch.empty_like(_loc(norm)) for _ in range(W)]
        dist.all_gather(got, _loc(norm).detach().contiguous())
        for q in range(1, W):
            _close(got[q], got[0], f"model.norm.weight on rank {q} against rank 0", atol=0,
                   rtol=0)


def _train_adapters(model, r, W, reference, steps=3):
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2, eps=1e-6)
    for step in range(steps):
        if reference:
            loss = sum(_loss(model, q, step)[0] for q in range(W)) / W
        else:
            loss = _loss(model, r, step)[0]
        loss.backward()
        opt.step()
        opt.zero_grad()


def _check_merge(model, ref, kind, r, what):
    """peft's ``merge_and_unload`` on the sharded model: the merged model computes the
    reference's merged logits, and its whole state dict loads into the plain architecture."""
    import torch.distributed as dist

    import torch_rsdp.plan as plan

    merged = model.merge_and_unload()
    want = copy.deepcopy(ref).merge_and_unload()
    _close(_loss(merged, r)[1], _loss(want, r)[1], f"{what}: logits after merge_and_unload")
    whole = plan.full_state_dict(merged)  # collective
    if dist.get_rank() == 0:
        plain = _make(kind)
        plain.load_state_dict(whole)
        _close(_loss(plain, r)[1], _loss(want, r)[1], f"{what}: merged state dict")


def fam_lora(ctx, rec, paths):
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    with rec.case("llama"):
        ref = _lora(_make("llama"))
        model = rsdp.shard(copy.deepcopy(ref))
        st = rsdp.rsdp_state(model)
        adapters = [e for e in st.left_whole if ".lora_" in e.name]
        assert len(adapters) == 2 * len(LORA_TARGETS) * 2, [e.name for e in adapters]
        assert all(e.reason.startswith("adapter") for e in adapters), adapters
        trainable, frozen = st.trainable_numel()
        want = [sum(_loc(p).numel() for p in model.parameters() if p.requires_grad is g)
                for g in (True, False)]
        assert [trainable, frozen] == want and trainable > 0, (trainable, frozen, want)
        assert f"{trainable:,} elements trainable, {frozen:,} frozen" in st.report()
        _train_adapters(model, r, W, reference=False)
        _train_adapters(ref, r, W, reference=True)
        ref_params = dict(ref.named_parameters())
        for key, p in model.named_parameters():
            if p.requires_grad:
                _close(_loc(p).detach(), ref_params[key].detach(), f"adapter {key}")
            else:
                assert p.grad is None, f"the frozen {key} holds a gradient"
    with rec.case("merge_and_unload"):
        _check_merge(model, ref, "llama", r, "per layer")


def fam_lora_plans(ctx, rec, paths):
    """LoRA on a frozen base under every strategy of torch_rsdp.plan, alone on every block."""
    from torch.distributed.tensor import DTensor

    import torch_rsdp.plan as plan
    from support.plan_cases import ALONE

    r, W = ctx.rank, ctx.world_size
    base = _lora(_make("llama"))
    ref = copy.deepcopy(base)
    _train_adapters(ref, r, W, reference=True)
    ref_params = dict(ref.named_parameters())
    for strategy in ALONE:
        with rec.case(strategy):
            model = plan.apply(copy.deepcopy(base), strategy)
            opt = plan.make_optimizer(model, torch.optim.AdamW, lr=1e-2, eps=1e-6)
            for step in range(3):
                _loss(model, r, step)[0].backward()
                opt.step()
                opt.zero_grad()
            for key, p in model.named_parameters():
                whole = p.full_tensor() if isinstance(p, DTensor) else p  # collective
                if p.requires_grad:
                    _close(whole.detach(), ref_params[key].detach(), f"{strategy}: {key}")
                else:
                    assert p.grad is None, f"{strategy}: the frozen {key} holds a gradient"
                    _close(whole.detach(), ref_params[key].detach(), f"{strategy}: {key}",
                           atol=0, rtol=0)


def fam_lora_meta(ctx, rec, paths):
    import torch.distributed as dist

    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    with rec.case("llama"):
        base = _make("llama")
        model = rsdp.shard(_lora(_on_meta("llama")))
        model.to_empty(device="cpu")
        rsdp.load_pretrained(model, paths["llama"])
        loss, logits = _loss(model, r)
        _close(logits, _loss(base, r)[1], "logits of the loaded model with fresh adapters")
        a = model.base_model.model.model.layers[0].self_attn.q_proj.lora_A["default"].weight
        got = [torch.empty_like(_loc(a)) for _ in range(W)]
        dist.all_gather(got, _loc(a).detach().contiguous())
        assert got[0].abs().sum() > 0, "lora_A was not initialised"
        for q in range(1, W):
            _close(got[q], got[0], f"lora_A on rank {q} against rank 0", atol=0, rtol=0)
        _train_adapters(model, r, W, reference=False)
        loaded = _saved_adapter(model, "llama", os.path.join(paths["work"], "adapter"))
        _close(_loss(loaded, r)[1], _loss(model, r)[1], "logits of the saved adapter on the base")


def fam_lora_units(ctx, rec, paths):
    """LoRA layers inside rotation units ([Note: adapters inside a unit]): the units form,
    the adapters stay whole and train as one process's, the frozen base holds no gradient."""
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    ref0 = _lora(_make("llama_u"))
    ref = copy.deepcopy(ref0)
    _train_adapters(ref, r, W, reference=True)
    ref_params = dict(ref.named_parameters())
    for recompute in (False, True):
        with rec.case(f"unit_recompute={recompute}"):
            model = rsdp.shard(copy.deepcopy(ref0), tp_plan="auto", unit_recompute=recompute)
            st = rsdp.rsdp_state(model)
            units = sorted(n for n in st.sharded if n.endswith(("self_attn", "mlp")))
            assert len(units) == 4 and not st.not_units, (units, st.not_units)
            assert all(e.reason.startswith("adapter") for e in st.left_whole
                       if ".lora_" in e.name)
            _train_adapters(model, r, W, reference=False)
            for key, p in model.named_parameters():
                if p.requires_grad:
                    _close(_loc(p).detach(), ref_params[key].detach(), f"adapter {key}")
                else:
                    assert p.grad is None, f"the frozen {key} holds a gradient"
            # the base layers move in the tree; the units keep their shards
            _check_merge(model, ref, "llama_u", r, f"unit_recompute={recompute}")
    with rec.case("DoRA refused by name"):
        from peft import LoraConfig, get_peft_model

        dora = get_peft_model(_make("llama_u"), LoraConfig(r=4, target_modules=LORA_TARGETS,
                                                           use_dora=True))
        st = rsdp.rsdp_state(rsdp.shard(dora, tp_plan="auto"))
        why = st.not_units["base_model.model.model.layers.0.self_attn"]
        assert "q_proj is a peft layer the unit cannot split" in why and "Dora" in why, why
        assert "not rotation units" in st.report()


class _Checkpointed(torch.nn.Module):
    """A layer run through ``torch.utils.checkpoint.checkpoint(use_reentrant=False)``, as a
    user who writes it by hand does."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args, **kwargs):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.inner, *args, use_reentrant=False, **kwargs)


def _enable_checkpointing(model, switch):
    """Checkpoints every decoder layer of ``model`` (a peft model or not) by ``switch``."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    hf = model.base_model.model if hasattr(model, "peft_config") else model
    if switch == "hf":
        hf.gradient_checkpointing_enable()
        return
    layers = hf.model.layers
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer) if switch == "wrapper" else _Checkpointed(layer)


def _step_bytes_and_grads(model, r, switch, twice=False):
    """(bytes this rank sent in one step, after a first step; the step's gradients by name)."""
    import torch_rsdp

    for p in model.parameters():
        p.grad = None
    _loss(model, r, 0)[0].backward()
    for p in model.parameters():
        p.grad = None
    torch_rsdp.reset_comm_stats()
    if twice:  # two forwards, then one backward of both: each recompute finds its own output
        (_loss(model, r, 1)[0] + _loss(model, r, 2)[0]).backward()
    else:
        _loss(model, r, 1)[0].backward()
    sent = torch_rsdp.comm_stats()["intra_node_bytes"]
    names = {n: n.replace("_checkpoint_wrapped_module.", "").replace("inner.", "")
             for n, _ in model.named_parameters()}
    return sent, {names[n]: _loc(p.grad).clone() for n, p in model.named_parameters()
                  if p.grad is not None}


def fam_checkpointing(ctx, rec, paths):
    """[Note: checkpointing without a second rotation]: each switch of activation
    checkpointing gives the gradients of the run without it and sends no more bytes (within
    1.02x); every output kept for a recompute is gone after backward."""
    import torch_rsdp.rsdp as rsdp

    r = ctx.rank
    cases = [("lora units", "llama_u", True, "auto", s) for s in ("hf", "wrapper", "torch")]
    cases += [("layers", "llama", False, None, s) for s in ("hf", "wrapper")]
    cases += [("lora layers", "llama", True, None, "torch"),
              ("lora units, two forwards", "llama_u", True, "auto", "wrapper")]
    for what, kind, lora, tp_plan, switch in cases:
        with rec.case(f"{what} {switch}"):
            base = _make(kind)
            if lora:
                base = _lora(base)
                for name, p in base.named_parameters():  # B = 0 would hide B's slicing
                    if "lora_B" in name:
                        torch.nn.init.normal_(p, std=0.1, generator=torch.Generator()
                                              .manual_seed(len(name)))
            twice = "two" in what
            plain = rsdp.shard(copy.deepcopy(base), tp_plan=tp_plan)
            sent0, grads0 = _step_bytes_and_grads(plain, r, switch, twice)
            model = rsdp.shard(copy.deepcopy(base), tp_plan=tp_plan)
            _enable_checkpointing(model, switch)
            kept = []
            model.register_forward_hook(lambda *_: kept.append(sum(
                len(m.__dict__.get("_rsdp_kept", ())) for m in model.modules())))
            sent, grads = _step_bytes_and_grads(model, r, switch, twice)
            assert kept and kept[-1] > 0, f"{what}: nothing computed under the checkpoint"
            alive = [m for m in model.modules()
                     if any(k() is not None and k().y is not None
                            for k in m.__dict__.get("_rsdp_kept", ()))]
            assert not alive, f"{what}: outputs still kept after backward: {alive[:3]}"
            assert sorted(grads) == sorted(grads0), (sorted(grads), sorted(grads0))
            for name, g in grads.items():
                _close(g, grads0[name], f"{what}: gradient of {name}")
            assert sent <= 1.02 * sent0, f"{what}: {sent} bytes a step against {sent0} without"



def fam_offload(ctx, rec, paths):
    """Offload on the stand-in device (support/offload_checks.py)."""
    from support import offload_checks, standin_device

    offload_checks.check_offload(ctx, rec, paths, standin_device.setup(), standin_device.MEMORY)

FAMILIES = {"meta_loaders": fam_meta_loaders, "meta_refusals": fam_meta_refusals,
            "replicas_agree": fam_replicas_agree, "lora": fam_lora, "lora_plans": fam_lora_plans,
            "lora_meta": fam_lora_meta, "lora_units": fam_lora_units,
            "checkpointing": fam_checkpointing, "offload": fam_offload}


def families_worker(ctx, names, paths):
    torch.set_num_threads(1)
    # before any backward: autograd's engine sizes its device queues once, at the first one
    from support import standin_device

    standin_device.setup()
    import transformers

    transformers.logging.set_verbosity_error()
    fams = {n: (lambda c, rec, f=f: f(c, rec, paths)) for n, f in FAMILIES.items()}
    return run_families(ctx, fams, names)


# --------------------------------------------------------------------------------------------
# pytest side
# --------------------------------------------------------------------------------------------

PARAMS = [pytest.param(ws, fam, id=f"{fam}-ws{ws}") for ws in WORLD_SIZES for fam in FAMILIES]
_BATCH: dict = {}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """save_pretrained directories (split over several files) of the models the families load,
    and a narrower Llama whose MLP does not fit them."""
    import transformers

    from support import hf_models

    transformers.logging.set_verbosity_error()
    root = tmp_path_factory.mktemp("finetune")
    paths = {"work": str(root)}
    for kind in ("llama", "llama_tied", "wide"):
        paths[kind] = str(root / kind)
        _make(kind).save_pretrained(paths[kind], max_shard_size="40KB")
    cls, cfg = hf_models._config("llama")
    cfg.intermediate_size = 64
    paths["narrow"] = str(root / "narrow")
    cls(cfg).save_pretrained(paths["narrow"])
    return paths


def _batch(ws, request, paths):
    """One launch per world size for every selected family."""
    if ws in _BATCH:
        return _BATCH[ws]
    names = [f for f in FAMILIES if any(
        getattr(it, "originalname", None) == "test_rsdp_finetune" and it.callspec.params == {
            "ws": ws, "family": f} for it in request.session.items)]
    results, errors, _ = launch_families(
        lambda batch: launch(families_worker, ws, (batch, paths), deadline=600,
                             pg_timeout=120), names, ws)
    _BATCH[ws] = (results, errors)
    return _BATCH[ws]


@pytest.mark.parametrize("ws,family", PARAMS)
def test_rsdp_finetune(ws, family, request, checkpoints):
    results, errors = _batch(ws, request, checkpoints)
    assert_family(results, errors, family, f"world size {ws}")


def test_lora_on_gloo(checkpoints):
    """The adapter families over gloo: nothing of the above leans on the rsdp backend."""
    names = ["lora", "lora_plans", "lora_meta"]
    results, errors, _ = launch_families(
        lambda batch: launch(families_worker, 2, (batch, checkpoints), backend="gloo",
                             deadline=600, pg_timeout=120, allow_exit_abort=True), names, 2)
    for name in names:
        assert_family(results, errors, name, "gloo, world size 2")


def test_offload_needs_a_host_backend():
    """Offload rotates host buffers: a group with a backend for CUDA only (as
    ``init_process_group("nccl")`` makes) is refused before anything changes, naming the
    fix; its replicas' collectives would run on the device."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    import torch_rsdp.rsdp as rsdp
    from torch_rsdp._host_staging import collective_device, has_backend

    class CudaOnly:
        def _get_backend(self, device):
            if device.type != "cuda":
                raise RuntimeError(f"No backend type associated with device type {device.type}")
            return object()

    cuda = torch.device("cuda", 0)
    assert not has_backend(CudaOnly(), torch.device("cpu"))
    assert collective_device(CudaOnly(), cuda) == cuda
    model = _make("llama")
    with pytest.raises(ValueError, match=r"no backend for CPU tensors.*cpu:rsdp,cuda:nccl"):
        rsdp.shard(model, CudaOnly(), offload_policy=CPUOffloadPolicy())
    assert not hasattr(model, "_rsdp_root")


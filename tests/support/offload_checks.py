"""Offload at shard granularity, checked end to end on a device: [Note: shards offloaded to
host memory] in torch_rsdp/rsdp/_rotation/device_copies.py.

:func:`check_offload` runs the same cases on whatever device it is given: the stand-in device
in CPU CI (tests/rsdp/test_rsdp_finetune.py, family ``offload``: support/standin_device.py,
whose ops raise on a host tensor) and CUDA on a GPU (tests/cuda/test_cuda.py,
``test_cuda_offload``). Each against one process on the CPU:

* trained whole: a Llama (untied, and with the head tied to the embedding) built on
  ``meta``, sharded with ``CPUOffloadPolicy``, materialised on the device and loaded with
  ``load_pretrained``, trained two AdamW steps: every shard,
  its gradient and its optimizer state in host memory, everything else on the device, the
  parameters those of one process;
* mixed precision: bf16 compute over float32 master shards on the host, logits and
  gradients of one process within bf16's precision;
* moved to the device, then sharded: the shards leave the device, and stay on the host when
  the model is moved to the device again (as the Hugging Face ``Trainer`` does), a cast is
  refused, the logits are one process's;
* refusal: an ``offload_policy`` that is not FSDP2's names the type expected;
* ``plan.apply(model, "rotate", offload_policy=...)``: placement and parity as above; on CUDA
  also ``"full_shard"`` (FSDP2's own offload, whose gathers need a device backend the
  stand-in does not have); ``"split:2"`` refused by name;
* LoRA per layer (also under Hugging Face's checkpointing, on CUDA only: torch's recompute
  inside backward aborts a Python device backend) and in rotation units (also with
  ``unit_recompute``) on a model whose weights outweigh its activations:
  the adapters train as one process's, and the device's peak during a step is at most what
  the model computed whole holds beyond its weights plus two flat shards (the one in hand
  and its gradient contribution), and below this rank's share of the model; the adapter,
  gathered by ``plan.full_state_dict`` and saved by peft on rank 0, loads onto the base with
  the adapter values of one process.
"""
from __future__ import annotations

import copy
import os

import torch

from .hf_models import _close, _ids, _lora, _loc, _make, _on_meta, _saved_adapter


class CudaMemory:
    """:data:`.standin_device.MEMORY`'s interface over torch's CUDA allocator statistics."""

    @property
    def current(self) -> int:
        return torch.cuda.memory_allocated()

    @property
    def peak(self) -> int:
        return torch.cuda.max_memory_allocated()

    def reset_peak(self) -> None:
        torch.cuda.reset_peak_memory_stats()


# AdamW's first steps move an element by about lr whatever its gradient's size, so rounding
# differences in small gradients show at lr times their relative size (2.5e-5 for the wide
# model's adapters at 2 ranks without offload)
ADAM_TOL = dict(atol=1e-4, rtol=1e-4)


def _train_on(model, r, W, device, reference, steps=2):
    """``steps`` AdamW steps of every trainable parameter, on this rank's batches (or on all
    ranks' with ``reference``), the inputs on ``device``; returns the optimizer."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, eps=1e-6)
    for step in range(steps):
        qs = range(W) if reference else [r]
        loss = sum(model(input_ids=_ids(q, step).to(device), labels=_ids(q, step).to(device)).loss
                   for q in qs) / len(qs)
        loss.backward()
        opt.step()
        opt.zero_grad()
    return opt


def _offloaded(kind, device, paths, ref, pin_memory=False, **kw):
    """``kind`` built on ``meta`` (with LoRA if ``ref`` has it), sharded with shards in host
    memory, materialised on ``device``, loaded from its checkpoint, adapters as ``ref``'s."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    import torch_rsdp.rsdp as rsdp

    lora = any(".lora_" in n for n, _ in ref.named_parameters())
    model = _on_meta(kind)
    model = rsdp.shard(_lora(model) if lora else model,
                       offload_policy=CPUOffloadPolicy(pin_memory=pin_memory), **kw)
    model.to_empty(device=device)
    rsdp.load_pretrained(model, paths[kind])
    if lora:
        ref_params = dict(ref.named_parameters())
        with torch.no_grad():
            for n, p in model.named_parameters():
                if p.requires_grad:
                    _loc(p).copy_(_loc(ref_params[n]))
    return model


def _placement(model, device, pinned=False):
    """(bytes of this rank's shards, of its largest flat shard); asserts every shard is in
    host memory (pinned if ``pinned``) and everything else on ``device``."""
    # every sharded module's state, under rsdp.shard or a plan's rotate units
    states = {id(m._rsdp): m._rsdp for m in model.modules()
              if hasattr(getattr(m, "_rsdp", None), "flat")}
    assert states, "no sharded module"
    flats = {k: st.flat for k, st in states.items()}
    shard_ids = {id(st.param(n)) for st in states.values() for n in st.names}
    for n, p in model.named_parameters():
        want = "cpu" if id(p) in shard_ids else device.type
        assert _loc(p).device.type == want, f"{n} on {_loc(p).device}, expected {want}"
        if p.grad is not None:
            assert _loc(p.grad).device.type == want, f"{n}'s gradient on {_loc(p.grad).device}"
    for n, b in model.named_buffers():
        assert b.device.type == device.type, f"buffer {n} on {b.device}"
    for f in flats.values():
        assert f.device.type == "cpu" and (f.is_pinned() or not pinned), (f.device, pinned)
    sizes = [f.untyped_storage().nbytes() for f in flats.values()]
    return sum(sizes), max(sizes)


def _close_whole(model, ref, what):
    """Every parameter of ``model``, gathered whole (collective), against ``ref``'s."""
    from torch.distributed.tensor import DTensor

    ref_params = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        whole = p.full_tensor() if isinstance(p, DTensor) else p
        _close(whole.detach().to("cpu"), ref_params[n].detach(), f"{what}: {n}", **ADAM_TOL)


def _trained_whole(kind, dev, paths, r, W, pin_memory):
    """``kind`` built on meta, offloaded, trained whole: placement of every shard, gradient
    and optimizer state, and the parameters of one process."""
    import torch_rsdp.rsdp as rsdp

    ref = _make(kind)
    model = _offloaded(kind, dev, paths, ref, pin_memory)
    opt = _train_on(model, r, W, dev, reference=False)
    _train_on(ref, r, W, "cpu", reference=True)
    _placement(model, dev, pin_memory)
    shard_ids = {id(p) for p in model.parameters() if _loc(p).device.type == "cpu"}
    assert shard_ids, "no parameter in host memory"
    for p, state in opt.state.items():
        want = "cpu" if id(p) in shard_ids else dev.type
        for k, v in state.items():
            if torch.is_tensor(v) and v.dim():
                assert _loc(v).device.type == want, f"optimizer {k} on {_loc(v).device}"
    st = rsdp.rsdp_state(model)
    ref_params = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        _close(_loc(p).detach().to("cpu"), st.local_shard_of(n, ref_params[n].detach()), n,
               **ADAM_TOL)


def _save_adapter(model, ref, paths, r):
    """The trained adapter of an offloaded ``model``, gathered and saved by peft on rank 0,
    loads onto the CPU base with ``ref``'s adapter values (``ref`` trained alike)."""
    loaded = _saved_adapter(model, "wide", os.path.join(paths["work"], "offloaded-adapter"))
    ref_params = dict(ref.named_parameters())
    for n, p in loaded.named_parameters():
        if ".lora_" in n:
            _close(p.detach(), ref_params[n].detach(), f"saved adapter {n}", **ADAM_TOL)


def _mixed_precision(dev, paths, r, W, pin_memory):
    """bf16 compute over float32 master shards in host memory (FSDP2's ``MixedPrecisionPolicy``
    beside the offload): logits and gradients of one process within bf16's precision, the
    master shards and their gradients float32 on the host."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    import torch_rsdp.rsdp as rsdp

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                              output_dtype=torch.float32)
    ref = _make("llama_tied")
    model = _offloaded("llama_tied", dev, paths, ref, pin_memory, mp_policy=mp)
    ids = _ids(r)
    out = model(input_ids=ids.to(dev), labels=ids.to(dev))
    out.loss.backward()
    (sum(ref(input_ids=_ids(q), labels=_ids(q)).loss for q in range(W)) / W).backward()
    _close(out.logits.detach().to("cpu"), ref(input_ids=ids).logits.detach(), "bf16 logits",
           5e-2, 5e-2)
    _placement(model, dev, pin_memory)
    st = rsdp.rsdp_state(model)
    ref_params = dict(ref.named_parameters())
    for n, p in model.named_parameters():
        assert p.dtype == torch.float32 and p.grad.dtype == torch.float32, n
        exp = st.local_shard_of(n, ref_params[n].grad)
        _close(_loc(p.grad).to("cpu"), exp, f"bf16 grad of {n}", 2e-2, 5e-2)


def check_offload(ctx, rec, paths, dev, mem, pin_memory=False):
    """The cases, on ``dev``; ``mem`` counts its bytes (``current``, ``peak``,
    ``reset_peak()``: :data:`.standin_device.MEMORY` or :class:`CudaMemory`); ``paths``: the
    ``save_pretrained`` directories of ``llama``, ``llama_tied`` and ``wide``, and ``work``, a
    directory every rank sees."""
    import torch_rsdp.rsdp as rsdp

    r, W = ctx.rank, ctx.world_size
    for kind in ("llama", "llama_tied"):
        with rec.case(f"{kind} trained whole"):
            _trained_whole(kind, dev, paths, r, W, pin_memory)
    with rec.case("mixed precision"):
        _mixed_precision(dev, paths, r, W, pin_memory)
    with rec.case("moved to the device, then sharded"):
        from torch.distributed.fsdp import CPUOffloadPolicy

        ref = _make("llama")
        model = rsdp.shard(copy.deepcopy(ref).to(dev),
                           offload_policy=CPUOffloadPolicy(pin_memory=pin_memory))
        _placement(model, dev, pin_memory)
        model.to(dev)  # the Hugging Face Trainer moves every model to its device: a no-op
        _placement(model, dev, pin_memory)
        try:
            model.to(torch.float16)
        except ValueError as e:
            assert "converting a sharded model" in str(e), e
        else:
            raise AssertionError("casting an offloaded model was accepted")
        _close(model(input_ids=_ids(r).to(dev)).logits.to("cpu"), ref(input_ids=_ids(r)).logits,
               "logits")
    with rec.case("refusal"):
        try:
            rsdp.shard(_make("llama"), offload_policy="cpu")
        except TypeError as e:
            assert "offload_policy must be a torch.distributed.fsdp.CPUOffloadPolicy" in str(e), e
        else:
            raise AssertionError("offload_policy='cpu' was accepted")
    import torch_rsdp.plan as plan

    # FSDP2 gathers on the device: the stand-in has no backend for it
    for strategy in ("rotate", "full_shard") if dev.type == "cuda" else ("rotate",):
        with rec.case(f"plan.apply {strategy}"):
            ref = _make("llama")
            model = plan.apply(copy.deepcopy(ref).to(dev), strategy,
                               offload_policy=CPUOffloadPolicy(pin_memory=pin_memory))
            _train_on(model, r, W, dev, reference=False)
            _train_on(ref, r, W, "cpu", reference=True)
            if strategy == "rotate":
                _placement(model, dev, pin_memory)
            else:  # FSDP2 shards every parameter; its own offload keeps them all on the host
                for n, p in model.named_parameters():
                    assert _loc(p).device.type == "cpu", f"{n} on {_loc(p).device}"
            _close_whole(model, ref, f"plan.apply {strategy}")
    with rec.case("plan.apply split refused"):
        try:
            plan.apply(_make("llama"), "split:2",
                       offload_policy=CPUOffloadPolicy(pin_memory=False))
        except ValueError as e:
            assert "split:k cannot offload" in str(e), e
        else:
            raise AssertionError("split:2 with an offload policy was accepted")
    for what, kw, ckpt in (("lora per layer", {}, False),
                           ("lora per layer, checkpointed", {}, True),
                           ("lora units", {"tp_plan": "auto"}, False),
                           ("lora units, unit_recompute", {"tp_plan": "auto",
                                                           "unit_recompute": True}, False)):
        if ckpt and dev.type != "cuda":
            # torch's checkpoint recomputes inside backward, on autograd's thread for the
            # device, where a Python device backend aborts the process (the model alone, on
            # the stand-in, without RSDP): this case runs on CUDA only
            continue
        with rec.case(what):
            ref = _lora(_make("wide"))
            on_device = _offloaded("wide", dev, paths, ref, pin_memory, **kw)
            share, largest = _placement(on_device, dev, pin_memory)
            # a first matmul makes cuBLAS's workspace, which CUDA's allocator counts and keeps
            torch.ones(8, 8, device=dev) @ torch.ones(8, 8, device=dev)
            base = mem.current
            mem.reset_peak()
            _train_on(on_device, r, W, dev, reference=False)
            peak = mem.peak - base
            whole = copy.deepcopy(ref).to(dev)  # the model whole on the device, one process
            if ckpt:  # Hugging Face's switch, on both: the bound compares like with like
                for m in (on_device, whole):
                    m.base_model.model.gradient_checkpointing_enable()
            base = mem.current
            mem.reset_peak()
            _train_on(whole, r, W, dev, reference=False)
            beyond_weights = mem.peak - base
            del whole
            _train_on(ref, r, W, "cpu", reference=True)
            _placement(on_device, dev, pin_memory)
            ref_params = dict(ref.named_parameters())
            for n, p in on_device.named_parameters():
                if p.requires_grad:
                    _close(_loc(p).detach().to("cpu"), ref_params[n].detach(), f"adapter {n}",
                           **ADAM_TOL)
            # beyond what the model computed whole holds beyond its weights, at most the
            # shard in hand and its gradient contribution; never this rank's share
            assert peak <= beyond_weights + 2 * largest, (what, peak, beyond_weights, largest)
            assert peak < share, (what, peak, share)
    with rec.case("adapter saved and loaded by peft"):
        _save_adapter(on_device, ref, paths, r)


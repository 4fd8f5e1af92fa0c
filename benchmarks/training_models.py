"""What the training-style suites and the examples share: the seed's TransformerLM (only
Linear, Embedding and LayerNorm, so RSDP can shard every large weight), `wrap` (one strategy:
rsdp, fsdp2 per block and root, or ddp), memory as torch's MemTracker measures it, and process
helpers.
"""
from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

# the examples reach these through this module
from .common import (default_threads, fmt_bytes, free_port, md_table, median,  # noqa: F401
                     proc_status_kib, tune_for_oversubscription)

STRATEGIES = ("rsdp", "fsdp2", "ddp")

# --------------------------------------------------------------------------------- the model


class Block(nn.Module):
    """Pre-norm decoder block: x + Attn(LN(x)), then x + FFN(LN(x)); causal attention."""

    def __init__(self, d_model: int, heads: int, ffn: int):
        super().__init__()
        if d_model % heads:
            raise ValueError(f"d_model {d_model} is not divisible by heads {heads}")
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.ff1 = nn.Linear(d_model, ffn)
        self.ff2 = nn.Linear(ffn, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        split = lambda y: y.view(b, t, self.heads, d // self.heads).transpose(1, 2)  # noqa: E731
        a = F.scaled_dot_product_attention(split(self.q(h)), split(self.k(h)), split(self.v(h)),
                                           is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, t, d))
        return x + self.ff2(F.gelu(self.ff1(self.ln2(x))))


class TransformerLM(nn.Module):
    def __init__(self, vocab: int, d_model: int, ffn: int, heads: int, layers: int,
                 seq_len: int, checkpoint_activations: bool = False):
        super().__init__()
        self.vocab = vocab
        self.checkpoint_activations = checkpoint_activations
        self.tok = nn.Embedding(vocab, d_model)
        self.pos = nn.Embedding(seq_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, ffn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d_model)
        self.out = nn.Linear(d_model, vocab)
        with torch.no_grad():  # GPT-2 style initialisation (identical on every rank per seed)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear) and m.bias is not None:
                    nn.init.zeros_(m.bias)
            for blk in self.blocks:  # scale the residual projections
                blk.o.weight.mul_(1 / math.sqrt(2 * layers))
                blk.ff2.weight.mul_(1 / math.sqrt(2 * layers))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(pos)
        ckpt = self.checkpoint_activations and torch.is_grad_enabled()
        for blk in self.blocks:
            if ckpt:
                x = torch.utils.checkpoint.checkpoint(blk, x, use_reentrant=False)
            else:
                x = blk(x)
        return self.out(self.ln_f(x))


def lm_loss(logits: torch.Tensor, targets: torch.Tensor, ignore_index: int = -100):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1),
                           ignore_index=ignore_index)


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------- strategies


def rsdp_import():
    """``(torch_rsdp.rsdp module, None)`` or ``(None, reason)``."""
    try:
        import torch_rsdp.rsdp as rsdp  # (importing torch_rsdp registers the backend)
        return rsdp, None
    except Exception as exc:  # noqa: BLE001
        return None, f"{type(exc).__name__}: {exc}"


def backend_import(backend: str):
    """None if ``backend`` can be used here, else the reason it cannot."""
    if backend in ("gloo", "nccl", "mpi"):
        return None
    if backend == "rsdp":
        try:
            import torch_rsdp  # noqa: F401
            return None
        except Exception as exc:  # noqa: BLE001
            return f"cannot import torch_rsdp ({type(exc).__name__}: {exc})"
    return f"unknown backend {backend!r}"


def wrap(model: nn.Module, strategy: str, device: torch.device, group=None) -> nn.Module:
    """Applies ``strategy`` to ``model`` (identically initialised on every rank) over ``group``
    (None: the default group). Collective."""
    if strategy == "rsdp":
        rsdp, why = rsdp_import()
        if rsdp is None:
            raise RuntimeError(f"rsdp: not available: {why}")
        return rsdp.shard(model, group)
    if strategy == "fsdp2":
        from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
        mesh = (init_device_mesh(device.type, (dist.get_world_size(),)) if group is None
                else DeviceMesh.from_group(group, device.type))
        return fully_shard_blocks(model, blocks_of(model), mesh)
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, process_group=group, gradient_as_bucket_view=True,
                   device_ids=[device.index] if device.type == "cuda" else None)
    raise ValueError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")


def blocks_of(model: nn.Module):
    """The repeated blocks (FSDP2's units) of a TransformerLM or a Hugging Face Llama."""
    inner = getattr(model, "module", model)
    return inner.model.layers if hasattr(inner, "model") else inner.blocks


def fully_shard_blocks(model: nn.Module, blocks, mesh=None) -> nn.Module:
    """FSDP2 as its documentation applies it: each block a unit, then the root."""
    from torch.distributed.fsdp import fully_shard
    for blk in blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def llama(seed: int = 0, **config) -> nn.Module:
    """A Hugging Face LlamaForCausalLM from LlamaConfig keywords, the same weights on every
    rank (seeded)."""
    import transformers as tf
    tf.logging.set_verbosity_error()
    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(tf.LlamaConfig(**config))


def token_batch(vocab: int, rows: int, cols: int, seed: int) -> torch.Tensor:
    """Random token ids, the same for a seed on every rank."""
    return torch.randint(0, vocab, (rows, cols), generator=torch.Generator().manual_seed(seed))


def hf_step(model: nn.Module, opt, ids: torch.Tensor, labels=None) -> float:
    """One training step of a Hugging Face causal LM on ``ids``; returns the loss."""
    loss = model(input_ids=ids, labels=ids if labels is None else labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss.item()


def timed_steps(step, n: int, warmup: int = 0, first: int = 0) -> list:
    """step(i) for i from ``first``, ``warmup`` untimed then ``n`` timed, each after a barrier;
    this rank's times of the timed ones."""
    import time
    times = []
    for i in range(first, first + warmup + n):
        dist.barrier()
        t0 = time.perf_counter()
        step(i)
        if i >= first + warmup:
            times.append(time.perf_counter() - t0)
    return times


def load_plan(spec: str):
    """A ``torch_rsdp.plan.Plan`` from a JSON file, or a strategy name (kept as the string:
    ``plan.apply`` makes it one unit per block)."""
    import torch_rsdp.plan as plan
    if spec.endswith(".json") or os.path.isfile(spec):
        with open(spec) as f:
            return plan.Plan.from_json(f.read())
    plan.Plan({"": spec})  # a bad name fails here, before any process starts
    return spec


# ------------------------------------------------------------------------------------ memory

#: torch's MemTracker categories, as the tables name them
MEM_CATS = {"Parameter": "params", "Buffer": "buffers", "Gradient": "grads",
            "Optstate": "optim", "Activation": "activations", "Temp": "temp", "Other": "other"}

METHOD = ("peak memory/rank = torch's MemTracker (torch.distributed._tools.mem_tracker) over the "
          "last training step: the model's parameters and buffers and the optimizer's state "
          "held from before it, plus every tensor storage torch allocates during it, each "
          "storage counted once, at the step's peak; max over ranks. Its split at that peak: "
          "params, buffers (the modules' registered buffers), grads (what parameters' gradient "
          "hooks receive), optim (optimizer state and the optimizer step's temporaries), "
          "activations (allocated in forward, gathered weights and communication buffers "
          "included), temp (allocated in backward: activations' gradients, gradients a "
          "strategy accumulates in its own buffers, communication buffers). Memory a backend "
          "allocates outside torch (its staging) is not counted. Peak RSS: VmHWM from "
          "/proc/self/status (reset via clear_refs after start-up where allowed), max over ranks.")


class NoModuleTracking:
    """Stands in for MemTracker's module tracker where that cannot run: it puts a gradient
    hook on every parameter, which torch refuses on a frozen one (a LoRA base, under FSDP2 as
    under RSDP). Without it gradients count as activations and nothing as temp; the peak is
    the same."""

    is_bw = False
    parents: set = set()

    def register_user_hooks(self, *hooks):
        pass

    def clear_user_hooks(self):
        pass

    def get_known_fqn(self, module):
        return ""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def memtracker(*held, modules: bool = True):
    """torch's MemTracker, told of ``held`` (modules, optimizers, tensors): everything the
    tracked code views must be among them, since MemTracker counts a view of a storage it does
    not know as a new allocation of all of it. ``modules=False``: NoModuleTracking."""
    from torch.distributed._tools.mem_tracker import MemTracker
    mt = MemTracker()
    if not modules:
        mt._mod_tracker = NoModuleTracking()
    mt.track_external(*held)
    return mt


def tracked_peak(mt) -> dict:
    """MemTracker's categories at its peak ("Total", "Parameter", ...; the largest device)."""
    snap = mt.get_tracker_snapshot("peak")
    peak = max(snap.values(), key=lambda d: d.get("Total", 0)) if snap else {}
    return {getattr(k, "value", k): float(v) for k, v in peak.items()}


def memtracker_peak(fn, *held, modules: bool = False) -> dict:
    """tracked_peak of MemTracker over ``fn()``; by default without the module tracker
    (frozen LoRA bases refuse its hooks), so every suite calling this counts alike."""
    mt = memtracker(*held, modules=modules)
    with mt:
        fn()
    return tracked_peak(mt)


def peak_beyond(fn, *held) -> float:
    """The peak of what ``fn()`` holds on top of ``held`` (their parameters, buffers and
    state): activations, gathered or rotating weights, gradients, optimizer state."""
    peak = memtracker_peak(fn, *held)
    return peak.get("Total", 0) - peak.get("Parameter", 0) - peak.get("Buffer", 0)


def resident_bytes(model: nn.Module) -> int:
    """Bytes of this rank's share of ``model``: its parameters' local tensors (a DTensor's
    shard) and its buffers, each storage counted once."""
    seen, n = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        loc = getattr(t, "_local_tensor", t)
        if id(loc) not in seen:
            seen.add(id(loc))
            n += loc.numel() * loc.element_size()
    return n


# ------------------------------------------------------------------------------------ process


def reset_peak_rss() -> bool:
    """Resets VmHWM to the current RSS (Linux: write 5 to clear_refs)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def gather_floats(values, device=None) -> list:
    """All-gather a list of floats from every rank: returns [rank][i]."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    out = [torch.zeros_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(out, t)
    return [o.tolist() for o in out]


def load_average() -> str:
    try:
        return " ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "?"


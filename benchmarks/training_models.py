"""What the training-style suites and the examples share: the seed's TransformerLM (only
Linear, Embedding and LayerNorm, so RSDP can shard every large weight), `wrap` (one strategy:
rsdp, fsdp2 per block and root, ddp, or a torch_rsdp.plan), the memory measurements
(ParamMemoryTracker, MemTracker's peak) and process helpers.
"""
from __future__ import annotations

import math
import os
from typing import Optional

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

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
        import torch_rsdp  # noqa: F401  (registers the backend)
        import torch_rsdp.rsdp as rsdp
        if not callable(getattr(rsdp, "shard", None)):
            return None, "torch_rsdp.rsdp has no shard()"
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


def wrap(model: nn.Module, strategy: str, device: torch.device) -> nn.Module:
    """Applies ``strategy`` to ``model`` (identically initialised on every rank). Collective."""
    world = dist.get_world_size()
    if strategy == "rsdp":
        rsdp, why = rsdp_import()
        if rsdp is None:
            raise RuntimeError(f"rsdp: not available: {why}")
        return rsdp.shard(model)
    if strategy == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        return fully_shard_blocks(model, model.blocks, init_device_mesh(device.type, (world,)))
    if strategy.startswith("plan="):
        return wrap_plan(model, strategy[len("plan="):])
    if strategy == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP
        return DDP(model, device_ids=[device.index] if device.type == "cuda" else None,
                   gradient_as_bucket_view=True)
    raise ValueError(f"unknown strategy {strategy!r} (choose from {', '.join(STRATEGIES)})")


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


def wrap_plan(model: nn.Module, spec: str) -> nn.Module:
    import torch_rsdp.plan as plan
    return plan.apply(model, load_plan(spec))


def make_optimizer(model: nn.Module, lr: float) -> torch.optim.Optimizer:
    """Adam over ``model``; for a planned model through ``plan.make_optimizer`` (which shards
    the state of ``shard_optim`` units)."""
    if getattr(model, "_rsdp_plan", None) is not None:
        import torch_rsdp.plan as plan
        return plan.make_optimizer(model, torch.optim.Adam, lr=lr)
    return torch.optim.Adam(model.parameters(), lr=lr)


# ------------------------------------------------------------------------------------ memory


def _local(t):
    if t is None:
        return None
    loc = getattr(t, "_local_tensor", None)  # DTensor
    return loc if loc is not None else t


class ParamMemoryTracker(TorchDispatchMode):
    """Peak bytes of parameters + gradients + optimizer state + gathered/communication buffers.

    Method: while active (one training step), after **every** dispatched aten/c10d op, and
    after every RSDP rotation-buffer allocation, the tracker sums the bytes of the distinct
    live storages (each storage counted once, at its current size) of

    * ``params``: every tensor in any module's ``_parameters`` (so FSDP2's unsharded
      parameters while a block is unsharded, DDP's full replicas, RSDP's local shards) and
      ``model.parameters()`` (FSDP2: the local shard of each DTensor);
    * ``grads``: their ``.grad`` (DDP: views of the gradient buckets);
    * ``optim``: every tensor in ``optimizer.state``;
    * ``buffers``: FSDP2's per-parameter all-gather outputs and unsharded parameters (also
      while not registered on a module, e.g. prefetched) and their gradients; every tensor
      passed to or returned by a c10d / functional-collective / fsdp op (all-gather and
      reduce-scatter flat buffers, DDP buckets); and RSDP's rotation / gradient-accumulator
      buffers (reported by ``torch_rsdp.rsdp._rotation.memory.alloc_buffer``);
    * ``activations``: every tensor autograd saves for backward (a saved-tensors hook), unless
      it is one of the above (a weight saved by a matmul is a parameter). ``peak`` and
      ``peak_breakdown`` are the parameter-related peak (the first four categories);
      ``peak_all`` and ``peak_all_breakdown`` the peak of all five.

    Buffers and activations are held through storage weak references, so tracking never
    extends a lifetime. Memory only grows at allocations, and every allocation is an op (or an
    RSDP buffer), so sampling after each op sees the peak, up to temporaries internal to one
    op and to tensors that are neither saved nor communicated (peak RSS covers everything).
    """

    CATS = ("params", "grads", "optim", "buffers")  # parameter-related: ``peak``
    ALL_CATS = CATS + ("activations",)               # everything tracked: ``peak_all``

    def __init__(self, model: nn.Module, optimizer: Optional[torch.optim.Optimizer] = None):
        super().__init__()
        self.model = model
        self.optimizer = optimizer
        self.modules = list(model.modules())
        self.fsdp_params = []
        for m in self.modules:
            get_state = getattr(m, "_get_fsdp_state", None)
            if get_state is not None:
                pg = get_state()._fsdp_param_group
                if pg is not None:
                    self.fsdp_params.extend(pg.fsdp_params)
        self._refs: dict = {}  # storage cdata -> StorageWeakRef
        self._acts: dict = {}  # the same, for tensors saved for backward
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self.peak = 0
        self.peak_breakdown = dict.fromkeys(self.CATS, 0)
        self.peak_all = 0
        self.peak_all_breakdown = dict.fromkeys(self.ALL_CATS, 0)
        self.samples = 0
        self._prev_rsdp = None

    def _pack(self, t):
        self.track(t, self._acts)
        return t

    # --- registration of communication / rotation buffers
    def track(self, t, into: Optional[dict] = None) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef
        t = _local(t)
        if not isinstance(t, torch.Tensor) or t.is_meta:
            return
        try:
            s = t.untyped_storage()
        except Exception:  # noqa: BLE001  (exotic subclasses)
            return
        ref = StorageWeakRef(s)
        (self._refs if into is None else into).setdefault(ref.cdata, ref)

    # Hooks called by torch_rsdp.rsdp._rotation.memory while this tracker is installed as its _ACTIVE.
    def _on_alloc(self, t) -> None:
        self.track(t)
        self.sample()

    def __getattr__(self, name):
        # every other hook (_on_release: storage counts while it is really alive, through the
        # weak references, not while RSDP holds it; a hook added later) does nothing
        if name.startswith("_on_"):
            return lambda *a, **k: None
        raise AttributeError(name)

    def _install(self, active: bool) -> None:
        try:
            import torch_rsdp.rsdp._rotation.memory as rmem
        except Exception:  # noqa: BLE001
            return
        if active:
            self._prev_rsdp, rmem._ACTIVE = rmem._ACTIVE, self
        else:
            rmem._ACTIVE = self._prev_rsdp

    def __enter__(self):
        self._install(True)
        self.sample()
        self._saved_hooks.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        self._install(False)
        self.sample()
        self._saved_hooks.__exit__(*exc)
        self._refs.clear()
        self._acts.clear()
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.namespace in ("c10d", "_c10d_functional", "c10d_functional", "fsdp"):
            for t in tree_flatten((args, kwargs, out))[0]:
                if isinstance(t, torch.Tensor):
                    self.track(t)
        self.sample()
        return out

    # --- sampling
    def sample(self) -> int:
        seen: dict = {}
        by_cat = dict.fromkeys(self.ALL_CATS, 0)

        def count(s, cat):
            ptr, n = s.data_ptr(), s.nbytes()
            if n and ptr not in seen:
                seen[ptr] = cat
                by_cat[cat] += n

        def add(t, cat):
            t = _local(t)
            if isinstance(t, torch.Tensor):
                try:
                    count(t.untyped_storage(), cat)
                except Exception:  # noqa: BLE001  (exotic subclasses)
                    pass

        params = []
        for m in self.modules:
            params.extend(m._parameters.values())
        params.extend(self.model.parameters())
        for p in params:
            add(p, "params")
        for p in params:
            add(getattr(p, "grad", None), "grads")
        if self.optimizer is not None:
            for st in self.optimizer.state.values():
                for v in st.values():
                    add(v, "optim")
        for fp in self.fsdp_params:
            for t in getattr(fp, "all_gather_outputs", ()):
                add(t, "buffers")
            up = getattr(fp, "_unsharded_param", None)
            if up is not None:
                add(up, "buffers")
                add(up.grad, "buffers")
        for refs, cat in ((self._refs, "buffers"), (self._acts, "activations")):
            dead = []
            for key, ref in refs.items():
                if ref.expired():
                    dead.append(key)
                    continue
                count(torch.UntypedStorage._new_with_weak_ptr(ref.cdata), cat)
            for key in dead:
                del refs[key]
        total = sum(by_cat[c] for c in self.CATS)
        self.samples += 1
        if total > self.peak:
            self.peak, self.peak_breakdown = total, {c: by_cat[c] for c in self.CATS}
        everything = total + by_cat["activations"]
        if everything > self.peak_all:
            self.peak_all, self.peak_all_breakdown = everything, by_cat
        return total


METHOD = ("peak parameter-related memory = max over one training step of the bytes of distinct "
          "live storages of parameters + gradients + optimizer state + gathered/communication "
          "buffers (FSDP2 all-gather outputs and unsharded params/grads, collective in/out "
          "buffers, RSDP rotation/accumulator buffers), sampled after every dispatched op "
          "(TorchDispatchMode) and every RSDP buffer allocation; max over ranks (with "
          "activations, the tensors saved for backward, where a table says so). Peak RSS: VmHWM from /proc/self/status (reset via clear_refs "
          "after start-up where allowed), max over ranks.")


# ------------------------------------------------------------------------------------ process


class NoModuleTracking:
    """Stands in for MemTracker's module tracker, for a benchmark that needs a step's peak, not
    its split by module: the module tracker's gradient hooks raise inside a rotation unit's
    backward (it runs ``autograd.grad`` on each shard's graph) and on frozen parameters. Without
    it every allocation outside parameters, gradients and optimizer state counts as an
    activation."""

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


def resident_bytes(model: nn.Module) -> int:
    """Bytes of this rank's share of ``model``: its parameters' local tensors (a DTensor's
    shard) and its buffers, each storage counted once."""
    seen, n = set(), 0
    for t in list(model.parameters()) + list(model.buffers()):
        loc = _local(t)
        if id(loc) not in seen:
            seen.add(id(loc))
            n += loc.numel() * loc.element_size()
    return n


def memtracker_peak(fn, *held) -> dict:
    """torch's MemTracker over ``fn()``, its categories at the peak (Total, Parameter,
    Gradient, Optstate, ...), without its per-module split (NoModuleTracking). ``held``
    (modules, optimizers) must name every tensor ``fn`` views: MemTracker counts a view of a
    storage it does not know as a new allocation of all of it."""
    from torch.distributed._tools.mem_tracker import MemTracker
    mt = MemTracker()
    mt._mod_tracker = NoModuleTracking()
    mt.track_external(*held)
    with mt:
        fn()
    snap = mt.get_tracker_snapshot("peak")
    peak = max(snap.values(), key=lambda d: d.get("Total", 0)) if snap else {}
    return {k: float(v) for k, v in peak.items()}


def peak_beyond(fn, *held) -> float:
    """The peak of what ``fn()`` holds on top of ``held`` (their parameters, buffers and
    state): activations, gathered or rotating weights, gradients, optimizer state."""
    peak = memtracker_peak(fn, *held)
    return peak.get("Total", 0) - peak.get("Parameter", 0) - peak.get("Buffer", 0)


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


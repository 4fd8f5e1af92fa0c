"""What the planner measures, on this machine, through this backend; cached on disk.

Per *unit* (a module the plan decides for), from one forward of the whole model under
``no_grad`` that records each unit's inputs, then each unit run alone with those inputs:

* forward and backward time at the example micro-batch (every rank runs at once, as in
  training, and the slowest rank's median counts), plain, and with each candidate strategy
  applied to a copy of the unit (so its collectives, their overlap with compute and the cost of
  sharing the cores are measured, not modelled), the strategies taking turns over three rounds;
* parameter bytes (owned by the unit, tied parameters counted once, at their owner), the part
  ``split:k`` can slice (Linear / Conv1D weights) and the part ``rotate`` can shard;
* activations saved for backward (a saved-tensors hook; parameters excluded) and the peak of
  the other tensors the unit creates in forward and backward (temporaries), from a dispatch
  mode that follows every op's outputs.

Units with the same structure and input shapes (the layers of a transformer) are measured
once. Only one unit's backward graph, or one copy of a unit, is alive at a time and the model
is never gathered or copied whole, so profiling needs the model's parameters plus about one
unit's parameters, gradients and activations.

Per collective kind (all-gather, reduce-scatter, all-reduce, broadcast, ring shift) and group
level (the whole group; with several nodes also inside a node and along a rail): a fit
``t = latency + bytes / bandwidth`` from timed calls at several sizes.

The optimizer step's cost per parameter byte comes from timing the optimizer on the largest
unit's parameters.

The result is cached (``RSDP_PLAN_CACHE``, default ``~/.cache/torch_rsdp/plans``) under a key
made of the model's structure (module classes, parameter names, shapes, dtypes), the example
inputs' shapes, the units, the optimizer, the world size and the topology; any change gives a
new key.
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from ..._utils import all_gather_tensor, group_rank0, reduce_scatter_tensor
from ..._ring import ring_shift
from .._apply import apply
from .._cost_terms import Fit, UnitProfile
from .._mesh import Meshes, device_type_of

# UnitProfile and Fit live in ..cost_terms (the handlers price with them too); they stay
# importable from here.
__all__ = ["UnitProfile", "Fit", "Profile", "profile_model", "OPTIMIZER_STATE_FACTOR",
           "cache_dir"]

#: Optimizer state per parameter byte, by the optimizer's state rule.
OPTIMIZER_STATE_FACTOR = {"adamw": 2.0, "adam": 2.0, "sgd_momentum": 1.0, "sgd": 0.0,
                          "adagrad": 1.0, "rmsprop": 1.0}
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "broadcast", "ring_shift")
SIZES = (16 << 10, 256 << 10, 2 << 20, 8 << 20)


@dataclass
class Profile:
    key: str
    world: int
    nodes: List[List[int]]
    optimizer: str
    units: List[UnitProfile]                  # in execution order
    fits: Dict[str, Fit]                      # "kind@level" -> fit
    optim_s_per_byte: float
    from_cache: bool = False

    def to_json(self) -> str:
        d = dataclasses.asdict(self)
        d.pop("from_cache")
        return json.dumps(d)

    @classmethod
    def from_json(cls, text: str) -> "Profile":
        d = json.loads(text)
        d["units"] = [UnitProfile(**u) for u in d["units"]]
        d["fits"] = {k: Fit(**v) for k, v in d["fits"].items()}
        return cls(**d)


def cache_dir() -> str:
    return os.environ.get("RSDP_PLAN_CACHE",
                          os.path.join(os.path.expanduser("~"), ".cache", "torch_rsdp", "plans"))


# ------------------------------------------------------------------------------ the cache key
def _shapes(obj) -> list:
    return [(tuple(t.shape), str(t.dtype)) if isinstance(t, torch.Tensor) else repr(t)
            for t in tree_flatten(obj)[0]]


def profile_key(model: nn.Module, example_inputs, units, optimizer: str,
                world: int, nodes) -> str:
    h = hashlib.sha256()
    for name, mod in model.named_modules():
        h.update(f"{name}:{type(mod).__qualname__};".encode())
    for name, p in model.named_parameters(remove_duplicate=False):
        # a frozen parameter changes backward's time and memory, and the cost model's terms
        h.update(f"{name}:{tuple(p.shape)}:{p.dtype}:{p.requires_grad};".encode())
    h.update(repr((_shapes(example_inputs), units, optimizer, world, nodes, 5)).encode())
    return h.hexdigest()[:24]


# ------------------------------------------------------------------------------- memory probes
class _LiveTracker(TorchDispatchMode):
    """Peak bytes of the storages created by ops while active (each counted once, while
    alive); storages in ``exclude`` (parameters) never count."""

    def __init__(self, exclude: set):
        super().__init__()
        self.exclude = exclude
        self.refs = {}
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and not t.is_meta:
                s = t.untyped_storage()
                if s.data_ptr() not in self.exclude:
                    ref = StorageWeakRef(s)
                    self.refs.setdefault(ref.cdata, (ref, s.nbytes()))
        live = 0
        for key, (ref, n) in list(self.refs.items()):
            if ref.expired():
                del self.refs[key]
            else:
                live += n
        self.peak = max(self.peak, live)
        return out


def _clone_inputs(args, kwargs):
    def f(x):
        if type(x).__name__.endswith("Cache"):
            return None  # a KV cache would grow, and chain the runs' graphs, at every run
        if isinstance(x, torch.Tensor):
            y = x.detach().clone()
            if y.is_floating_point():
                y.requires_grad_(True)
            return y
        return x
    return tree_map(f, args), tree_map(f, kwargs)


def _measure_unit(mod: nn.Module, args, kwargs, reps: int) -> Tuple[float, float, int, int]:
    """(forward s, backward s, saved-activation bytes, temporaries' peak bytes)."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in mod.parameters()}
    fwd, bwd = [], []
    saved = {}

    def pack(t):
        s = t.untyped_storage()
        if s.data_ptr() not in param_ptrs:
            saved[s.data_ptr()] = s.nbytes()
        return t

    for i in range(reps + 1):
        a, k = _clone_inputs(args, kwargs)
        t0 = time.perf_counter()
        if i == reps:  # the last run measures memory only (the probes slow it down)
            tracker = _LiveTracker(param_ptrs)
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), tracker:
                out = mod(*a, **k)
                outs = [t for t in tree_flatten(out)[0]
                        if isinstance(t, torch.Tensor) and t.requires_grad]
                ins = [t for t in tree_flatten((a, k))[0]
                       if isinstance(t, torch.Tensor) and t.requires_grad]
                if outs and ins:  # inputs only: parameter gradients are the gradients' share
                    torch.autograd.grad(outs, ins, [torch.ones_like(t) for t in outs],
                                        allow_unused=True)
            act = sum(saved.values())
            return (statistics.median(fwd) if fwd else 0.0,
                    statistics.median(bwd) if bwd else 0.0, act, max(0, tracker.peak - act))
        out = mod(*a, **k)
        t1 = time.perf_counter()
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor) and t.requires_grad]
        if outs:
            torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
        t2 = time.perf_counter()
        if i > 0:  # the first run warms up
            fwd.append(t1 - t0)
            bwd.append(t2 - t1)
        del out, outs
        mod.zero_grad(set_to_none=True)
    raise AssertionError("unreachable")


def _time_strategies(mod: nn.Module, args, kwargs, strategies, group, reps: int,
                     rounds: int = 3) -> Dict[str, float]:
    """Median seconds of forward + backward of a copy of ``mod`` under each strategy (its
    collectives included). Collective. The strategies take turns, ``rounds`` times, so that a
    slow spell of the machine touches all of them alike instead of one, and each round starts
    one strategy later, so that none always follows the same one (what a heavy strategy
    leaves behind, on the link or in the allocator, then touches each in turn); one copy is
    alive at a time.

    The optimizer step is left out, and priced per byte stepped (:func:`_optimizer_cost`):
    summed over units timed alone, each with every rank stepping at once right after a
    barrier, measured steps overestimated a whole training step by up to 1.7x here."""

    times: Dict[str, List[float]] = {s: [] for s in strategies}
    per_round = max(1, -(-reps // rounds))
    for rd in range(rounds):
        for s in strategies[rd % len(strategies):] + strategies[:rd % len(strategies)]:
            holder = nn.Module()
            holder.unit = copy.deepcopy(mod)
            apply(holder, {"unit": s}, group=group, sync_module_states=False)
            for i in range(per_round + 1):
                a, k = _clone_inputs(args, kwargs)
                dist.barrier(group=group)
                t0 = time.perf_counter()
                out = holder.unit(*a, **k)
                outs = [t for t in tree_flatten(out)[0]
                        if isinstance(t, torch.Tensor) and t.requires_grad]
                if outs:
                    torch.autograd.backward(outs, [torch.ones_like(t) for t in outs])
                if i:  # the first run warms up
                    times[s].append(time.perf_counter() - t0)
                del out, outs
                holder.zero_grad(set_to_none=True)
            del holder
    return {s: statistics.median(t) for s, t in times.items()}


def _record_inputs(model: nn.Module, example_inputs, names: List[str]):
    """(execution order, {unit: (args, kwargs)}) from one no-grad forward."""
    order, inputs, handles = [], {}, []
    for n in names:
        if not n:
            continue
        mod = model.get_submodule(n)

        def hook(m, args, kwargs, n=n):
            if n not in inputs:
                order.append(n)
                inputs[n] = tree_map(lambda x: x.detach() if isinstance(x, torch.Tensor) else x,
                                     (args, kwargs))
        handles.append(mod.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            args, kwargs = _as_args(example_inputs)
            model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    return order, inputs


def _as_args(example_inputs):
    if isinstance(example_inputs, dict):
        return (), example_inputs
    if isinstance(example_inputs, (tuple, list)):
        return tuple(example_inputs), {}
    return (example_inputs,), {}


def _signature(mod: nn.Module, inp) -> str:
    parts = [type(mod).__qualname__]
    parts += [f"{n}:{tuple(p.shape)}" for n, p in mod.named_parameters()]
    parts += [str(s) for s in _shapes(inp)]
    return hashlib.sha256(";".join(parts).encode()).hexdigest()[:16]


# ---------------------------------------------------------------------------- collective fits
def _time_collective(kind: str, nbytes: int, group, reps: int = 3) -> float:
    W = dist.get_world_size(group)
    n = max(W, nbytes // 4)
    n -= n % W
    x = torch.ones(n)
    times = []
    for i in range(reps + 1):
        dist.barrier(group=group)
        t0 = time.perf_counter()
        if kind == "all_gather":
            out = torch.empty(n)
            all_gather_tensor(out, x[: n // W], group=group)
        elif kind == "reduce_scatter":
            out = torch.empty(n // W)
            reduce_scatter_tensor(out, x, group=group)
        elif kind == "all_reduce":
            dist.all_reduce(x, group=group)
        elif kind == "broadcast":
            dist.broadcast(x, src=group_rank0(group), group=group)
        else:
            ring_shift(x, out=x, group=group)
        if i:
            times.append(time.perf_counter() - t0)
    t = torch.tensor([statistics.median(times)], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _fit(points: List[Tuple[int, float]]) -> Fit:
    """Least-squares ``t = a + b * bytes`` (a, b >= 0)."""
    xs, ys = [float(x) for x, _ in points], [y for _, y in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else 0.0
    b = max(b, 1e-13)
    a = max(0.0, my - b * mx)
    return Fit(a, 1.0 / b)


def _fits(group, meshes) -> Dict[str, Fit]:
    levels = {"group": group}
    if len(meshes.nodes()) > 1:
        hm = meshes.hybrid()
        levels.update(intra=hm.get_group("shard"), inter=hm.get_group("replicate"))
    out = {}
    for level, g in levels.items():
        if dist.get_world_size(g) == 1:
            for kind in KINDS:
                out[f"{kind}@{level}"] = Fit(0.0, float("inf"))
            continue
        for kind in KINDS:
            out[f"{kind}@{level}"] = _fit([(s, _time_collective(kind, s, g)) for s in SIZES])
    return out


# ------------------------------------------------------------------------------- entry point
def profile_model(model: nn.Module, example_inputs, unit_params: Dict[str, Dict[str, int]],
                  *, group=None, optimizer: str = "adamw", meshes=None, reps: int = 9,
                  use_cache: bool = True, strategies: Optional[Callable] = None) -> Profile:
    """Measures (or loads) the profile. Collective. ``unit_params``: unit name -> byte counts
    {"numel", "param_bytes", "linear_bytes", "rotate_bytes"} of what the unit owns;
    ``strategies(unit_profile) -> [names]``: the strategies to time each unit with."""
    meshes = meshes or Meshes(group, device_type_of(model))
    world, nodes = dist.get_world_size(group), meshes.nodes()
    names = list(unit_params)
    cand = {n: tuple(strategies(UnitProfile(n, **unit_params[n]))) if strategies else ()
            for n in names}
    key = profile_key(model, example_inputs, (names, sorted(cand.items())), optimizer, world,
                      nodes)
    path = os.path.join(cache_dir(), f"{key}.json")
    hit = [use_cache and os.path.exists(path)]
    dist.broadcast_object_list(hit, src=group_rank0(group),
                               group=group)
    if hit[0]:
        text = [open(path).read() if dist.get_rank(group) == 0 else None]
        dist.broadcast_object_list(text, src=group_rank0(group),
                                   group=group)
        prof = Profile.from_json(text[0])
        prof.from_cache = True
        return prof

    order, inputs = _record_inputs(model, example_inputs, names)
    order += [n for n in names if n not in order]  # the root / units never called directly
    by_sig: Dict[str, tuple] = {}
    units = []
    for n in order:
        u = UnitProfile(n, **unit_params[n])
        if n in inputs:
            mod = model.get_submodule(n)
            u.signature = _signature(mod, inputs[n])
            if u.signature not in by_sig:
                plain = _measure_unit(mod, *inputs[n], reps)
                timed = _time_strategies(mod, *inputs[n], list(cand[n]), group, reps)
                by_sig[u.signature] = (plain, timed)
            (u.fwd_s, u.bwd_s, u.act_bytes, u.temp_bytes), u.strategy_s = by_sig[u.signature]
            u.strategy_s = dict(u.strategy_s)
        units.append(u)
    # The slowest rank's times count (ranks share the machine as in training).
    slots = [(u, key) for u in units for key in ["fwd_s", "bwd_s", *sorted(u.strategy_s)]]
    t = torch.tensor([getattr(u, k) if k in ("fwd_s", "bwd_s") else u.strategy_s[k]
                      for u, k in slots] or [0.0], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    for (u, k), v in zip(slots, t.tolist()):
        if k in ("fwd_s", "bwd_s"):
            setattr(u, k, v)
        else:
            u.strategy_s[k] = v
    prof = Profile(key, world, nodes, optimizer, units, _fits(group, meshes),
                   _optimizer_cost(model, optimizer, units))
    # Every rank plans from rank 0's profile (the few numbers measured per rank differ).
    text = [prof.to_json()]
    dist.broadcast_object_list(text, src=group_rank0(group), group=group)
    prof = Profile.from_json(text[0])
    if dist.get_rank(group) == 0 and use_cache:
        os.makedirs(cache_dir(), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(prof.to_json())
        os.replace(tmp, path)
    return prof


def _optimizer_cost(model: nn.Module, optimizer: str, units: List[UnitProfile]) -> float:
    """Seconds per parameter byte of one optimizer step (timed on a scratch copy)."""
    n = max([u.numel for u in units] + [1 << 16])
    n = min(n, 1 << 24)
    p = nn.Parameter(torch.zeros(n))
    p.grad = torch.full_like(p, 1e-3)
    cls = {"adamw": torch.optim.AdamW, "adam": torch.optim.Adam, "sgd": torch.optim.SGD,
           "sgd_momentum": torch.optim.SGD, "adagrad": torch.optim.Adagrad,
           "rmsprop": torch.optim.RMSprop}[optimizer]
    kw = {"lr": 1e-3, "momentum": 0.9} if optimizer == "sgd_momentum" else {"lr": 1e-3}
    opt = cls([p], **kw)
    opt.step()
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / (4 * n)

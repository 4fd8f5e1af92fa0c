"""What ``shard()`` left whole, and why: nothing stays replicated silently.

:func:`classify` says which RSDP rule (if any) decomposes a module; ``shard()`` records, for
every module it does not shard, the reason (no rule for its class, too small, excluded by the
caller's ``filter``, tied to a module it cannot share a shard with...). :func:`left_whole`
turns that into one :class:`LeftWhole` entry per replicated parameter, and :func:`report`
into the table ``rsdp_state(model).report()`` prints.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch.nn as nn

from ._layers.sharded_attention import can_shard_attention
from .._utils import is_conv1d
from ._layers.sharded_embedding import can_shard_embedding
from ._units.unit_adapters import is_peft_layer

__all__ = ["LeftWhole", "classify", "can_rotate", "left_whole", "report", "TOO_SMALL", "FILTERED",
           "NOT_DECOMPOSABLE", "ADAPTER", "is_adapter"]

TOO_SMALL = "too small"
ADAPTER = "adapter"
FILTERED = "excluded by filter"
NOT_DECOMPOSABLE = "not decomposable"


@dataclass(frozen=True)
class LeftWhole:
    """One parameter every rank holds whole."""

    name: str
    shape: Tuple[int, ...]
    numel: int
    reason: str


def classify(mod: nn.Module) -> Tuple[Optional[str], Optional[str]]:
    """(rule, None) when RSDP can shard ``mod`` (``"linear"``, ``"conv1d"``, ``"embedding"``,
    ``"attention"``); (None, why not) for a module with parameters of its own it cannot shard;
    (None, None) for a module without parameters of its own."""
    cls = type(mod)
    if cls is nn.Linear:
        return "linear", None
    if is_conv1d(mod):
        return "conv1d", None
    if cls is nn.Embedding:
        if can_shard_embedding(mod):
            return "embedding", None
        return None, f"{NOT_DECOMPOSABLE}: Embedding with max_norm or sparse gradients"
    if cls is nn.MultiheadAttention:
        if can_shard_attention(mod):
            return "attention", None
        return None, (f"{NOT_DECOMPOSABLE}: MultiheadAttention with kdim/vdim != embed_dim, "
                      f"add_bias_kv or add_zero_attn")
    if next(mod.parameters(recurse=False), None) is None:
        return None, None
    if isinstance(mod, (nn.Linear, nn.Embedding)):
        return None, (f"{NOT_DECOMPOSABLE}: {cls.__name__} subclasses "
                      f"{'nn.Linear' if isinstance(mod, nn.Linear) else 'nn.Embedding'} "
                      f"(its own forward may differ)")
    return None, f"{NOT_DECOMPOSABLE}: no RSDP rule for {cls.__name__}"


def is_adapter(model: nn.Module, name: str) -> bool:
    """Whether module ``name`` of ``model`` is an adapter's own layer (peft's ``lora_A`` /
    ``lora_B`` ...): it sits under a peft tuner layer, outside that layer's ``base_layer``.

    [Note: adapters stay whole]
    An adapter is small (rank r: r x (in + out) weights for an in x out base layer) and
    trained; its base is large and frozen. Sharded, each adapter rotates like a big layer: its
    own ring steps in forward and in backward, W - 1 hops each, for a few KiB a hop, so a
    model with adapters on seven projections a block pays 14 latency-bound rotations a block
    for them. Whole, their gradients join the replicated parameters' bucketed all-reduce
    (:class:`torch_rsdp._grad_sync.GradSync`): one collective per bucket for every adapter of
    the model, at the price of holding every adapter whole on every rank (2r/(in+out) of the
    base at most; under 1% of a Llama at r = 16). The rotations' count grows with the ranks,
    the all-reduce's does not.
    """
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        parent = model.get_submodule(".".join(parts[:cut]))
        if is_peft_layer(parent):
            return parts[cut] != "base_layer"
    return False


def can_rotate(mod: nn.Module) -> bool:
    """Whether an RSDP rule shards ``mod``'s own parameters (what ``shard()`` would rotate,
    unless a filter, ``min_numel`` or a tie keeps it whole)."""
    return classify(mod)[0] is not None


def left_whole(model: nn.Module, local_ids: set, why: Dict[str, str]) -> List[LeftWhole]:
    """One entry per parameter of ``model`` not sharded (``local_ids``: the sharded ones),
    with the reason recorded for its module (``why``: module name -> reason)."""
    out, seen = [], set()
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in local_ids or id(p) in seen:
                continue
            seen.add(id(p))
            name = f"{mname}.{pname}" if mname else pname
            reason = why.get(mname) or _why_param(model, mname, mod, pname)
            if not p.requires_grad:
                reason += "; frozen (requires_grad=False: no gradient sync)"
            out.append(LeftWhole(name, tuple(p.shape), p.numel(), reason))
    return out


def _why_param(model, mname, mod, pname) -> str:
    """The reason for a parameter whose module has none recorded: a bias RSDP keeps whole
    on purpose (input-split layers, attention output) or an unknown module."""
    holder = mod
    if getattr(mod, "_rsdp", None) is None and mname:
        parent = model.get_submodule(mname.rpartition(".")[0]) if "." in mname else model
        holder = parent if getattr(parent, "_rsdp", None) is not None else mod
    if getattr(holder, "_rsdp", None) is not None and pname == "bias":
        return (f"{TOO_SMALL}: bias of a layer split by input features / heads "
                f"(added once after the ring)")
    rule, reason = classify(mod)
    return reason or f"{NOT_DECOMPOSABLE}: {type(mod).__name__}"


def report(entries: List[LeftWhole], full_numel: int, resident: int, world: int, rank: int,
           n_sharded: int, not_units: Optional[Dict[str, str]] = None,
           trainable: Optional[Tuple[int, int]] = None) -> str:
    """The human-readable coverage table (and the rotation units ``tp_plan="auto"`` named
    but could not form, ``not_units``: module name -> why; their layers are sharded one by
    one). ``trainable``: (trainable, frozen) elements this rank holds, shown when some are
    frozen."""
    pct = (lambda n: f"{100.0 * n / full_numel:.1f}%") if full_numel else (lambda n: "-")
    whole = sum(e.numel for e in entries)
    lines = [f"RSDP over {world} rank(s): {n_sharded} module(s) sharded; rank {rank} holds "
             f"{resident:,} of {full_numel:,} parameter elements ({pct(resident)}; "
             f"ideal {100.0 / world:.1f}%)",
             f"left whole on every rank: {len(entries)} parameter(s), {whole:,} elements "
             f"({pct(whole)})"]
    if trainable is not None and trainable[1]:
        lines.insert(1, f"of what rank {rank} holds: {trainable[0]:,} elements trainable, "
                        f"{trainable[1]:,} frozen (no gradient, no optimizer state)")
    if entries:
        w = max(len(e.name) for e in entries)
        s = max(len(str(e.shape)) for e in entries)
        for e in sorted(entries, key=lambda e: -e.numel):
            lines.append(f"  {e.name:<{w}}  {str(e.shape):<{s}}  {e.numel:>10,}  {e.reason}")
    if not_units:
        lines.append(f"not rotation units (tp_plan='auto'; their layers are sharded one by one): "
                     f"{len(not_units)}")
        w = max(len(n) for n in not_units)
        for n, why in not_units.items():
            lines.append(f"  {n:<{w}}  {why}")
    return "\n".join(lines)

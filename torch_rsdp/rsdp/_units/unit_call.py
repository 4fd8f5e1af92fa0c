"""One call of a rotation unit's own forward on the weights in hand (a shard, or the whole unit).

What :mod:`.rotation_unit` (shard by shard) and :mod:`.unit_whole` (a small unit computed
whole) share: the call's flattened inputs, the KV cache seen through one call
(:class:`CacheShard`), running the unit's forward with given weights (:func:`run_part`), the
RNG state every call starts from, and saving weights as references into a rotation buffer
(:class:`WeightRefs`).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
from torch.utils._pytree import tree_unflatten

from ..._dtensor_params import computing
from .unit_adapters import set_cut

__all__ = ["CACHE_KWARGS", "is_cache", "Call", "CacheShard", "fill_caches", "run_part",
           "rng_state", "set_rng_state", "stub", "WeightRefs", "check_graph_kept",
           "own_replicas", "replica_grads", "replica_returns", "add_grads"]

# The KV cache's keyword in Hugging Face attention forwards (it was renamed twice); any other
# keyword whose value is a cache (``is_cache``) is taken too: a cache passed on to every
# shard's forward would collect each shard's keys one after another, silently wrong.
CACHE_KWARGS = ("past_key_values", "past_key_value", "cache")


def is_cache(value) -> bool:
    return (not isinstance(value, torch.Tensor) and callable(getattr(value, "update", None))
            and callable(getattr(value, "get_seq_length", None)))


class Call:
    """One call's inputs: the flattened (args, kwargs), which leaves carry gradients, caches,
    and the unit's own replicas that need a gradient (:func:`own_replicas`)."""

    def __init__(self, leaves, spec, grad_idx, caches, extras=()):
        self.leaves, self.spec, self.grad_idx, self.caches = leaves, spec, grad_idx, caches
        self.extras = list(extras)
        # inside torch's checkpoint ([Note: checkpointing without a second rotation])
        self.checkpointed = False
        self.kv: dict = {}  # cache kwarg -> {shard: (keys, values, layer_idx, args, kwargs)}
        self.past: dict = {}  # cache kwarg -> {layer_idx: cached length before this call}

    def tensors(self):
        """Every tensor among the call's inputs (what tells one call from another)."""
        return [t for t in self.leaves if isinstance(t, torch.Tensor)]

    def device(self, src: torch.Tensor) -> torch.device:
        """Where the unit computes: its inputs' device (the shards ``src`` may be in host
        memory: [Note: shards offloaded to host memory] in ``_rotation.device_copies``)."""
        return next((t.device for t in self.tensors()), src.device)


class CacheShard:
    """Stands in for a KV cache during one shard's call. ``update`` hands back what the real
    cache would for this shard's KV heads (its past keys / values, then the new ones) without
    storing anything; in forward it keeps the new ones, so that the real cache is updated once
    with every head (:func:`fill_caches`). Backward's recomputation sees the past as the
    forward saw it (``past``: cached length per layer when the forward ran)."""

    def __init__(self, real, store: Optional[dict], past: dict, heads: slice, j: int):
        self._real, self._store, self._past, self._heads, self._j = real, store, past, heads, j

    def update(self, keys, values, layer_idx, *args, **kwargs):
        if self._store is not None:  # forward: remember how much was cached before
            self._past.setdefault(layer_idx, self._real.get_seq_length(layer_idx))
            self._store[self._j] = (keys, values, layer_idx, args, kwargs)
        n = self._past.get(layer_idx, 0)
        if n == 0:
            return keys, values
        layer = self._real.layers[layer_idx] if hasattr(self._real, "layers") else None
        if type(layer).__name__ != "DynamicLayer":
            raise NotImplementedError(f"torch_rsdp.rsdp rotation units: decoding with a "
                                      f"filled {type(layer).__name__} is not supported (only "
                                      f"DynamicCache's full layers); shard without tp_plan")
        return (torch.cat([layer.keys[:, self._heads, :n], keys], dim=-2),
                torch.cat([layer.values[:, self._heads, :n], values], dim=-2))

    def __getattr__(self, name):
        return getattr(self._real, name)


def fill_caches(call: Call) -> None:
    for key, per_shard in call.kv.items():
        if per_shard:
            parts = [per_shard[j] for j in sorted(per_shard)]
            _, _, layer_idx, args, kwargs = parts[0]
            call.caches[key].update(torch.cat([p[0] for p in parts], dim=1),
                                    torch.cat([p[1] for p in parts], dim=1), layer_idx,
                                    *args, **kwargs)


def run_part(unit, call: Call, ins, weights: Dict[str, torch.Tensor], j: int, heads: slice,
             record: bool) -> torch.Tensor:
    """The unit's own forward with ``weights`` (shard ``j``'s parameters, whose atoms of a
    unit with a cache are the KV heads ``heads``; or the whole unit's); returns the row-split
    layer's output (a partial sum for a shard)."""
    u = unit._rsdp_unit
    leaves = list(call.leaves)
    for i, t in zip(call.grad_idx, ins):
        # A view of a leaf, not the leaf: the unit's backward differentiates the part with
        # autograd.grad, inside which torch refuses gradient hooks on leaves, and module hooks
        # that watch their inputs' gradients (torch's ModTracker, under MemTracker or
        # FlopCounterMode) would put one on each input of the unit's modules
        leaves[i] = t.view_as(t) if t.requires_grad and t.is_leaf else t
    args, kwargs = tree_unflatten(leaves, call.spec)
    for key, real in call.caches.items():
        kwargs[key] = CacheShard(real, call.kv.setdefault(key, {}) if record else None,
                                 call.past.setdefault(key, {}), heads, j)
    for _, m, _ in u.members:
        m._rsdp_hand = weights
    set_cut(u.members, heads, u.atoms)  # [Note: adapters inside a unit]
    try:
        with computing():  # the unit's replicas read as local tensors, in backward too
            out = u.base_forward(unit, *args, **kwargs)
        row_out = u.row._rsdp_last
    finally:
        for _, m, _ in u.members:
            m._rsdp_hand = None
        set_cut(u.members, None, u.atoms)
        u.row._rsdp_last = None
    y = out[0] if isinstance(out, (tuple, list)) else out
    if y is not row_out or y is None:
        raise RuntimeError(f"rotation unit {u.name or type(unit).__name__}: its forward must "
                           f"return its row-split layer's output as is (it changes it after "
                           f"the layer); shard it without tp_plan")
    unit._rsdp_out_len = len(out) if isinstance(out, (tuple, list)) else 0
    return y


def rng_state(device: torch.device):
    """The CPU generator's state and, for a CUDA unit, the device's (dropout draws there)."""
    return (torch.get_rng_state(),
            torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def stub(t: torch.Tensor) -> torch.Tensor:
    """A tensor of ``t``'s shape and dtype over one element (stride 0)."""
    return torch.zeros((), dtype=t.dtype, device=t.device).expand(t.shape)


class WeightRefs:
    """[Note: keeping activations without keeping weights]
    With ``recompute=False`` each shard's (or the whole unit's) forward is recorded by autograd
    while its weights are in hand. Autograd would save those weights (``grad_input = dy @ W``
    needs them), i.e. keep every shard of the layer alive until backward. These saved-tensor
    hooks save a tensor living in a rotation (or gather) buffer as a *reference* (the buffer's
    key, offset, shape, strides) instead, and backward resolves it in whichever buffer holds
    those weights when the graph is run."""

    def __init__(self):
        self.fwd: Dict[int, object] = {}  # storage of a buffer in hand during forward -> key
        self.bwd: Dict[object, torch.Tensor] = {}  # key -> the buffer in hand during backward

    def save_by_reference(self, buffers: Dict[object, torch.Tensor]) -> None:
        """Forward: tensors living in these buffers (key -> buffer) are saved by reference."""
        self.fwd = {t.untyped_storage().data_ptr(): k for k, t in buffers.items()}

    def pack(self, t):
        if self.fwd and t.device.type != "meta":
            key = self.fwd.get(t.untyped_storage().data_ptr())
            if key is not None:
                return ("rsdp_weight", key, t.storage_offset(), tuple(t.shape), t.stride())
        return t

    def unpack(self, packed):
        if isinstance(packed, tuple) and packed and packed[0] == "rsdp_weight":
            _, key, off, shape, stride = packed
            return self.bwd[key].as_strided(shape, stride, off)
        return packed


def check_graph_kept(unit, graph) -> None:
    """Backward of a unit that recorded its graph in forward (``unit_recompute=False``) when
    that graph is gone: it was freed by a first backward (``retain_graph=True``). Raises
    before any ring op, on every rank alike."""
    if graph is None:
        name = unit._rsdp_unit.name or type(unit).__name__
        raise RuntimeError(f"rotation unit {name}: a second backward through it "
                           f"(retain_graph=True), but with unit_recompute=False (the default) a "
                           f"unit frees the graph it recorded in forward at its first backward; "
                           f"shard with unit_recompute=True to backpropagate through it twice")


def own_replicas(unit) -> list:
    """[Note: a unit's own replicas]
    The parameters inside a unit that no shard holds and that need a gradient: a LoRA layer's
    adapters ([Note: adapters inside a unit] in :mod:`.unit_adapters`), the per-head norms of
    an attention block (Qwen3's ``q_norm`` / ``k_norm``). The unit's forward runs inside its
    own autograd function, whose backward computes every gradient with ``autograd.grad``: a
    parameter that is not one of the function's inputs gets none, and would silently never
    train. So each unit function takes them as inputs after the shards, and its backward asks
    ``autograd.grad`` for theirs too (summed over the shards' calls) and returns them; they
    are replicas, so the group averages them with the other replicas' gradients. The
    row-split layer's own bias is added outside the function and is not among them."""
    st = unit._rsdp
    sharded = {id(st.param(n)) for n in st.names}
    members = {id(m) for _, m, _ in unit._rsdp_unit.members}
    out, seen = [], set()
    for mod in unit.modules():
        if id(mod) in members:
            continue
        for p in mod.parameters(recurse=False):
            if p.requires_grad and id(p) not in sharded and id(p) not in seen:
                seen.add(id(p))
                out.append(p)
    return out


def replica_grads(ctx, first: int) -> list:
    """The unit's own replicas whose gradients backward must compute (the function's inputs
    from index ``first`` on are ``ctx.call.extras``)."""
    return [p for p, w in zip(ctx.call.extras, ctx.needs_input_grad[first:]) if w]


def replica_returns(ctx, first: int, gxs) -> list:
    """The backward's returns for the function's inputs from ``first`` on (the unit's own
    replicas): their gradients where they need one, else None."""
    gxs = iter(gxs)
    return [next(gxs) if w else None for w in ctx.needs_input_grad[first:]]


def add_grads(acc: list, got) -> None:
    """``acc[i] += got[i]`` (``acc`` starts as Nones; a None in ``got`` adds nothing)."""
    for i, g in enumerate(got):
        if g is not None:
            acc[i] = g if acc[i] is None else acc[i] + g

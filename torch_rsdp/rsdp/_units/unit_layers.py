"""At two ranks, a small rotation unit's layers rotate one by one, as per-layer RSDP's do.

[Note: small units layer by layer at two ranks]
A unit no larger than its activations computes whole ([Note: small units computed whole] in
:mod:`.unit_whole`); from 3 ranks on, in its block's pass ([Note: unit blocks]). At two ranks
there is no block pass (a rotation is one hop: nothing to share), and alone a whole unit costs
more than per-layer rotation does there: ``rsdp-units`` measured 1.02-1.04x FSDP2's throughput
where activations dominate against per-layer rotation's 1.12-1.14x
(``benchmarks/bench_rsdp_fsdp2.py --settings act --world-sizes 2``). Per-layer rotation at two
ranks runs each layer's forward and backward as one native ring schedule
(``csrc/rotation/linear_schedule.cpp``) whose hop overlaps the matmul on the shard in hand, where a
whole unit first waits for its gather, then computes, then waits for its reduction, and runs
through the recorded-call machinery of :mod:`.unit_call`.

A unit whose heads divide evenly ([Note: units split evenly] in :mod:`.rotation_unit`) holds,
for each of its layers, exactly the shard per-layer sharding would: ``torch.chunk`` of the
rows (column-split layers) or columns (the row-split layer), each layer's pieces one
contiguous region of the unit's flat shard. So at two ranks such a unit, when it computes
whole, runs its module's own forward once in the caller's graph (as in its block's pass:
[Note: units in their block's pass]) and each of its layers computes through the sharded
Linear's own function (:class:`.._layers.sharded_linear._LinearFn`) on its region of the unit's flat
shard, seen through a :class:`LayerView`. The layer's gradients come back as DTensors of the
unit's parameters, which autograd accumulates as any other. Nothing of the unit's contract
changes: the row-split layer's output is returned as is (checked), its bias is added once, the
other outputs (attention weights) come back whole, a KV cache is filled by the forward itself.

Only where the unit's flat shard is what the layers read (no ``param_dtype`` cast: a cast
copies the whole unit's shard, once per layer here) and for ``unit_recompute=False`` (layers
keep their inputs; a recomputing unit keeps only its own and computes whole alone).
"""
from __future__ import annotations

from typing import Dict, Optional

import torch
import torch.nn as nn

from .._rotation.flat_shard import FlatLayout, chunk_sizes
from .._rotation.ring_feedback import RingFeedback
from .._layers.shard_state import ShardState, grads_like_params, owner_of
from .._layers.sharded_linear import _LinearFn

__all__ = ["LayerView", "make_layer_views", "by_layers", "layers_forward", "layer_forward"]

#: ``False`` keeps small units whole at two ranks too (for comparison).
ENABLED = True


class LayerView:
    """A unit member's region of its unit's flat shard, seen as a sharded layer's state
    (what :class:`.._layers.sharded_linear._LinearFn` reads of a :class:`.._layers.shard_state.ShardState`)."""

    def __init__(self, unit_state: ShardState, key: str):
        self.unit = unit_state
        self.ring = unit_state.ring
        lay = unit_state.layout
        names = {"weight": key + ".weight"}
        if key + ".bias" in lay.shapes:  # a column-split layer's bias is sharded with its rows
            names["bias"] = key + ".bias"
        # (name here, module holding the unit's parameter, its attribute), resolved once
        self.owners = [(n, *owner_of(unit_state.module_ref, full)) for n, full in names.items()]
        self.layout = FlatLayout({n: lay.shapes[full] for n, full in names.items()})
        self.start = lay.offsets[names["weight"]]
        self.stop = self.start + self.layout.numel
        self.feedback: Optional[RingFeedback] = RingFeedback()  # not used on one node
        for n, full in names.items():  # the unit's layout keeps a layer's pieces together
            assert lay.offsets[full] - self.start == self.layout.offsets[n], (key, n)

    @property
    def mp(self):
        return self.unit.mp

    @property
    def grad_dtype(self) -> torch.dtype:
        return self.unit.grad_dtype

    def local_flat(self) -> torch.Tensor:
        return self.unit.local_flat()[self.start:self.stop]

    def compute_flat(self) -> torch.Tensor:
        return self.local_flat()  # by_layers: no param_dtype cast

    def release(self, src: torch.Tensor) -> None:
        """Nothing to give back: ``src`` is a view of the unit's storage, never a buffer."""

    def grads_from(self, acc: torch.Tensor) -> Dict[str, torch.Tensor]:
        """The layer's gradients (views of ``acc``, averaged over the group) as the unit's
        parameters' kind: DTensors of their spec."""
        return grads_like_params(acc, self.ring, self.unit.flat.dtype, self.layout,
                                 self.owners)


def make_layer_views(unit: nn.Module, members, ring) -> Optional[Dict[nn.Module, LayerView]]:
    """Each member's :class:`LayerView` when ``unit`` (sharded) may run layer by layer: two
    ranks on one node, every layer's pieces ``torch.chunk``'s; else None."""
    if ring.world != 2 or not ring.one_node:
        return None
    st: ShardState = unit._rsdp
    views = {}
    for key, m, style in members:
        fin, fout = m._rsdp_in, m._rsdp_out
        split = m._rsdp_split
        n = fout if split == "out" else fin
        d = st.dims[key + ".weight"]
        if [s[d] for s in st.layout.shapes[key + ".weight"]] != chunk_sizes(n, ring.world):
            return None
        views[m] = LayerView(st, key)
    return views


def by_layers(unit: nn.Module) -> bool:
    """Whether this call of ``unit``, which computes whole, runs layer by layer."""
    u, st = unit._rsdp_unit, unit._rsdp
    pdt = st.mp.param_dtype
    return (ENABLED and u.layers is not None and not u.recompute
            and (pdt is None or pdt == st.flat.dtype))


def layers_forward(unit: nn.Module, args, kwargs):
    """``unit``'s own forward on ``args`` / ``kwargs``, its layers rotating one by one."""
    u = unit._rsdp_unit
    members = u.members
    for _, m, _ in members:
        m._rsdp_layer = u.layers[m]
    try:
        return u.base_forward(unit, *args, **kwargs)
    finally:
        for _, m, _ in members:
            m._rsdp_layer = None


def layer_forward(mod: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Forward of ``mod``, a unit's layer, as a sharded Linear on its :class:`LayerView`
    (the row-split layer's bias is the unit's to add)."""
    bias = mod.bias if mod._rsdp_split == "out" else None
    return _LinearFn.apply(x, mod.weight, bias, mod)

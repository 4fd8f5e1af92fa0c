"""The whole units of one block gathered together: one rotation for a decoder layer.

[Note: unit blocks]
A unit computed whole ([Note: small units computed whole] in :mod:`.unit_whole`) gathers on
its own: a decoder layer's attention and MLP cost two rotations forward and four backward,
``6 (W - 1)`` hops, twice a block of small layers ([Note: block gathers] in
:mod:`.block_gather`). So from 3 ranks on, on one node, the units of one block (an element of
an ``nn.ModuleList`` / ``nn.Sequential``, grouped as block gathers group layers) that compute
whole take part in one pass of :mod:`.block_gather`: the first of them to run rotates all
their shards once (:func:`.block_gather.open_pass`), each computes with its whole parameters
from the pass (:class:`_BlockUnitFn`), the first backward gathers once more for all of them,
and the gradients of the whole parameters ride home summed in the pass's one counter-rotation.
``3 (W - 1)`` hops a block, as for small layers, and the last gather of a forward stays for
its backward ([Note: the last gather stays for backward]).

Which units take part is decided from the token count agreed over the group, so every rank
makes the same passes; a block with fewer than two such units leaves them to gather alone.
"""
from __future__ import annotations

from typing import Dict, List, Optional

import torch
import torch.nn as nn

from .block_gather import SmallLayers, block_key, containers, open_pass
from .ring_order import Ring
from .unit_call import (Call, WeightRefs, check_graph_kept, fill_caches, rng_state, run_part,
                        set_rng_state, stub)
from .unit_whole import small_at

__all__ = ["UnitBlock", "make_unit_blocks"]


class _BlockUnitFn(torch.autograd.Function):
    """A unit's output (row-split bias excluded) from its whole parameters, which come in as
    inputs (outputs of the pass's gather): their gradients go back to the gather, which sums
    them over the group for every unit of the pass at once."""

    @staticmethod
    def forward(ctx, unit, call: Call, p, *tensors):
        st, u = unit._rsdp, unit._rsdp_unit
        n_in = len(call.grad_idx)
        ins = tensors[:n_in]
        whole = dict(zip(st.names, tensors[n_in:]))
        keep = not u.recompute and any(ctx.needs_input_grad[3:])
        device = tensors[n_in].device
        rng = rng_state(device)
        everything = slice(0, u.atoms)
        refs = leaves_in = graph = None
        if keep:  # record the graph; its weights are saved as references into the pass
            refs = WeightRefs()
            refs.watch(whole)
            leaves_in = [t.detach().requires_grad_(t.requires_grad) for t in ins]
            leaves_w = {n: w.detach().requires_grad_() for n, w in whole.items()}
            with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(
                    refs.pack, refs.unpack):
                y = run_part(unit, call, leaves_in, leaves_w, 0, everything, record=True)
            for w in leaves_w.values():  # gradient targets only: let go of the whole weights
                w.data = stub(w)
            graph = (y, leaves_w)
            y = y.detach()
        else:
            y = run_part(unit, call, ins, whole, 0, everything, record=True)
        fill_caches(call)
        call.kv = {}
        ctx.unit, ctx.call, ctx.p, ctx.rng, ctx.refs = unit, call, p, rng, refs
        ctx.graph, ctx.leaves_in = graph, leaves_in
        ctx.save_for_backward(*([] if keep else ins))
        ctx.in_meta = [(t.dtype, t.shape, t.device) for t in ins]
        return y.to(st.mp.output_dtype or y.dtype)

    @staticmethod
    def backward(ctx, dy):
        unit, call = ctx.unit, ctx.call
        st, u = unit._rsdp, unit._rsdp_unit
        if ctx.refs is not None:
            check_graph_kept(unit, ctx.graph)
        n_in = len(ctx.in_meta)
        need_in = ctx.needs_input_grad[3:3 + n_in]
        need_w = any(ctx.needs_input_grad[3 + n_in:])
        whole = ctx.p.whole_for_backward(unit)
        if ctx.refs is not None:  # run the recorded graph, its weights resolved in ``whole``
            y, leaves_w = ctx.graph
            leaves_in = ctx.leaves_in
            ctx.refs.bwd = whole
        else:  # recompute the forward, replaying its random draws
            device = next(iter(whole.values())).device
            leaves_in = [t.detach().requires_grad_(w) for t, w in zip(ctx.saved_tensors, need_in)]
            leaves_w = {n: w.detach().requires_grad_(need_w) for n, w in whole.items()}
            with torch.enable_grad(), torch.random.fork_rng(
                    devices=[device] if device.type == "cuda" else []):
                set_rng_state(ctx.rng, device)
                y = run_part(unit, call, leaves_in, leaves_w, 0, slice(0, u.atoms),
                             record=False)
        wanted = [t for t, w in zip(leaves_in, need_in) if w and t.requires_grad]
        wl = [leaves_w[n] for n in st.names] if need_w else []
        with torch.enable_grad():
            got = list(torch.autograd.grad(y, wanted + wl, dy.to(y.dtype), allow_unused=True))
        ctx.graph = ctx.leaves_in = None
        if ctx.refs is not None:
            ctx.refs.bwd = {}
        del y, leaves_w, whole
        ctx.p.backward_done()
        gins = []
        for t, w, (dt, shape, dev) in zip(leaves_in, need_in, ctx.in_meta):
            g = got.pop(0) if w and t.requires_grad else None
            if w and g is None:
                g = torch.zeros(shape, dtype=dt, device=dev)
            gins.append(g.to(dt) if g is not None else None)
        gws = got if need_w else [None] * len(st.names)
        return (None, None, None, *gins, *gws)


class UnitBlock:
    """The rotation units of one block, and the pass they are in."""

    def __init__(self, ring: Ring, units: List[nn.Module], small: SmallLayers):
        self.ring, self.units, self.small = ring, units, small
        self.current = None

    def forward(self, unit, call: Call, ins) -> Optional[torch.Tensor]:
        """``unit``'s output through the block's pass, or None: it gathers on its own. Only
        for a unit that computes whole (the group's tokens are agreed by then)."""
        p = self.current
        if p is None or unit in p.used or p.epoch != self.small.epoch:
            T = self.small.tokens or 0
            p = self.current = open_pass(
                self, [m for m in self.units if small_at(m._rsdp_unit, T)])
        p.used.add(unit)
        if unit not in p.whole:
            return None
        whole = p.whole.pop(unit)
        y = _BlockUnitFn.apply(unit, call, p, *ins, *[whole[n] for n in unit._rsdp.names])
        if y.requires_grad:  # its backward will ask for the weights again
            p.registered += 1
            p.waiting += 1
        return y


def make_unit_blocks(model: nn.Module, sharded: Dict[str, nn.Module], ring: Ring,
                     small: SmallLayers) -> int:
    """Groups the rotation units of ``sharded`` by the container element holding them, gives
    each group of two or more a :class:`UnitBlock`; returns how many."""
    if ring.world < 3 or not ring.one_node:
        return 0  # two ranks: one hop a rotation, as for block gathers
    lists = containers(model)
    groups: Dict[str, list] = {}
    for name, mod in sharded.items():
        if getattr(mod, "_rsdp_unit", None) is not None:
            key = block_key(name, lists)
            if key is not None:
                groups.setdefault(key, []).append(mod)
    blocks = [UnitBlock(ring, units, small) for units in groups.values() if len(units) >= 2]
    for block in blocks:
        for unit in block.units:
            unit._rsdp_unit.block = block
    return len(blocks)

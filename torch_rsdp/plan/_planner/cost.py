"""The planner's cost model: memory per rank and step time of one unit under one strategy.

Notation, per unit: ``P`` parameter bytes it owns, ``Pl`` the part ``split:k`` slices (Linear
weights), ``Pr`` the part ``rotate`` shards, ``G`` / ``Gl`` / ``Gr`` the trainable bytes of each
(``requires_grad``: a frozen base under LoRA has none; [Note: frozen parameters in the cost
model] in :mod:`.._cost_terms`), ``f`` optimizer state per parameter byte (AdamW 2), ``A``
activations saved for backward, ``T`` its peak temporaries; ``W`` ranks, ``L`` ranks per node,
``B`` the gradient bucket of replicated parameters.

Memory is split as :mod:`.search` needs it: *resident* (held all step: sharded parameters and
optimizer state), *live* (held from the unit's forward to its backward: activations, and for
``shard_grad_op`` the gathered weights; or, once its backward has run, the unit's gradients:
per unit the larger of the two counts, as backward frees activations while it makes
gradients), *transient* (only while the unit computes):

=================  ====================================  ====================  ===============
strategy           resident (+ gradients)                live                  transient
=================  ====================================  ====================  ===============
no_shard           P + f G  (+ G)                        A                     T + min(G, B)
shard_optim        P + f G / W  (+ G)                    A                     T + min(G, B)
full_shard         (P + f G) / W  (+ G / W)              A                     T + 2 P + 2 G
                                                                               (in backward:
                                                                               the gathered
                                                                               weights and the
                                                                               previous unit's
                                                                               in flight, the
                                                                               unsharded
                                                                               gradient and the
                                                                               reduce-scatter
                                                                               input)
shard_grad_op      (P + f G) / W  (+ G / W)              A + P (W-1)/W         T + P + 1.5 G
hybrid_shard       (P + f G) / L  (+ G / L)              A                     T + 2 P + 2 G
rotate             (Pr + f Gr) / W + (P - Pr) + f (G -   A                     T + (Pr + Gr) / W
                   Gr)  (+ Gr / W + G - Gr)                                    (the weights
                                                                               arriving, this
                                                                               rank's gradient
                                                                               contribution)
split:k            as rotate with Pl, Gl                 A                     T + (2 Pl + Gl)
                                                                               / k (one slice,
                                                                               padding, its
                                                                               gradient)
=================  ====================================  ====================  ===============

These coefficients were fitted to torch's MemTracker on this backend: a Llama's layers under
each strategy, the rest replicated, one AdamW step on 4 ranks (``python -m benchmarks plans`` checks
them on every plan it runs). FSDP2 units are measured under a common FSDP2 root, as
:func:`~torch_rsdp.plan.apply` builds them. With gradient accumulation (``accumulation > 1``),
FSDP2 units and split layers also keep their unsharded gradient (``P``, ``Pl``) between
micro-batches, as ``plan.no_sync`` makes them.

Step time = forward + backward + the optimizer step on the bytes this rank steps. For the group
that was profiled, forward + backward under each strategy is *measured* (the unit copied, the
strategy applied, timed with its real collectives; ``shard_optim``'s broadcast after the step is
added from its fit). For a :class:`~torch_rsdp.plan.Cluster` it is modelled: plain compute
(measured) + communication, all of it counted as exposed, each collective priced by its fit
``latency + bytes / bandwidth`` at its level:

* no_shard: all-reduce(G); shard_optim: all-reduce(G) + W broadcasts of G/W;
* full_shard: 2 all-gathers(P) + reduce-scatter(G); shard_grad_op: 1 all-gather + 1 reduce-scatter;
* hybrid_shard: the same inside the node, plus all-reduce(G / L) along the rail;
* rotate: 2 (W - 1) ring shifts of Pr / W (forward; backward's weights), (W - 1) of Gr / W (the
  gradients) and an all-reduce of what stays replicated and trains;
* split:k: 2k all-gathers of Pl / k, k reduce-scatters of Gl / k, and an all-reduce of the rest.

Compression (``full_shard+int8`` and the like, :mod:`.._plan_compression`; candidates only with
``plan.auto(allow_compression=True)`` and more than one node) changes only what crosses
nodes: each handler lists those collectives (``cross_node``: the rail's share ``P / L`` of
every all-gather of weights, reduce-scatter or all-reduce of gradients) and
:func:`compression_gain` prices each by its rail fit at the exact size and at the quantised
one (int8: 0.252 of float32 with the scales; int4: 0.127; an all-reduce sends int8 back),
less the quantisation kernels' time (measured here, or given to a ``Cluster``). The
measured or modelled step time of the exact strategy minus that gain is the compressed
strategy's; its error-feedback residuals (``feedback_bytes``: ``N`` regions of ``P / W`` for
a sharded unit, one more for a replicated one) count as resident memory.
"""
from __future__ import annotations

from typing import List

from ..._grad_sync import DEFAULT_BUCKET_BYTES
from .._plan_compression import WIRE_RATIO, parse
from .._cost_terms import Links, UnitProfile, kernel_s_per_byte
from .._spec import Strategy, parse_strategy
from .profile import OPTIMIZER_STATE_FACTOR
from .search import Choice

# Links and kernel_s_per_byte live in ..cost_terms (the handlers price with them too); they
# stay importable from here.
__all__ = ["Links", "unit_choices", "DEFAULT_STRATEGIES", "applicable", "compression_gain",
           "kernel_s_per_byte", "with_compression"]

# Where the formulas live: each strategy's handler prices itself
# (torch_rsdp/plan/_strategies/*.py, ``cost``); the table above is their summary.

DEFAULT_STRATEGIES = ("no_shard", "shard_optim", "full_shard", "shard_grad_op", "hybrid_shard",
                      "rotate", "split:2", "split:4")


def compression_gain(strategy: Strategy, u: UnitProfile, links: Links) -> float:
    """Seconds per step that ``strategy``'s compression (``full_shard+int8``) saves on ``u``
    against the exact strategy: each cross-node collective (:meth:`cross_node`) priced by
    its rail fit at the exact and at the quantised size, less the kernels' time to quantise
    what is sent and dequantise what arrives. Negative when the kernels cost more than the
    link saves (fast links)."""
    if not strategy.compress or links.nodes < 2:
        return 0.0
    c = parse(strategy.compress)
    q, d = links.kernels()
    N, gain = links.nodes, 0.0
    for kind, nbytes, what in strategy.handler.cross_node(u, links):
        fmt = c["weights"] if what == "weights" else c["grads"]
        if fmt == "none" or nbytes <= 0:
            continue
        if kind == "all_reduce":  # a reduce-scatter in fmt, then an all-gather in int8
            ratio = (WIRE_RATIO[fmt] + WIRE_RATIO["int8"]) / 2
            kernels = 2 * (q + d) * nbytes * (1 + 1 / N) / 2
        elif kind == "all_gather":  # quantise one's own share, dequantise everyone's
            ratio, kernels = WIRE_RATIO[fmt], q * nbytes / N + d * nbytes
        elif kind == "ring_shift":
            # One hop of the whole ring: the boundary ranks' hop shrinks, the hops inside a
            # node do not, and the slowest of them sets the pace.
            ratio = WIRE_RATIO[fmt]
            gain += (links.t(kind, nbytes) - max(links.t(kind, nbytes, "intra"),
                                                 links.t(kind, nbytes * ratio))
                     - (q + d) * nbytes)
            continue
        else:  # reduce-scatter: quantise the node's partial sums, dequantise what arrives
            ratio, kernels = WIRE_RATIO[fmt], q * nbytes + d * nbytes / N
        gain += (links.t(kind, nbytes, "inter") - links.t(kind, nbytes * ratio, "inter")
                 - kernels)
    return gain


def with_compression(strategies: List[str], links: Links) -> List[str]:
    """``strategies`` and, for each that can compress, its ``+int8`` and ``+int4`` forms
    (only when the traffic crosses nodes)."""
    out = list(strategies)
    if links.nodes < 2:
        return out
    for name in strategies:
        s = parse_strategy(name)
        if s.handler.compressible and not s.compress:
            out += [f"{s}+int8", f"{s}+int4"]
    return list(dict.fromkeys(out))


def applicable(u: UnitProfile, strategy: Strategy, links: Links) -> bool:
    """Whether the planner may choose ``strategy`` for ``u`` (its handler says; compression
    only where traffic crosses nodes)."""
    if strategy.compress and links.nodes < 2:
        return False
    return strategy.handler.applicable(u, links)


def unit_choices(u: UnitProfile, strategies: List[str], links: Links, optimizer: str,
                 optim_s_per_byte: float, bucket: int = DEFAULT_BUCKET_BYTES,
                 measured_ok: bool = True, accumulation: int = 1) -> List[Choice]:
    """One :class:`Choice` per applicable strategy (in the order given), priced by each
    strategy's handler (:meth:`~torch_rsdp.plan._strategies.StrategyHandler.cost`).

    Args:
        u: the profiled unit.
        strategies: candidate strategy names.
        links: the group's shape and collective fits (measured, or a :class:`Cluster`'s).
        optimizer: the optimizer's state rule (a key of ``OPTIMIZER_STATE_FACTOR``).
        optim_s_per_byte: the optimizer step's seconds per parameter byte.
        bucket: the gradient bucket of replicated parameters.
        measured_ok: planning for the group that was profiled: a strategy's forward +
            backward time measured with it applied replaces compute + modelled communication.
        accumulation: micro-batches per optimizer step.
    """
    f = OPTIMIZER_STATE_FACTOR[optimizer]
    out = []
    for name in strategies:
        s = parse_strategy(name)
        if not applicable(u, s, links):
            continue
        c = s.handler.cost(u, links, f, bucket)
        compute, comm = u.fwd_s + u.bwd_s, c.comm_s
        if links.world == 1:
            comm = 0.0
        measured = u.strategy_s.get(str(s.exact)) if measured_ok else None
        if measured is not None:  # forward + backward with the strategy, timed here
            compute, comm = measured, c.after_step_comm_s
        gain = compression_gain(s, u, links)
        time_s = compute + comm - gain + optim_s_per_byte * c.stepped
        note = ""
        if s.compress:  # its residuals are held all step
            fb = s.handler.feedback_bytes(u, links)
            c.state += fb
            note = (f"{s.compress} saves {gain * 1e3:,.1f} ms/step across nodes"
                    + (f", keeps {fb / 2**20:,.1f} MiB of residuals" if fb else ""))
        grads, act = c.grads, c.live
        if accumulation == 1:
            # Gradients appear as backward frees the activations (zero_grad(set_to_none)
            # leaves none from the last step): per unit, one or the other is held.
            resident, live = c.state, max(c.live, c.grads)
        else:  # no_sync keeps gradients, and the sharded units' unsharded ones, throughout
            resident, live = c.state + c.grads + c.accumulation_bytes, c.live
            grads = 0
        out.append(Choice(str(s), time_s, int(resident), int(live), int(c.transient),
                          int(act), int(grads), int(c.step_bytes), note))
    return out

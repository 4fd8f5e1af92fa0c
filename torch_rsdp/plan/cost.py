"""The planner's cost model: memory per rank and step time of one unit under one strategy.

Notation, per unit: ``P`` parameter bytes it owns, ``Pl`` the part ``split:k`` slices (Linear
weights), ``Pr`` the part ``rotate`` shards, ``f`` optimizer state per parameter byte (AdamW 2),
``A`` activations saved for backward, ``T`` its peak temporaries; ``W`` ranks, ``L`` ranks per
node, ``B`` the gradient bucket of replicated parameters.

Memory is split as :mod:`.search` needs it: *resident* (held all step: sharded parameters and
optimizer state), *live* (held from the unit's forward to its backward: activations, and for
``shard_grad_op`` the gathered weights; or, once its backward has run, the unit's gradients:
per unit the larger of the two counts, as backward frees activations while it makes
gradients), *transient* (only while the unit computes):

=================  ===============================  ====================  ====================
strategy           resident (+ gradients)           live                  transient
=================  ===============================  ====================  ====================
no_shard           (1 + f) P  (+ P)                 A                     T + min(P, B)
shard_optim        P + f P / W  (+ P)               A                     T + min(P, B)
full_shard         (1 + f) P / W  (+ P / W)         A                     T + 4 P  (in backward:
                                                                          the gathered weights,
                                                                          the unsharded gradient,
                                                                          the reduce-scatter
                                                                          input and the previous
                                                                          unit's still in flight)
shard_grad_op      (1 + f) P / W  (+ P / W)         A + P (W-1)/W         T + 2.5 P
hybrid_shard       (1 + f) P / L  (+ P / L)         A                     T + 4 P
rotate             (1 + f) (Pr / W + P - Pr)  (+ ..)  A                   T + 2 Pr / W  (the
                                                                          weights arriving, this
                                                                          rank's gradient
                                                                          contribution; the
                                                                          accumulator becomes
                                                                          the gradient)
split:k            (1 + f) (Pl / W + P - Pl)  (+ ..)  A                   T + 3 Pl / k  (one
                                                                          slice, its gradient,
                                                                          padding)
=================  ===============================  ====================  ====================

These coefficients were fitted to torch's MemTracker on this backend: a Llama's layers under
each strategy, the rest replicated, one AdamW step on 4 ranks (benchmarks/bench_plans.py checks
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

* no_shard: all-reduce(P); shard_optim: all-reduce(P) + W broadcasts of P/W;
* full_shard: 2 all-gathers(P) + reduce-scatter(P); shard_grad_op: 1 all-gather + 1 reduce-scatter;
* hybrid_shard: the same inside the node, plus all-reduce(P / L) along the rail;
* rotate: 3 (W - 1) ring shifts of Pr / W (forward; backward weights and gradients) and an
  all-reduce of what stays replicated;
* split:k: 2k all-gathers and k reduce-scatters of Pl / k, and an all-reduce of the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List

from .grad_sync import DEFAULT_BUCKET_BYTES
from .profile import OPTIMIZER_STATE_FACTOR, Fit, Profile, UnitProfile
from .search import Choice
from .spec import Strategy, parse_strategy

__all__ = ["Links", "unit_choices", "DEFAULT_STRATEGIES", "applicable"]

DEFAULT_STRATEGIES = ("no_shard", "shard_optim", "full_shard", "shard_grad_op", "hybrid_shard",
                      "rotate", "split:2", "split:4")


@dataclass
class Links:
    """The group's shape and the time of each collective kind at each level."""

    world: int
    nodes: int
    fits: Dict[str, Fit]

    @property
    def local(self) -> int:
        return self.world // self.nodes

    def t(self, kind: str, nbytes: float, level: str = "group") -> float:
        if nbytes <= 0:
            return 0.0
        fit = self.fits.get(f"{kind}@{level}")
        if fit is None:
            return 0.0  # a level this group does not have (one node: no rail)
        return fit.time(nbytes)

    @classmethod
    def measured(cls, prof: Profile) -> "Links":
        return cls(prof.world, len(prof.nodes), prof.fits)


def applicable(u: UnitProfile, strategy: Strategy, links: Links) -> bool:
    if u.param_bytes == 0:
        return strategy.kind == "no_shard"
    if strategy.kind == "hybrid_shard":
        return links.nodes > 1
    if strategy.kind == "rotate":
        return u.rotate_bytes > 0
    if strategy.kind == "split":
        return u.linear_bytes > 0
    return True


def unit_choices(u: UnitProfile, strategies: List[str], links: Links, optimizer: str,
                 optim_s_per_byte: float, bucket: int = DEFAULT_BUCKET_BYTES,
                 measured_ok: bool = True, accumulation: int = 1) -> List[Choice]:
    """One :class:`Choice` per applicable strategy (in the order given). With
    ``measured_ok`` (planning for the group that was profiled), a strategy's forward +
    backward time measured with it applied replaces compute + modelled communication."""
    f = OPTIMIZER_STATE_FACTOR[optimizer]
    W, L = links.world, links.local
    P, A, T = u.param_bytes, u.act_bytes, u.temp_bytes
    out = []
    for name in strategies:
        s = parse_strategy(name)
        if not applicable(u, s, links):
            continue
        k = s.kind
        t = links.t
        compute = u.fwd_s + u.bwd_s
        # (state without gradients, gradients, live, transient), in bytes per rank
        if k == "no_shard":
            mem = ((1 + f) * P, P, A, T + min(P, bucket))
            comm, stepped = t("all_reduce", P), P
        elif k == "shard_optim":
            mem = (P + f * P / W, P, A, T + min(P, bucket))
            comm = t("all_reduce", P) + W * t("broadcast", P / W)
            stepped = P / W
        elif k == "full_shard":
            mem = ((1 + f) * P / W, P / W, A, T + 4 * P)
            comm = 2 * t("all_gather", P) + t("reduce_scatter", P)
            stepped = P / W
        elif k == "shard_grad_op":
            mem = ((1 + f) * P / W, P / W, A + P * (W - 1) / W, T + 2.5 * P)
            comm = t("all_gather", P) + t("reduce_scatter", P)
            stepped = P / W
        elif k == "hybrid_shard":
            mem = ((1 + f) * P / L, P / L, A, T + 4 * P)
            comm = (2 * t("all_gather", P, "intra") + t("reduce_scatter", P, "intra")
                    + t("all_reduce", P / L, "inter"))
            stepped = P / L
        elif k == "rotate":
            pr, rest = u.rotate_bytes, P - u.rotate_bytes
            mem = ((1 + f) * (pr / W + rest), pr / W + rest, A, T + 2 * pr / W)
            comm = 3 * (W - 1) * t("ring_shift", pr / W) + t("all_reduce", rest)
            stepped = pr / W + rest
        else:  # split:k
            pl, rest = u.linear_bytes, P - u.linear_bytes
            mem = ((1 + f) * (pl / W + rest), pl / W + rest, A, T + 3 * pl / s.k)
            comm = (s.k * (2 * t("all_gather", pl / s.k) + t("reduce_scatter", pl / s.k))
                    + t("all_reduce", rest))
            stepped = pl / W + rest
        if W == 1:
            comm = 0.0
        measured = u.strategy_s.get(str(s)) if measured_ok else None
        if measured is not None:  # forward + backward with the strategy, timed here
            comm = t("broadcast", P / W) * W if k == "shard_optim" and W > 1 else 0.0
            compute = measured
        time_s = compute + comm + optim_s_per_byte * stepped
        state, grads, live, transient = mem
        act = live
        if accumulation == 1:
            # Gradients appear as backward frees the activations (zero_grad(set_to_none)
            # leaves none from the last step): per unit, one or the other is held.
            resident, live = state, max(live, grads)
        else:  # no_sync keeps gradients, and the sharded units' unsharded ones, throughout
            resident = state + grads + {"full_shard": P, "shard_grad_op": P, "hybrid_shard": P,
                                        "split": u.linear_bytes}.get(k, 0)
            grads = 0
        step = P / W if k == "shard_optim" else 0  # its owner's broadcast after the step
        out.append(Choice(str(s), time_s, int(resident), int(live), int(transient),
                          int(act), int(grads), int(step)))
    return out

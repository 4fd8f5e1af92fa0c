"""Pick one strategy per unit: minimum predicted step time under a per-rank memory budget.

A model is a sequence of units (execution order); each unit has a list of :class:`Choice` s,
one per candidate strategy. :func:`solve` picks one choice per unit minimising the total
predicted step time (plus an optional ``transition(prev, nxt)`` cost between neighbouring
units) subject to ``peak_bytes <= budget``.

Memory model (a conservative bound on the execution-order walk)::

    peak = sum_u (resident_u + live_u) + max_u transient_u

resident bytes are held all step; every unit's live bytes (saved activations, ZeRO-2's gathered
weights) coexist at the forward/backward turn; at most one unit's transient bytes (gathered
weights + prefetch, rotation buffers, one slice, temporaries) are live at a time.

Search (OSDP's, made exact). The ``max`` term is handled by enumerating the cap ``c`` on the
largest transient (each distinct transient value). Under a cap every unit keeps only choices
with ``transient <= c`` and the rest is a multiple-choice knapsack: weight ``resident + live``,
capacity ``budget - c``, minimise time. The knapsack is a Pareto-frontier DP: per unit (and per
previous pick, when transitions are given) a list of non-dominated ``(weight, time)`` states with
back-pointers. It is exact; only a frontier longer than ``buckets`` states is coarsened, by
rounding weights *up* to a multiple of ``budget / buckets``, which can cost optimality but never
admits a plan over budget. Bounds keep it fast (and leave it exact): a state is dropped when
the remaining units' lightest choices no longer fit, or when it cannot beat the best plan so
far even with the remaining units' fastest choices or by a Lagrangian bound (a price per byte,
bisected per cap to where the relaxed plan starts to fit; that plan, polished by single swaps,
is also the incumbent); whole caps are skipped by the same bounds. Ties are broken by time, then exact peak, then the
picks (lexicographically), and nothing depends on hashing or dict order, so every rank computes
the same plan from the same inputs.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence, Tuple

__all__ = ["Choice", "Solution", "BudgetError", "peak_bytes", "walk_peak", "total_time",
           "smallest_feasible_budget", "solve", "runner_up"]

Transition = Callable[["Choice", "Choice"], float]


@dataclass(frozen=True)
class Choice:
    strategy: str            # e.g. "full_shard", "split:4"
    time_s: float            # this unit's predicted step-time contribution
    resident_bytes: int      # held for the whole step
    live_bytes: int          # held from the unit's forward to its backward
    transient_bytes: int     # live only while this unit computes
    # For :func:`walk_peak` (the search itself uses the bound above): what the unit holds from
    # its forward to its backward (-1: ``live_bytes``), from its backward to the optimizer
    # step, and what the step itself adds for it (a shard_optim owner's broadcast share).
    act_bytes: int = -1
    grad_bytes: int = 0
    step_bytes: int = 0
    note: str = ""           # why it costs what it does, for explain() (compression)

    @property
    def weight(self) -> int:
        return self.resident_bytes + self.live_bytes


@dataclass
class Solution:
    picks: List[int]          # index into each unit's choice list
    time_s: float             # total, including transitions
    peak_bytes: int           # by the memory model above (exact)


def _fmt(n: int) -> str:
    return f"{n / 2**30:.3f} GiB = {n / 2**20:.1f} MiB"


class BudgetError(ValueError):
    """No assignment fits; ``.smallest_feasible_bytes`` says the smallest budget that fits."""

    def __init__(self, budget: int, smallest_feasible_bytes: int):
        self.budget = budget
        self.smallest_feasible_bytes = smallest_feasible_bytes
        super().__init__(
            f"no plan fits the per-rank memory budget of {budget} bytes ({_fmt(budget)}); "
            f"the smallest feasible budget is {smallest_feasible_bytes} bytes "
            f"({_fmt(smallest_feasible_bytes)})")


def _check(units: Sequence[Sequence[Choice]]) -> None:
    for u, cs in enumerate(units):
        if not cs:
            raise ValueError(f"unit {u} has no candidate choices")


def peak_bytes(units: Sequence[Sequence[Choice]], picks: Sequence[int]) -> int:
    cs = [units[u][k] for u, k in enumerate(picks)]
    return sum(c.weight for c in cs) + max((c.transient_bytes for c in cs), default=0)


def walk_peak(units: Sequence[Sequence[Choice]], picks: Sequence[int],
              step_bucket: int = 25 << 20) -> int:  # grad_sync's bucket; no torch here
    """The peak of one step walked in execution order: what the planner predicts. It never
    exceeds :func:`peak_bytes`, the bound the search plans against, except by the optimizer
    step's broadcast bucket when several shard_optim units share it.

    While unit u runs its backward, the units before it still hold their activations, the
    units after it already hold their gradients, and u holds the larger of the two (backward
    frees the one as it makes the other) and its transient; then the optimizer step holds
    every gradient and at most one broadcast bucket."""
    cs = [units[u][k] for u, k in enumerate(picks)]
    if not cs:
        return 0
    resident = sum(c.resident_bytes for c in cs)
    act = [c.live_bytes if c.act_bytes < 0 else c.act_bytes for c in cs]
    grads = sum(c.grad_bytes for c in cs)
    peak, before, after = 0, 0, grads
    for c, a in zip(cs, act):
        after -= c.grad_bytes
        peak = max(peak, resident + before + max(a, c.grad_bytes) + c.transient_bytes + after)
        before += a
    step = resident + grads + min(step_bucket, sum(c.step_bytes for c in cs))
    return max(peak, step)


def total_time(units: Sequence[Sequence[Choice]], picks: Sequence[int],
               transition: Optional[Transition] = None) -> float:
    # Summed in exactly the order solve's DP sums (time, then the transition into the unit), so
    # the two agree bit for bit.
    total, prev = 0.0, None
    for u, k in enumerate(picks):
        c = units[u][k]
        tr = float(transition(prev, c)) if (transition is not None and prev is not None) else 0.0
        total = total + c.time_s + tr
        prev = c
    return total


def smallest_feasible_budget(units: Sequence[Sequence[Choice]]) -> int:
    """Exact: min over caps c of (c + sum_u min weight among choices with transient <= c)."""
    return _leanest(units)[0]


def _leanest(units):
    """(smallest feasible budget, the cap that achieves it); one sweep over caps ascending,
    keeping each unit's lightest weight so far (first cap wins ties)."""
    _check(units)
    if not units:
        return 0, 0
    events = sorted((ch.transient_bytes, u, ch.weight) for u, cs in enumerate(units) for ch in cs)
    lightest = [None] * len(units)
    missing, total, best, i = len(units), 0, None, 0
    while i < len(events):
        c = events[i][0]
        while i < len(events) and events[i][0] == c:
            _, u, w = events[i]
            if lightest[u] is None:
                missing -= 1
                total += w
                lightest[u] = w
            elif w < lightest[u]:
                total += w - lightest[u]
                lightest[u] = w
            i += 1
        if not missing and (best is None or c + total < best[0]):
            best = (c + total, c)
    return best


def _key(units, picks, t):
    return (t, peak_bytes(units, picks), tuple(picks))


def brute_force(units: Sequence[Sequence[Choice]], budget: int, *,
                transition: Optional[Transition] = None) -> Solution:
    """Every assignment, for tests. Same tie-break as :func:`solve`."""
    _check(units)
    best = None
    for picks in itertools.product(*(range(len(cs)) for cs in units)):
        p = peak_bytes(units, picks)
        if p > budget:
            continue
        key = (total_time(units, picks, transition), p, picks)
        if best is None or key < best:
            best = key
    if best is None:
        raise BudgetError(budget, smallest_feasible_budget(units))
    return Solution(list(best[2]), best[0], best[1])


def _tol(t: float) -> float:
    # Bounds are summed in a different order than the DP's times: allow for rounding so that a
    # state tying the best plan is never dropped.
    return 1e-9 * max(1.0, abs(t))


def solve(units: Sequence[Sequence[Choice]], budget: int, *,
          transition: Optional[Transition] = None, buckets: int = 4096) -> Solution:
    smallest, lean_cap = _leanest(units)
    if budget < smallest:
        raise BudgetError(budget, smallest)
    n = len(units)
    if n == 0:
        return Solution([], 0.0, 0)
    step = max(1, -(-int(budget) // max(1, int(buckets))))

    # tr[u][j][k]: transition from unit u-1's choice j into unit u's choice k (tr[0] unused).
    if transition is None:
        tr, tr_floor = None, 0.0
    else:
        tr = [None] + [[[float(transition(a, b)) for b in units[u]] for a in units[u - 1]]
                       for u in range(1, n)]
        tr_floor = sum(min(min(row) for row in tr[u]) for u in range(1, n))

    # Lagrangian relaxation (price lam per byte): for every cap c and every plan under it,
    #   time >= sum_u min_{transient <= c} (time + lam * weight) + tr_floor - lam * (budget - c).
    # lam is chosen to maximise the weakest cap's bound; it bounds caps cheaply below and,
    # with transitions, states inside the DP.
    caps = sorted({ch.transient_bytes for cs in units for ch in cs})
    events = sorted((ch.transient_bytes, u, ch.time_s, ch.weight)
                    for u, cs in enumerate(units) for ch in cs)

    def cap_bounds(lam):
        """[(cap, Lagrangian bound)] for every cap under which every unit has a choice."""
        cur = [math.inf] * n
        missing, out, i = n, [], 0
        slack = _tol(lam * budget)  # rounding of terms as large as lam * budget
        for c in caps:
            while i < len(events) and events[i][0] <= c:
                _, u, t, w = events[i]
                v = t + lam * w
                if v < cur[u]:
                    missing -= cur[u] == math.inf
                    cur[u] = v
                i += 1
            if not missing:
                out.append((c, math.fsum(cur) + tr_floor - lam * (budget - c) - slack))
        return out

    def dual(lam):
        return min(b for _, b in cap_bounds(lam))

    # Natural scale: seconds per byte between a unit's fastest and its lightest choice.
    dt = sum(max(ch.time_s for ch in cs) - min(ch.time_s for ch in cs) for cs in units)
    dw = sum(max(ch.weight for ch in cs) - min(ch.weight for ch in cs) for cs in units)
    scale = hi = dt / dw if dt > 0 and dw > 0 else 1.0
    while dual(hi) > dual(hi / 2) and hi < 1e30:  # concave: the maximum lies below hi
        hi *= 2
    lo = 0.0
    for _ in range(60):  # ternary search on a concave function
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if dual(a) < dual(b):
            lo = a
        else:
            hi = b
    bounds = sorted(cap_bounds(lo), key=lambda x: (x[1], x[0]))
    # The knapsacks refine the price per cap (transitions included); any price gives valid
    # bounds, and a zero price (memory not binding in the relaxation) finds no incumbents.
    lam = lo if lo > 0 else scale

    # Seed with the leanest plan (at the cap that gives the smallest feasible budget, each
    # unit's lightest choice): it fits, so even a coarsened search always returns a plan.
    lean = [min((k for k, ch in enumerate(cs) if ch.transient_bytes <= lean_cap),
                key=lambda k, cs=cs: (cs[k].weight, cs[k].time_s, k)) for cs in units]
    best = _key(units, lean, total_time(units, lean, transition))  # (time, peak, picks)
    # Most promising caps first, so that an early incumbent prunes the rest.
    for c, lb in bounds:
        if lb > best[0] + _tol(best[0]):
            break
        allowed = [[k for k, ch in enumerate(cs) if ch.transient_bytes <= c] for cs in units]
        minw = [min(units[u][k].weight for k in allowed[u]) for u in range(n)]
        capacity = budget - c
        if sum(minw) > capacity:
            continue
        found, lam = _knapsack(units, allowed, minw, capacity, tr, step, buckets, best, lam)
        best = min(best, found)
    return Solution(list(best[2]), best[0], best[1])


def _completion(units, allowed, tr, lam):
    """H[u][k]: min over units u+1.. of sum(time + lam * weight) + transitions, given unit u
    picks k (memory otherwise ignored)."""
    n = len(units)
    H = [None] * n
    H[n - 1] = {k: 0.0 for k in allowed[n - 1]}
    for u in range(n - 2, -1, -1):
        nxt, nh = units[u + 1], H[u + 1]
        cost = {k: nxt[k].time_s + lam * nxt[k].weight + nh[k] for k in allowed[u + 1]}
        if tr is None:
            m = min(cost.values())
            H[u] = {j: m for j in allowed[u]}
        else:
            t = tr[u + 1]
            H[u] = {j: min(t[j][k] + cost[k] for k in allowed[u + 1]) for j in allowed[u]}
    return H


def _greedy(units, allowed, tr, lam, H, capacity):
    """The plan minimising time + lam * weight, if it fits ``capacity``: an incumbent."""
    picks, prev = [], None
    for u in range(len(units)):
        def score(k):
            ch = units[u][k]
            return (ch.time_s + lam * ch.weight + H[u][k]
                    + (tr[u][prev][k] if tr is not None and prev is not None else 0.0))
        prev = min(allowed[u], key=score)
        picks.append(prev)
    if sum(units[u][k].weight for u, k in enumerate(picks)) <= capacity:
        return picks
    return None


def _knapsack(units, allowed, minw, capacity, tr, step, buckets, best, lam):
    """(the better of ``best`` and the best (time, peak, picks) under one cap, price used)."""
    n = len(units)
    suf_w = [0] * (n + 1)  # lightest possible weight of units u..
    for u in range(n - 1, -1, -1):
        suf_w[u] = suf_w[u + 1] + minw[u]
    h = _completion(units, allowed, tr, 0.0)  # fastest completion: a time bound
    t_of = lambda p: total_time(units, p, None) if tr is None else _time_tr(units, p, tr)

    # Price 0 first: if the fastest plan under this cap fits, it is this cap's optimum.
    p = _greedy(units, allowed, tr, 0.0, h, capacity)
    if p is not None:
        return min(best, _key(units, p, t_of(p))), lam
    hl = None
    if lam > 0:
        # Lagrangian bound for this cap, transitions included: any plan that fits has
        # time >= min(time + lam * weight) - lam * capacity.
        hl = _completion(units, allowed, tr, lam)
        root = min(units[0][k].time_s + lam * units[0][k].weight + hl[0][k] for k in allowed[0])
        if root - lam * capacity > best[0] + _tol(best[0]) + _tol(root):
            return best, lam
        # Bracket, then bisect, the price at which the relaxation's plan starts to fit: the
        # fitting plan (polished by single swaps) is an incumbent, the price the best bound.
        fits = lambda x: _greedy(units, allowed, tr, x, _completion(units, allowed, tr, x),
                                 capacity) is not None
        lo, hi = lam, lam
        if fits(lam):
            for _ in range(60):
                lo /= 2
                if not fits(lo):
                    break
                hi = lo
        else:
            for _ in range(60):
                hi *= 2
                if fits(hi):
                    break
                lo = hi
        for _ in range(12):
            mid = (lo + hi) / 2
            lo, hi = (lo, mid) if fits(mid) else (mid, hi)
        lam = hi
        hl = _completion(units, allowed, tr, lam)
        p = _greedy(units, allowed, tr, lam, hl, capacity)
        if p is not None:
            p = _polish(units, allowed, tr, p, capacity)
            best = min(best, _key(units, p, t_of(p)))

    bound = best[0] + _tol(best[0])
    if min(units[0][k].time_s + h[0][k] for k in allowed[0]) > bound:
        return best, lam

    # The Lagrangian terms are as large as lam * capacity; their rounding needs its own slack.
    lbound = bound + (_tol(max(abs(v) for v in hl[0].values()) + lam * capacity) if hl else 0)

    def lower(u, k, w, t):
        if hl is not None and t + hl[u][k] - lam * (capacity - w) > lbound:
            return math.inf
        return t + h[u][k]

    # A state is (weight, time, parent state, pick). frontiers maps a group (the last pick when
    # transitions matter, else 0) to states sorted by weight with strictly decreasing time.
    frontiers = {}
    for k in allowed[0]:
        ch = units[0][k]
        if ch.weight + suf_w[1] <= capacity and lower(0, k, ch.weight, ch.time_s) <= bound:
            frontiers.setdefault(k if tr else 0, []).append((ch.weight, ch.time_s, None, k))
    frontiers = {g: _prune(s, step, buckets) for g, s in sorted(frontiers.items())}

    for u in range(1, n):
        cands = {}
        rest = suf_w[u + 1]
        for k in allowed[u]:
            ch = units[u][k]
            w_k, t_k, hk = ch.weight, ch.time_s, h[u][k]
            hlk = hl[u][k] - lam * capacity if hl is not None else None
            lim = capacity - rest - w_k
            out = cands.setdefault(k if tr else 0, [])
            for j in sorted(frontiers):
                t_in = tr[u][j][k] if tr else 0.0
                for s in frontiers[j]:
                    if s[0] > lim:
                        break  # sorted by weight: the rest are heavier still
                    t = s[1] + t_k + t_in
                    w = s[0] + w_k
                    if t + hk > bound or (hlk is not None and t + hlk + lam * w > lbound):
                        continue
                    out.append((w, t, s, k))
        frontiers = {g: f for g, s in sorted(cands.items()) if (f := _prune(s, step, buckets))}
        if not frontiers:
            return best, lam

    found = best
    for g in sorted(frontiers):
        s = frontiers[g][-1]  # fastest state of its group
        picks = []
        node = s
        while node is not None:
            picks.append(node[3])
            node = node[2]
        picks.reverse()
        key = _key(units, picks, s[1])
        found = min(found, key)
    return found, lam


def _polish(units, allowed, tr, picks, capacity):
    """Single-choice swaps that save time and still fit, until none is left."""
    n, picks = len(units), list(picks)
    weight = sum(units[u][k].weight for u, k in enumerate(picks))

    def around(u, k):  # unit u's time with choice k, transitions to its neighbours included
        t = units[u][k].time_s
        if tr is not None:
            if u > 0:
                t += tr[u][picks[u - 1]][k]
            if u + 1 < n:
                t += tr[u + 1][k][picks[u + 1]]
        return t

    for _ in range(100):
        improved = False
        for u in range(n):
            cur = picks[u]
            for k in allowed[u]:
                dw = units[u][k].weight - units[u][cur].weight
                if weight + dw <= capacity and around(u, k) < around(u, cur) - 1e-12:
                    picks[u], weight, cur, improved = k, weight + dw, k, True
        if not improved:
            break
    return picks


def _time_tr(units, picks, tr):
    # total_time with the precomputed transition table, same summation order
    total, prev = 0.0, None
    for u, k in enumerate(picks):
        total = total + units[u][k].time_s + (tr[u][prev][k] if prev is not None else 0.0)
        prev = k
    return total


def _prune(states, step, buckets):
    """Non-dominated states, by weight ascending (time strictly decreasing); coarsened (weights
    rounded up to multiples of ``step``) when longer than ``buckets``."""
    states.sort(key=lambda s: (s[0], s[1]))  # stable: ties keep generation order
    out = []
    for s in states:
        # After the sort an equal weight comes with an equal or greater time: dominated too.
        if not out or s[1] < out[-1][1]:
            out.append(s)
    if len(out) > buckets:
        coarse = []
        for w, t, p, k in out:
            w = -(-w // step) * step
            if coarse and coarse[-1][0] == w:
                coarse[-1] = (w, t, p, k)  # same rounded weight, and faster
            else:
                coarse.append((w, t, p, k))
        out = coarse
    return out


def runner_up(units: Sequence[Sequence[Choice]], sol: Solution, budget: int, *,
              transition: Optional[Transition] = None, peak=peak_bytes
              ) -> List[Optional[Tuple[int, float, int]]]:
    """Per unit, the best other choice with every other pick fixed that still fits the budget:
    ``(choice index, total time, peak bytes)``, or None when no other choice fits. ``peak``
    prices a plan's memory (:func:`peak_bytes` or :func:`walk_peak`)."""
    out = []
    for u, cs in enumerate(units):
        best = None
        for k in range(len(cs)):
            if k == sol.picks[u]:
                continue
            picks = list(sol.picks)
            picks[u] = k
            p = peak(units, picks)
            if p > budget:
                continue
            key = (total_time(units, picks, transition), p, k)
            if best is None or key < best:
                best = key
        out.append(None if best is None else (best[2], best[0], best[1]))
    return out

"""torch_rsdp.plan._planner.search: the per-unit strategy search (pure Python, no processes).

The reference is brute_force (every assignment); solve must agree with it exactly on small
instances, including ties, zero transients and transition costs.
"""
import math
import random
import time

import pytest

from torch_rsdp.plan._planner import search
from torch_rsdp.plan._planner.search import (BudgetError, Choice, brute_force, peak_bytes, runner_up,
                                    smallest_feasible_budget, solve, total_time)

MiB = 2**20


def random_units(rng, n_units, n_choices, *, small_values=False):
    """Random instance; small_values draws from a few values so that sizes and times tie."""
    def size():
        return rng.choice([0, 1, 2, 3]) * MiB if small_values else rng.randrange(0, 64) * MiB

    def secs():
        return rng.choice([0.1, 0.2, 0.3]) if small_values else rng.uniform(0.01, 1.0)

    return [[Choice(f"s{k}", secs(), size(), size(), size())
             for k in range(rng.randint(1, n_choices))] for _ in range(n_units)]


def random_transition(rng):
    """A deterministic transition cost depending on both strategies (a random table)."""
    table = {(a, b): rng.choice([0.0, 0.0, 0.05, 0.1, rng.uniform(0, 0.3)])
             for a in range(8) for b in range(8)}
    return lambda prev, nxt: table[int(prev.strategy[1:]), int(nxt.strategy[1:])]


def loose_budget(units):
    return sum(max(c.resident_bytes + c.live_bytes for c in cs) for cs in units) \
        + max(c.transient_bytes for cs in units for c in cs)


def realistic_units(n=6):
    """no_shard: biggest and fastest; full_shard: small, slower; rotate: smallest, slowest."""
    G = 2**30
    return [[Choice("no_shard", 1.0, 4 * G, G, 0),
             Choice("full_shard", 1.3, G, G, 3 * G // 2),
             Choice("rotate", 1.6, G, G, G // 2)] for _ in range(n)]


@pytest.mark.parametrize("incumbents", [True, False])
def test_solve_equals_brute_force(incumbents, monkeypatch):
    if not incumbents:
        # solve seeds its bound with relaxation plans (which alone would often be optimal);
        # without them the Pareto DP must find the optimum by itself
        monkeypatch.setattr(search, "_greedy", lambda *a: None)
    rng = random.Random(1234)
    for trial in range(250):
        units = random_units(rng, rng.randint(1, 6), 7, small_values=trial % 2 == 0)
        transition = random_transition(rng) if trial % 3 else None
        lo, hi = smallest_feasible_budget(units), loose_budget(units)
        for budget in (lo, rng.randint(lo, hi), hi, lo - 1):
            try:
                want = brute_force(units, budget, transition=transition)
            except BudgetError:
                with pytest.raises(BudgetError):
                    solve(units, budget, transition=transition)
                continue
            got = solve(units, budget, transition=transition)
            assert got.time_s == pytest.approx(want.time_s, rel=0, abs=1e-12), (trial, budget)
            # the reported numbers describe the reported picks, and the plan fits
            assert got.peak_bytes == peak_bytes(units, got.picks) <= budget
            assert got.time_s == pytest.approx(total_time(units, got.picks, transition), abs=1e-12)


def test_time_never_increases_with_budget():
    rng = random.Random(7)
    for trial in range(30):
        units = random_units(rng, 10, 5)
        transition = random_transition(rng) if trial % 2 else None
        lo, hi = smallest_feasible_budget(units), loose_budget(units)
        times = [solve(units, lo + (hi - lo) * i // 20, transition=transition).time_s
                 for i in range(21)]
        # more memory can only admit more plans
        assert all(b <= a + 1e-12 for a, b in zip(times, times[1:])), times
        assert times[-1] < times[0] or times[-1] == times[0]


def test_loose_budget_picks_fastest():
    rng = random.Random(3)
    units = random_units(rng, 12, 6)
    sol = solve(units, loose_budget(units))
    fastest = [min(range(len(cs)), key=lambda k: (cs[k].time_s, k)) for cs in units]
    assert sol.picks == fastest
    units = realistic_units()
    sol = solve(units, loose_budget(units))
    assert [units[u][k].strategy for u, k in enumerate(sol.picks)] == ["no_shard"] * len(units)


def test_tightest_budget_is_feasible_and_lean():
    rng = random.Random(11)
    for _ in range(50):
        units = random_units(rng, 8, 5)
        tight = smallest_feasible_budget(units)
        assert solve(units, tight).peak_bytes == tight
    units = realistic_units()
    tight = smallest_feasible_budget(units)
    sol = solve(units, tight)
    assert sol.peak_bytes == tight
    # all rotate: 6 * 2 GiB + 0.5 GiB; any no_shard or full_shard would cost more
    assert {units[u][k].strategy for u, k in enumerate(sol.picks)} == {"rotate"}


def test_infeasible_budget_raises_with_smallest_feasible():
    rng = random.Random(5)
    for _ in range(20):
        units = random_units(rng, 6, 4)
        tight = smallest_feasible_budget(units)
        with pytest.raises(BudgetError) as info:
            solve(units, tight - 1)
        assert info.value.smallest_feasible_bytes == tight
        assert str(tight) in str(info.value) and "GiB" in str(info.value)
        assert isinstance(info.value, ValueError)


def test_deterministic():
    rng = random.Random(99)
    units = random_units(rng, 20, 6, small_values=True)  # many ties
    transition = random_transition(rng)
    budget = (smallest_feasible_budget(units) + loose_budget(units)) // 2
    a = solve(units, budget, transition=transition)
    b = solve([list(cs) for cs in units], budget, transition=transition)
    assert (a.picks, a.time_s, a.peak_bytes) == (b.picks, b.time_s, b.peak_bytes)


def test_runner_up_feasible_and_never_better():
    rng = random.Random(21)
    for trial in range(40):
        units = random_units(rng, 5, 5)
        transition = random_transition(rng) if trial % 2 else None
        budget = rng.randint(smallest_feasible_budget(units), loose_budget(units))
        sol = solve(units, budget, transition=transition)
        alts = runner_up(units, sol, budget, transition=transition)
        assert len(alts) == len(units)
        for u, alt in enumerate(alts):
            others = [k for k in range(len(units[u])) if k != sol.picks[u]]
            if alt is None:  # only when no other choice of u fits
                for k in others:
                    picks = sol.picks[:u] + [k] + sol.picks[u + 1:]
                    assert peak_bytes(units, picks) > budget
                continue
            k, t, peak = alt
            picks = sol.picks[:u] + [k] + sol.picks[u + 1:]
            assert k in others and peak == peak_bytes(units, picks) <= budget
            assert t == total_time(units, picks, transition) >= sol.time_s - 1e-12


def _fastest_of(runs, fn):
    best = math.inf
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _reference_work():
    """A fixed amount of plain Python (about 1 M dict and float operations): what this
    machine's interpreter does in the time it takes, so that the solver's bound below is a
    multiple of it rather than of seconds on one CPU model."""
    d = {}
    for i in range(200_000):
        d[i & 1023] = d.get(i & 1023, 0.0) + i * 0.5
    return d


def test_speed_64_units_8_choices_with_transitions():
    """Each solve of 64 units x 8 choices with transitions costs at most 40 times the reference
    work (a wide margin over what a quiet machine takes), the fastest of three runs each, so that a
    neighbour's burst on a shared machine does not count against the solver."""
    rng = random.Random(64)
    units = [[Choice(f"s{k}", rng.uniform(0.01, 1.0), rng.randrange(1, 2**30),
                     rng.randrange(0, 2**30), rng.randrange(0, 2**30)) for k in range(8)]
             for _ in range(64)]
    transition = random_transition(rng)
    lo, hi = smallest_feasible_budget(units), loose_budget(units)
    reference = _fastest_of(3, _reference_work)
    for frac in (0.0, 0.05, 0.2, 0.5, 1.0):
        budget = lo + int((hi - lo) * frac)
        took = _fastest_of(3, lambda: solve(units, budget, transition=transition))
        assert took < 40 * reference, (frac, took, reference)
        assert solve(units, budget, transition=transition).peak_bytes <= budget


def test_coarsened_frontier_never_exceeds_budget():
    # few buckets coarsen every frontier (weights rounded up to budget / buckets): the plan
    # may be slower than optimal, but is never over budget, and some plan is always found
    rng = random.Random(8)
    for trial in range(100):
        units = random_units(rng, 6, 5)
        transition = random_transition(rng) if trial % 2 else None
        budget = rng.randint(smallest_feasible_budget(units), loose_budget(units))
        exact = brute_force(units, budget, transition=transition)
        got = solve(units, budget, transition=transition, buckets=rng.randint(1, 4))
        assert got.peak_bytes == peak_bytes(units, got.picks) <= budget
        assert got.time_s >= exact.time_s - 1e-12


def test_walk_peak_by_hand_and_never_above_the_bound():
    # two units: (resident, act, grads, transient); backward of unit 1 sees unit 0's
    # activations and its own larger part; backward of unit 0 sees unit 1's gradients
    a = Choice("x", 1.0, 10, 7, 5, act_bytes=7, grad_bytes=2)
    b = Choice("y", 1.0, 20, 4, 1, act_bytes=3, grad_bytes=4)
    # unit 0's backward: 30 + 0 + max(7, 2) + 5 + 4 = 46; unit 1's: 30 + 7 + 4 + 1 = 42;
    # the optimizer step: 30 + 6 + min(bucket, 0) = 36
    assert search.walk_peak([[a], [b]], [0, 0]) == 46
    assert peak_bytes([[a], [b]], [0, 0]) == 30 + 7 + 4 + 5
    so = Choice("shard_optim", 1.0, 100, 0, 0, act_bytes=0, grad_bytes=50, step_bytes=40)
    assert search.walk_peak([[so]], [0], step_bucket=25) == 100 + 50 + 25
    rng = random.Random(7)
    for _ in range(300):
        units = []
        for _ in range(rng.randint(1, 6)):
            cs = []
            for k in range(rng.randint(1, 4)):
                act, grad = rng.randrange(0, 9), rng.randrange(0, 9)
                cs.append(Choice(f"s{k}", 1.0, rng.randrange(0, 9), max(act, grad),
                                 rng.randrange(0, 9), act_bytes=act, grad_bytes=grad))
            units.append(cs)
        picks = [rng.randrange(len(cs)) for cs in units]
        assert search.walk_peak(units, picks) <= peak_bytes(units, picks)


def test_auto_choice_uses_what_the_bound_leaves_and_stays_monotone():
    # plan.auto plans against the walked peak: never slower than the bound's plan, always
    # fitting by the walk, and never slower at a larger budget
    from torch_rsdp.plan._planner.auto import _choose
    rng = random.Random(11)
    gained = 0
    for _ in range(40):
        units = []
        for _ in range(rng.randint(2, 6)):
            cs = []
            for k in range(rng.randint(2, 4)):
                act, grad = rng.randrange(0, 64) * MiB, rng.randrange(0, 64) * MiB
                cs.append(Choice(f"s{k}", rng.uniform(0.1, 1.0), rng.randrange(0, 64) * MiB,
                                 max(act, grad), rng.randrange(0, 64) * MiB,
                                 act_bytes=act, grad_bytes=grad))
            units.append(cs)
        lo, hi = smallest_feasible_budget(units), loose_budget(units)
        prev = None
        for i in range(8):
            budget = lo + (hi - lo) * i // 7
            got = _choose(units, budget)
            bound = solve(units, budget)
            assert search.walk_peak(units, got.picks) <= budget
            assert got.time_s <= bound.time_s + 1e-12
            gained += got.time_s < bound.time_s - 1e-12
            if prev is not None:
                assert got.time_s <= prev + 1e-12, (i, got.time_s, prev)
            prev = got.time_s
    assert gained, "the walk never allowed a faster plan than the bound"

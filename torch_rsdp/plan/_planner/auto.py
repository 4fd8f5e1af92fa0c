"""``plan.auto``: choose every unit's strategy under a memory budget from measured costs (OSDP).

    p = plan.auto(model, example_batch, memory_budget="6GiB")
    print(p.explain())
    model = plan.apply(model, p)

Steps: decide the units (by default each repeated block, e.g. every transformer layer, and
every other module that holds parameters: embeddings, norms, the head); measure them and the
collectives (:mod:`.profile`, cached); price every (unit, strategy) (:mod:`.cost`, or with
``topology=Cluster(...)`` for a cluster we do not have, :mod:`.cluster`); search the cheapest
assignment whose peak fits (:mod:`.search`) on group rank 0 and broadcast it, so every rank
applies the same plan.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import torch.distributed as dist
import torch.nn as nn

from ..._utils import group_rank0
from ...rsdp import can_rotate
from .._cost_terms import Links, UnitProfile
from .._mesh import Meshes, device_type_of
from .._spec import Plan, block_patterns, parse_strategy, resolve
from .._strategies import is_splittable
from .._ownership import build_units
from .cluster import Cluster
from .cost import DEFAULT_STRATEGIES, applicable, unit_choices, with_compression
from .explain import Prediction, UnitPrediction, explain
from .profile import OPTIMIZER_STATE_FACTOR, Profile, profile_model
from .search import (BudgetError, Choice, Solution, peak_bytes, runner_up,
                     smallest_feasible_budget, solve, total_time, walk_peak)
from .verify import PlanCheck, measure_plans

__all__ = ["auto", "predict", "plan_profile", "AutoPlan", "parse_budget", "default_units"]


class AutoPlan(Plan):
    """A :class:`Plan` with the planner's prediction (``explain()``, ``prediction``)."""

    prediction: Prediction

    def explain(self) -> str:
        return explain(self.prediction)


_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 10**6,
          "mib": 1 << 20, "g": 1 << 30, "gb": 10**9, "gib": 1 << 30, "t": 1 << 40,
          "tb": 10**12, "tib": 1 << 40}


def parse_budget(budget: Union[str, int, float], local_ranks: int = 1) -> int:
    """Bytes per rank from ``"6GiB"`` / ``"512MB"`` / bytes / a fraction in (0, 1] of this
    machine's memory shared by its ``local_ranks`` ranks."""
    if isinstance(budget, bool):
        raise TypeError("memory_budget: expected bytes, a size string or a fraction")
    if isinstance(budget, float) and 0 < budget <= 1:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return int(total * budget / max(1, local_ranks))
    if isinstance(budget, (int, float)):
        if budget <= 0:
            raise ValueError(f"memory_budget must be positive, got {budget}")
        return int(budget)
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(budget))
    if not m or m.group(2).lower() not in _UNITS:
        raise ValueError(f"memory_budget {budget!r}: expected e.g. '6GiB', '512MB', bytes, or a "
                         f"fraction of the machine's memory")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def default_units(model: nn.Module) -> List[str]:
    """Every repeated block, then every other module that holds parameters itself."""
    names = [n for n, _ in model.named_modules()]
    blocks = []
    for pat in block_patterns(model):
        prefix = pat[:-1]
        blocks += [n for n in names if n.startswith(prefix) and "." not in n[len(prefix):]
                   and n[len(prefix):]]
    under = tuple(b + "." for b in blocks)
    others = [n for n, m in model.named_modules()
              if n and n not in blocks and not n.startswith(under)
              and any(True for _ in m.parameters(recurse=False))]
    return blocks + others


@dataclass
class _Planning:
    """One run of the planner: what it was asked and what its phases have found so far.

    ``auto``, ``predict`` and ``plan_profile`` share the first phases and every phase reads
    most of these, so each takes this one object rather than the same values in a row. One
    ``Meshes`` serves the whole run, so the node layout is read once and any group it builds
    is built once."""

    model: nn.Module
    example_inputs: object
    group: Optional[dist.ProcessGroup]
    optimizer: str
    topology: Optional[Cluster] = None
    accumulation: int = 1
    #: bytes per rank; 0 where nothing is planned against a budget (``predict``)
    budget: int = 0
    meshes: Meshes = field(init=False)
    # found by the phases, in this order
    prof: Optional[Profile] = None
    links: Optional[Links] = None
    candidates: List[str] = field(default_factory=list)
    choices: List[List[Choice]] = field(default_factory=list)  # per profiled unit

    def __post_init__(self):
        self.meshes = Meshes(self.group, device_type_of(self.model))

    def ranks_per_node(self) -> int:
        """Ranks sharing a machine's memory (a budget given as a fraction of it is split
        among them)."""
        if self.topology is not None:
            return self.topology.ranks_per_node
        return len(self.meshes.nodes()[0])


def auto(model: nn.Module, example_inputs, *, memory_budget, group=None,
         optimizer: str = "adamw", strategies: Optional[Sequence[str]] = None,
         units: Union[None, Sequence[str], Callable[[str, nn.Module], bool]] = None,
         topology: Optional[Cluster] = None, use_cache: bool = True,
         headroom: float = 0.05, accumulation: int = 1, verify: int = 2,
         verify_steps: int = 4, allow_compression: bool = False) -> AutoPlan:
    """The fastest plan whose predicted peak per rank fits ``memory_budget``. Collective.

    Args:
        model: the unwrapped model.
        example_inputs: one micro-batch as this rank passes it to ``model`` (a tensor, a tuple of
            positional arguments, or a dict of keyword arguments).
        memory_budget: per rank: bytes, ``"6GiB"``, or a fraction of this machine's memory.
        optimizer: the optimizer's state rule: ``"adamw"``, ``"adam"``, ``"sgd"``,
            ``"sgd_momentum"``, ``"adagrad"``, ``"rmsprop"``.
        strategies: the candidates (default: every strategy, ``split:2`` and ``split:4``).
        units: module names, or a predicate ``(name, module) -> bool``; default: each repeated
            block and every other module holding parameters.
        topology: a :class:`Cluster` to plan for instead of this group.
        headroom: the fraction of the budget kept free for what the model does not count
            (allocator slack, the optimizer's temporaries, library buffers).
        accumulation: micro-batches per optimizer step (``plan.no_sync`` on all but the last):
            sharded units then keep unsharded gradients between micro-batches.
        verify: after the search, race the pick against this many uniform plans
            (:meth:`Plan.uniform`; the fastest predicted of those that fit the budget or miss
            it by less than :data:`RIVAL_SLACK`), each trained ``verify_steps`` steps on a
            copy of the model (:mod:`.verify`), and keep the fastest whose measured peak fits;
            ``explain()`` shows predicted against measured. 0: trust the cost model. Not
            done with ``topology`` (there is nothing to measure on).
        verify_steps: timed steps per candidate (over two rounds, plus a warm-up step each).
        allow_compression: also consider, per unit, sending its cross-node traffic quantised
            (``full_shard+int8``, ``no_shard+int4``, ...: :mod:`torch_rsdp.plan._plan_compression`),
            priced from the links' fits and the quantisation kernels' speed, residuals
            counted as memory; ``explain()`` says where it was chosen and what it saves.
            Only with more than one node; off by default, as it changes the numbers.

    Raises:
        BudgetError: (a ``ValueError``) no plan fits; it names the smallest budget that fits.
    """
    _check_options(headroom, verify, verify_steps)
    job = _Planning(model, example_inputs, group, optimizer, topology, accumulation)
    job.budget = parse_budget(memory_budget, job.ranks_per_node())
    _profile(job, strategies, units, use_cache)
    _price_units(job, allow_compression)
    picks, runner_ups, rivals = _search_on_rank0(job, headroom, verify)
    picked = _planned(job, picks, runner_ups)
    return _race(job, picked, rivals, verify_steps) if rivals else picked


def _check_options(headroom: float, verify: int, verify_steps: int) -> None:
    """The options only ``auto`` takes, checked first: a bad one fails before anything is
    measured."""
    if not 0 <= headroom < 1:
        raise ValueError(f"torch_rsdp.plan.auto: headroom must be in [0, 1), got {headroom}")
    if isinstance(verify, bool) or not isinstance(verify, int) or verify < 0:
        raise ValueError(f"torch_rsdp.plan.auto: verify must be an int >= 0 (uniform plans to "
                         f"race the pick against; 0: none), got {verify!r}")
    if isinstance(verify_steps, bool) or not isinstance(verify_steps, int) or verify_steps < 1:
        raise ValueError(f"torch_rsdp.plan.auto: verify_steps must be an int >= 1, got "
                         f"{verify_steps!r}")


def _profile(job: _Planning, strategies, units, use_cache: bool) -> None:
    """Sets ``job.prof`` (the units and collectives measured, or read from the cache),
    ``job.links`` (measured, or the ``Cluster``'s) and ``job.candidates``. Collective."""
    if job.optimizer not in OPTIMIZER_STATE_FACTOR:
        raise ValueError(f"torch_rsdp.plan.auto: unknown optimizer rule {job.optimizer!r}; "
                         f"one of {sorted(OPTIMIZER_STATE_FACTOR)}")
    cands = _candidates(strategies)
    owned = _unit_bytes(job.model, _select_units(job.model, units))
    here = Links(dist.get_world_size(job.group), len(job.meshes.nodes()), {})
    # timed as the exact strategies: compression is priced from the links and kernels
    timed = (lambda u: list(dict.fromkeys(str(s.exact) for s in map(parse_strategy, cands)
                                          if applicable(u, s.exact, here))))
    job.prof = profile_model(job.model, job.example_inputs, owned, group=job.group,
                             optimizer=job.optimizer, meshes=job.meshes, use_cache=use_cache,
                             strategies=timed)
    job.links = (job.topology.links() if job.topology is not None
                 else Links.measured(job.prof))
    job.candidates = cands


def _select_units(model: nn.Module, units) -> List[str]:
    if units is None:
        return default_units(model)
    if callable(units):
        picked = [n for n, m in model.named_modules() if n and units(n, m)]
        return [n for n in picked if not any(n.startswith(p + ".") for p in picked)]
    names = dict(model.named_modules())
    bad = [u for u in units if u not in names]
    if bad:
        raise ValueError(f"torch_rsdp.plan.auto: units {bad} are not modules of "
                         f"{type(model).__name__}")
    return list(units)


def _unit_bytes(model: nn.Module, unit_names: List[str]) -> Dict[str, Dict[str, int]]:
    """What each unit owns (tied parameters at their common ancestor, as apply does)."""
    res = resolve(model, Plan({n: "no_shard" for n in unit_names}), strict=True)
    units = build_units(model, res)
    counts: Dict[int, int] = {}
    for _, p in model.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    linear, rotate = set(), set()
    for _, m in model.named_modules():
        if is_splittable(m) and counts.get(id(m.weight), 0) == 1:
            linear.add(id(m.weight))
        if can_rotate(m):
            if all(counts.get(id(p), 0) == 1 for p in m.parameters(recurse=False)):
                rotate.update(id(p) for p in m.parameters())
    out = {}
    for name, u in units.items():
        if name not in unit_names and not (name == "" and u.params):
            continue
        ps = list(u.params.values())
        nb = lambda sel: sum(p.numel() * p.element_size() for p in ps if sel(p))  # noqa: E731
        out[name] = {"numel": sum(p.numel() for p in ps),
                     "param_bytes": nb(lambda p: True),
                     "linear_bytes": nb(lambda p: id(p) in linear),
                     "rotate_bytes": nb(lambda p: id(p) in rotate),
                     # [Note: frozen parameters in the cost model] in _cost_terms.py
                     "frozen_bytes": nb(lambda p: not p.requires_grad),
                     "frozen_linear": nb(lambda p: id(p) in linear and not p.requires_grad),
                     "frozen_rotate": nb(lambda p: id(p) in rotate and not p.requires_grad)}
    return out


def _candidates(strategies) -> List[str]:
    """The candidate strategies' canonical names (every strategy by default)."""
    return [str(parse_strategy(s)) for s in (strategies or DEFAULT_STRATEGIES)]


def _price_units(job: _Planning, allow_compression: bool) -> None:
    """Sets ``job.choices``: every profiled unit under each candidate it can use, priced."""
    if allow_compression:  # whether compressing can pay depends on the links just found
        job.candidates = with_compression(job.candidates, job.links)
    if job.accumulation < 1:
        raise ValueError(f"torch_rsdp.plan.auto: accumulation must be >= 1, got "
                         f"{job.accumulation}")
    job.choices = [unit_choices(u, job.candidates, job.links, job.optimizer,
                                job.prof.optim_s_per_byte, measured_ok=job.topology is None,
                                accumulation=job.accumulation)
                   for u in job.prof.units]


def _search_on_rank0(job: _Planning, headroom: float, verify: int):
    """(picks per unit, runner-up per unit, uniform plans to race) as rank 0 found them.
    Collective; raises BudgetError on every rank when no plan fits."""
    # One rank searches and the others take its answer, so that every rank applies (and
    # races) the very same plans; a failed search travels as data so that every rank raises.
    result: list = [None]
    if dist.get_rank(job.group) == 0:
        result[0] = _search(job, headroom, verify)
    dist.broadcast_object_list(result, src=group_rank0(job.group), group=job.group)
    if result[0][0] == "budget":
        raise BudgetError(result[0][1], result[0][2])
    _, picks, runner_ups, rivals = result[0]
    return picks, runner_ups, rivals


def _search(job: _Planning, headroom: float, verify: int) -> tuple:
    """``("ok", picks, runner-ups, rivals)``, or ``("budget", budget, the smallest budget
    that fits)``."""
    usable = int(job.budget * (1 - headroom))
    try:
        sol = _choose(job.choices, usable)
        rivals = (_uniform_rivals(job)[:verify]
                  if verify > 0 and job.topology is None else [])  # nothing to measure on
        return ("ok", sol.picks, runner_up(job.choices, sol, usable, peak=walk_peak), rivals)
    except BudgetError as e:
        # The search saw the budget less its headroom: name the budget to ask for, the one
        # whose usable part is the smallest that fits (rounded up).
        return ("budget", job.budget,
                -(-e.smallest_feasible_bytes * 10**6 // int((1 - headroom) * 10**6)))


GRID_POINTS = 24


def _choose(choices, usable: int) -> Solution:
    """The fastest plan whose walked peak (:func:`.search.walk_peak`) fits ``usable``.

    The exact search plans against a bound (every unit's activations or gradients at once,
    plus the largest transient) that overestimates the walk by up to a tenth here; planning
    against the bound alone would leave that memory idle. So the search also runs at bound
    budgets above ``usable``, on a grid fixed by the model alone (24 steps from the smallest
    feasible budget to the fastest plan's), and the fastest of those plans whose walk fits
    wins. With the grid independent of the budget, a larger budget never gives a slower plan.
    """
    sol = solve(choices, usable)  # raises BudgetError naming the smallest feasible budget
    first = (sol.time_s, walk_peak(choices, sol.picks), sol.picks)
    best = first if first[1] <= usable else None
    top = peak_bytes(choices, solve(choices, 1 << 62).picks)
    low = smallest_feasible_budget(choices)
    ratio = max(1.01, (top / max(1, low)) ** (1 / GRID_POINTS))
    for j in range(1, GRID_POINTS + 1):
        x = int(low * ratio ** j)
        if x <= usable:
            continue  # solve(usable) is at least as fast
        s = solve(choices, x)
        w = walk_peak(choices, s.picks)
        if w <= usable:
            best = min(best or (s.time_s, w, s.picks), (s.time_s, w, s.picks))
        if x >= top:
            break
    best = best or first  # only the step's shared broadcast bucket could make it not fit
    return Solution(list(best[2]), best[0], peak_bytes(choices, best[2]))


def _planned(job: _Planning, picks: List[int], runner_ups) -> AutoPlan:
    """The search's plan, with its prediction."""
    mapping = {u.name: job.choices[i][picks[i]].strategy for i, u in enumerate(job.prof.units)}
    default = mapping.pop("", "no_shard")  # the root unit, if any, is the rest of the model
    p = AutoPlan(mapping, default)
    p.prediction = _prediction(job, job.prof.units, job.choices, picks, runner_ups)
    return p


def _prediction(job: _Planning, units, choices, picks, runner_ups=None) -> Prediction:
    links, topology = job.links, job.topology
    topo = (f"{topology}" if topology is not None else
            f"measured here ({links.world} ranks, {links.nodes} node(s))")
    pred = Prediction(job.budget, walk_peak(choices, picks), total_time(choices, picks),
                      links.world, links.nodes, topo, from_cache=job.prof.from_cache)
    for i, u in enumerate(units):
        c = choices[i][picks[i]]
        up = runner_ups[i] if runner_ups else None
        pred.units.append(UnitPrediction(
            u.name, u.numel, c.strategy, c.resident_bytes + c.live_bytes, c.transient_bytes,
            c.time_s, *(None, None, None) if up is None else
            (choices[i][up[0]].strategy, up[1], up[2]), note=_compression_note(choices[i], c)))
    return pred


def _compression_note(cs, c) -> str:
    """Why the unit's traffic is, or is not, compressed (empty if it was no candidate)."""
    if c.note:
        return c.note
    alts = [a for a in cs if a.strategy.startswith(f"{c.strategy}+")]
    if not alts:
        return ""
    best = min(alts, key=lambda a: a.time_s)
    why = ("no faster" if best.time_s >= c.time_s else
           "faster, but it does not fit with the other units' choices")
    return f"exact: {best.note} ({best.strategy} {why})"


#: A uniform plan predicted to need up to this much more than the budget still races (the
#: memory model errs by some percent either way, and the race measures what it needs).
RIVAL_SLACK = 0.15
#: Step times this close are a tie at least (wider where the race's own steps spread more):
#: a few steps of two runs of one plan land this far apart on a quiet machine.
RACE_TIE = 0.03


def _uniform_rivals(job: _Planning) -> List[Tuple[str, float, int]]:
    """``(strategy, predicted step s, predicted peak)`` of each uniform plan
    (:meth:`Plan.uniform`: every block its own unit, the rest of the model one more, as users
    apply FSDP2) predicted to fit ``job.budget`` within :data:`RIVAL_SLACK`, fastest first; of
    two the cost model cannot tell apart (``hybrid_shard`` on one node is ``full_shard``) only
    the first."""
    out, seen = [], set()
    for s in job.candidates:
        _, cs, ps = _price(job, Plan.uniform(job.model, s))
        t, peak = total_time(cs, ps), walk_peak(cs, ps)
        if peak <= job.budget * (1 + RIVAL_SLACK) and (round(t, 9), peak) not in seen:
            seen.add((round(t, 9), peak))
            out.append((t, s, peak))
    return [(s, t, peak) for t, s, peak in sorted(out)]


def _race(job: _Planning, picked: AutoPlan, rivals, steps: int) -> AutoPlan:
    """The pick against ``rivals``, measured (:func:`.verify.measure_plans`): the fastest
    whose measured peak fits ``job.budget`` wins -- a uniform plan within :data:`RACE_TIE` of
    the pick, or within the spread of either one's timed steps, counts as a tie and wins it,
    being the simpler plan: a mix must be measurably faster --; if none fits, the smallest
    measured peak. (The measurement counts every tensor torch allocates, temporaries
    included, so it is held to the budget itself, not to what the headroom leaves of it.)
    The plan returned carries the race in ``prediction.checks``."""
    plans = [picked] + [Plan.uniform(job.model, s) for s, _, _ in rivals]
    measured = measure_plans(job.model, job.example_inputs, plans, group=job.group,
                             optimizer=job.optimizer, steps=steps,
                             accumulation=job.accumulation)
    fit = [i for i, (_, peak, _) in enumerate(measured) if peak <= job.budget]
    if fit:
        best = min(fit, key=lambda i: (measured[i][0], i))

        def tie(i):  # how close counts as equal: the quiet-machine floor or the race's noise
            return max(RACE_TIE, measured[0][2], measured[i][2])

        tied = [i for i in fit if i and measured[i][0] <= measured[best][0] * (1 + tie(i))]
        if best == 0 and tied:  # a mix must be measurably faster to be worth it
            best = min(tied, key=lambda i: (measured[i][0], i))
    else:  # the memory model erred for every one: the budget is the harder constraint
        best = min(range(len(plans)), key=lambda i: (measured[i][1], i))
    pred = picked.prediction
    rows = [("planned", pred.step_time_s, pred.peak_bytes)] + [
        (f"uniform {s}", t, peak) for s, t, peak in rivals]
    checks = [PlanCheck(label, t * job.accumulation, peak, mt, mpeak, kept=i == best,
                        measured_spread=spread)
              for i, ((label, t, peak), (mt, mpeak, spread)) in enumerate(zip(rows, measured))]
    if best:
        won = plans[best]
        picked = AutoPlan({k: str(v) for k, v in won.mapping.items()}, str(won.default))
        picked.prediction = _prediction(job, *_price(job, won))
    picked.prediction.checks = checks
    return picked


def predict(model: nn.Module, example_inputs, plan, *, group=None, optimizer: str = "adamw",
            units=None, topology: Optional[Cluster] = None, use_cache: bool = True
            ) -> Prediction:
    """What the planner predicts for ``plan`` (any :class:`Plan`, mapping or strategy name):
    peak per rank and step time. Collective (profiles, or reads the cache).

    The plan's own units are priced: where one of its units covers several profiled units
    (``Plan.uniform`` puts the embeddings, the final norm and the head in the root unit), their
    measurements are merged into one unit (:func:`_merge`): under an FSDP2 strategy, for
    example, that unit gathers all three at once, and its transient memory is priced so (its
    time is the sum of theirs, each timed alone)."""
    p = Plan.of(plan, model=model)
    job = _Planning(model, example_inputs, group, optimizer, topology)
    _profile(job, None, units, use_cache)
    return _prediction(job, *_price(job, p))


def plan_profile(model: nn.Module, example_inputs, *, group=None, optimizer: str = "adamw",
                 units=None, use_cache: bool = True):
    """The profile the planner uses (per-unit measurements, collective fits). Collective."""
    job = _Planning(model, example_inputs, group, optimizer)
    _profile(job, None, units, use_cache)
    return job.prof


def _price(job: _Planning, p: Plan):
    """(the plan's units, their choices, the plan's pick in each): ``p`` priced as it is,
    its units and strategies rather than the search's."""
    res = resolve(job.model, p, strict=False)
    groups: Dict[str, List[UnitProfile]] = {}
    for u in job.prof.units:  # execution order; a group sits where its first member runs
        groups.setdefault(res.unit_of[u.name], []).append(u)
    merged = [g[0] if len(g) == 1 else _merge(owner, g) for owner, g in groups.items()]
    choices, picks = [], []
    for u in merged:
        s = res.strategy_of_module(u.name)
        want = str(s)
        cands = list(DEFAULT_STRATEGIES) + ([want] if want not in DEFAULT_STRATEGIES else [])
        cs = unit_choices(u, cands, job.links, job.optimizer, job.prof.optim_s_per_byte,
                          measured_ok=job.topology is None, accumulation=job.accumulation)
        names = [c.strategy for c in cs]
        if want not in names:  # what apply does with a strategy the unit cannot use
            want = str(s.exact) if str(s.exact) in names else s.handler.fallback(job.links)
        choices.append(cs)
        picks.append(names.index(want))
    return merged, choices, picks


def _merge(name: str, parts: List[UnitProfile]) -> UnitProfile:
    """One unit made of ``parts`` (profiled separately): bytes and times add up, the
    temporaries' peak is the largest part's; a strategy's measured time is known only where
    every part was timed with it."""
    timed = set.intersection(*(set(u.strategy_s) for u in parts))
    return UnitProfile(
        name, sum(u.numel for u in parts), sum(u.param_bytes for u in parts),
        sum(u.linear_bytes for u in parts), sum(u.rotate_bytes for u in parts),
        fwd_s=sum(u.fwd_s for u in parts), bwd_s=sum(u.bwd_s for u in parts),
        act_bytes=sum(u.act_bytes for u in parts), temp_bytes=max(u.temp_bytes for u in parts),
        strategy_s={s: sum(u.strategy_s[s] for u in parts) for s in sorted(timed)},
        frozen_bytes=sum(u.frozen_bytes for u in parts),
        frozen_linear=sum(u.frozen_linear for u in parts),
        frozen_rotate=sum(u.frozen_rotate for u in parts))

"""torch_rsdp.plan._strategies: the handler registry and the cost each handler gives the planner
(pure Python, no processes; every strategy's behaviour end to end is in test_plan.py)."""
from __future__ import annotations

import pytest

import torch_rsdp.plan as plan
from torch_rsdp.plan._cost_terms import Fit, Links, UnitProfile
from torch_rsdp.plan._planner.cost import unit_choices
from torch_rsdp.plan._registry import unregister
from torch_rsdp.plan._strategies import StrategyHandler, handler_for, kinds, register
from torch_rsdp.plan._strategies.replicate import NoShard
from torch_rsdp.plan import _registry as registry
from torch_rsdp.plan._spec import parse_strategy


def test_every_strategy_has_one_handler():
    assert plan.STRATEGIES == ("no_shard", "shard_optim", "full_shard", "shard_grad_op",
                               "hybrid_shard", "rotate", "split:k")
    for name in plan.STRATEGIES:
        s = parse_strategy(name.replace(":k", ":3"))
        assert isinstance(s.handler, StrategyHandler)
        assert s.handler.kind == s.kind
        assert handler_for(s) is s.handler  # one instance per strategy
        assert str(parse_strategy(str(s))) == str(s)
    assert parse_strategy("split:3").k == 3
    fsdp = {k for k in kinds() if handler_for(parse_strategy(
        k + (":2" if k == "split" else ""))).fsdp}
    assert fsdp == {"full_shard", "shard_grad_op", "hybrid_shard"}
    with pytest.raises(ValueError, match="unknown strategy 'rotate:2'"):
        parse_strategy("rotate:2")  # only split takes :k
    with pytest.raises(ValueError, match="split:k needs k >= 1"):
        parse_strategy("split:0")
    with pytest.raises(ValueError, match="no_shard, shard_optim, full_shard"):
        parse_strategy("zero4")


def test_a_new_strategy_is_one_registered_handler():
    """Registering a handler is all a strategy needs to be parsed and priced."""

    class Mirror(NoShard):
        kind = "mirror"

        def cost(self, u, links, f, bucket):
            c = super().cost(u, links, f, bucket)
            c.state *= 2
            return c

    register(Mirror)
    try:
        s = parse_strategy("mirror")
        assert isinstance(s.handler, Mirror)
        u = UnitProfile("x", 10, 400, 0, 0, fwd_s=0.1, bwd_s=0.2)
        links = Links(2, 1, {})
        (m,), (n,) = (unit_choices(u, [name], links, "sgd", 0.0) for name in ("mirror",
                                                                             "no_shard"))
        assert m.resident_bytes == 2 * n.resident_bytes == 800
        with pytest.raises(ValueError, match="registered twice"):
            register(Mirror)
    finally:
        unregister("mirror")
    with pytest.raises(ValueError, match="unknown strategy"):
        parse_strategy("mirror")

    class Incomplete(StrategyHandler):  # no apply, no cost
        kind = "incomplete"

    register(Incomplete)
    try:
        with pytest.raises(TypeError, match="abstract"):
            parse_strategy("incomplete").handler
    finally:
        unregister("incomplete")


def _links(world=4, nodes=2, s_per_byte=1e-9):
    fit = Fit(0.0, 1 / s_per_byte)
    fits = {f"{k}@{lvl}": fit for k in ("all_gather", "reduce_scatter", "all_reduce",
                                        "broadcast", "ring_shift")
            for lvl in ("group", "intra", "inter")}
    return Links(world, nodes, fits)


@pytest.mark.parametrize("accumulation,frozen", [(1, False), (3, False), (1, True)])
def test_handler_costs_follow_the_table(accumulation, frozen):
    """Every handler's memory terms, as the table in _planner/cost.py states them (W=4 ranks,
    L=2 per node, AdamW f=2, bucket B), and its modelled communication; with ``frozen`` part
    of each kind of parameter needs no gradient ([Note: frozen parameters in the cost
    model]): it is held, but has no gradient, optimizer state or gradient traffic."""
    P, A, T, Pl, Pr, B = 4000, 300, 50, 2400, 3200, 1000
    W, L, f = 4, 2, 2.0
    Fz, Fl, Fr = (3000, 2000, 2800) if frozen else (0, 0, 0)  # frozen bytes of P, Pl, Pr
    G, Gl, Gr = P - Fz, Pl - Fl, Pr - Fr
    u = UnitProfile("layer", 1000, P, Pl, Pr, fwd_s=0.01, bwd_s=0.02, act_bytes=A, temp_bytes=T,
                    frozen_bytes=Fz, frozen_linear=Fl, frozen_rotate=Fr)
    links = _links()
    names = ["no_shard", "shard_optim", "full_shard", "shard_grad_op", "hybrid_shard",
             "rotate", "split:2"]
    got = {c.strategy: c for c in unit_choices(u, names, links, "adamw", 0.0, bucket=B,
                                               measured_ok=False, accumulation=accumulation)}
    # strategy: (state, grads, live, transient, extra kept between micro-batches)
    table = {
        "no_shard": (P + f * G, G, A, T + min(G, B), 0),
        "shard_optim": (P + f * G / W, G, A, T + min(G, B), 0),
        "full_shard": ((P + f * G) / W, G / W, A, T + 2 * P + 2 * G, G),
        "shard_grad_op": ((P + f * G) / W, G / W, A + P * (W - 1) / W, T + P + 1.5 * G, G),
        "hybrid_shard": ((P + f * G) / L, G / L, A, T + 2 * P + 2 * G, G),
        "rotate": ((Pr + f * Gr) / W + P - Pr + f * (G - Gr), Gr / W + G - Gr, A,
                   T + (Pr + Gr) / W, 0),
        "split:2": ((Pl + f * Gl) / W + P - Pl + f * (G - Gl), Gl / W + G - Gl, A,
                    T + (2 * Pl + Gl) / 2, Gl),
    }
    if not frozen:  # the same as the fully trained table
        assert table["full_shard"][3] == T + 4 * P and table["split:2"][3] == T + 3 * Pl / 2
    assert set(got) == set(table)
    for name, (state, grads, live, transient, extra) in table.items():
        c = got[name]
        if accumulation == 1:
            want = (state, max(live, grads), transient, grads)
        else:
            want = (state + grads + extra, live, transient, 0)
        assert (c.resident_bytes, c.live_bytes, c.transient_bytes, c.grad_bytes) == \
            tuple(int(x) for x in want), name
        assert c.act_bytes == int(live), name
        assert c.step_bytes == (int(G / W) if name == "shard_optim" else 0), name
    # communication at 1 ns per byte, no latency: compute 30 ms plus these bytes
    comm = {"no_shard": G, "shard_optim": G + G, "full_shard": 2 * P + G,
            "shard_grad_op": P + G, "hybrid_shard": 2 * P + G + G / L,
            "rotate": (W - 1) * (2 * Pr + Gr) / W + (G - Gr),
            "split:2": 2 * Pl + Gl + (G - Gl)}
    for name, nbytes in comm.items():
        assert got[name].time_s == pytest.approx(0.03 + nbytes * 1e-9), name


def test_applicability_and_fallbacks():
    links1, links2 = _links(4, 1), _links(4, 2)
    empty = UnitProfile("root", 0, 0, 0, 0)
    norm = UnitProfile("norm", 10, 40, 0, 0)
    assert [c.strategy for c in unit_choices(empty, list(plan.STRATEGIES[:-1]) + ["split:2"],
                                             links2, "adamw", 0.0)] == ["no_shard"]
    names = [c.strategy for c in unit_choices(norm, ["rotate", "split:2", "hybrid_shard",
                                                     "full_shard"], links1, "adamw", 0.0)]
    assert names == ["full_shard"]  # nothing to rotate or split; one node: no hybrid
    assert parse_strategy("hybrid_shard").handler.fallback(links1) == "full_shard"
    assert parse_strategy("hybrid_shard").handler.fallback(links2) == "no_shard"
    assert parse_strategy("rotate").handler.fallback(links1) == "no_shard"


def test_cost_terms_keep_their_old_homes():
    """Links, UnitProfile, Fit and Cost live in plan.cost_terms (below both the handlers and
    the planner) and stay importable where they were."""
    from torch_rsdp.plan import _cost_terms as cost_terms
    from torch_rsdp.plan._planner import cost, profile
    from torch_rsdp.plan._strategies import Cost, base
    assert cost.Links is cost_terms.Links and cost.kernel_s_per_byte is cost_terms.kernel_s_per_byte
    assert profile.UnitProfile is cost_terms.UnitProfile and profile.Fit is cost_terms.Fit
    assert Cost is base.Cost is cost_terms.Cost
    assert base.register is registry.register and base.handler_for is handler_for

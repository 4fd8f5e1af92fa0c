"""``python -m benchmarks launches``: how the spread over launches is judged, how variants of
rsdp's environment are compared, and what each launch runs.

The verdicts of the launches suite (rsdp at or below Open MPI in every launch of a steady mode,
its spread over launches no wider than Open MPI's) and the variants' ratios are computed by
`summarize` from the launches' medians; a wrong one there would misreport the comparison. These
tests feed it launches whose outcome is known (the arithmetic, not this machine's speed), and
check that each launch asks the collectives suite for the same timed iterations at every size
(`--iters`) under its variant's environment. No process is spawned: under a second.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import launches as bench_launches

K64, M1, B8 = 64 << 10, 1 << 20, 8


def launch(mode: str, rsdp: dict, mpi: dict, state: str = "clear") -> dict:
    return {"probe": {"mode": mode}, "states": {"rsdp": state, "mpi": state},
            "times": {"rsdp": rsdp, "mpi": mpi}}


def cells(table: str, n: int) -> list[list[str]]:
    """The first `n` cells of every row of a markdown table."""
    return [[c.strip() for c in line.split("|")[1:n + 1]] for line in table.splitlines()]


def verdicts(launches, sizes=(B8, K64, M1)):
    return bench_launches.summarize(launches, list(sizes))[1]


def test_spread_is_max_over_min_and_judged_against_open_mpi():
    launches = [launch("near", {K64: 10, M1: 100}, {K64: 20, M1: 200}),
                launch("near", {K64: 12, M1: 180}, {K64: 30, M1: 210}),
                launch("far", {K64: 11, M1: 120}, {K64: 25, M1: 400})]
    v = verdicts(launches)
    # 64 KiB: rsdp 12/10 = 1.20x against Open MPI 30/20 = 1.50x; 1 MiB: 1.80x against 2.00x.
    assert "PASS  all launches, 64K: rsdp spread 1.20x, Open MPI 1.50x" in v
    assert "PASS  all launches, 1M: rsdp spread 1.80x, Open MPI 2.00x" in v
    launches[1]["times"]["rsdp"][M1] = 250  # 2.50x now, and above Open MPI in that launch
    v = verdicts(launches)
    assert "MISS  all launches, 1M: rsdp spread 2.50x, Open MPI 2.00x" in v
    assert "MISS  near/clear launches, 1M: rsdp/mpi at most 1.19 (goal <= 1)" in v
    assert "PASS  far/clear launches, 1M: rsdp/mpi at most 0.30 (goal <= 1)" in v


def test_small_sizes_and_changing_cpus_are_shown_not_judged():
    launches = [launch("near", {B8: 50, K64: 10}, {B8: 5, K64: 20}),
                launch("near", {B8: 60, K64: 40}, {B8: 5, K64: 20}, state="changed")]
    table, v = bench_launches.summarize(launches, [B8, K64])
    assert not any(" 8B:" in line for line in v)  # below 64 KiB a call's fixed cost rules
    assert not any("changed" in line for line in v)  # the CPUs changed under that launch
    assert "PASS  near/clear launches, 64K: rsdp/mpi at most 0.50 (goal <= 1)" in v
    # The changed launch still counts in the spread over all launches: 40/10 against 1.00x.
    assert "MISS  all launches, 64K: rsdp spread 4.00x, Open MPI 1.00x" in v
    assert ["near/changed", "1", "64K"] in cells(table, 3)


def run_one_launch(monkeypatch, tmp_path, iters: int) -> list[str]:
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        out = Path(cmd[cmd.index("--out") + 1])
        rows = [{"backend": b, "op": "allreduce", "bytes": K64, "time_us": t}
                for b, t in (("rsdp", 9.0), ("rsdp@1", 3.0), ("mpi", 18.0))]
        seen["env"] = kwargs["env"]
        out.joinpath("results.json").write_text(json.dumps({"results": {"rows": rows,
                                                                         "machine": {}}}))
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(bench_launches.subprocess, "run", fake_run)
    args = SimpleNamespace(world_size=4, op="allreduce", sizes=[K64], peers=["mpi"],
                           iters=iters, timeout=60)
    times = bench_launches.one_launch(args, str(tmp_path), "on", {"RSDP_SHM_ADAPT": "once"},
                                      peers=["mpi"])
    assert times == {"on": {K64: 9.0}, "mpi": {K64: 18.0}}  # rsdp@1 is no launch's
    assert seen["env"]["RSDP_SHM_ADAPT"] == "once"
    assert seen["cmd"][1:4] == ["-m", "benchmarks", "collectives"]
    return seen["cmd"]


def test_every_size_gets_the_same_timed_iterations(monkeypatch, tmp_path):
    cmd = run_one_launch(monkeypatch, tmp_path, bench_launches.ITERS)
    i = cmd.index("--iters")
    assert cmd[i + 1] == str(bench_launches.ITERS)
    assert cmd[cmd.index("--min-iters") + 1] == str(bench_launches.ITERS)
    assert cmd[cmd.index("--peers") + 1] == "mpi"
    # 0 leaves the collectives suite's own scaling.
    cmd = run_one_launch(monkeypatch, tmp_path, 0)
    assert "--iters" not in cmd and "--min-iters" not in cmd


def test_variants_parse_and_are_compared_with_the_first():
    parse = bench_launches.parse_variants
    assert parse("") == [("rsdp", {})]
    assert parse("off:RSDP_SHM_ADAPT=off,on:RSDP_SHM_ADAPT=continuous;RSDP_SPIN_US=0") == [
        ("off", {"RSDP_SHM_ADAPT": "off"}),
        ("on", {"RSDP_SHM_ADAPT": "continuous", "RSDP_SPIN_US": "0"})]
    for bad in ("off:RSDP_SHM_ADAPT", "a:X=1,a:X=2"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse(bad)
    rounds = [{"probe": {"mode": "near"}, "states": {"off": "clear", "on": "clear"},
               "times": {"off": {K64: off}, "on": {K64: on}}}
              for off, on in ((10.0, 8.0), (20.0, 10.0), (10.0, 12.0))]
    table, v = bench_launches.summarize(rounds, [K64], ["off", "on"])
    assert v == []  # no Open MPI: nothing to judge
    head, _, near, all_ = table.splitlines()
    assert "on/off per launch" in head and "off/mpi" not in head
    # per-launch ratios 0.8, 0.5, 1.2: median 0.80; off's median 10.0 over 3 launches
    assert "0.80 (0.50–1.20) [3]" in all_ and "10.0 (10.0–20.0, 2.00x) [3]" in all_
    assert cells(near, 1) == [["near/clear"]]


def test_a_round_alternates_variants_and_runs_the_peers_last(monkeypatch):
    calls = []

    def fake(args, out_dir, label, env, peers):
        calls.append((label, env, tuple(peers)))
        return {label: {K64: 1.0}, **{p: {K64: 2.0} for p in peers}}

    # the CPUs contended around the second launch only (its probes 30 ms against 10 ms)
    probes = iter({"alone_ms": {0: ms}, "together_ms": ms} for ms in (10, 10, 30))
    monkeypatch.setattr(bench_launches, "one_launch", fake)
    monkeypatch.setattr(bench_launches.common, "probe", lambda: next(probes))
    args = SimpleNamespace(peers=["mpi"])
    ln = bench_launches.one_round(args, [("on", {"A": "1"}), ("off", {"A": "0"})])
    assert calls == [("on", {"A": "1"}, ()), ("off", {"A": "0"}, ("mpi",))]
    assert set(ln["times"]) == {"on", "off", "mpi"}
    assert bench_launches.cpu_states(ln, 10.0) == {"on": "clear", "off": "changed",
                                                   "mpi": "changed"}

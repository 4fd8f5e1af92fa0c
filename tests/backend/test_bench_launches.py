"""``bench_launches.py``: how the spread over launches is judged, and what each launch runs.

The goals of the launch-mode benchmark (rsdp at or below Open MPI in every launch of a steady
mode, its spread over launches no wider than Open MPI's) are computed by `summarize` from the
launches' medians; a wrong verdict there would report a goal held that was missed. These tests
feed it launches whose outcome is known, and check that each launch asks bench_collectives.py
for the same timed iterations at every size (`--iters`), which is what keeps a launch's median
from being 20 noisy samples. No process is spawned: under a second.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import bench_launches  # noqa: E402

K64, M1, B8 = 64 << 10, 1 << 20, 8


def launch(mode: str, rsdp: dict, mpi: dict, state: str = "clear") -> dict:
    return {"probe": {"mode": mode}, "states": {"rsdp": state, "mpi": state},
            "times": {"rsdp": rsdp, "mpi": mpi}}


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
    assert "| near/changed | 1 | 64K |" in table


def run_one_launch(monkeypatch, tmp_path, iters: int) -> list[str]:
    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        out = Path(cmd[cmd.index("--out") + 1])
        rows = [{"backend": b, "op": "allreduce", "bytes": K64, "time_us": t}
                for b, t in (("rsdp", 9.0), ("rsdp@1", 3.0), ("mpi", 18.0))]
        out.joinpath("results.json").write_text(json.dumps({"rows": rows, "machine": {}}))
        return SimpleNamespace(returncode=0, stdout="", stderr="")

    monkeypatch.setattr(bench_launches.subprocess, "run", fake_run)
    args = SimpleNamespace(world_size=4, op="allreduce", sizes=[K64], peers=["mpi"],
                           iters=iters, timeout=60)
    ln = bench_launches.one_launch(args, str(tmp_path))
    assert ln["times"] == {"rsdp": {K64: 9.0}, "mpi": {K64: 18.0}}  # rsdp@1 is no launch's
    return seen["cmd"]


def test_every_size_gets_the_same_timed_iterations(monkeypatch, tmp_path):
    cmd = run_one_launch(monkeypatch, tmp_path, bench_launches.ITERS)
    i = cmd.index("--iters")
    assert cmd[i + 1] == str(bench_launches.ITERS)
    assert cmd[cmd.index("--min-iters") + 1] == str(bench_launches.ITERS)
    assert cmd[cmd.index("--peers") + 1] == "mpi"
    # 0 leaves bench_collectives' own scaling, as runs before the option were measured.
    cmd = run_one_launch(monkeypatch, tmp_path, 0)
    assert "--iters" not in cmd and "--min-iters" not in cmd

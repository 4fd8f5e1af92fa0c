"""``python -m benchmarks collectives --peers mpi,oneccl``: the libraries measured beside the backends.

One tiny sweep (2 ranks, allreduce / allgather / reduce_scatter / broadcast / alltoall, float32
and bfloat16, 1 KiB and 2 KiB, a couple of iterations) run as a user runs it: a subprocess of
the benchmark. Every point must have a row from Open MPI (float32 only: MPI has no bfloat16) and
from oneCCL (both dtypes), each checked exact by the peer itself and timed, and the report must
show both peers with their `rsdp/<peer>` ratios. scripts/setup.sh installs both peers (Open
MPI and mpi4py; the oneccl-cpu wheels and libfabric), so a peer that cannot run here fails the
test rather than skipping it: a skip would hide a broken set-up. About 15 s on the 2-core
machine (the first run also compiles benchmarks/oneccl_peer.cpp, a few seconds more).
"""
from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks import common as bench_peers
from support.harness import backend_under_test

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="the sweep runs rsdp (and rsdp@1) beside the peers")

OPS = ("allreduce", "allgather", "reduce_scatter", "broadcast", "alltoall")


def test_peers_mpi_and_oneccl_measure_every_point(tmp_path):
    for peer in ("mpi", "oneccl"):
        why = bench_peers.unavailable(peer)
        if why:
            pytest.fail(f"peer {peer} cannot run here: {why} (bash scripts/setup.sh installs it)")
    cmd = [sys.executable, "-m", "benchmarks", "collectives", "--backends", "rsdp", "--peers",
           "mpi,oneccl", "--ops", ",".join(OPS), "--dtypes", "float32,bfloat16",
           "--min-bytes", "1K", "--max-bytes", "2K", "--iters", "3", "--min-iters", "2",
           "--reps", "2", "--warmup", "1", "--timeout", "60", "--out",
           str(tmp_path)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    report = json.loads((tmp_path / "results.json").read_text())["results"]
    rows = {(r["backend"], r["op"], r["dtype"], r["bytes"]): r for r in report["rows"]}
    for op in OPS:
        for dtype, esize in (("float32", 4), ("bfloat16", 2)):
            for nbytes in (1024, 2048):
                for peer in ("mpi", "oneccl") if dtype == "float32" else ("oneccl",):
                    r = rows.get((peer, op, dtype, nbytes))
                    assert r is not None, f"no {peer} row for {op} {dtype} {nbytes} B"
                    assert r["correct"] and not r.get("error"), r
                    assert r["count"] == nbytes // esize and r["world_size"] == 2, r
                    assert r["time_us"] > 0 and len(r["samples_us"]) >= 2, r
    assert not any(k[0] == "mpi" and k[2] == "bfloat16" for k in rows)
    info = report["machine"]
    assert info["oneccl_wheel_version"] == bench_peers.ONECCL_VERSION
    assert bench_peers.ONECCL_VERSION in info["oneccl_library_version"]
    assert "FI_PROVIDER=shm" in info["oneccl_command"]
    text = (tmp_path / "results.md").read_text()
    assert "Peer `oneccl`: oneCCL" in text and "Peer `mpi`: Open MPI" in text
    assert "oneccl µs" in text and "mpi µs" in text
    assert "rsdp/oneccl" in text and "rsdp/mpi" in text


def test_a_missing_oneccl_wheel_is_named(monkeypatch):
    """Without the wheel the peer is left out with the reason and the install command."""
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    why = bench_peers.unavailable("oneccl")
    assert "oneccl-cpu" in why and f"=={bench_peers.ONECCL_VERSION}" in why, why

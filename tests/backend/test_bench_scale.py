"""`python -m benchmarks scale --quick` runs and reports sane costs (docs/scale.md).

The quick run measures 2 ranks on one node and 4 ranks on 2 emulated nodes (RSDP_NODE_ID on
the loopback), so both the shared-memory-only group and the UCX path are covered. The bounds
are loose on purpose (a loaded 2-core machine) but catch a broken measurement: a missing row,
a zero or negative time, a thread or fd count that grew with something other than the group,
a shared-memory size that disagrees with the layout in csrc/transport/shm/shm_layout.h. About
20 s (two launches).
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from support.harness import backend_under_test

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MiB = 1 << 20

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="measures the rsdp backend's own costs")


def test_bench_scale_quick(tmp_path):
    cmd = [sys.executable, "-m", "benchmarks", "scale", "--quick", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = json.loads((tmp_path / "scale.json").read_text())["results"]["rows"]
    assert [(r["world_size"], r["nodes"]) for r in rows] == [(2, 1), (4, 2)], rows
    for r in rows:
        W, ctx = r["world_size"], f"{r['world_size']} ranks"
        assert "error" not in r and not r["hung"], (ctx, r.get("error"), r.get("log_tails"))
        assert 0 < r["setup_s"] < 60 and 0 < r["new_group_s"] < 60, (ctx, r["setup_s"])
        assert 0 < r["allreduce_8B_us"] < 1e5 and 0 < r["allreduce_1MiB_us"] < 1e6, ctx
        init = r["init"]
        # One worker thread per group, plus UCX's progress thread with other nodes.
        assert all(1 <= t <= 4 for t in r["after_ops"]["threads"]), (ctx, r["after_ops"])
        # A pidfd per local peer; UCX's sockets, event fds and epolls per endpoint.
        assert all(1 <= n <= 16 + 4 * W for n in init["fds"]), (ctx, init)
        assert all(p == r["per_node"] - 1 for p in init["pidfds"]), (ctx, init)
        assert all(-16 < m < 256 for m in init["rss_mib"]), (ctx, init["rss_mib"])
        # 2 local ranks: header and control pages, two 1 MiB staging halves per rank, a 1 MiB
        # ring with its 128 B of control per ordered pair.
        shm = r["shm"]
        assert shm["local_size"] == 2
        assert shm["reserved_bytes"] == 8192 + 2 * 2 * MiB + 4 * (MiB + 128), shm
        assert shm["reserved_per_rank_bytes"] == shm["reserved_bytes"] / 2
        # set-up asks the store a fixed number of things per rank, whatever W (docs/scale.md)
        assert all(1 <= q <= 12 for q in r["setup_store_requests"]), (ctx, r)
        note = r["notice"]
        assert note["raised"] == W - 1 and 0 < note["last_s"] < 10, (ctx, note)
    one, two = rows
    assert one["endpoints"] == [0, 0] and one["shm"]["pool_bytes_per_rank"] > 0
    # UCX: endpoints only to the peers a rank reached, all on the other node (shared memory
    # inside a node): its rail peer at least, never more than the other node's two ranks.
    assert all(1 <= e <= 2 for e in two["endpoints"]), two["endpoints"]
    assert two["endpoints_other_node"] == two["endpoints"], two
    assert two["shm"]["pool_bytes_per_rank"] == 0
    assert two["shm"]["segment_bytes"] == two["shm"]["reserved_bytes"]
    assert all(s >= 1 for s in two["init"]["sockets"]), two["init"]
    assert re.search(r"^\|\s*4\s*\|\s*2 x 2\s*\|", (tmp_path / "scale.md").read_text(), re.M)

"""Self-tests of tests/support/harness.py: its failure detection must actually fail.

These run without the backend under test (no process group, backend="gloo" so torch_rsdp is
not imported) and only check that the launcher reports exceptions, crashes, hangs and
leaked /dev/shm entries.
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from support.harness import LaunchError, launch, rsdp_shm_entries


def _ok_worker(ctx, x):
    return (ctx.rank, ctx.world_size, x, os.environ.get("RSDP_SHM_BYTES"), os.environ.get("RSDP_X"))


def _raise_worker(ctx):
    if ctx.rank == 1:
        raise ValueError("boom-from-rank-one")
    return "fine"


def _crash_worker(ctx):
    if ctx.rank == 0:
        os._exit(3)
    return "fine"


def _hang_worker(ctx):
    if ctx.rank == 1:
        time.sleep(3600)
    return "fine"


def _shm_leak_worker(ctx, name):
    if ctx.rank == 0:
        with open(os.path.join("/dev/shm", name), "wb") as f:
            f.write(b"x")
    return "fine"


def _sigkill_worker(ctx):
    if ctx.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return "fine"


def test_values_and_env_reach_workers():
    res = launch(_ok_worker, 3, ("arg",), backend="gloo", init=False, env={"RSDP_X": "7"}, deadline=60)
    assert res.values() == [(r, 3, "arg", "65536", "7") for r in range(3)]


def test_exception_is_reported_with_traceback():
    with pytest.raises(LaunchError) as ei:
        launch(_raise_worker, 2, backend="gloo", init=False, deadline=60)
    msg = str(ei.value)
    assert "rank 1 raised ValueError" in msg
    assert "boom-from-rank-one" in msg and "_raise_worker" in msg


def test_crash_is_reported():
    with pytest.raises(LaunchError, match=r"rank 0 died without a result \(exitcode=3\)"):
        launch(_crash_worker, 2, backend="gloo", init=False, deadline=60)


def test_hang_is_killed_at_deadline():
    t0 = time.monotonic()
    with pytest.raises(LaunchError) as ei:
        launch(_hang_worker, 2, backend="gloo", init=False, deadline=12)
    assert time.monotonic() - t0 < 12 + 20
    msg = str(ei.value)
    assert re.search(r"ranks \[(0, )?1\] still running after the 12s deadline", msg), msg[:500]
    assert "_hang_worker" in msg  # faulthandler dumped the hung stack into the log


def test_shm_leak_is_detected():
    name = f"rsdp_harness_selftest_{os.getpid()}_{time.monotonic_ns()}"
    try:
        with pytest.raises(LaunchError, match=f"left behind: .*{name}"):
            launch(_shm_leak_worker, 1, (name,), backend="gloo", init=False, deadline=60)
    finally:
        try:
            os.unlink(os.path.join("/dev/shm", name))
        except FileNotFoundError:
            pass
    assert name not in rsdp_shm_entries()


def test_expected_sigkill():
    res = launch(_sigkill_worker, 2, backend="gloo", init=False, expect_killed=[1], deadline=60)
    assert res[0] == "fine"
    with pytest.raises(LaunchError, match="died without a result"):
        launch(_sigkill_worker, 2, backend="gloo", init=False, deadline=60)


_ORPHAN_LAUNCHER = """
import os, sys, time
sys.path.insert(0, {tests!r})
from support.harness import launch

def sleeper(ctx):
    with open(os.path.join({out!r}, f"pid{{ctx.rank}}"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(300)

if __name__ == "__main__":
    launch(sleeper, 2, deadline=300, init=False)
"""


def test_ranks_die_with_a_launcher_killed_from_outside(tmp_path):
    """A launcher SIGKILLed mid-launch (no cleanup of its own runs) takes its ranks with it
    within seconds, instead of leaving them to run to their deadline."""
    import subprocess
    import sys

    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "launcher.py"
    script.write_text(_ORPHAN_LAUNCHER.format(tests=tests, out=str(tmp_path)))
    proc = subprocess.Popen([sys.executable, str(script)])
    try:
        end = time.monotonic() + 90
        while len(list(tmp_path.glob("pid*"))) < 2 and time.monotonic() < end:
            time.sleep(0.2)
        pids = [int(p.read_text()) for p in tmp_path.glob("pid*")]
        assert len(pids) == 2, "the ranks did not start"
    finally:
        proc.kill()
        proc.wait()

    def alive(pid):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        # a zombie is dead too (its parent, the fork server, may not have reaped it yet)
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"

    end = time.monotonic() + 15
    while any(alive(p) for p in pids) and time.monotonic() < end:
        time.sleep(0.2)
    left = [p for p in pids if alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"ranks {left} outlived their killed launcher"

"""Processes a test leaves running.

The suite puts ``RSDP_TEST_OWNER=<pytest pid>`` into its environment, which every process a
test starts inherits (ranks, launchers, peers' programs, their children; the multiprocessing
fork server's children through the server) unless a test hands a process a whole new
environment. After a test, a process that carries the mark, started while the test ran and is
still running outlived it: a leak (a rank still spinning on a core slows every test after it and
turns timing checks into coin tosses). It is given a few seconds to exit (ranks being reaped),
then killed, and the test fails naming it. multiprocessing's fork server and resource tracker
live as long as pytest by design and are not counted.
"""
from __future__ import annotations

import os
import signal
import time

MARK = "RSDP_TEST_OWNER"
_HZ = os.sysconf("SC_CLK_TCK")
_SERVERS = ("multiprocessing.forkserver", "multiprocessing.resource_tracker")


def install() -> None:
    """Marks this pytest process's environment (once; kept by sub-sessions)."""
    os.environ.setdefault(MARK, str(os.getpid()))


def now() -> int:
    """Clock ticks since boot, the unit of a process's start time in /proc/PID/stat."""
    with open("/proc/uptime") as f:
        return int(float(f.read().split()[0]) * _HZ)


def started_since(ticks: int) -> dict[int, str]:
    """{pid: command line} of the live processes with this session's mark that started at or
    after `ticks` (this process and pytest's own servers excluded)."""
    needle = f"{MARK}={os.environ.get(MARK, '')}".encode()
    me = os.getpid()
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == me:
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            state, ppid, start = fields[0], int(fields[1]), int(fields[19])
            if state in "ZX" or start < ticks:
                continue
            with open(f"/proc/{name}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmd = " ".join(f.read().decode(errors="replace").replace("\0", " ").split())
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            continue
        if ppid == me and any(s in cmd for s in _SERVERS):
            continue
        out[int(name)] = cmd[:200]
    return out


def reap(ticks: int, grace: float = 5.0) -> dict[int, str]:
    """Waits up to `grace` seconds for the processes started since `ticks` to exit; kills
    those left and returns them ({} when none outlived the test)."""
    end = time.monotonic() + grace
    left = started_since(ticks)
    while left and time.monotonic() < end:
        time.sleep(0.1)
        left = started_since(ticks)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    return left

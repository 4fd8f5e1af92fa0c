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


def proc(pid: int) -> dict:
    """One process as /proc shows it: state, ppid, start (clock ticks since boot), cpu (user +
    system ticks used) and cmd (its command line, or [name] for a kernel thread). Raises
    OSError when it is gone or not ours to read."""
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    fields = stat.rsplit(")", 1)[1].split()
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        cmd = " ".join(f.read().decode(errors="replace").replace("\0", " ").split())
    return {"state": fields[0], "ppid": int(fields[1]), "start": int(fields[19]),
            "cpu": int(fields[11]) + int(fields[12]),
            "cmd": cmd[:200] or f"[{stat[stat.find('(') + 1:stat.rfind(')')]}]"}


def pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def started_since(ticks: int) -> dict[int, str]:
    """{pid: command line} of the live processes with this session's mark that started at or
    after `ticks` (this process and pytest's own servers excluded)."""
    needle = f"{MARK}={os.environ.get(MARK, '')}".encode()
    me = os.getpid()
    out = {}
    for pid in pids():
        if pid == me:
            continue
        try:
            p = proc(pid)
            if p["state"] in "ZX" or p["start"] < ticks:
                continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
        except (OSError, IndexError, ValueError):  # gone meanwhile, or not ours to read
            continue
        if p["ppid"] == me and any(s in p["cmd"] for s in _SERVERS):
            continue
        out[pid] = p["cmd"]
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

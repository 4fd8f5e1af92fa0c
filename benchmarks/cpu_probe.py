"""How fast this machine's CPUs run the interpreter right now: alone, and all at once.

On a virtual machine a vCPU can share its host core with another hardware thread: the guest's
other vCPU (when the host placed the two on one core's hyperthreads) or another guest's. The
sharing comes and goes within seconds, and neither the guest kernel nor the hand-off probe
(csrc/transport/shm/handoff_probe.h: cache-line round trips stay fast) sees it. What it does to
a collective is double its fixed cost: torch's dispatch and any Python around it run at half
speed (2-core AMD EPYC KVM guest: a 2-rank 4 KiB all-reduce 8 -> 21 µs, 64 KiB 18 -> 30-49 µs,
while a C multiply chain and an 8 KiB memcpy loop keep their speed).

probe() times a fixed interpreter loop on each CPU alone (the others idle), then on all of them
at once (each pinned to its CPU, started together), the fastest of `reps` each. `contended`
classifies a probe against the fastest alone time seen in the same run: a probe is contended
when a CPU alone, or the CPUs together, take more than THRESHOLD times that. About 0.5 s on
two CPUs.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import time

LOOP = 1_000_000
THRESHOLD = 1.25


def _spin(n: int) -> float:
    t0 = time.perf_counter()
    s = 0
    for i in range(n):
        s += i
    return time.perf_counter() - t0


def _pinned(cpu: int, n: int, reps: int, start, q) -> None:
    os.sched_setaffinity(0, {cpu})
    start.wait()
    q.put(min(_spin(n) for _ in range(reps)))


def probe(reps: int = 3, loop: int = LOOP) -> dict:
    """{"alone_ms": {cpu: ms}, "together_ms": ms (slowest CPU), "cpus": [...]}."""
    cpus = sorted(os.sched_getaffinity(0))
    ctx = mp.get_context("fork")
    alone = {}
    for cpu in cpus:
        q, start = ctx.Queue(), ctx.Event()
        p = ctx.Process(target=_pinned, args=(cpu, loop, reps, start, q))
        p.start()
        start.set()
        alone[cpu] = q.get() * 1e3
        p.join()
    q, start = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_pinned, args=(c, loop, reps, start, q)) for c in cpus]
    for p in procs:
        p.start()
    time.sleep(0.05)  # all started and waiting
    start.set()
    together = max(q.get() for _ in procs) * 1e3
    for p in procs:
        p.join()
    return {"cpus": cpus, "alone_ms": alone, "together_ms": together}


def reference_ms(probes: list[dict]) -> float:
    """The fastest alone time of a run's probes: the machine uncontended."""
    return min(min(p["alone_ms"].values()) for p in probes)


def contended(p: dict, ref_ms: float) -> bool:
    worst = max(max(p["alone_ms"].values()), p["together_ms"])
    return worst > THRESHOLD * ref_ms


def describe(p: dict) -> str:
    alone = "/".join(f"{v:.0f}" for v in p["alone_ms"].values())
    return f"interpreter loop alone {alone} ms, together {p['together_ms']:.0f} ms"

"""Multi-process test harness for the torch_rsdp c10d backend.

The launcher itself (`launch`, `LaunchError`, `backend_under_test`, the /dev/shm checks) is
torch_rsdp.testing.launch, shared with the benchmarks; see its docstring. This module adds the
batched cases the test families run inside one launch.
"""

from __future__ import annotations

import time
import traceback
from typing import Callable, Sequence

from torch_rsdp.testing.launch import (  # noqa: F401  (the names the tests import from here)
    DEFAULT_SHM_BYTES,
    PRELOAD,
    SHM_DIR,
    LaunchError,
    LaunchResult,
    RankOutcome,
    WorkerContext,
    backend_under_test,
    launch,
    own_shm_entries,
    rsdp_shm_entries,
    shm_holders,
)

# --------------------------------------------------------------------------------------------
# Batched cases: many sub-cases inside one launch, each reported separately.
# --------------------------------------------------------------------------------------------


class CaseRecorder:
    """Collects per-case failures inside a worker.

    ``with rec.case("float32 SUM n=7"):`` records an AssertionError (wrong result) and keeps
    going.  Any other exception (the backend raised) is recorded too; after every case the
    participating ranks exchange their status through the store (never through the backend).
    If a backend error happened on some participants but not all of them, or took so long that
    it was probably a timeout, the group may be out of step: the family is marked broken and
    stops issuing collectives (run_families then re-creates the process group).  An error raised
    consistently and quickly on every participant (e.g. "dtype not supported") lets the family
    continue with its next case.
    """

    def __init__(self, ctx):
        self.ctx = ctx
        self.rank = ctx.rank
        self.failures: dict[str, list[tuple[str, str]]] = {}
        self.counts: dict[str, int] = {}
        self.slowest: dict[str, list[tuple[float, str]]] = {}
        self.family = ""
        self.broken = False
        self.slow_error_s = max(2.0, ctx.pg_timeout.total_seconds() / 2)

    def start_family(self, family: str) -> None:
        self.family = family
        self.failures.setdefault(family, [])
        self.counts.setdefault(family, 0)
        self.slowest.setdefault(family, [])
        self.broken = False

    def case(self, case_id: str, ranks: Sequence[int] | None = None):
        """ranks: the ranks that execute this case (default: all ranks of the world)."""
        rec = self
        participants = list(range(self.ctx.world_size)) if ranks is None else sorted(ranks)

        class _Case:
            def __enter__(self_inner):
                if rec.broken:
                    raise _Broken()
                rec.counts[rec.family] += 1
                self_inner.t0 = time.monotonic()
                return self_inner

            def __exit__(self_inner, et, ev, tb):
                if et is _Broken:
                    return False
                dt = time.monotonic() - self_inner.t0
                slow_list = rec.slowest[rec.family]
                slow_list.append((dt, case_id))
                slow_list.sort(reverse=True)
                del slow_list[3:]
                backend_error = et is not None and not issubclass(et, AssertionError)
                if et is not None:
                    text = "".join(traceback.format_exception(et, ev, tb))
                    rec.failures[rec.family].append((case_id, f"{et.__name__}: {ev}\n{text}"))
                slow = backend_error and dt > rec.slow_error_s
                flag = b"2" if slow else (b"1" if backend_error else b"0")
                flags = rec.ctx.store_sync(f"case/{rec.family}/{case_id}", flag, ranks=participants)
                if any(f == b"2" for f in flags) or len(set(flags)) > 1:
                    rec.broken = True
                    if et is None or not backend_error:
                        if et is None:
                            rec.failures[rec.family].append(
                                (case_id, "another rank failed this case with a backend error; "
                                          "stopping the family"))
                        raise _Broken()
                if backend_error:
                    if rec.broken:
                        raise _Broken()
                return et is not None  # swallow recorded failures, keep going

        return _Case()


class _Broken(Exception):
    """Raised inside a family once the backend errored: stop issuing collectives."""


def run_families(ctx: WorkerContext, families: dict[str, Callable], names: Sequence[str]):
    """Run the named families in order; returns {family: (n_cases, [(case_id, error), ...])}.

    After every family the ranks exchange a flag through the store (not the backend); if any
    rank saw a backend error, every rank destroys and re-creates the process group so that
    later families start from a clean, matched state.
    """
    import torch.distributed as dist

    rec = CaseRecorder(ctx)
    out = {}
    for name in names:
        rec.start_family(name)
        t0 = time.monotonic()
        print(f"[harness] family {name} starting", flush=True)
        ctx.set_progress(name)
        try:
            families[name](ctx, rec)
        except _Broken:
            pass
        except BaseException as e:  # noqa: BLE001 - an error outside any case
            rec.failures[name].append(
                ("<family>", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
            rec.broken = True
        flags = ctx.store_sync(f"family/{name}", b"1" if rec.broken else b"0")
        if any(f == b"1" for f in flags):
            try:
                ctx.reinit()
            except BaseException as e:  # noqa: BLE001
                rec.failures[name].append(("<reinit>", f"{type(e).__name__}: {e}"))
                out[name] = (rec.counts[name], rec.failures[name], time.monotonic() - t0,
                             rec.slowest[name])
                # cannot continue without a process group
                for rest in names[names.index(name) + 1:]:
                    out[rest] = (0, [("<not run>", "process group could not be re-created")], 0.0, [])
                return out
        out[name] = (rec.counts[name], rec.failures[name], time.monotonic() - t0,
                             rec.slowest[name])
    if dist.is_initialized():
        dist.barrier()
    return out


def format_family_failures(results_by_rank: dict[int, dict], family: str, limit: int = 12) -> str | None:
    """None when every rank passed every case of `family`; otherwise a readable report."""
    lines = []
    total = 0
    ncases = 0
    for r in sorted(results_by_rank):
        n, fails = results_by_rank[r].get(family, (0, [("<missing>", "family not run")]))[:2]
        ncases = max(ncases, n)
        for cid, err in fails:
            total += 1
            if len(lines) < limit:
                lines.append(f"[rank {r}] {cid}: {err.strip()[:1500]}")
    if total == 0:
        if ncases == 0:
            return f"family {family}: no cases ran"
        return None
    head = f"family {family}: {total} failing (rank, case) pairs out of {ncases} cases per rank"
    return head + "\n" + "\n".join(lines)


def families_needed(session, test_name: str, key: str, value, families) -> list:
    """The families (in ``families``' order) of the collected ``test_name`` items whose
    parameter ``key`` is ``value``: what one batch launch must run for this pytest session."""
    wanted = set()
    for item in session.items:
        cs = getattr(item, "callspec", None)
        if (getattr(item, "originalname", None) == test_name and cs is not None
                and cs.params.get(key) == value):
            wanted.add(cs.params["family"])
    return [f for f in families if f in wanted]


def launch_families(run: Callable[[list], "LaunchResult"], names: Sequence[str],
                    world_size: int, attempts: int = 6):
    """Runs families ``names`` through ``run(names) -> LaunchResult`` in as few launches as
    possible. If a launch crashes or hangs, the family that was running (the furthest any
    rank's progress marker reached) is charged with the launch error and the remaining
    families go on in a new launch, so one crashing case does not hide every other result.

    Returns (results by rank, errors by family, the mode of the last launch)."""
    names = list(names)
    results: dict = {r: {} for r in range(world_size)}
    errors: dict[str, str] = {}
    mode = ""
    for _attempt in range(attempts):
        if not names:
            break
        try:
            res = run(names)
            mode = res.mode
            for r in range(world_size):
                results[r].update(res[r])
            names = []
        except LaunchError as e:
            started = [o.progress for o in (e.result.outcomes.values() if e.result else [])
                       if o.progress in names]
            culprit = max(started, key=names.index) if started else names[0]
            errors[culprit] = str(e)
            names = names[names.index(culprit) + 1:]
    for n in names:
        errors[n] = "not run: too many crashed launches"
    return results, errors, mode


def assert_family(results: dict, errors: dict, family: str, label: str) -> None:
    """The pytest verdict for one family of a ``launch_families`` batch: the launch error
    charged to it, or every failing case, with ``label`` naming the batch. Prints the
    family's case count, time and slowest cases."""
    if family in errors:
        raise AssertionError(f"the launch for {label} failed while running {family}:\n"
                             f"{errors[family]}")
    if family in results[0]:
        slow = ", ".join(f"{c} {t:.2f}s" for t, c in results[0][family][3])
        print(f"{family} {label}: {results[0][family][0]} cases, "
              f"{max(b[family][2] for b in results.values()):.1f}s; slowest on rank 0: {slow}")
    msg = format_family_failures(results, family)
    assert msg is None, f"[{label}] {msg}"

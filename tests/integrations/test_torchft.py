"""torchft's own process-group tests, run on torch_rsdp.torchft.ProcessGroupRSDP.

torchft ships its tests in the package (torchft/process_group_test.py). Its multi-rank suite
(``MultiPgBaseTest``: ranks as threads of one process sharing a TCPStore, every collective
checked exactly, and a rank that shuts down mid-run while the others must fail and report) is
subclassed here with ProcessGroupRSDP, over every collective, reduce-scatter and all-to-all
included (torchft skips those for gloo). Its single-rank checks (``test_gloo_apis``,
``test_gloo_timeout``, ``test_functional_collectives``) are hard-wired to ProcessGroupGloo,
so they are repeated here with torchft's ``_test_pg`` helper. torchft's Manager integration
tests (manager_integ_test.py: lighthouse, quorum, DDP, injected failures, live recovery) run
with ProcessGroupRSDP patched in where their train loops build ProcessGroupGloo. Our own checks: reduce-scatter
on CPU (torchft's helper returns early on CPU), configure again at another world size,
abort() failing pending ops, errored() after an abort and after a lost peer, a replica
process SIGKILLed and the survivors reconfigured.

Skipped as a whole without torchft (scripts/setup.sh installs it, with parameterized, which
torchft's test module imports).
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

ftt = pytest.importorskip("torchft.process_group_test")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from parameterized import parameterized  # noqa: E402
from torch.distributed import TCPStore  # noqa: E402
from torch.distributed.distributed_c10d import (  # noqa: E402
    AllreduceOptions,
    ReduceOp,
    ReduceScatterOptions,
)

import torch_rsdp  # noqa: E402,F401
from torch_rsdp.torchft import ProcessGroupRSDP  # noqa: E402

ALL = ftt._ALL_COLLECTIVES


class RSDPMultiPgTest(ftt.MultiPgBaseTest):
    """torchft's ``NormalGlooMultiPgTest`` with ProcessGroupRSDP and nothing skipped."""

    BACKEND = "rsdp"
    WORLD_SIZE = 3

    @classmethod
    def _create_pg(cls, backend: str):
        assert backend == "rsdp"
        return ProcessGroupRSDP(timeout=timedelta(seconds=10))

    @parameterized.expand(ALL)
    def test_collective(self, collective: str) -> None:
        self._run_parallel(collective, device="cpu")

    @parameterized.expand(ALL)
    def test_collective_with_resiliency(self, collective: str) -> None:
        self._run_with_resiliency(collective, device="cpu")


def _store():
    return TCPStore("localhost", 0, is_master=True, wait_for_workers=False)


def _on_ranks(fn, world_size: int, timeout: float = 30.0):
    """fn(rank) on one thread per rank; results in rank order, the first error raised."""
    with ThreadPoolExecutor(world_size) as ex:
        futs = [ex.submit(fn, r) for r in range(world_size)]
        return [f.result(timeout=timeout) for f in futs]


def _configure(pgs, store, prefix: str, world_size: int):
    addr = f"localhost:{store.port}/{prefix}"
    _on_ranks(lambda r: pgs[r].configure(addr, "0", r, world_size), world_size)


# ---- torchft's ProcessGroupTest, single-rank checks repeated for ProcessGroupRSDP ----

def test_apis_one_rank_and_ddp():
    """torchft's test_gloo_apis: every collective through _test_pg, then DDP over the pg."""
    store = _store()
    pg = ProcessGroupRSDP()
    pg.configure(f"localhost:{store.port}/prefix", "0", 0, 1)
    assert pg.size() == 1 and pg.getBackendName() == "torchft-rsdp"
    works = ftt._test_pg(pg, torch.tensor([2]))
    # nothing refused: reduce_scatter and its coalesced form ran too
    assert set(works) >= {"reduce_scatter", "reduce_scatter_tensor_coalesced", "alltoall_base"}
    m = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 4), process_group=pg)
    m(torch.rand(2, 3)).sum().backward()
    pg.shutdown()


def test_configure_timeout():
    """torchft's test_gloo_timeout: a peer that never joins makes configure raise in time."""
    store = _store()
    pg = ProcessGroupRSDP(timeout=timedelta(seconds=0.01))
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match="(?i)time"):
        pg.configure(f"localhost:{store.port}/prefix", "0", 0, 2)
    assert time.monotonic() - t0 < 10


def test_functional_collectives():
    """torchft's test_functional_collectives: register() makes the pg resolvable by name."""
    from torch.distributed import _functional_collectives as fc
    from torch._C._distributed_c10d import _resolve_process_group

    ftt.dummy_init_pg()
    store = _store()
    pg = ProcessGroupRSDP().register("test_rsdp_func_col")
    pg.configure(f"localhost:{store.port}/prefix", "0", 0, 1)
    assert pg.group_name == str(dist.get_pg_count() - 1)
    assert _resolve_process_group(pg.group_name) is pg
    try:
        t = torch.ones(10)
        out = fc.all_reduce(t, "sum", pg)
        torch.testing.assert_close(fc.wait_tensor(out), torch.ones(10))
    finally:
        pg.unregister()


# ---- our own checks ----

def test_reduce_scatter_cpu():
    """reduce_scatter (list form, SUM and AVG) and the coalesced tensor form at 3 ranks,
    exact; torchft's gloo group refuses both and its helper skips CPU."""
    W = 3
    store = _store()
    pgs = [ProcessGroupRSDP(timeout=timedelta(seconds=10)) for _ in range(W)]
    _configure(pgs, store, "rs", W)

    def run(r):
        pg = pgs[r]
        inp = [torch.arange(4, dtype=torch.float32) + 100 * i + r for i in range(W)]
        out = torch.empty(4)
        pg.reduce_scatter([out], [inp], ReduceScatterOptions()).wait()
        torch.testing.assert_close(out, W * (torch.arange(4.0) + 100 * r) + sum(range(W)))
        opts = ReduceScatterOptions()
        opts.reduceOp = ReduceOp.AVG
        pg.reduce_scatter([out], [inp], opts).wait()
        torch.testing.assert_close(out, torch.arange(4.0) + 100 * r + 1)
        ftt.run_reduce_scatter_tensor_coalesced_test(pg, r, torch.tensor([r + 1]))

    _on_ranks(run, W)
    for pg in pgs:
        pg.shutdown()


def test_reconfigure_other_world_size():
    """configure at 3 ranks, then again at 2 (rank 2 gone) and back to 3: every
    configuration computes with its own world size and the old backend is gone."""
    store = _store()
    pgs = [ProcessGroupRSDP(timeout=timedelta(seconds=10)) for _ in range(3)]
    for step, W in enumerate([3, 2, 3]):
        _configure(pgs[:W], store, f"quorum_{step}", W)
        backends = {id(pg._backend) for pg in pgs[:W]}
        assert len(backends) == W

        def run(r):
            assert pgs[r].size() == W
            ftt.run_allreduce_test(pgs[r], r, torch.tensor([r + 1]))
            ftt.run_reduce_scatter_tensor_coalesced_test(pgs[r], r, torch.tensor([r + 1]))
            ftt.run_alltoall_test(pgs[r], r, torch.tensor([r + 1]))

        _on_ranks(run, W)
        assert all(pg.errored() is None for pg in pgs[:W])
    for pg in pgs:
        pg.shutdown()


def test_abort_fails_pending_ops_and_errored_reports():
    """rank 0 waits in an all-reduce that rank 1 never joins; abort() from another thread
    makes the wait raise at once (not at the 30 s deadline), errored() names the abort, and a
    new configure() gives a working group with errored() cleared."""
    store = _store()
    pgs = [ProcessGroupRSDP(timeout=timedelta(seconds=30)) for _ in range(2)]
    _configure(pgs, store, "a", 2)
    work = pgs[0].allreduce([torch.ones(8)], AllreduceOptions())
    threading.Timer(0.3, pgs[0].abort).start()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError):
        work.wait()
    assert time.monotonic() - t0 < 5
    err = pgs[0].errored()
    assert isinstance(err, RuntimeError) and "rank 0" in str(err) and "aborted" in str(err)
    with pytest.raises(Exception):
        pgs[0].allreduce([torch.ones(8)], AllreduceOptions()).wait()
    pgs[1].abort()

    _configure(pgs, store, "b", 2)
    assert [pg.errored() for pg in pgs] == [None, None]
    _on_ranks(lambda r: ftt.run_allreduce_test(pgs[r], r, torch.tensor([r + 1])), 2)
    for pg in pgs:
        pg.shutdown()


def test_errored_after_lost_peer():
    """A peer aborted mid-run (as a crashed replica): the survivor's op fails within the
    timeout and errored() reports the broken group until the next configure()."""
    store = _store()
    pgs = [ProcessGroupRSDP(timeout=timedelta(seconds=2)) for _ in range(2)]
    _configure(pgs, store, "a", 2)
    assert pgs[1].errored() is None
    pgs[0].abort()
    t0 = time.monotonic()
    with pytest.raises(RuntimeError):
        pgs[1].allreduce([torch.ones(8)], AllreduceOptions()).wait()
    assert time.monotonic() - t0 < 5
    err = pgs[1].errored()  # at once: the backend records the failure before wait() raises
    assert isinstance(err, RuntimeError) and "rank 1" in str(err), err
    pgs[1].abort()


def _crash_worker(rank: int, port: int, results) -> None:
    """One replica's process: a 3-rank group, rank 2 SIGKILLed after one all-reduce, the
    survivors fail, see errored(), and carry on in a 2-rank group (torchft's recovery)."""
    import os
    import signal

    try:
        from torch_rsdp.torchft import ProcessGroupRSDP

        pg = ProcessGroupRSDP(timeout=timedelta(seconds=10))
        pg.configure(f"localhost:{port}/quorum_1", "0", rank, 3)
        ftt.run_allreduce_test(pg, rank, torch.tensor([rank + 1]))
        if rank == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        t0 = time.monotonic()
        try:
            ftt.run_allreduce_test(pg, rank, torch.tensor([rank + 1]))
            raise AssertionError(f"rank {rank}: all-reduce with a dead peer did not fail")
        except RuntimeError as e:
            failed_after, msg = time.monotonic() - t0, str(e)
        err = pg.errored()  # at once, right after the failed op's wait() raised
        pg.configure(f"localhost:{port}/quorum_2", "0", rank, 2)
        assert pg.errored() is None
        ftt.run_allreduce_test(pg, rank, torch.tensor([rank + 1]))
        ftt.run_reduce_scatter_tensor_coalesced_test(pg, rank, torch.tensor([rank + 1]))
        pg.shutdown()
        results.put((rank, "ok", failed_after, msg, str(err)))
    except BaseException as e:  # reported to the test, which names the rank
        results.put((rank, "error", 0.0, repr(e), ""))


def test_rank_sigkilled_then_reconfigured():
    """A replica process dies (SIGKILL) mid-training: the survivors' next op fails within a
    few seconds (not the 10 s timeout), errored() reports, and configure() at world size 2
    gives a group whose all-reduce and reduce-scatter are exact."""
    import multiprocessing as mp

    store = _store()
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=_crash_worker, args=(r, store.port, results)) for r in range(3)]
    for p in procs:
        p.start()
    try:
        got = {}
        for _ in range(2):
            rank, status, failed_after, msg, err = results.get(timeout=60)
            got[rank] = (status, failed_after, msg, err)
        for rank in (0, 1):
            status, failed_after, msg, err = got[rank]
            assert status == "ok", f"rank {rank}: {msg}"
            assert failed_after < 5, f"rank {rank} failed after {failed_after:.1f}s: {msg}"
            assert f"rank {rank}" in err and "broken" in err, err
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    assert procs[2].exitcode == -9


# ---- torchft's Manager integration tests (lighthouse, quorum, DDP, live recovery) ----

MANAGER_TESTS = [
    "test_ddp_healthy",
    "test_ddp_recovery_0_async_quorum",
    "test_ddp_recovery_1_sync_quorum",
    "test_ddp_recovery_multi_rank",
    "test_ddp_skip_init_sync",
    "test_manager_allreduce_1",  # the CPU case
]


@pytest.mark.parametrize("name", MANAGER_TESTS)
def test_manager_integration(name):
    """torchft's ManagerIntegTest (replicas as threads, a real lighthouse, injected failures,
    recovery from a live peer's checkpoint, final weights equal on every replica) with
    ProcessGroupRSDP where its train loops build ProcessGroupGloo; every configure the
    Manager made is counted, so a run that never reached our group fails."""
    from unittest.mock import patch

    mit = pytest.importorskip("torchft.manager_integ_test")
    configured = []

    class Counted(ProcessGroupRSDP):
        def configure(self, store_addr, replica_id, rank, world_size, *args, **kwargs):
            configured.append((rank, world_size))
            super().configure(store_addr, replica_id, rank, world_size, *args, **kwargs)

    with patch.object(mit, "ProcessGroupGloo", Counted):
        mit.ManagerIntegTest(name).debug()  # raises what the test raises
    assert configured and all(ws == 2 for _, ws in configured), configured


def test_torchft_is_optional():
    """Without torchft, import torch_rsdp works and torch_rsdp.torchft raises ImportError
    saying how to install it (torchft hidden from a fresh interpreter)."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torchft'] = None\n"
        "import torch_rsdp\n"
        "assert 'torch_rsdp.torchft' not in sys.modules\n"
        "try:\n"
        "    import torch_rsdp.torchft\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "pip install torchft" in out.stdout, out.stdout

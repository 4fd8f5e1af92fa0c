"""The parts of torch's ``c10d::Backend`` contract beyond the collectives themselves.

Each through the Python API torch offers for it: ``ProcessGroup.set_timeout``, ``get_error``
(torch binds it for NCCL only; here ``torch_rsdp.group_error``), coalescing
(``batch_isend_irecv`` and ``_coalescing_manager``, as FSDP2 and DTensor issue them),
``_wait_for_pending_works``, ``_register_on_completion_hook`` (case by case as torch's
``WorkHookTest`` checks ProcessGroupNCCL's), ``Backend.memory_stats`` of the communication memory pool, and
``torch_rsdp.monitored_barrier`` (torch's Python refuses ``dist.monitored_barrier`` for any
backend not named "gloo").
"""
from __future__ import annotations

import datetime
import time

import pytest
import torch
import torch.distributed as dist
from torch.distributed.distributed_c10d import _coalescing_manager

from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="these are the rsdp backend's own entries")


def _backend():
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def _coalescing_pending(ctx):
    import torch_rsdp
    r, W = ctx.rank, ctx.world_size
    pg = dist.group.WORLD
    out = {"supports": _backend().supports_coalescing}

    # batch_isend_irecv: one Work for the whole ring exchange.
    send = torch.full((1000,), float(r))
    recv = torch.empty(1000)
    ops = [dist.P2POp(dist.isend, send, (r + 1) % W), dist.P2POp(dist.irecv, recv, (r - 1) % W)]
    works = dist.batch_isend_irecv(ops)
    out["batch_works"] = len(works)
    for w in works:
        w.wait()
    assert bool((recv == (r - 1) % W).all()), f"batch_isend_irecv got {recv[:3].tolist()}"

    # _coalescing_manager with a device: ops that have no coalesced form (broadcast) become
    # one Work; the fast path (all_gather_into_tensor, reduce_scatter_tensor) too.
    bs = [torch.full((5,), float(r * 10 + i)) for i in range(3)]
    with _coalescing_manager(device=torch.device("cpu"), async_ops=True) as cm:
        for i, b in enumerate(bs):
            dist.broadcast(b, src=i % W)
    cm.wait()
    assert [b[0].item() for b in bs] == [float((i % W) * 10 + i) for i in range(3)], bs
    outs = [torch.empty(W * 4) for _ in range(2)]
    with _coalescing_manager(device=torch.device("cpu")):
        for i, o in enumerate(outs):
            dist.all_gather_into_tensor(o, torch.full((4,), float(r + i)))
    for i, o in enumerate(outs):
        assert o.tolist() == [float(q + i) for q in range(W) for _ in range(4)], o.tolist()
    rs = [torch.empty(3) for _ in range(2)]
    with _coalescing_manager(async_ops=True) as cm:
        for i, o in enumerate(rs):
            dist.reduce_scatter_tensor(o, torch.arange(W * 3, dtype=torch.float32) + i)
    cm.wait()
    for i, o in enumerate(rs):
        assert o.tolist() == [W * float(r * 3 + k + i) for k in range(3)], o.tolist()

    # waitForPendingWorks: every Work issued before it is complete after it.
    ws = [dist.all_reduce(torch.ones(1 << 16), async_op=True) for _ in range(6)]
    pg._wait_for_pending_works()
    out["pending_done"] = [w.is_completed() for w in ws]

    # The pool's statistics move with communication memory handed out and freed.
    before = _backend().memory_stats()
    t = torch_rsdp.comm_empty(1 << 20)
    during = _backend().memory_stats()
    del t
    after = _backend().memory_stats()
    out["stats"] = (before, during, after)
    out["error"] = str(torch_rsdp.group_error())
    return out


@pytest.mark.slow
def test_coalescing_pending_works_and_memory_stats():
    res = launch(_coalescing_pending, 3, deadline=180)
    for r in range(3):
        o = res[r]
        assert o["supports"] is True
        assert o["batch_works"] == 1, f"rank {r}: batch_isend_irecv gave {o['batch_works']} Works"
        assert all(o["pending_done"]), f"rank {r}: pending after wait: {o['pending_done']}"
        before, during, after = o["stats"]
        assert during["pool_in_use_bytes"] >= before["pool_in_use_bytes"] + 4 * (1 << 20)
        assert after["pool_in_use_bytes"] == before["pool_in_use_bytes"]
        assert during["pool_peak_in_use_bytes"] >= during["pool_in_use_bytes"]
        assert during["pool_allocations"] == before["pool_allocations"] + 1
        assert before["pool_capacity_bytes"] > 0
        assert o["error"] == "ErrorType.SUCCESS"


def _hooks(ctx):
    """torch's WorkHookTest (test_c10d_nccl.py), case by case, on rsdp: every Work fires the
    hook once, with its op type, its sequence number and a positive duration, before
    destroy_process_group (or _wait_for_pending_works) returns."""
    from torch._C._distributed_c10d import OpType
    from torch.nn.parallel import DistributedDataParallel as DDP
    r, W = ctx.rank, ctx.world_size
    out = {}

    def recorder():
        fired = []

        def hook(info):
            fired.append((info.op_type, info.seq, info.active_duration.total_seconds(),
                          (info.time_finished - info.time_started).total_seconds()))
        return fired, hook

    # test_on_completion_hook_broadcast / _seq
    ctx.init_pg(tag="broadcast")
    pg = dist.distributed_c10d._get_default_group()
    fired, hook = recorder()
    pg._register_on_completion_hook(hook)
    pg._enable_collectives_timing()
    tensor = torch.ones(2, 3) * r
    for _ in range(3):
        pg.broadcast([tensor]).wait()
    try:
        pg._register_on_completion_hook(hook)
        out["second_hook"] = "no error"
    except Exception as e:  # noqa: BLE001
        out["second_hook"] = f"{type(e).__name__}: {e}"
    dist.destroy_process_group()
    out["broadcast"] = fired
    out["broadcast_value"] = tensor.tolist()

    # test_on_completion_hook_mixed_ops: async ops, destroy waits for them and their hooks
    ctx.init_pg(tag="mixed")
    pg = dist.distributed_c10d._get_default_group()
    fired, hook = recorder()
    pg._register_on_completion_hook(hook)
    tensor = torch.ones(2, 3)
    tensor_list = [torch.empty_like(tensor) for _ in range(W)]
    pg.allreduce(tensor)
    pg.allgather([tensor_list], [tensor])
    pg.allreduce(tensor)
    dist.destroy_process_group()
    out["mixed"] = fired
    out["mixed_values"] = (tensor.tolist(), [t.tolist() for t in tensor_list])

    # test_on_completion_hook_with_ddp: _wait_for_pending_works after DDP's constructor
    ctx.init_pg(tag="ddp")
    pg = dist.distributed_c10d._get_default_group()
    fired, hook = recorder()
    pg._register_on_completion_hook(hook)
    torch.manual_seed(0)
    ddp = DDP(torch.nn.Sequential(*[torch.nn.Linear(64, 64, bias=False) for _ in range(4)]),
              process_group=pg, bucket_cap_mb=0.01)
    pg._wait_for_pending_works()
    out["ddp_ctor"] = sorted({str(f[0]) for f in fired})
    n_ctor = sum(f[0] == OpType.ALLREDUCE for f in fired)
    ddp(torch.zeros(2, 64)).sum().backward()
    dist.destroy_process_group()
    out["ddp_allreduces"] = sum(f[0] == OpType.ALLREDUCE for f in fired) - n_ctor
    out["ddp_durations"] = [f[2] for f in fired]

    # test_on_completion_hook_all_gather_object
    ctx.init_pg(tag="objects")
    pg = dist.distributed_c10d._get_default_group()
    fired, hook = recorder()
    pg._register_on_completion_hook(hook)
    objs = [None] * W
    dist.all_gather_object(objs, {"rank": r})
    dist.destroy_process_group()
    out["objects"] = ([o["rank"] for o in objs], [str(f[0]) for f in fired])
    return out


@pytest.mark.slow
def test_on_completion_hook_as_torch_tests_it():
    from torch._C._distributed_c10d import OpType
    res = launch(_hooks, 2, init=False, deadline=180)
    for r in range(2):
        o = res[r]
        seqs = [f[1] for f in o["broadcast"]]
        assert [f[0] for f in o["broadcast"]] == [OpType.BROADCAST] * 3, o["broadcast"]
        assert seqs == [1, 2, 3], f"rank {r}: sequence numbers {seqs}"
        assert all(f[2] > 0 and f[3] >= f[2] for f in o["broadcast"]), o["broadcast"]
        assert o["broadcast_value"] == [[0.0] * 3] * 2
        assert "already has a hook" in o["second_hook"], o["second_hook"]
        assert [f[0] for f in o["mixed"]] == [OpType.ALLREDUCE, OpType.ALLGATHER,
                                              OpType.ALLREDUCE], o["mixed"]
        assert all(f[2] > 0 for f in o["mixed"]), o["mixed"]
        assert o["mixed_values"] == ([[4.0] * 3] * 2, [[[2.0] * 3] * 2] * 2), o["mixed_values"]
        assert "OpType.BROADCAST" in o["ddp_ctor"], o["ddp_ctor"]
        assert o["ddp_allreduces"] > 0 and all(d > 0 for d in o["ddp_durations"]), o
        assert o["objects"] == ([0, 1], ["OpType.ALLGATHER", "OpType.ALLGATHER"]), o["objects"]


def _timeout_and_errors(ctx):
    import torch_rsdp
    r = ctx.rank
    out = {"start": str(torch_rsdp.group_error())}
    with pytest.raises(ValueError):  # a bad argument leaves the group usable and error-free
        dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BAND)
    out["after_bad_arg"] = str(torch_rsdp.group_error())
    dist.group.WORLD.set_timeout(datetime.timedelta(seconds=1))
    t0 = time.monotonic()
    if r == 1:
        time.sleep(4)  # misses the collective's 1 s deadline
        return out
    with pytest.raises(RuntimeError, match="Timed out"):
        dist.all_reduce(torch.ones(10))
    out["waited"] = time.monotonic() - t0
    out["after_timeout"] = str(torch_rsdp.group_error())
    return out


@pytest.mark.slow
def test_set_timeout_and_get_error():
    res = launch(_timeout_and_errors, 2, pg_timeout=60, deadline=120)
    o = res[0]
    assert o["start"] == o["after_bad_arg"] == "ErrorType.SUCCESS", o
    assert 0.8 <= o["waited"] <= 3.5, f"set_timeout(1 s) not applied: waited {o['waited']:.1f}s"
    assert o["after_timeout"] == "ErrorType.TIMEOUT", o


def _monitored(ctx):
    import torch_rsdp
    r = ctx.rank
    out = {}
    torch_rsdp.monitored_barrier(timeout=5)  # everyone comes
    # Rank 2 comes 2.5 s late to a 1 s barrier: rank 0 names it, rank 1 hears rank 0's
    # verdict at once, rank 2 gets the verdict when it arrives.
    for name, late, wait_all in (("one", [2], False), ("all", [1, 2], True)):
        if r in late:
            time.sleep(2.5)
        t0 = time.monotonic()
        try:
            torch_rsdp.monitored_barrier(timeout=datetime.timedelta(seconds=1),
                                         wait_all_ranks=wait_all)
            out[name] = ("passed", time.monotonic() - t0)
        except RuntimeError as e:
            out[name] = (str(e), time.monotonic() - t0)
        ctx.store_sync(f"after-{name}")
    torch_rsdp.monitored_barrier()  # the group's timeout; still usable
    x = torch.ones(4)
    dist.all_reduce(x)
    out["after"] = x.tolist()
    try:
        torch_rsdp.monitored_barrier(timeout=0)
    except ValueError as e:
        out["bad_timeout"] = str(e)
    return out


@pytest.mark.slow
def test_monitored_barrier_names_the_missing_ranks():
    res = launch(_monitored, 3, pg_timeout=30, deadline=120)
    msg0, t0 = res[0]["one"]
    assert "Rank 2 failed to pass monitoredBarrier in 1000 ms" in msg0, msg0
    assert 0.8 <= t0 <= 2.4, f"rank 0 took {t0:.1f}s for a 1 s barrier"
    msg1, t1 = res[1]["one"]
    assert "Rank 2 failed to pass monitoredBarrier" in msg1 and t1 <= 2.4, (msg1, t1)
    assert "Rank 2 failed" in res[2]["one"][0], res[2]["one"]
    msg_all, _ = res[0]["all"]
    assert "Ranks 1, 2 failed to pass monitoredBarrier in 1000 ms" in msg_all, msg_all
    for r in range(3):
        assert res[r]["after"] == [3.0] * 4
        assert "timeout must be positive" in res[r]["bad_timeout"]

"""Communication memory (torch_rsdp._comm_memory): torch's allocate_tensor and one-copy collectives.

One launch at world size 3 (odd, so chunks are uneven) checks, exactly against closed forms:
allocation and freeing (the bytes in use return to where they were), every collective with a
direct path (all-gather into a tensor, in place as FSDP2 calls it and out of place, the list
form, all-reduce SUM/AVG/MAX in float32/bfloat16/int64, reduce-scatter, broadcast from a
non-zero root) when every rank's buffer is in the pool -- and that it really took the one-copy
path (comm_stats()["one_copy_ops"]) -- and when only some ranks' are, which must fall back to
staging on every rank alike. Also: a pool too small falls back to ordinary memory, a tensor
outlives its group, world size 1 has no pool, and FSDP2 with allocation from the process group
trains exactly as without it.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="communication memory is rsdp's")

N = 150_001  # above the one-copy thresholds (all-reduce: 256 KiB) for every dtype used; odd
SMALL = 1_000  # below it: always staged


def _stats():
    import torch_rsdp
    return torch_rsdp.comm_stats()["one_copy_ops"]


def _buf(kind: str, n: int, dtype, rank: int):
    import torch_rsdp
    pooled = kind == "pool" or (kind == "mixed" and rank == 0)
    return torch_rsdp.comm_empty(n, dtype=dtype) if pooled else torch.empty(n, dtype=dtype)


def _values(n: int, dtype, rank: int) -> torch.Tensor:
    # Small integers: every sum is exact in every dtype used, bfloat16 included.
    return ((torch.arange(n) * 7 + rank * 3) % 61).to(dtype)


def collectives_worker(ctx, kind: str):
    import torch_rsdp
    rank, w = ctx.rank, ctx.world_size
    done = []
    for n in (N, SMALL):
        before = _stats()
        ops = 0
        # all_gather_into_tensor, in place (the input is this rank's slice of the output).
        per = n // w
        out = _buf(kind, per * w, torch.float32, rank)
        inp = out.narrow(0, rank * per, per)
        inp.copy_(_values(per, torch.float32, rank))
        dist.all_gather_into_tensor(out, inp)
        assert torch.equal(out, torch.cat([_values(per, torch.float32, r) for r in range(w)]))
        ops += 1
        # Out of place, uneven sizes through the list form (torch's layout: output[r] from r).
        inp = _buf(kind, n, torch.float32, rank)
        inp.copy_(_values(n, torch.float32, rank))
        outs = [torch.full((n,), -1.0) for _ in range(w)]
        dist.all_gather(outs, inp)
        for r in range(w):
            assert torch.equal(outs[r], _values(n, torch.float32, r)), f"all_gather from {r}"
        ops += 1
        # The last case spans several of the one-copy all-reduce's 1 MiB segments.
        for dtype, op, m in ((torch.float32, dist.ReduceOp.SUM, n),
                             (torch.float32, dist.ReduceOp.AVG, n),
                             (torch.bfloat16, dist.ReduceOp.SUM, n),
                             (torch.int64, dist.ReduceOp.MAX, n),
                             (torch.float32, dist.ReduceOp.SUM, 8 * n + 1)):
            t = _buf(kind, m, dtype, rank)
            t.copy_(_values(m, dtype, rank))
            dist.all_reduce(t, op=op)
            stack = torch.stack([_values(m, torch.float64, r) for r in range(w)])
            ref = {dist.ReduceOp.SUM: stack.sum(0), dist.ReduceOp.AVG: stack.sum(0) / w,
                   dist.ReduceOp.MAX: stack.max(0).values}[op]
            assert torch.equal(t, ref.to(dtype)), f"all_reduce {dtype} {op}"
            ops += 1
        # reduce_scatter_tensor: this rank gets chunk `rank` summed over every rank.
        inp = _buf(kind, per * w, torch.float32, rank)
        inp.copy_(_values(per * w, torch.float32, rank))
        res = torch.empty(per)
        dist.reduce_scatter_tensor(res, inp)
        full = sum(_values(per * w, torch.float64, r) for r in range(w))
        assert torch.equal(res, full[rank * per:(rank + 1) * per].float()), "reduce_scatter"
        ops += 1
        # broadcast from the last rank: only the root's buffer needs to be in the pool (in
        # "mixed", only the root's is).
        t = _buf(kind, n, torch.float32, (rank + 1) % w)
        t.copy_(_values(n, torch.float32, rank))
        dist.broadcast(t, src=w - 1)
        assert torch.equal(t, _values(n, torch.float32, w - 1)), "broadcast"
        ops += 1
        direct = _stats() - before
        # Mixed: rank 0's buffers alone are in the pool, except in the broadcast, where the
        # root's is, which is all a broadcast reads.
        expect = 0 if n < N else {"pool": ops, "mixed": 1, "plain": 0}[kind]
        assert direct == expect, f"{kind} n={n}: {direct} of {ops} ops took the one-copy path"
        done.append((n, direct))
    return done


def lifecycle_worker(ctx):
    import torch_rsdp
    from torch_rsdp._comm_memory import comm_memory_in_use
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert be.supports_tensor_alloc(torch.device("cpu"))
    start = comm_memory_in_use()
    a = torch_rsdp.comm_empty((3, 5), dtype=torch.bfloat16)
    assert a.shape == (3, 5) and a.dtype == torch.bfloat16 and a.device.type == "cpu"
    b = be.allocate_tensor(1 << 20, dtype=torch.float32, device=torch.device("cpu"))
    assert comm_memory_in_use() >= start + 4 * (1 << 20) + 30
    del a, b
    assert comm_memory_in_use() == start, "freed blocks return to the pool"
    # Freed blocks coalesce: a block as large as both fits again without growing.
    c = torch_rsdp.comm_empty(1 << 21)
    c.fill_(ctx.rank)
    # The pool is 8 MiB here (RSDP_POOL_BYTES): a larger request gets ordinary memory, and
    # collectives over it still work (staged).
    big = torch_rsdp.comm_empty(3 << 20)
    assert comm_memory_in_use() == start + 8 * (1 << 20), "too big: not from the pool"
    big.fill_(1.0)
    dist.all_reduce(big)
    assert torch.all(big == ctx.world_size)
    # A pool tensor outlives its group.
    dist.destroy_process_group()
    c += 1
    assert torch.all(c == ctx.rank + 1)
    del c
    return True


def world_one_worker(ctx):
    import torch_rsdp
    from torch_rsdp._comm_memory import comm_memory_in_use
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    assert not be.supports_tensor_alloc(torch.device("cpu")), "no peer, no pool"
    t = torch_rsdp.comm_empty(10)
    assert t.numel() == 10 and comm_memory_in_use() == 0
    return True


def fsdp_worker(ctx):
    import torch_rsdp
    from torch.distributed.fsdp import fully_shard

    def train(from_pg: bool):
        torch.manual_seed(0)
        # Layers large enough (>= 64 KiB) for the one-copy path.
        model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                    torch.nn.Linear(256, 8))
        for layer in (model[0], model[2], model[4]):
            fully_shard(layer)
            layer.set_allocate_memory_from_process_group_for_comm(from_pg)
        fully_shard(model)
        model.set_allocate_memory_from_process_group_for_comm(from_pg)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(100 + ctx.rank)
        before = _stats()
        for _ in range(3):
            loss = model(torch.randn(16, 64, generator=g)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        return loss.item(), [p.full_tensor() for p in model.parameters()], _stats() - before

    loss0, params0, direct0 = train(False)
    loss1, params1, direct1 = train(True)
    assert direct0 == 0 and direct1 > 0, (direct0, direct1)
    assert loss0 == loss1
    for a, b in zip(params0, params1):
        assert torch.equal(a, b)
    return direct1


@pytest.mark.parametrize("kind", ["pool", "mixed", "plain"])
def test_collectives_over_comm_memory(kind):
    res = launch(collectives_worker, 3, (kind,), deadline=240)
    assert all(v == res[0] for v in res.values()), res.values()


def test_allocation_lifecycle():
    launch(lifecycle_worker, 2, env={"RSDP_POOL_BYTES": "8M"}, destroy=False)


def test_world_size_one_has_no_pool():
    launch(world_one_worker, 1)


def test_fsdp2_allocates_from_the_process_group():
    res = launch(fsdp_worker, 2, deadline=240)
    assert res[0] > 0


def test_bench_comm_memory_runs(tmp_path):
    import json
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([sys.executable, "-m", "benchmarks", "comm-memory", "--layers", "2",
                    "--width", "256", "--steps", "1", "--rounds", "1", "--out", str(tmp_path)],
                   check=True, timeout=300, cwd=root)
    res = json.loads((tmp_path / "comm_memory.json").read_text())["results"]
    assert res["torch.empty"]["one_copy_ops"] == 0
    assert res["communication memory"]["one_copy_ops"] > 0
    assert all(r["step_ms"] > 0 for r in res.values())

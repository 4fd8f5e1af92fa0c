"""ring_shift / ring_shift_reduce: the ring-redistribution primitive.

Every case checks exact values: each rank's tensor encodes its rank and every
element index, so a shift from the wrong neighbour, a wrong offset or a torn
segment shows up as a wrong element.

The primitive runs on any backend: the rsdp backend's fused ring step, and on
gloo torch's batched point-to-point ops (``torch_rsdp/_p2p_ring.py``); the same
workers check both (gloo at the odd world size and 1, where its ring differs
most from a swap), and ranks that disagree on direction or size raise on both.
"""
import time

import pytest
import torch

from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="launches name their backends themselves")

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128]
COUNTS = [0, 1, 7, 100_003]  # 100_003 elements stream through many 32 KiB staging halves


def _value(rank, n, dtype):
    """Distinct per (rank, index) where the dtype allows; exact in every dtype."""
    i = torch.arange(n, dtype=torch.int64)
    if dtype == torch.bool:
        return ((i + rank) % 2).bool()
    if dtype in (torch.int8, torch.uint8):
        return ((i * 3 + rank * 17) % 100).to(dtype)
    if dtype in (torch.float16, torch.bfloat16):
        return ((i % 64) + rank * 64).to(dtype)  # integers < 256: exact
    v = (i % 100_000) * 8 + rank
    return v.to(dtype) if not dtype.is_complex else torch.complex(v.double(), -v.double()).to(dtype)


def _shift_worker(ctx):
    import torch_rsdp

    r, w = ctx.rank, ctx.world_size
    prev, nxt = (r - 1) % w, (r + 1) % w
    assert torch_rsdp.ring_neighbours() == (nxt, prev)
    assert torch_rsdp.ring_neighbours(direction=-1) == (prev, nxt)
    for dtype in DTYPES:
        for n in COUNTS:
            x = _value(r, n, dtype)
            got = torch_rsdp.ring_shift(x)
            assert torch.equal(got, _value(prev, n, dtype)), (dtype, n, "forward")
            got = torch_rsdp.ring_shift(x, direction=-1)
            assert torch.equal(got, _value(nxt, n, dtype)), (dtype, n, "backward")
            # In place, a whole rotation brings every tensor home.
            z = x.clone()
            for _ in range(w):
                assert torch_rsdp.ring_shift(z, z) is z
            assert torch.equal(z, x), (dtype, n, "rotation")
    # Non-contiguous input and output.
    base = torch.arange(60, dtype=torch.float32).reshape(6, 10) + 100 * r
    out = torch.zeros(10, 6)
    torch_rsdp.ring_shift(base.t(), out)
    assert torch.equal(out, (torch.arange(60, dtype=torch.float32).reshape(6, 10) + 100 * prev).t())


def _reduce_worker(ctx):
    import torch_rsdp

    r, w = ctx.rank, ctx.world_size
    for dtype in [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.complex64]:
        for n in COUNTS:
            # Rank r owns shard r; every rank's contribution to shard s is
            # value(s) * (r + 1). Accumulators travel forward, so shard s starts
            # w - 1 ranks before its owner, at rank s + 1: rank r starts with
            # shard r - 1 and after hop k holds shard r - 1 - k.
            def value(shard):
                if dtype == torch.bfloat16:  # bf16 sums stay exact below 256
                    return ((torch.arange(n) % 4) + shard).to(dtype)
                return _value(shard, n, dtype)

            def contrib(shard):
                return value(shard) * (r + 1)

            acc = contrib((r - 1) % w)
            for k in range(1, w):
                shard = (r - 1 - k) % w
                acc = torch_rsdp.ring_shift_reduce(acc, contrib(shard))
            total = sum(range(1, w + 1))
            assert torch.equal(acc, value(r) * total), (dtype, n)


def _async_worker(ctx):
    import torch_rsdp

    r, w = ctx.rank, ctx.world_size
    # 200 rotations in flight at once, then waited in reverse order.
    xs = [torch.full((1000 + i,), float(r * 1000 + i)) for i in range(200)]
    outs = [torch.empty_like(x) for x in xs]
    works = [torch_rsdp.ring_shift(x, o, async_op=True) for x, o in zip(xs, outs)]
    for wk in reversed(works):
        wk.wait()
    for i, o in enumerate(outs):
        assert torch.equal(o, torch.full((1000 + i,), float(((r - 1) % w) * 1000 + i)))
    fut = torch_rsdp.ring_shift(xs[0], async_op=True).get_future()
    assert torch.equal(fut.wait()[0], torch.full((1000,), float(((r - 1) % w) * 1000)))
    # polled and never waited: is_completed() alone brings the result
    out = torch.zeros(1000)
    work = torch_rsdp.ring_shift(xs[0], out, async_op=True)
    deadline = time.monotonic() + 60
    while not work.is_completed():
        assert time.monotonic() < deadline, "is_completed() never became true"
        time.sleep(0.001)
    assert torch.equal(out, torch.full((1000,), float(((r - 1) % w) * 1000)))


def _step_worker(ctx):
    """Ring steps on the caller's thread (BackendRSDP.ring_step, what RSDP's layers use): open
    while other ops are issued, a second step finishing the first, collectives after ring
    steps, shifts larger than a staging half."""
    import torch.distributed as dist

    import torch_rsdp
    from torch_rsdp._ring import rsdp_backend

    r, w = ctx.rank, ctx.world_size
    prev, nxt = (r - 1) % w, (r + 1) % w
    b = rsdp_backend()
    for n in (0, 5, 100_003):  # 100 003 float32 stream through many 32 KiB halves
        x = _value(r, n, torch.float32)
        out = torch.empty_like(x)
        step = b.ring_step(x, out, 1, None)
        # an op issued while the step is open runs after it (and does not wait for it)
        t = torch.full((3,), float(r))
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((3,), float(sum(range(w)))))
        step.wait()
        step.wait()  # a second wait is a no-op
        assert torch.equal(out, _value(prev, n, torch.float32)), n
        # a second step finishes the first; either order of waits
        o1, o2 = torch.empty_like(x), torch.empty_like(x)
        s1 = b.ring_step(x, o1, 1, None)
        s2 = b.ring_step(x, o2, -1, None)
        s2.wait()
        s1.wait()
        assert torch.equal(o1, _value(prev, n, torch.float32)) and torch.equal(
            o2, _value(nxt, n, torch.float32)), n
        # shift-reduce, in place, then an async collective after it
        acc = _value(r, n, torch.float32)
        s3 = b.ring_step(acc, acc, 1, torch.ones_like(acc))
        work = dist.all_reduce(torch.ones(4), async_op=True)
        s3.wait()
        work.wait()
        assert torch.equal(acc, _value(prev, n, torch.float32) + 1), n
    # a whole rotation by ring steps with work in between, then a collective of every rank
    z = _value(r, 1000, torch.float32)
    home = z.clone()
    for _ in range(w):
        step = b.ring_step(z, z, 1, None)
        torch.mm(torch.ones(64, 64), torch.ones(64, 64))
        step.wait()
    assert torch.equal(z, home)
    gathered = [torch.empty(1000) for _ in range(w)]
    dist.all_gather(gathered, z)
    for q in range(w):
        assert torch.equal(gathered[q], _value(q, 1000, torch.float32))
    assert torch_rsdp.ring_shift(torch.ones(3)).sum() == 3


def _bad_input_worker(ctx):
    import torch_rsdp

    for call, words in [
        (lambda: torch_rsdp.ring_shift(torch.ones(4), torch.ones(5)), ["ring_shift", "[5]"]),
        (lambda: torch_rsdp.ring_shift(torch.ones(4), torch.ones(4, dtype=torch.int32)),
         ["ring_shift", "Int"]),
        (lambda: torch_rsdp.ring_shift(torch.ones(4), direction=2), ["direction"]),
        (lambda: torch_rsdp.ring_shift_reduce(torch.ones(4), torch.ones(3)), ["local", "[3]"]),
    ]:
        with pytest.raises((ValueError, RuntimeError)) as e:
            call()
        msg = str(e.value)
        assert f"rank {ctx.rank}" in msg and all(wd.lower() in msg.lower() for wd in words), msg
    # Different sizes on different ranks: every rank raises a mismatch, then recovers.
    with pytest.raises(RuntimeError, match="mismatch"):
        torch_rsdp.ring_shift(torch.ones(10 + ctx.rank))
    assert torch.equal(torch_rsdp.ring_shift(torch.ones(3)), torch.ones(3))
    # Different directions: the ranks that see it raise (on gloo, every rank), none hangs.
    try:
        torch_rsdp.ring_shift(torch.ones(3), direction=-1 if ctx.rank == 0 else 1)
        disagreed = False
    except RuntimeError as e:
        assert "mismatch" in str(e) and f"rank {ctx.rank}" in str(e), e
        disagreed = True
    assert torch.equal(torch_rsdp.ring_shift(torch.ones(3)), torch.ones(3))
    return disagreed


BACKENDS = [("rsdp", 1), ("rsdp", 2), ("rsdp", 3), ("rsdp", 4), ("gloo", 1), ("gloo", 3)]


@pytest.mark.parametrize("backend,world", BACKENDS)
def test_ring_shift_all_dtypes(backend, world):
    launch(_shift_worker, world, backend=backend,
           allow_exit_abort=backend == "gloo", deadline=240)


@pytest.mark.parametrize("backend,world", BACKENDS[:-2] + [("gloo", 3)])
def test_ring_shift_reduce_carries_gradients_home(backend, world):
    launch(_reduce_worker, world, backend=backend,
           allow_exit_abort=backend == "gloo", deadline=240)


@pytest.mark.parametrize("backend,world", [("rsdp", 2), ("rsdp", 3), ("gloo", 3)])
def test_ring_shift_many_in_flight(backend, world):
    launch(_async_worker, world, backend=backend,
           allow_exit_abort=backend == "gloo", deadline=120)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_ring_steps_on_the_callers_thread(world):
    launch(_step_worker, world, deadline=120)


@pytest.mark.parametrize("backend", ["rsdp", "gloo"])
def test_ring_shift_bad_input(backend):
    res = launch(_bad_input_worker, 3, backend=backend, allow_exit_abort=backend == "gloo",
                 deadline=120)
    disagreed = [res[r] for r in range(3)]
    # rsdp: the ranks whose neighbour disagrees; gloo: all of them (one agreement check)
    assert disagreed == [True] * 3 if backend == "gloo" else sum(disagreed) >= 2, disagreed

"""Collective families for device tensors, shared by the CUDA tests (tests/cuda/test_cuda.py, on
a GPU) and the emulated device (tests/cuda/test_emulated_device.py, in CI): the dtypes and counts
of the device matrix, ring_shift / ring_shift_reduce on whatever device the worker's tensors live
(``ctx.device``), and the family table built from collective_families.py.
"""

from __future__ import annotations

import torch

from support.values import check_equal, dname

F32, BF16, F16, I64, BOOL = torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.bool
DEVICE_DTYPES = (F32, BF16, F16, I64, BOOL)
# 4099: one-shot for 4-byte types, just above 32 KiB for int64; 1 500 007: 6 MiB of float32,
# two-shot, and with STAGING_SMALL many times the staging buffer.
DEVICE_COUNTS = (0, 1, 7, 4099, 100_003, 1_500_007)
STAGING_SMALL = str(1 << 20)  # RSDP_CUDA_STAGING_BYTES: 1 MiB, far below the largest messages


RING_DTYPES = (F32, BF16, F16, I64, BOOL, torch.uint8, torch.complex64)
RING_COUNTS = (0, 1, 7, 100_003, 1_500_007)


def fam_ring_shift(ctx, rec):
    """ring_shift on GPU tensors: both directions, in-place rotation, views, many in flight."""
    from backend import test_ring_shift as trs
    import torch_rsdp

    r, w = ctx.rank, ctx.world_size
    prev, nxt = (r - 1) % w, (r + 1) % w
    with rec.case("ring_neighbours"):
        assert torch_rsdp.ring_neighbours() == (nxt, prev)
        assert torch_rsdp.ring_neighbours(direction=-1) == (prev, nxt)
    for dtype in RING_DTYPES:
        for n in RING_COUNTS:
            with rec.case(f"{dname(dtype)} n={n}"):
                x = trs._value(r, n, dtype)
                assert x.device == ctx.device, x.device
                got = torch_rsdp.ring_shift(x)
                assert got.device == ctx.device, f"output on {got.device}"
                check_equal(got, trs._value(prev, n, dtype), "ring_shift forward")
                check_equal(torch_rsdp.ring_shift(x, direction=-1), trs._value(nxt, n, dtype),
                            "ring_shift backward")
                check_equal(x, trs._value(r, n, dtype), "input (must be unchanged)")
                z = x.clone()
                for _ in range(w):
                    assert torch_rsdp.ring_shift(z, z) is z
                check_equal(z, x, "after a whole in-place rotation")
                out = torch.empty_like(x)
                work = torch_rsdp.ring_shift(x, out, direction=-1, async_op=True)
                got = work.get_future().wait()
                check_equal(got[0], trs._value(nxt, n, dtype), "async ring_shift future value")
    with rec.case("non-contiguous input and output"):
        base = torch.arange(60, dtype=torch.float32).reshape(6, 10) + 100 * r
        out = torch.zeros(10, 6)
        torch_rsdp.ring_shift(base.t(), out)
        check_equal(out, (torch.arange(60, dtype=torch.float32).reshape(6, 10) + 100 * prev).t(),
                    "ring_shift into a transposed view")
    with rec.case("200 rotations in flight, waited in reverse order"):
        trs._async_worker(ctx)


def fam_ring_shift_reduce(ctx, rec):
    """Gradient accumulators carried home in both directions (exact integer values)."""
    from backend import test_ring_shift as trs
    import torch_rsdp

    r, w = ctx.rank, ctx.world_size
    for dtype in (F32, BF16, F16, I64):
        for n in RING_COUNTS:
            for direction in (1, -1):
                with rec.case(f"{dname(dtype)} n={n} direction={direction}"):
                    def value(shard):
                        if dtype in (BF16, F16):  # half sums stay exact below 256
                            return ((torch.arange(n) % 4) + shard).to(dtype)
                        return trs._value(shard, n, dtype)

                    # Every rank's contribution to shard s is value(s) * (rank + 1). The
                    # accumulator rank r holds after hop k is shard r - direction * (k + 1).
                    acc = value((r - direction) % w) * (r + 1)
                    for k in range(1, w):
                        shard = (r - direction * (k + 1)) % w
                        acc = torch_rsdp.ring_shift_reduce(acc, value(shard) * (r + 1),
                                                           direction=direction)
                    assert acc.device == ctx.device, f"accumulator on {acc.device}"
                    check_equal(acc, value(r) * sum(range(1, w + 1)),
                                "accumulator after a whole rotation")


def device_families(first: dict, leave_out=()) -> dict:
    """``first`` (device-specific families), then the collective families except those that
    cannot run on device tensors and ``leave_out``, then ring_shift / ring_shift_reduce, and
    ``reinit`` last (it replaces the default group)."""
    from support.collective_families import FAMILIES

    fams = dict(first)
    # objects: pickled CPU tensors (the CPU path); recv_anysource: NCCL has no any-source recv
    skip = {"objects", "recv_anysource", "reinit", *leave_out}
    fams.update((k, v) for k, v in FAMILIES.items() if k not in skip)
    fams.update(ring_shift=fam_ring_shift, ring_shift_reduce=fam_ring_shift_reduce)
    fams["reinit"] = FAMILIES["reinit"]
    return fams


def device_min_world() -> dict:
    from support.collective_families import MIN_WORLD

    return dict(MIN_WORLD, ring_shift=2, ring_shift_reduce=2)

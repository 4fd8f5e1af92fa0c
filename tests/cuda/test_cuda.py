"""CUDA tensors over the rsdp backend: collectives, stream semantics, ring redistribution, RSDP
and DDP, with several processes sharing one GPU.

Skipped as a whole (one reason in the summary) unless torch_rsdp was built with CUDA and a GPU
is visible: ``torch_rsdp.cuda_available()``. Every test is marked ``cuda`` (``-m cuda`` selects
them, ``-m "not cuda"`` leaves them out).

Ranks sharing a GPU: every launch except the wrong-device-index one gets
``CUDA_VISIBLE_DEVICES=<the first visible GPU>``, so 2-4 ranks always share one GPU (the CUDA-IPC
path) even on a machine with several; a rank uses ``cuda:(LOCAL_RANK % device_count())``, set
before ``init_process_group`` (the launches use ``init=False`` for that).

* ``test_cuda_collective[<family>-<batch>]``: the families of collective_families.py (the CPU
  matrix) run on GPU tensors -- the worker makes its GPU torch's default device, so every input,
  output buffer and expected value the families create lives there -- plus CUDA-only families:
  ``cuda_paths`` (which transport serves the group: "nccl" for 1 rank, "cuda-ipc" for ranks
  sharing the GPU), ``streams`` (stream semantics, see fam_streams) and ``ring_shift`` /
  ``ring_shift_reduce``. Dtypes float32, bfloat16, float16, int64, bool (every legal op each);
  counts 0, 1, 7, 4099 (one-shot for 4-byte types, just above 32 KiB for int64), 100 003 and
  1 500 007 (6 MiB of float32: two-shot, and with ``RSDP_CUDA_STAGING_BYTES=1M`` many times the
  staging buffer). Batches: ws1 (NCCL path), ws2 / ws3 / ws4 with 1 MiB of staging, and
  ws2-staging-default (the default staging, where the large messages fit in one step).
* ``test_cuda_rsdp_parity``: the RSDP forward/backward families of test_rsdp.py (Linear,
  Embedding, MultiheadAttention, a small transformer) on the GPU against the same model in one
  process on the same GPU.
* ``test_cuda_offload``: a Llama's shards offloaded to pinned host memory
  (``CPUOffloadPolicy``), 2 ranks sharing the GPU: the cases of support/offload_checks.py, the
  device's bytes from ``torch.cuda.max_memory_allocated`` (needs transformers and peft).
* ``test_cuda_ddp_matches_reference``: DDP (SGD, Adam, allreduce comm hook) on the GPU over
  rsdp, 2 ranks, against a single-process reference trained on the GPU.
* ``test_cuda_mixed_devices_raise``: CPU and CUDA tensors in one op raise on the calling rank,
  naming the rank and the op; the group works afterwards.
* ``test_cuda_wrong_device_index``: a tensor on another GPU than the rank's (needs 2 GPUs).
"""

from __future__ import annotations

import os
import re

import pytest
import torch
import torch.distributed as dist

from support.device_families import (DEVICE_COUNTS, DEVICE_DTYPES, STAGING_SMALL,
                                     device_families, device_min_world)
from support.harness import (assert_family, backend_under_test, families_needed, launch,
                             launch_families, run_families)
from support.values import check_equal


def _skip_reason() -> str | None:
    if backend_under_test() != "rsdp":
        return f"the CUDA tests run on the rsdp backend only (RSDP_TEST_BACKEND={backend_under_test()!r})"
    try:
        import torch_rsdp
    except Exception as e:  # noqa: BLE001
        return f"torch_rsdp is not importable ({type(e).__name__}: {e})"
    if not torch_rsdp.build_info()["cuda"]:
        return "torch_rsdp built without CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device"
    available = getattr(torch_rsdp, "cuda_available", None)
    if available is None or not available():
        return "torch_rsdp.cuda_available() is False"
    return None


_SKIP = _skip_reason()
if _SKIP is not None:
    pytest.skip(_SKIP, allow_module_level=True)

pytestmark = pytest.mark.cuda

CUDA_DTYPES, CUDA_COUNTS = DEVICE_DTYPES, DEVICE_COUNTS
PG_TIMEOUT = 60

# GPU time of torch.cuda._sleep (it spins for that many clock cycles; ~1-2 GHz): long enough
# that the host is certainly done issuing (and waiting on) an op before the sleep ends.
SLEEP_SHORT = 50_000_000  # tens of ms: lets a missing stream dependency show as a wrong result
SLEEP_LONG = 4_000_000_000  # seconds: wait() must return while this still runs


def _one_gpu_env() -> dict:
    """Restricts the ranks to the first visible GPU, so that they share it."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[0].strip() if visible else "0"
    return {"CUDA_VISIBLE_DEVICES": first}


# --------------------------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------------------------


def _cuda_setup(ctx) -> torch.device:
    """Picks this rank's GPU (LOCAL_RANK % device count), then creates the process group."""
    n = torch.cuda.device_count()
    local = int(os.environ.get("LOCAL_RANK", ctx.rank))
    dev = torch.device("cuda", local % n)
    torch.cuda.set_device(dev)
    ctx.device = dev
    ctx.init_pg()
    return dev


def fam_cuda_paths(ctx, rec):
    """The families really run on the GPU, and cuda_paths() names the expected transport."""
    import torch_rsdp

    W, r = ctx.world_size, ctx.rank
    with rec.case("families create their tensors on the GPU"):
        t = torch.empty(1)
        assert t.device == ctx.device, f"default device {t.device}, expected {ctx.device}"
    with rec.case("first CUDA all_reduce"):
        t = torch.full((1000,), float(r + 1))
        dist.all_reduce(t)
        check_equal(t, torch.full((1000,), float(W * (W + 1) // 2)), "all_reduce output")
        assert t.device == ctx.device, f"output moved to {t.device}"
    with rec.case("cuda_paths names the transport"):
        paths = torch_rsdp.cuda_paths()
        assert isinstance(paths, str) and paths.strip(), f"cuda_paths() = {paths!r}"
        want = "nccl" if W == 1 else "cuda-ipc"
        assert want in paths.lower(), (
            f"cuda_paths() = {paths!r}: expected it to mention {want!r} "
            f"({W} rank(s) on one GPU)")
        print(f"[cuda] rank {r}: cuda_paths() = {paths!r}", flush=True)


def fam_streams(ctx, rec):
    """ProcessGroupNCCL stream semantics: an op runs after the work already queued on the
    caller's current stream; work.wait() makes the current stream wait and returns without
    blocking the host; futures complete with the output; inputs stay alive until done."""
    W, r = ctx.world_size, ctx.rank
    total = float(W * (W + 1) // 2)
    warm = torch.ones(10)
    dist.all_reduce(warm)  # transports are set up before anything below is timed by a sleep
    torch.cuda.synchronize()
    for n in (1000, 1_000_003):
        with rec.case(f"ordered after a kernel on a non-default current stream n={n}"):
            side = torch.cuda.Stream()
            t = torch.full((n,), -7.0)
            torch.cuda.synchronize()
            with torch.cuda.stream(side):
                torch.cuda._sleep(SLEEP_SHORT)  # the fill below runs late
                t.fill_(r + 1)
                work = dist.all_reduce(t, async_op=True)
                work.wait()
                seen = t.clone()  # queued on `side` after wait(): must see the result
            torch.cuda.synchronize()
            check_equal(seen, torch.full((n,), total),
                        "all_reduce output read on the issuing stream after work.wait()")
            check_equal(t, torch.full((n,), total), "all_reduce output")

        still_busy = completed = None
        with rec.case(f"work.wait() returns while the GPU is still busy n={n}"):
            t = torch.full((n,), -7.0)
            torch.cuda.synchronize()
            torch.cuda._sleep(SLEEP_LONG)
            t.fill_(r + 1)  # only after the sleep: the op must be ordered after it
            slept = torch.cuda.Event()
            slept.record()
            work = dist.all_reduce(t, async_op=True)
            work.wait()
            still_busy = not slept.query()
            completed = work.is_completed()
            torch.cuda.synchronize()
            check_equal(t, torch.full((n,), total), "all_reduce output after a long kernel")
            assert still_busy, (
                "work.wait() returned only after the sleep kernel queued before the all_reduce "
                "had finished: it blocked the host instead of making the stream wait")
        with rec.case(f"is_completed() is False until the GPU ran the op n={n}"):
            if still_busy:
                assert not completed, "is_completed() was True while the kernel before the op ran"
            else:
                assert completed is not None, "the previous case did not get that far"

        with rec.case(f"get_future() completes with the output n={n}"):
            t = torch.full((n,), -7.0)
            torch.cuda.synchronize()
            torch.cuda._sleep(SLEEP_SHORT)
            t.fill_(r + 1)
            val = dist.all_reduce(t, async_op=True).get_future().wait()
            assert isinstance(val, list) and len(val) >= 1, f"future value {type(val)}"
            check_equal(val[0], torch.full((n,), total), "get_future().wait()[0]")
            t2 = torch.full((n,), -7.0)
            torch.cuda._sleep(SLEEP_SHORT)
            t2.fill_(r + 1)
            fut = dist.all_reduce(t2, async_op=True).get_future()
            doubled = fut.then(lambda f: f.value()[0] * 2).wait()
            check_equal(doubled, torch.full((n,), 2 * total), "future.then(...) value")
            torch.cuda.synchronize()
            check_equal(t2, torch.full((n,), total), "all_reduce output after then()")

        with rec.case(f"input freed before the op ran n={n}"):
            torch.cuda.synchronize()
            torch.cuda._sleep(SLEEP_SHORT)
            t = torch.full((n,), float(r + 1))
            dist.all_reduce(t, async_op=True)  # handle dropped
            del t  # the allocator may hand its block out again at once
            junk = [torch.full((n,), 99.0) for _ in range(4)]
            chk = torch.full((7,), float(r + 1))
            dist.all_reduce(chk)
            torch.cuda.synchronize()
            for k, j in enumerate(junk):
                check_equal(j, torch.full((n,), 99.0),
                            f"tensor {k} allocated after an unfinished all_reduce's input was freed")
            check_equal(chk, torch.full((7,), total), "the next all_reduce")


CUDA_FAMILIES = device_families({"cuda_paths": fam_cuda_paths, "streams": fam_streams})
CUDA_MIN_WORLD = device_min_world()


def _collectives_worker(ctx, names):
    dev = _cuda_setup(ctx)
    torch.set_default_device(dev)  # every tensor the families create lands on the GPU
    ctx.dtypes = CUDA_DTYPES
    ctx.counts = CUDA_COUNTS
    return run_families(ctx, CUDA_FAMILIES, names)


# --------------------------------------------------------------------------------------------
# Collectives: one launch per batch, each family reported as its own test
# --------------------------------------------------------------------------------------------

# batch -> (world size, extra environment, deadline in seconds)
BATCHES = {
    "ws1": (1, {}, 420),
    "ws2": (2, {"RSDP_CUDA_STAGING_BYTES": STAGING_SMALL}, 600),
    "ws3": (3, {"RSDP_CUDA_STAGING_BYTES": STAGING_SMALL}, 600),
    "ws4": (4, {"RSDP_CUDA_STAGING_BYTES": STAGING_SMALL}, 600),
    "ws2-staging-default": (2, {}, 600),
}
PARAMS = [pytest.param(batch, fam, id=f"{fam}-{batch}")
          for batch, (ws, _, _) in BATCHES.items() for fam in CUDA_FAMILIES
          if ws >= CUDA_MIN_WORLD.get(fam, 1)]
_BATCH: dict = {}


def _batch(batch, request):
    if batch in _BATCH:
        return _BATCH[batch]
    ws, env, deadline = BATCHES[batch]
    names = families_needed(request.session, "test_cuda_collective", "batch", batch,
                            CUDA_FAMILIES)
    results, errors, _ = launch_families(
        lambda batch: launch(_collectives_worker, ws, (batch,), init=False, deadline=deadline,
                            pg_timeout=PG_TIMEOUT, env=dict(_one_gpu_env(), **env)),
        names, ws)
    _BATCH[batch] = (results, errors)
    return _BATCH[batch]


@pytest.mark.parametrize("batch,family", PARAMS)
def test_cuda_collective(batch, family, request):
    results, errors = _batch(batch, request)
    ws, env, _ = BATCHES[batch]
    label = f"{ws} rank(s) on one GPU" + (f", {env}" if env else "")
    assert_family(results, errors, family, label)


# --------------------------------------------------------------------------------------------
# RSDP parity (the forward/backward families of test_rsdp.py on the GPU)
# --------------------------------------------------------------------------------------------

RSDP_FAMILIES = ("linear", "embedding", "attention", "transformer")
# The sharded and the whole model multiply in different blockings on the GPU; a wrong
# gradient is off by far more.
RSDP_TOLS = (1e-4, 1e-4)
_RSDP_BATCH: dict = {}


def _rsdp_worker(ctx, names):
    from rsdp import test_rsdp

    _cuda_setup(ctx)
    ctx.tols = RSDP_TOLS
    return run_families(ctx, {k: test_rsdp.FAMILIES[k] for k in names}, names)


def _rsdp_batch(ws):
    if ws not in _RSDP_BATCH:
        names = list(RSDP_FAMILIES)
        _RSDP_BATCH[ws] = launch_families(
            lambda batch: launch(_rsdp_worker, ws, (batch,), init=False, deadline=300,
                                pg_timeout=PG_TIMEOUT, env=_one_gpu_env()),
            names, ws)[:2]
    return _RSDP_BATCH[ws]


@pytest.mark.parametrize("ws,family", [pytest.param(ws, f, id=f"{f}-ws{ws}")
                                       for ws in (2, 3) for f in RSDP_FAMILIES])
def test_cuda_rsdp_parity(ws, family):
    results, errors = _rsdp_batch(ws)
    assert_family(results, errors, family, f"RSDP on {ws} ranks sharing one GPU")


# --------------------------------------------------------------------------------------------
# Offload at shard granularity
# --------------------------------------------------------------------------------------------


def _offload_worker(ctx, names, paths):
    from support import offload_checks

    dev = _cuda_setup(ctx)

    def offload(c, rec):
        offload_checks.check_offload(c, rec, paths, dev, offload_checks.CudaMemory(),
                                     pin_memory=True)

    return run_families(ctx, {"offload": offload}, names)


def test_cuda_offload(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("peft")
    from support.hf_models import _make

    paths = {"work": str(tmp_path)}
    for kind in ("llama", "llama_tied", "wide"):
        paths[kind] = str(tmp_path / kind)
        _make(kind).save_pretrained(paths[kind])
    results, errors, _ = launch_families(
        lambda batch: launch(_offload_worker, 2, (batch, paths), init=False, deadline=300,
                             pg_timeout=PG_TIMEOUT, env=_one_gpu_env()), ["offload"], 2)
    assert_family(results, errors, "offload", "offload, 2 ranks sharing one GPU")


# --------------------------------------------------------------------------------------------
# DDP
# --------------------------------------------------------------------------------------------


def _ddp_worker(ctx):
    from integrations import test_training as tt

    dev = _cuda_setup(ctx)
    out = {"ddp": tt._ddp_worker(ctx)}
    if ctx.rank == 0:
        out["ref"] = {opt: tt.reference_params(ctx.world_size, opt, device=dev)
                      for opt in ("sgd", "adam")}
    return out


def test_cuda_ddp_matches_reference():
    from integrations import test_training as tt

    ws = 2
    res = launch(_ddp_worker, ws, init=False, deadline=300, pg_timeout=PG_TIMEOUT,
                 env=_one_gpu_env())
    got, ref = res[0]["ddp"], res[0]["ref"]
    assert set(got) == {"sgd", "adam", "sgd+allreduce_hook"}, sorted(got)
    init = tt.make_model(0).state_dict()
    for variant, params in got.items():
        moved = max((params[k] - init[k]).abs().max().item() for k in init)
        assert moved > 1e-3, f"{variant}: parameters barely changed ({moved:.2e})"
        for k in params:
            assert torch.equal(params[k], res[1]["ddp"][variant][k]), (
                f"{variant}: rank 1's {k} differs from rank 0's")
        tt._compare(params, ref[variant.split("+")[0]], rtol=1e-4, atol=1e-5,
                    what=f"DDP {variant} on CUDA over rsdp vs single-process reference on the GPU")


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

N_BAD = 1000


def _mixed_cases(W, dev):
    """name -> (call mixing CPU and CUDA tensors, op regex)."""
    import torch_rsdp

    def gpu(n):
        return torch.ones(n, device=dev)

    def cpu(n):
        return torch.ones(n)

    n = N_BAD
    return {
        "all_reduce_coalesced [cuda, cpu]":
            (lambda: dist.all_reduce_coalesced([gpu(n), cpu(n)], async_op=True), r"all_?reduce"),
        "all_gather_into_tensor cpu output, cuda input":
            (lambda: dist.all_gather_into_tensor(torch.empty(W * n), gpu(n), async_op=True),
             r"all_?gather"),
        "all_gather output list with a cpu tensor":
            (lambda: dist.all_gather([torch.empty(n, device=dev) for _ in range(W - 1)]
                                     + [torch.empty(n)], gpu(n), async_op=True), r"all_?gather"),
        "reduce_scatter_tensor cuda output, cpu input":
            (lambda: dist.reduce_scatter_tensor(torch.empty(n, device=dev), cpu(W * n),
                                                async_op=True), r"reduce_?scatter"),
        "all_to_all_single cpu output, cuda input":
            (lambda: dist.all_to_all_single(torch.empty(W * n), gpu(W * n), async_op=True),
             r"all_?to_?all|alltoall"),
        "ring_shift cuda input, cpu output":
            (lambda: torch_rsdp.ring_shift(gpu(n), torch.empty(n)), r"ring_shift"),
        "ring_shift_reduce cpu local":
            (lambda: torch_rsdp.ring_shift_reduce(gpu(n), cpu(n)), r"ring_shift"),
    }


def _raises(call):
    """None if `call` (and waiting for what it returns) raised nothing, else a summary."""
    try:
        work = call()
    except Exception as e:  # noqa: BLE001
        return {"when": "call", "type": type(e).__name__,
                "ok_type": isinstance(e, (RuntimeError, ValueError, TypeError)), "msg": str(e)}
    try:
        if work is not None and hasattr(work, "wait"):
            work.wait()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        return {"when": "wait", "type": type(e).__name__,
                "ok_type": isinstance(e, (RuntimeError, ValueError, TypeError)), "msg": str(e)}
    return None


def _group_works(ctx, dev):
    W, r = ctx.world_size, ctx.rank
    out = {}
    for where in (dev, torch.device("cpu")):
        try:
            t = torch.full((N_BAD,), float(r + 1), device=where)
            dist.all_reduce(t)
            ok = torch.equal(t.cpu(), torch.full((N_BAD,), float(W * (W + 1) // 2)))
            out[where.type] = True if ok else f"wrong result {t[:4].tolist()}"
        except Exception as e:  # noqa: BLE001
            out[where.type] = f"{type(e).__name__}: {e}"[:1000]
    return out


def _mixed_worker(ctx):
    dev = _cuda_setup(ctx)
    dist.all_reduce(torch.ones(8, device=dev))  # the group's CUDA side exists
    out = {name: _raises(call) for name, (call, _) in _mixed_cases(ctx.world_size, dev).items()}
    out["<afterwards>"] = _group_works(ctx, dev)
    return out


def _names_rank(msg, r):
    return any(str(r) in re.findall(r"\d+", m.group(1))
               for m in re.finditer(r"\branks?\b[\s:=#\[\(\{]*((?:\d+[\s,]*)+)", msg, re.I))


def _check_raised(o, r, case, op_re, detail_re):
    assert o is not None, f"rank {r}: {case}: accepted"
    msg = o["msg"]
    assert o["ok_type"], f"rank {r}: {case}: raised {o['type']}: {msg[:300]}"
    assert re.search(op_re, msg, re.I), f"rank {r}: {case}: message does not name the op: {msg[:600]}"
    assert _names_rank(msg, r), f"rank {r}: {case}: message does not name the rank: {msg[:600]}"
    assert re.search(detail_re, msg, re.I), f"rank {r}: {case}: message lacks {detail_re}: {msg[:600]}"


_MIXED: dict = {}


@pytest.mark.parametrize("case", list(_mixed_cases(2, None)))
def test_cuda_mixed_devices_raise(case):
    ws = 2
    if "res" not in _MIXED:
        try:
            _MIXED["res"] = launch(_mixed_worker, ws, init=False, deadline=180, pg_timeout=30,
                                   env=_one_gpu_env())
        except AssertionError as e:
            _MIXED["res"] = e
    if isinstance(_MIXED["res"], Exception):
        raise AssertionError(f"the mixed-device launch failed:\n{_MIXED['res']}")
    op_re = _mixed_cases(ws, None)[case][1]
    for r in range(ws):
        _check_raised(_MIXED["res"][r][case], r, case, op_re, r"\bcpu\b|\bcuda\b|device")
        assert _MIXED["res"][r]["<afterwards>"] == {"cuda": True, "cpu": True}, (
            f"rank {r}: the group does not work after the errors: {_MIXED['res'][r]['<afterwards>']}")


def _wrong_device_worker(ctx):
    dev = _cuda_setup(ctx)
    dist.all_reduce(torch.ones(8, device=dev))  # binds the group to this rank's GPU
    other = torch.device("cuda", (dev.index + 1) % torch.cuda.device_count())
    out = {"device": str(dev), "other": str(other),
           "all_reduce": _raises(lambda: dist.all_reduce(torch.ones(N_BAD, device=other),
                                                         async_op=True))}
    out["<afterwards>"] = _group_works(ctx, dev)
    return out


def test_cuda_wrong_device_index():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs: every rank's only GPU is the group's")
    ws = 2
    res = launch(_wrong_device_worker, ws, init=False, deadline=180, pg_timeout=30)
    for r in range(ws):
        o = res[r]
        _check_raised(o["all_reduce"], r, f"all_reduce on {o['other']} (rank uses {o['device']})",
                      r"all_?reduce", r"cuda:\d|device")
        assert o["<afterwards>"] == {"cuda": True, "cpu": True}, (
            f"rank {r}: the group does not work after the error: {o['<afterwards>']}")

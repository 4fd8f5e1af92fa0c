"""Failure behaviour: dead peers, missing peers, mismatched collectives, invalid arguments.

The backend must never hang and never succeed falsely: every wait has a deadline, a dead or
missing peer turns into a RuntimeError (naming the missing rank), mismatched collectives are
detected through the per-group sequence number / op / byte count, and invalid arguments raise
before any communication with the rank, the op and the offending shape/dtype in the message.
"""

from __future__ import annotations

import datetime
import os
import re
import signal
import time

import pytest
import torch
import torch.distributed as dist

from support.harness import launch, own_shm_entries, rsdp_shm_entries

PG_TIMEOUT = 10.0
MISMATCH_WORDS = re.compile(r"mismatch|does not match|do not match|doesn't match|differ", re.I)


def names_rank(msg: str, rank: int) -> bool:
    """True when the message names `rank` after the word rank/ranks ("rank 1", "ranks [0, 1]")."""
    for m in re.finditer(r"\branks?\b[\s:=#\[\(\{]*((?:\d+[\s,]*)+)", msg, re.I):
        if str(rank) in re.findall(r"\d+", m.group(1)):
            return True
    return False


# --------------------------------------------------------------------------------------------
# (a) a rank is SIGKILLed in the middle of a loop of large all_reduces
# --------------------------------------------------------------------------------------------

KILL_NUMEL = 1 << 21  # 8 MiB of float32 per all_reduce: many staging segments
KILL_ITER = 4


def _sigkill_worker(ctx, victim):
    r, W = ctx.rank, ctx.world_size
    t = torch.empty(KILL_NUMEL)
    for i in range(2000):
        if r == victim and i == KILL_ITER:
            ctx.store.set("killed_at", repr(time.time()))
            os.kill(os.getpid(), signal.SIGKILL)
        t.fill_(r + 1)
        try:
            dist.all_reduce(t)
        except RuntimeError as e:
            raised = time.time()
            killed = float(ctx.store.get("killed_at"))
            return {"outcome": "raised", "iter": i, "after_kill_s": raised - killed,
                    "type": type(e).__name__, "msg": str(e)[:2000]}
        except BaseException as e:  # noqa: BLE001
            return {"outcome": "other", "type": type(e).__name__, "msg": str(e)[:2000]}
        exp = W * (W + 1) / 2
        if not bool((t == exp).all()):
            return {"outcome": "wrong", "iter": i, "got": t[:4].tolist(), "exp": exp}
    return {"outcome": "completed"}


@pytest.mark.slow
@pytest.mark.parametrize("ws,victim", [(2, 0), (3, 1)], ids=["ws2-victim0", "ws3-victim1"])
def test_sigkill_peer(ws, victim):
    before = rsdp_shm_entries()
    res = launch(_sigkill_worker, ws, (victim,), pg_timeout=PG_TIMEOUT, deadline=90,
                 expect_killed=[victim])  # also checks that /dev/shm is clean afterwards
    for r in range(ws):
        if r == victim:
            continue
        o = res[r]
        assert o["outcome"] == "raised", f"survivor rank {r}: {o}"
        assert o["iter"] >= KILL_ITER, f"rank {r} raised before the kill: {o}"
        assert o["after_kill_s"] <= PG_TIMEOUT + 5, (
            f"rank {r} raised {o['after_kill_s']:.1f}s after the kill (timeout {PG_TIMEOUT}s)")
    left = (rsdp_shm_entries() - before) & own_shm_entries()
    assert left == set(), f"/dev/shm entries left behind after the kill: {sorted(left)}"


# --------------------------------------------------------------------------------------------
# (b) a rank that never shows up
# --------------------------------------------------------------------------------------------

MISSING_TIMEOUT = 5.0


def _missing_rank_worker(ctx):
    # a dedicated store client whose own timeout is short as well; the launcher's TCPStore
    # master was created with wait_for_workers=False
    store = dist.TCPStore("127.0.0.1", ctx.store_port, is_master=False,
                          timeout=datetime.timedelta(seconds=MISSING_TIMEOUT))
    t0 = time.time()
    stage = "init"
    try:
        dist.init_process_group(ctx.backend, store=dist.PrefixStore("/missing/", store),
                                rank=ctx.rank, world_size=ctx.world_size,
                                timeout=datetime.timedelta(seconds=MISSING_TIMEOUT))
        stage = "first collective"
        t = torch.ones(1000)
        dist.all_reduce(t)
    except Exception as e:  # noqa: BLE001
        return {"raised": True, "stage": stage, "elapsed": time.time() - t0,
                "type": type(e).__name__, "isruntime": isinstance(e, RuntimeError),
                "msg": str(e)[:3000]}
    return {"raised": False, "stage": stage, "elapsed": time.time() - t0}


def test_missing_rank_times_out():
    W, missing = 3, 1
    res = launch(_missing_rank_worker, W, ranks=[0, 2], init=False, destroy=True, deadline=90,
                 pg_timeout=MISSING_TIMEOUT)
    for r in (0, 2):
        o = res[r]
        assert o["raised"], f"rank {r}: {o['stage']} succeeded although rank {missing} never started"
        assert o["isruntime"], f"rank {r}: raised {o['type']}, expected a RuntimeError subclass"
        assert re.search(r"time[d]?\s*out|timeout|deadline", o["msg"], re.I), (
            f"rank {r}: not a timeout error: {o['type']}: {o['msg'][:500]}")
        assert names_rank(o["msg"], missing), (
            f"rank {r}: message does not name missing rank {missing}: {o['msg'][:800]}")
        assert o["elapsed"] <= 2 * MISSING_TIMEOUT + 10, f"rank {r}: took {o['elapsed']:.1f}s"


# --------------------------------------------------------------------------------------------
# (c) mismatched collectives
# --------------------------------------------------------------------------------------------


def _mismatch_worker(ctx, scenario):
    r = ctx.rank
    t0 = time.time()
    try:
        if scenario == "count-small":
            t = torch.ones(7 + r)
            dist.all_reduce(t)
        elif scenario == "count-large":
            t = torch.ones(100_003 + 7 * r)
            dist.all_reduce(t)
        elif scenario == "allreduce-vs-broadcast":
            t = torch.ones(4096)  # same byte count on both ranks
            if r == 0:
                dist.all_reduce(t)
            else:
                dist.broadcast(t, src=0)
        elif scenario == "dtype":
            # same byte count, different dtypes
            t = torch.ones(1024, dtype=torch.float32 if r == 0 else torch.int32)
            dist.all_reduce(t)
        else:
            raise AssertionError(scenario)
    except Exception as e:  # noqa: BLE001
        return {"raised": True, "elapsed": time.time() - t0, "type": type(e).__name__,
                "isruntime": isinstance(e, RuntimeError), "msg": str(e)[:3000]}
    return {"raised": False, "elapsed": time.time() - t0, "value": t[:4].tolist()}


@pytest.mark.slow
@pytest.mark.parametrize("scenario", ["count-small", "count-large", "allreduce-vs-broadcast", "dtype"])
def test_mismatched_collectives_raise(scenario):
    # every rank must report (the harness fails on crashes, hangs and non-zero exit codes)
    res = launch(_mismatch_worker, 2, (scenario,), pg_timeout=PG_TIMEOUT, deadline=90)
    for r in range(2):
        o = res[r]
        assert o["raised"], f"rank {r}: mismatched collective completed without error: {o}"
        assert o["isruntime"], f"rank {r}: raised {o['type']}, expected RuntimeError: {o['msg'][:300]}"
        assert MISMATCH_WORDS.search(o["msg"]), f"rank {r}: message does not mention the mismatch: {o['msg'][:800]}"
        assert o["elapsed"] <= PG_TIMEOUT + 5, f"rank {r}: took {o['elapsed']:.1f}s"


# --------------------------------------------------------------------------------------------
# (d) invalid arguments, (e) the group still works afterwards
# --------------------------------------------------------------------------------------------

BAD_ROOT = 97
N = 1234


def _backend():
    return dist.group.WORLD._get_backend(torch.device("cpu"))


def _invalid_cases(W):
    """name -> (callable issuing the invalid call, op regex, detail regexes (any must match))."""

    def ag_into_tensor():
        return dist.all_gather_into_tensor(torch.empty(W * N + 5), torch.ones(N), async_op=True)

    def rs_tensor():
        return dist.reduce_scatter_tensor(torch.empty(N), torch.ones(W * N + 3), async_op=True)

    def ag_list_dtypes():
        outs = [torch.empty(N) for _ in range(W)]
        outs[-1] = torch.empty(N, dtype=torch.float64)
        return _backend().allgather([outs], [torch.ones(N)])

    def band_float():
        return dist.all_reduce(torch.ones(N), op=dist.ReduceOp.BAND, async_op=True)

    def avg_bool():
        return dist.all_reduce(torch.ones(N, dtype=torch.bool), op=dist.ReduceOp.AVG, async_op=True)

    def bcast_bad_root():
        opts = dist.BroadcastOptions()
        opts.rootRank = BAD_ROOT
        opts.rootTensor = 0
        return _backend().broadcast([torch.ones(N)], opts)

    def bcast_negative_root():
        opts = dist.BroadcastOptions()
        opts.rootRank = -1
        opts.rootTensor = 0
        return _backend().broadcast([torch.ones(N)], opts)

    def send_bad_peer():
        return _backend().send([torch.ones(N)], BAD_ROOT, 0)

    return {
        "all_gather_into_tensor wrong output size":
            (ag_into_tensor, r"all_?gather", [rf"\b{W * N + 5}\b", rf"\b{W * N}\b"]),
        "reduce_scatter_tensor wrong input size":
            (rs_tensor, r"reduce_?scatter", [rf"\b{W * N + 3}\b", rf"\b{W * N}\b"]),
        "all_gather output list with mixed dtypes":
            (ag_list_dtypes, r"all_?gather", [r"float64|double"]),
        "all_reduce BAND on float32":
            (band_float, r"all_?reduce", [r"band|bitwise"]),
        "all_reduce AVG on bool":
            (avg_bool, r"all_?reduce", [r"avg|average"]),
        "broadcast root out of range":
            (bcast_bad_root, r"broadcast|bcast", [rf"\b{BAD_ROOT}\b"]),
        "broadcast negative root":
            (bcast_negative_root, r"broadcast|bcast", [r"-1\b"]),
        "send to invalid peer":
            (send_bad_peer, r"send", [rf"\b{BAD_ROOT}\b"]),
    }


def _dtype_words(name):
    if "float32" in name:
        return r"float(32)?\b|\bFloat\b"
    if "int32" in name:
        return r"int(32)?\b|\bInt\b"
    return None


def _invalid_args_worker(ctx):
    r, W = ctx.rank, ctx.world_size
    out = {}
    for name, (call, _, _) in _invalid_cases(W).items():
        try:
            work = call()
        except Exception as e:  # noqa: BLE001
            out[name] = {"raised": "call", "type": type(e).__name__,
                         "ok_type": isinstance(e, (RuntimeError, ValueError)), "msg": str(e)}
            continue
        try:
            if work is not None:
                work.wait()
        except Exception as e:  # noqa: BLE001
            out[name] = {"raised": "wait", "type": type(e).__name__,
                         "ok_type": isinstance(e, (RuntimeError, ValueError)), "msg": str(e)}
            continue
        out[name] = {"raised": None}

    def check_allreduce(tag):
        try:
            t = torch.arange(1000, dtype=torch.float32) + r
            dist.all_reduce(t)
            exp = torch.arange(1000, dtype=torch.float32) * W + W * (W - 1) / 2
            return bool(torch.equal(t, exp)) or f"wrong result {t[:4].tolist()}"
        except Exception as e:  # noqa: BLE001
            return f"{type(e).__name__}: {e}"[:1000]

    # (e) the group still works after caught argument errors on every rank ...
    out["<after errors on all ranks>"] = {"collective_ok": check_allreduce("all")}
    # ... and after an argument error on one rank only (it must not have consumed a
    # sequence number or sent anything)
    if r == W - 1:
        try:
            dist.all_reduce(torch.ones(N), op=dist.ReduceOp.BAND)
        except Exception:  # noqa: BLE001
            pass
    out["<after an error on one rank>"] = {"collective_ok": check_allreduce("one")}
    out["<broadcast after errors>"] = {"collective_ok": _bcast_ok(r)}
    return out


def _bcast_ok(r):
    try:
        t = torch.arange(77, dtype=torch.int64) if r == 0 else torch.zeros(77, dtype=torch.int64)
        dist.broadcast(t, src=0)
        return bool(torch.equal(t, torch.arange(77, dtype=torch.int64))) or f"wrong result {t[:4].tolist()}"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"[:1000]


_INVALID: dict = {}


def _invalid_results():
    if "res" not in _INVALID:
        try:
            _INVALID["res"] = launch(_invalid_args_worker, 2, pg_timeout=PG_TIMEOUT, deadline=90)
        except AssertionError as e:
            _INVALID["res"] = e
    if isinstance(_INVALID["res"], Exception):
        raise AssertionError(f"invalid-argument launch failed:\n{_INVALID['res']}")
    return _INVALID["res"]


@pytest.mark.parametrize("case", list(_invalid_cases(2)))
def test_invalid_argument_raises(case):
    W = 2
    _, op_re, detail_res = _invalid_cases(W)[case]
    res = _invalid_results()
    for r in range(W):
        o = res[r][case]
        assert o["raised"] is not None, f"rank {r}: invalid call was accepted"
        assert o["ok_type"], f"rank {r}: raised {o['type']}, expected RuntimeError or ValueError: {o['msg'][:300]}"
        assert o["raised"] == "call", (
            f"rank {r}: raised only in work.wait(), not when the call was made "
            f"(must be rejected before any communication): {o['msg'][:300]}")
        msg = o["msg"]
        assert re.search(op_re, msg, re.I), f"rank {r}: message does not name the op ({op_re}): {msg[:600]}"
        assert names_rank(msg, r) or re.search(rf"\[?rank\s*{r}\]?", msg, re.I), (
            f"rank {r}: message does not name the rank: {msg[:600]}")
        assert any(re.search(d, msg, re.I) for d in detail_res), (
            f"rank {r}: message lacks the offending value ({detail_res}): {msg[:600]}")
        dw = _dtype_words(case)
        if dw:
            assert re.search(dw, msg, re.I), f"rank {r}: message does not name the dtype: {msg[:600]}"


@pytest.mark.parametrize("after", ["<after errors on all ranks>", "<after an error on one rank>",
                                   "<broadcast after errors>"])
def test_group_usable_after_argument_errors(after):
    res = _invalid_results()
    for r in range(2):
        ok = res[r][after]["collective_ok"]
        assert ok is True, f"rank {r}: collective {after} failed: {ok}"

"""A hostile and a broken peer, end to end (docs/reliability.md; the decoders' rules:
docs/architecture.md, Records a peer leaves).

Store: rank 1 of the launch is a plain process with its own client of the job's TCPStore and no
process group. Before each case it writes malformed records under the keys a real rank reads
(csrc/core/store_records.h: the peer record, the shared-memory segment name, UCX worker
addresses), taking the place of the real rank's only peer; a name may point at a segment it made
of the wrong size or with a header never finished. The real rank (rank 0 of the launch) then calls
``init_process_group("rsdp")`` for a world of 2 (for the UCX address records, then its first
collective: endpoints are made on first use) and must raise at once (not crash, not wait for
its timeout) with an error naming the peer's rank and what was malformed; afterwards its threads,
file descriptors and /dev/shm entries are what they were before the first case.

Wire: 2 ranks on 2 emulated nodes (UCX between them); rank 1 sets ``RSDP_TEST_WIRE_LIE`` (the
test hook of csrc/transport/ucx/wire_lie.h) so that every collective header it sends lies about
one field while the message stays well-formed. For each lie, all_reduce / all_gather /
broadcast, with payloads inline in the header message (<= 8 KiB) and following it (> 8 KiB): the
honest rank raises a mismatch naming rank 1 and the op within a second, then leaks are checked.
Each case is a fresh group on a fresh store prefix, in one launch per part.
"""

from __future__ import annotations

import datetime
import os
import random
import re
import secrets
import struct
import time

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from backend.test_faults import names_rank
from backend.test_leaks import measure, settled
from support.harness import backend_under_test, launch

pytestmark = pytest.mark.skipif(backend_under_test() != "rsdp",
                                reason="the records and the wire hook are rsdp's")

PG_TIMEOUT = 10.0
SHM_MAGIC = 0x3150445352  # "RSDP1", csrc/core/store_records.h


def _group_store(base, tag: str, group_name: str):
    """The store the rsdp backend of a default group sees: torch's prefixes, as
    init_process_group(store=PrefixStore(f"/{tag}/", base)) stacks them for CPU tensors."""
    s = dist.PrefixStore(f"/{tag}/", base)
    s = dist.PrefixStore(f"{group_name}/", s)
    return dist.PrefixStore("cpu/", s)


def _leaks(base: dict, now: dict) -> list:
    out = []
    for k in ("threads", "fds", "shm"):
        if now[k] != base[k]:
            extra = ""
            if k == "fds":
                extra = f" (new: {sorted(set(now['fd_targets']) - set(base['fd_targets']))})"
            out.append(f"{k} {base[k]} -> {now[k]}{extra}")
    return out


# --------------------------------------------------------------------------------------------
# the store: malformed records
# --------------------------------------------------------------------------------------------

def _peer(rank: int, node: str) -> str:
    return f"rsdp1|peer|{rank}|{os.getpid()}|{node}"


def _ucx(rank: int, coll: bytes, p2p: bytes) -> str:
    return f"rsdp1|ucx|{rank}|{len(coll)}|{coll.hex()}|{len(p2p)}|{p2p.hex()}"


REAL_NODE = "hostile-test-node0"  # the real rank's RSDP_NODE_ID
OTHER_NODE = "hostile-test-node1"  # a hostile peer on another node: the real rank uses UCX

# name -> (the real rank's rank, the hostile's records {key: value or segment spec}, what the
# error must say). A segment spec ("segment", bytes, header) makes a segment under a fresh name
# and writes the record naming it; bytes None: the size the real rank expects.
STORE_CASES = {
    "peer-truncated": (0, {"peer/1": "rsdp1|peer|1|4242"}, r"malformed peer record.*no node id"),
    "peer-pid-not-a-number": (0, {"peer/1": "rsdp1|peer|1|42x|n"}, r"pid '42x' is not"),
    "peer-another-job": (0, {"peer/1": "4242|host/6f1c2d3e-boot"},
                         r"not a torch_rsdp record"),
    "peer-another-version": (0, {"peer/1": "rsdp2|peer|1|4242|n"}, r"another version"),
    "peer-copied": (0, {"peer/1": "rsdp1|peer|0|4242|n"}, r"written by group rank 0"),
    "peer-table-truncated": (1, {"peer/0": ("peer", REAL_NODE),
                                 "peers": f"rsdp1|peers|0|2|1|{len(REAL_NODE)}|{REAL_NODE}|7.0"},
                             r"malformed peer table.*1 rank entries for 2"),
    "peer-table-other-node-count": (1, {"peer/0": ("peer", REAL_NODE),
                                        "peers": "rsdp1|peers|0|2|3|1|a|1.0,2.0"},
                                    r"malformed peer table.*number of nodes '3'"),
    "peer-table-copied": (1, {"peer/0": ("peer", REAL_NODE),
                              "peers": f"rsdp1|peers|0|2|1|{len(REAL_NODE)}|{REAL_NODE}|7.0,8.0"},
                          r"peer table that rank 0 posted.*stale or copied"),
    "shm-name-missing": (1, {"peer/0": ("peer", REAL_NODE),
                             "shm/name": "rsdp1|shm|0|/rsdp-" + "0" * 15 + "1"},
                         r"shm_open.*No such file"),
    "shm-name-too-long": (1, {"peer/0": ("peer", REAL_NODE),
                              "shm/name": "rsdp1|shm|0|/rsdp-" + "ab" * 200},
                          r"longer than any shm record"),
    "shm-name-a-path": (1, {"peer/0": ("peer", REAL_NODE),
                            "shm/name": "rsdp1|shm|0|/../../dev/zero"},
                        r"not a segment name"),
    "shm-wrong-size": (1, {"peer/0": ("peer", REAL_NODE), "shm/name": ("segment", 4096, b"")},
                       r"has 4096 bytes, expected \d+"),
    "shm-header-never-written": (1, {"peer/0": ("peer", REAL_NODE),
                                     "shm/name": ("segment", None, b"")},
                                 r"header is empty"),
    "shm-header-another-version": (1, {"peer/0": ("peer", REAL_NODE),
                                       "shm/name": ("segment", None,
                                                    struct.pack("<Q", SHM_MAGIC + (1 << 32)))},
                                   r"another version"),
    "ucx-address-truncated": (0, {"peer/1": ("peer", OTHER_NODE),
                                  "ucx/addr/1": _ucx(1, b"\1" * 40, b"\2" * 40)[:-9]},
                              r"UCX address record.*truncated"),
    "ucx-address-wrong-length": (0, {"peer/1": ("peer", OTHER_NODE),
                                     "ucx/addr/1": "rsdp1|ucx|1|70000|00|1|00"},
                                 r"UCX address record.*length '70000'"),
    "ucx-address-not-hex": (0, {"peer/1": ("peer", OTHER_NODE),
                                "ucx/addr/1": "rsdp1|ucx|1|2|zz00|1|00"},
                            r"UCX address record.*not lower-case hex"),
    "ucx-address-garbage": (0, {"peer/1": ("peer", OTHER_NODE),
                                "ucx/addr/1": _ucx(1, bytes(range(7, 207)), b"\xff" * 64)},
                            r"UCX address record of rank 1.*format version 7"),
    # Racing: waits for the real rank's own record and copies its first byte (UCX's address
    # format version), so that UCX itself parses the garbage that follows.
    "ucx-address-garbage-racing": (0, {"peer/1": ("peer", OTHER_NODE),
                                       "ucx/addr/1": ("race", "ucx/addr/0")},
                                   r"UCX refused the collective address that rank 1 published"),
    "ucx-address-another-job": (0, {"peer/1": ("peer", OTHER_NODE), "ucx/addr/1": "0a0b:0c0d"},
                                r"UCX address record.*not a torch_rsdp record"),
}


def _table(real_record: str) -> str:
    """The peer table a group rank 0 on REAL_NODE posts: itself, then the real rank 1."""
    pid1 = real_record.split("|")[3]
    return (f"rsdp1|peers|0|2|1|{len(REAL_NODE)}|{REAL_NODE}|{os.getpid()}.0,{pid1}.0")


for _name, (_real_rank, _records, _words) in STORE_CASES.items():
    if _real_rank == 1 and "peers" not in _records:  # the hostile is group rank 0: it posts the peer table as well
        _records["peers"] = ("table",)


def _hostile(ctx, cases):
    """Rank 1 of the launch: writes each case's records, then removes what it made."""
    st = ctx.store
    for i, name in enumerate(cases):
        go = st.get(f"hostile/{i}/go").decode().split("|")
        group_name, seg_bytes = go[0], int(go[1])
        real, records, _ = STORE_CASES[name]
        hostile = 1 - real
        gs = _group_store(st, f"hostile{i}", group_name)
        made, ready = [], False
        for key, value in records.items():
            if isinstance(value, tuple) and value[0] == "race":
                st.set(f"hostile/{i}/ready", "1")
                ready = True
                gs.wait([f"rsdp/2/0/{value[1]}"])
                theirs = gs.get(f"rsdp/2/0/{value[1]}").decode().split("|")
                first = bytes.fromhex(theirs[4])[:1]
                rng = random.Random(7)  # garbage UCX refuses (checked)
                value = _ucx(hostile, first + rng.randbytes(199), first + rng.randbytes(99))
            elif isinstance(value, tuple) and value[0] == "table":
                if not ready:
                    st.set(f"hostile/{i}/ready", "1")
                    ready = True
                gs.wait(["rsdp/2/0/peer/1"])
                value = _table(gs.get("rsdp/2/0/peer/1").decode())
            elif isinstance(value, tuple) and value[0] == "peer":
                value = _peer(hostile, value[1])
            elif isinstance(value, tuple) and value[0] == "segment":
                seg = "rsdp-" + secrets.token_hex(8)
                fd = os.open(f"/dev/shm/{seg}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
                made.append(seg)
                os.ftruncate(fd, value[1] if value[1] is not None else seg_bytes)
                os.pwrite(fd, value[2], 0)
                os.close(fd)
                value = f"rsdp1|shm|0|/{seg}"
            gs.set(f"rsdp/2/0/{key}", value)
        if not ready:
            st.set(f"hostile/{i}/ready", "1")
        st.get(f"hostile/{i}/done")  # waits
        for seg in made:
            os.unlink(f"/dev/shm/{seg}")
        st.set(f"hostile/{i}/clean", "1")
    return "hostile"


def _real(ctx, cases):
    """Rank 0 of the launch: one init_process_group per case, as rank 0 or 1 of a world of 2."""
    st = ctx.store
    base = measure()
    seg_bytes = 0
    out = {}
    for i, name in enumerate(cases):
        real = STORE_CASES[name][0]
        group_name = str(c10d._world.group_count)
        st.set(f"hostile/{i}/go", f"{group_name}|{seg_bytes}")
        st.get(f"hostile/{i}/ready")
        t0 = time.monotonic()
        left_initialized = False
        try:
            dist.init_process_group(
                "rsdp", store=dist.PrefixStore(f"/hostile{i}/", st), rank=real, world_size=2,
                timeout=datetime.timedelta(seconds=PG_TIMEOUT))
            left_initialized = True
            if name.startswith("ucx-"):
                # UCX endpoints are made on first use: the first collective reads the
                # peer's address record.
                left_initialized = False
                dist.all_reduce(torch.ones(4))
            o = {"raised": False}
        except Exception as e:  # noqa: BLE001
            o = {"raised": True, "type": type(e).__name__, "msg": str(e)[:3000],
                 "runtime": isinstance(e, RuntimeError)}
        o["elapsed"] = time.monotonic() - t0
        o["initialized"] = left_initialized
        if dist.is_initialized():
            dist.destroy_process_group()
        m = re.search(r"expected (\d+)", o.get("msg", ""))
        if name == "shm-wrong-size" and m:
            seg_bytes = int(m.group(1))
        st.set(f"hostile/{i}/done", "1")
        st.get(f"hostile/{i}/clean")
        o["leaks"] = _leaks(base, settled(base))
        out[name] = o
    return out


def _store_attack(ctx, cases):
    return _real(ctx, cases) if ctx.rank == 0 else _hostile(ctx, cases)


def test_malformed_store_records_fail_cleanly():
    cases = list(STORE_CASES)
    t0 = time.monotonic()
    res = launch(_store_attack, 2, (cases,), init=False, deadline=180, pg_timeout=PG_TIMEOUT,
                 env={"RSDP_NODE_ID": REAL_NODE, "RSDP_POOL_BYTES": "0", "UCX_TLS": "tcp",
                      "UCX_NET_DEVICES": "lo"})
    print(f"\n{len(cases)} store cases in one launch: {time.monotonic() - t0:.1f} s")
    bad = []
    for name, o in res[0].items():
        real, _, words = STORE_CASES[name]
        hostile = 1 - real
        print(f"  {name}: {o['elapsed'] * 1000:.0f} ms: {o.get('msg', '')[:200]}")
        if not o["raised"]:
            bad.append(f"{name}: init_process_group succeeded")
            continue
        why = []
        if not o["runtime"]:
            why.append(f"raised {o['type']}, not a RuntimeError")
        if not re.search(words, o["msg"], re.S):
            why.append(f"does not say /{words}/")
        if not names_rank(o["msg"], hostile):
            why.append(f"does not name rank {hostile}")
        if not o["msg"].startswith(f"rsdp rank {real}:") and f"rsdp rank {real}:" not in o["msg"]:
            why.append(f"does not name this rank ({real})")
        if o["elapsed"] > PG_TIMEOUT / 2 or re.search("timed out", o["msg"], re.I):
            why.append(f"took {o['elapsed']:.1f} s (it must not wait for the timeout)")
        if o["initialized"]:
            why.append("the default group was left initialized")
        why += o["leaks"]
        if why:
            bad.append(f"{name}: {'; '.join(why)}\n    message: {o['msg'][:600]}")
    assert not bad, "\n".join(bad)


# --------------------------------------------------------------------------------------------
# the wire: well-formed UCX messages whose headers lie
# --------------------------------------------------------------------------------------------

LIES = ["bytes", "step", "dtype", "op", "bits", "count"]
OPS = ["all_reduce", "all_gather", "broadcast"]
SIZES = {"inline": 100, "large": 40_003}  # float32 elements: 400 B, 160 KB (> 8 KiB)
OP_WORDS = {"all_reduce": "allreduce", "all_gather": "allgather", "broadcast": "broadcast"}
LIAR = 1


def _run_op(op: str, n: int, rank: int) -> None:
    t = torch.full((n,), float(rank + 1))
    if op == "all_reduce":
        dist.all_reduce(t)
    elif op == "all_gather":
        dist.all_gather([torch.empty(n) for _ in range(2)], t)
    else:
        dist.broadcast(t, src=LIAR)  # the liar sends


def _wire_attack(ctx, cases):
    r = ctx.rank
    timeout = datetime.timedelta(seconds=PG_TIMEOUT)
    # An honest group first: what a group leaves for the process's life (UCX's and torch's
    # one-time state) is there before the baseline.
    ctx.init_pg(tag="wire-honest", timeout=timeout)
    _run_op("all_reduce", SIZES["large"], r)
    dist.destroy_process_group()
    base = measure()
    out = {}
    for i, (lie, op, size) in enumerate(cases):
        name = f"{lie}-{op}-{size}"
        if r == LIAR:  # read once, when the group is made
            os.environ["RSDP_TEST_WIRE_LIE"] = lie
        ctx.init_pg(tag=f"wire{i}", timeout=timeout)
        os.environ.pop("RSDP_TEST_WIRE_LIE", None)
        t0 = time.monotonic()
        try:
            _run_op(op, SIZES[size], r)
            o = {"raised": False}
        except Exception as e:  # noqa: BLE001
            o = {"raised": True, "type": type(e).__name__, "msg": str(e)[:3000]}
        o["elapsed"] = time.monotonic() - t0
        # Destroyed before the ranks meet: a liar still waiting in a multi-step op learns from
        # the closed endpoints that the honest rank gave up, rather than from its own timeout.
        dist.destroy_process_group()
        ctx.store_sync(f"wire{i}/done", timeout_s=60)
        o["leaks"] = _leaks(base, settled(base))
        out[name] = o
    return out


def test_lying_ucx_headers_are_refused():
    cases = [(lie, op, size) for lie in LIES for op in OPS for size in SIZES]
    t0 = time.monotonic()
    res = launch(_wire_attack, 2, (cases,), init=False, node_of=[0, 1], deadline=300,
                 pg_timeout=PG_TIMEOUT)
    print(f"\n{len(cases)} wire cases in one launch ({res.mode}): {time.monotonic() - t0:.1f} s")
    bad = []
    for name, o in res[0].items():
        lie, op, _ = name.split("-")
        print(f"  {name}: {o['elapsed'] * 1000:.0f} ms: {o.get('msg', '')[:160]}")
        if not o["raised"]:
            bad.append(f"{name}: the honest rank accepted the message")
            continue
        why = []
        msg = o["msg"]
        if not names_rank(msg, LIAR):
            why.append(f"does not name rank {LIAR}")
        if OP_WORDS[op] not in msg:
            why.append(f"does not name the op ({OP_WORDS[op]})")
        if not re.search(r"is running|expects|announced|mismatch", msg):
            why.append("does not say what disagreed")
        if o["elapsed"] > 2.0:
            why.append(f"took {o['elapsed']:.1f} s")
        why += o["leaks"]
        if why:
            bad.append(f"{name}: {'; '.join(why)}\n    message: {msg[:600]}")
    for name, o in res[LIAR].items():
        if o["leaks"]:
            bad.append(f"{name} (the liar): {'; '.join(o['leaks'])}")
    assert not bad, "\n".join(bad)

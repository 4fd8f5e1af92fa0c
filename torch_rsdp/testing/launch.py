"""Launches N rank processes on one machine: the launcher the tests and the benchmarks share.

`launch(fn, world_size, ...)` starts one process per rank (forkserver; see `_context`).
Every worker redirects its stdout/stderr to a per-rank log file, imports ``torch_rsdp`` (when
the backend under test is "rsdp"), connects to a TCPStore hosted by the launching process (pytest or a
benchmark), calls ``init_process_group``, runs ``fn(ctx, *args)`` and writes ``("ok", value)`` or
``("error", type, message, traceback)`` to a per-rank result file.  The launcher enforces a
hard deadline: when it passes, every child is SIGKILLed and ``LaunchError`` is raised with the
Python stacks of the hung ranks (faulthandler) and the tail of every rank's log.  After all
children have exited, no /dev/shm entry whose name contains "rsdp" may have appeared.

The backend under test comes from the environment variable RSDP_TEST_BACKEND (default
"rsdp"; "gloo" runs the same tests against gloo to validate the tests themselves).
Workers get RSDP_SHM_BYTES=65536 unless the caller overrides it, so that large messages
stream through many staging segments.

Functions passed to `launch` must be defined at module top level (spawn pickles them by name).

Emulated nodes: ``launch(..., node_of=[0, 0, 1, 1])`` places rank r on node node_of[r]. With
``netns=EmulatedNodes(...)`` (torch_rsdp.testing.netns) every rank first moves into its
node's network namespace (with the namespace name as host name), the TCPStore listens on
``netns.store_addr`` and GLOO_SOCKET_IFNAME / UCX_NET_DEVICES name the node's interface;
without it ranks share the loopback and get RSDP_NODE_ID=node<i>. Both set UCX_TLS=tcp unless
the caller's env sets it, and LOCAL_RANK / LOCAL_WORLD_SIZE per node. With a netns, `args`
should be plain Python values: they are unpickled before the rank switches namespaces.
"""

from __future__ import annotations

import datetime
import faulthandler
import importlib
import importlib.util
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

SHM_DIR = "/dev/shm"
DEFAULT_SHM_BYTES = "65536"


def backend_under_test() -> str:
    return os.environ.get("RSDP_TEST_BACKEND", "rsdp")


def rsdp_shm_entries() -> set[str]:
    """Names in /dev/shm that contain "rsdp" (case-insensitive)."""
    try:
        return {n for n in os.listdir(SHM_DIR) if "rsdp" in n.lower()}
    except FileNotFoundError:
        return set()


def shm_holders() -> dict[str, set[int]]:
    """For every /dev/shm entry containing "rsdp": the pids that have it open or mapped."""
    holders: dict[str, set[int]] = {}

    def note(path: str, pid: int) -> None:
        if path.startswith(SHM_DIR + "/") and not path.endswith("(deleted)"):
            name = path[len(SHM_DIR) + 1:]
            if "rsdp" in name.lower():
                holders.setdefault(name, set()).add(pid)

    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        pid = int(d)
        try:
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    if "/dev/shm/" in line:
                        note(line.split(None, 5)[-1].strip(), pid)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    note(os.readlink(f"/proc/{pid}/fd/{fd}"), pid)
                except OSError:
                    pass
        except OSError:
            continue
    return holders


def own_shm_entries(own_pids: Iterable[int] = ()) -> set[str]:
    """rsdp /dev/shm entries that are ours or nobody's: held by one of `own_pids`, or held by
    no live process at all.  Entries held only by other processes belong to some other job
    running on the same machine at the same time and are ignored."""
    own = set(own_pids)
    names = rsdp_shm_entries()
    if not names:
        return names
    holders = shm_holders()
    return {n for n in names if not holders.get(n) or holders[n] & own}


class LaunchError(AssertionError):
    """A launch failed: a rank raised, died, hung, or left shared memory behind.

    ``.result`` holds the LaunchResult (per-rank outcomes, log tails, progress markers).
    """

    def __init__(self, msg: str, result: "LaunchResult | None" = None):
        super().__init__(msg)
        self.result = result


@dataclass
class RankOutcome:
    rank: int
    exitcode: int | None = None  # None: still running when killed at the deadline
    status: str = "missing"  # "ok" | "error" | "missing"
    value: Any = None
    exc_type: str = ""
    exc_msg: str = ""
    exc_tb: str = ""
    log_tail: str = ""
    progress: str = ""  # last value the worker passed to ctx.set_progress()
    hung: bool = False


@dataclass
class LaunchResult:
    world_size: int
    outcomes: dict[int, RankOutcome] = field(default_factory=dict)
    elapsed: float = 0.0
    mode: str = "single node"  # or "network namespaces" / "RSDP_NODE_ID loopback"

    def values(self) -> list[Any]:
        return [self.outcomes[r].value for r in sorted(self.outcomes)]

    def __getitem__(self, rank: int) -> Any:
        return self.outcomes[rank].value


# --------------------------------------------------------------------------------------------
# Worker side
# --------------------------------------------------------------------------------------------


class WorkerContext:
    """What a worker function receives as its first argument."""

    def __init__(self, rank, world_size, backend, workdir, store_port, pg_timeout, init,
                 store_host="127.0.0.1"):
        self.rank = rank
        self.world_size = world_size
        self.backend = backend
        self.workdir = workdir
        self.store_port = store_port
        self.store_host = store_host
        self.pg_timeout = datetime.timedelta(seconds=pg_timeout)
        self._init_count = 0
        self._store = None
        self.auto_init = init

    # The raw TCP store client (one connection for the whole life of the worker).
    @property
    def store(self):
        if self._store is None:
            import torch.distributed as dist

            self._store = dist.TCPStore(
                self.store_host,
                self.store_port,
                is_master=False,
                timeout=max(self.pg_timeout, datetime.timedelta(seconds=60)),
            )
        return self._store

    def new_store(self, tag: str | None = None):
        """A fresh key space on the shared store (one per process-group incarnation)."""
        import torch.distributed as dist

        self._init_count += 1
        tag = tag or f"init{self._init_count}"
        return dist.PrefixStore(f"/{tag}/", self.store)

    def init_pg(self, backend: str | None = None, timeout: datetime.timedelta | None = None,
                tag: str | None = None, **kwargs):
        """init_process_group on a fresh store prefix (all ranks must use the same tag order)."""
        import torch.distributed as dist

        dist.init_process_group(
            backend or self.backend,
            store=self.new_store(tag),
            rank=self.rank,
            world_size=self.world_size,
            timeout=timeout or self.pg_timeout,
            **kwargs,
        )

    def reinit(self, backend: str | None = None, **kwargs):
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
        self.init_pg(backend, **kwargs)

    def set_progress(self, text: str) -> None:
        """Record what this rank is doing; the launcher reports it if the rank dies or hangs."""
        path = os.path.join(self.workdir, f"progress{self.rank}")
        with open(path + ".tmp", "w") as f:
            f.write(text)
        os.replace(path + ".tmp", path)

    def store_sync(self, key: str, value: bytes = b"1", timeout_s: float | None = None,
                   ranks: Sequence[int] | None = None) -> list[bytes]:
        """All-gather a small byte string among `ranks` through the store (not the backend)."""
        st = self.store
        st.set(f"sync/{key}/{self.rank}", value)
        ranks = range(self.world_size) if ranks is None else ranks
        keys = [f"sync/{key}/{r}" for r in ranks]
        if timeout_s is not None:
            st.wait(keys, datetime.timedelta(seconds=timeout_s))
        else:
            st.wait(keys)
        return list(st.multi_get(keys))


def _enter_netns(name: str) -> None:
    """Moves this process into network namespace `name` (host name = `name`).

    netns.py is loaded from its file, not through `import torch_rsdp.testing.netns`: the
    package's __init__ imports torch, which starts a thread, and the namespace switch must
    happen while this process is still single-threaded.
    """
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "torch_rsdp", "testing", "netns.py")
    spec = importlib.util.spec_from_file_location("_rsdp_test_netns", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.enter(name, hostname=name)


def _resolve_fn(fn):
    """A ("__fnref__", module, qualname) tuple -> the function (imported only now)."""
    if isinstance(fn, tuple) and fn and fn[0] == "__fnref__":
        mod = sys.modules.get("__mp_main__") if fn[1] == "__main__" else None
        obj = mod or importlib.import_module(fn[1])
        for part in fn[2].split("."):
            obj = getattr(obj, part)
        return obj
    return fn


def _write_result(path: str, payload) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        try:
            pickle.dump(payload, f)
        except Exception as e:  # unpicklable return value
            f.seek(0)
            f.truncate()
            pickle.dump(("error", "PicklingError", f"result not picklable: {e!r}", ""), f)
    os.replace(tmp, path)


def _die_with_launcher(launcher_pid: int) -> None:
    """Ends this rank (SIGKILL) within half a second of its launcher's exit.

    A rank forked by the fork server is not the launcher's child, and the server outlives a
    launcher killed from outside (a SIGKILLed pytest, a benchmark stopped by hand): its ranks
    used to run on until their process-group timeout. A daemon thread polls the launcher."""
    import threading

    def watch():
        while True:
            time.sleep(0.5)
            try:
                os.kill(launcher_pid, 0)
            except ProcessLookupError:
                os.kill(os.getpid(), signal.SIGKILL)
            except PermissionError:
                pass  # alive, owned by another user

    threading.Thread(target=watch, name="rsdp-test-launcher-watch", daemon=True).start()


def _worker_main(fn, args, rank, world_size, backend, workdir, store_port, env, pg_timeout,
                 init, deadline_s, destroy, store_host="127.0.0.1"):
    log_path = os.path.join(workdir, f"rank{rank}.log")
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log_fd, 1)
    os.dup2(log_fd, 2)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    log_file = os.fdopen(log_fd, "w", buffering=1)
    faulthandler.enable(file=log_file, all_threads=True)
    # The launcher sends SIGUSR1 to a rank that is still running at the deadline: dump every
    # thread's Python stack into the log before it is killed (diagnoses hangs).
    faulthandler.register(signal.SIGUSR1, file=log_file, all_threads=True)
    netns_error = None
    if env.get("RSDP_TEST_NETNS"):  # first, while single-threaded
        try:
            _enter_netns(env["RSDP_TEST_NETNS"])
        except BaseException as e:  # noqa: BLE001 - reported as this rank's error below
            netns_error = e

    if env.get("RSDP_TEST_LAUNCHER_PID"):  # a thread: only after the namespace is entered
        _die_with_launcher(int(env["RSDP_TEST_LAUNCHER_PID"]))
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)
    if os.environ.get("OMP_NUM_THREADS"):
        # As torchrun does for every rank of a multi-process job. The fork server loaded
        # torch's OpenMP before this variable was set, so it is applied here: each rank's
        # own intra-op threads would otherwise spin on the cores its peers need (4 ranks
        # on 2 cores: a test's tensor maths 10-30x slower).
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    os.environ["RANK"] = str(rank)
    os.environ["WORLD_SIZE"] = str(world_size)
    os.environ["LOCAL_RANK"] = str(env.get("LOCAL_RANK", rank))
    os.environ["LOCAL_WORLD_SIZE"] = str(env.get("LOCAL_WORLD_SIZE", world_size))

    result_path = os.path.join(workdir, f"result{rank}.pkl")
    try:
        if netns_error is not None:
            raise netns_error
        # The "rsdp" backend is registered: this module is part of torch_rsdp, whose import
        # registers it, and the rank imported this module to run this function.
        fn = _resolve_fn(fn)
        import torch.distributed as dist

        dist.set_debug_level_from_env()
        ctx = WorkerContext(rank, world_size, backend, workdir, store_port, pg_timeout, init,
                            store_host)
        if init:
            ctx.init_pg()
            got = dist.get_backend()
            if got != backend:
                raise RuntimeError(f"harness: default group backend is {got!r}, expected {backend!r}")
        value = fn(ctx, *args)
        payload = ("ok", value)
    except BaseException as e:  # noqa: BLE001 - report everything to pytest
        payload = ("error", type(e).__name__, str(e), traceback.format_exc())
    _write_result(result_path, payload)
    print(f"[harness] rank {rank} finished: {payload[0]}", flush=True)
    if destroy:
        try:
            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
        except BaseException:  # noqa: BLE001
            print("[harness] destroy_process_group raised:\n" + traceback.format_exc(), flush=True)
    print(f"[harness] rank {rank} exiting", flush=True)
    sys.stdout.flush()
    sys.stderr.flush()


# --------------------------------------------------------------------------------------------
# Launcher side
# --------------------------------------------------------------------------------------------


def _tail(path: str, n: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def _format_failure(what: str, res: LaunchResult, ranks: Iterable[int]) -> str:
    lines = [what]
    for r in ranks:
        o = res.outcomes[r]
        lines.append(f"---- rank {r}: status={o.status} exitcode={o.exitcode} hung={o.hung}"
                     + (f" progress={o.progress!r}" if o.progress else ""))
        if o.status == "error":
            lines.append(f"{o.exc_type}: {o.exc_msg}")
            lines.append(o.exc_tb)
        if o.log_tail.strip():
            lines.append(f"-- log tail (rank {r}):\n{o.log_tail}")
    return "\n".join(lines)


# Modules every rank imports before it runs anything: imported once, by the fork server.
PRELOAD = ("torch", "torch.distributed", "torch_rsdp", "torch_rsdp.testing.launch")


def _context(mp):
    """The multiprocessing context ranks start from.

    "forkserver" (default): one server process imports PRELOAD once per pytest run and forks
    every rank from it, so a rank starts in milliseconds instead of spending seconds of CPU
    importing torch (most of a short test's time on a small machine). A forked rank is as
    fresh as a spawned one where it matters: one thread, no process group, no backend
    state, modules as imported. Variables the caller passes in ``env`` are applied by the
    rank itself (_worker_main) before it does anything; variables that must be set before
    the interpreter starts come from the environment pytest was started in, as with spawn.
    RSDP_TEST_START=spawn starts every rank from scratch (a fresh interpreter per rank).
    """
    method = os.environ.get("RSDP_TEST_START", "forkserver")
    if method not in ("forkserver", "spawn"):
        raise ValueError(f"RSDP_TEST_START={method!r}: choose forkserver or spawn")
    ctx = mp.get_context(method)
    if method == "forkserver":
        from multiprocessing import forkserver

        ctx.set_forkserver_preload(list(PRELOAD))
        # Started now, before _start_all sets a launch's variables in os.environ: the server's
        # environment is every later rank's starting point.
        forkserver.ensure_running()
    return ctx


def _start_all(ctx, procs, ranks, fn, args, world_size, backend, workdir, port, full_env,
               pg_timeout, init, deadline, destroy, rank_env=None, store_host="127.0.0.1"):
    for r in ranks:
        env = dict(full_env, **(rank_env or {}).get(r, {}))
        saved = {k: os.environ.get(k) for k in env}
        for k, v in env.items():  # children see the variables from interpreter start
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = str(v)
        try:
            p = ctx.Process(
                target=_worker_main,
                args=(fn, tuple(args), r, world_size, backend, workdir, port, env, pg_timeout,
                      init, deadline, destroy, store_host),
                name=f"rsdp-test-rank{r}",
                daemon=False,
            )
            p.start()
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        procs[r] = p


def _node_env(node_of, netns, world_size, caller_env):
    """Per-rank environment for ranks spread over emulated nodes, and the mode's name."""
    if len(node_of) != world_size:
        raise ValueError(f"node_of has {len(node_of)} entries for {world_size} ranks")
    if netns is not None and max(node_of) >= netns.num_nodes:
        raise ValueError(f"node_of names node {max(node_of)}, netns has {netns.num_nodes}")
    rank_env = {}
    for r, node in enumerate(node_of):
        peers = [q for q in range(world_size) if node_of[q] == node]
        env = {"LOCAL_RANK": peers.index(r), "LOCAL_WORLD_SIZE": len(peers)}
        if "UCX_TLS" not in caller_env:
            env["UCX_TLS"] = "tcp"  # not UCX's shared memory: traffic must cross the link
        if netns is not None:
            env["RSDP_TEST_NETNS"] = netns.netns_name(node)
            env["GLOO_SOCKET_IFNAME"] = netns.ifname(node)
            if "UCX_NET_DEVICES" not in caller_env:
                env["UCX_NET_DEVICES"] = netns.ifname(node)
        else:
            env["RSDP_NODE_ID"] = f"node{node}"
            if "UCX_NET_DEVICES" not in caller_env:
                # UCX would use every interface, including the bridges of emulated nodes
                # that another run is about to remove (its connections then die silently).
                env["UCX_NET_DEVICES"] = "lo"
        rank_env[r] = env
    return rank_env, ("network namespaces" if netns is not None else "RSDP_NODE_ID loopback")


def launch(
    fn: Callable,
    world_size: int,
    args: Sequence[Any] = (),
    *,
    backend: str | None = None,
    env: dict[str, Any] | None = None,
    deadline: float = 180.0,
    pg_timeout: float = 60.0,
    init: bool = True,
    ranks: Sequence[int] | None = None,
    expect_killed: Sequence[int] = (),
    check_shm: bool = True,
    destroy: bool = True,
    raise_on_error: bool = True,
    allow_exit_abort: bool = False,
    node_of: Sequence[int] | None = None,
    netns=None,
) -> LaunchResult:
    """Run ``fn(ctx, *args)`` on ``world_size`` ranks; return per-rank outcomes.

    ranks: subset of ranks to actually start (default: all); the others never show up.
    expect_killed: ranks that are expected to die from SIGKILL (exit code -9) without a result.
    raise_on_error: raise LaunchError when any started rank raised, died or hung.
    allow_exit_abort: accept SIGABRT at interpreter exit after a rank reported ok and destroyed
        its group. Only for reference runs on gloo, whose teardown occasionally aborts
        ("terminate called without an active exception"); never for the backend under test.
    node_of: node index of every rank (emulated nodes; see the module docstring).
    netns: an open torch_rsdp.testing.netns.EmulatedNodes to run the nodes in; None with
        node_of: all ranks on the loopback, told apart by RSDP_NODE_ID.
    The /dev/shm check and the deadline are always enforced.
    """
    import multiprocessing as mp

    import torch.distributed as dist

    backend = backend or backend_under_test()
    ranks = list(range(world_size)) if ranks is None else list(ranks)
    full_env = {"RSDP_SHM_BYTES": DEFAULT_SHM_BYTES, "RSDP_TEST_LAUNCHER_PID": str(os.getpid()),
                "OMP_NUM_THREADS": "1"}
    full_env.update(env or {})
    rank_env, mode, store_host = None, "single node", "127.0.0.1"
    if netns is not None and node_of is None:
        raise ValueError("netns needs node_of")
    if node_of is not None:
        rank_env, mode = _node_env(list(node_of), netns, world_size, env or {})
        print(f"[harness] {world_size} ranks on nodes {list(node_of)}: {mode}"
              + (f" ({netns.describe()})" if netns is not None else ""), flush=True)
    if netns is not None:
        store_host = netns.store_addr
        # imported by the worker only after it entered its namespace (see _resolve_fn)
        fn = ("__fnref__", fn.__module__, fn.__qualname__)

    workdir = tempfile.mkdtemp(prefix="rstest_launch_")
    shm_before = rsdp_shm_entries()
    # The store lives in the launcher so that rank 0 dying (or never starting) cannot take it down.
    store = dist.TCPStore(
        store_host,
        0,
        world_size=None,
        is_master=True,
        timeout=datetime.timedelta(seconds=max(pg_timeout, 60)),
        wait_for_workers=False,  # never block on clients: some tests start only W-1 ranks
    )
    port = store.port

    ctx = _context(mp)
    procs = {}
    start = time.monotonic()
    _start_all(ctx, procs, ranks, fn, args, world_size, backend, workdir, port, full_env,
               pg_timeout, init, deadline, destroy, rank_env, store_host)

    end = start + deadline

    hung = []
    for r, p in procs.items():
        p.join(max(0.0, end - time.monotonic()))
    for r, p in procs.items():
        if p.is_alive():
            hung.append(r)
    if hung:
        # Ask the hung ranks for a stack dump (faulthandler, SIGUSR1), then kill everything.
        for r in hung:
            try:
                os.kill(procs[r].pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        time.sleep(1.5)
        for r in hung:
            try:
                os.kill(procs[r].pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in procs.values():
            if p.is_alive():
                p.kill()
        for p in procs.values():
            p.join(10)
    elapsed = time.monotonic() - start
    del store

    res = LaunchResult(world_size=world_size, elapsed=elapsed, mode=mode)
    for r, p in procs.items():
        o = RankOutcome(rank=r, exitcode=p.exitcode, hung=r in hung)
        rp = os.path.join(workdir, f"result{r}.pkl")
        if os.path.exists(rp):
            with open(rp, "rb") as f:
                payload = pickle.load(f)
            if payload[0] == "ok":
                o.status, o.value = "ok", payload[1]
            else:
                o.status = "error"
                o.exc_type, o.exc_msg, o.exc_tb = payload[1], payload[2], payload[3]
        # A rank killed by a signal (a native abort) printed its reason above a long native
        # backtrace: keep enough of its log to hold both.
        o.log_tail = _tail(os.path.join(workdir, f"rank{r}.log"),
                           16000 if (p.exitcode or 0) < 0 else 4000)
        try:
            with open(os.path.join(workdir, f"progress{r}")) as f:
                o.progress = f.read()
        except OSError:
            pass
        res.outcomes[r] = o

    # /dev/shm must not keep anything once every process is gone (allow a short grace period
    # for unlinks racing with process exit).
    # An entry counts as leaked if it appeared during this launch, is still there after a
    # grace period and no live process holds it (all our children are gone by now, so an
    # entry held by a live process belongs to another job running at the same time).
    leaked: set[str] = set()
    if check_shm:
        leaked = rsdp_shm_entries() - shm_before
        for _ in range(20):
            if not leaked:
                break
            time.sleep(0.1)
            leaked &= rsdp_shm_entries()
        if leaked:
            leaked &= own_shm_entries()

    fatal = []  # always fail the launch: hangs, crashes, unexpected exit codes
    errors = []  # ranks that raised (fail only with raise_on_error)
    if hung:
        fatal.append(f"ranks {hung} still running after the {deadline:.0f}s deadline (killed)")
    for r, o in res.outcomes.items():
        if r in expect_killed:
            if o.exitcode != -signal.SIGKILL:
                fatal.append(f"rank {r} expected to die by SIGKILL, exitcode={o.exitcode}")
            continue
        if r in hung:
            continue
        if o.status == "missing":
            fatal.append(f"rank {r} died without a result (exitcode={o.exitcode})")
        elif o.exitcode != 0 and not (allow_exit_abort and o.status == "ok"
                                      and o.exitcode == -signal.SIGABRT):
            fatal.append(f"rank {r} exited with code {o.exitcode} after reporting {o.status}")
        if o.status == "error":
            errors.append(f"rank {r} raised {o.exc_type}: {o.exc_msg[:300]}")
    problems = fatal + (errors if raise_on_error else [])
    shutil.rmtree(workdir, ignore_errors=True)
    if problems:
        msg = _format_failure("; ".join(problems), res, sorted(res.outcomes))
        if leaked:
            msg += f"\nalso leaked /dev/shm entries: {sorted(leaked)}"
        raise LaunchError(msg, res)
    if leaked:
        raise LaunchError(f"/dev/shm entries containing 'rsdp' left behind: {sorted(leaked)}", res)
    return res

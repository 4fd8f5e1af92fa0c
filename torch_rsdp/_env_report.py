"""``python -m torch_rsdp``: the plain-text report a user pastes into a bug.

As ``python -m torch.utils.collect_env`` and DeepSpeed's ``ds_report``: versions, this build
(``build_info()``), what each transport can do on this machine, the environment variables
that steer them, and the backends torch offers. It starts no process group and spawns no
rank (``--check``, :mod:`torch_rsdp._selfcheck`, does that), so it takes about as long as
``import torch``.

Every probe runs through :func:`_probe`: one that raises prints ``unavailable: <reason>``
instead of ending the report, because a report that crashes on the broken machine it is meant
to describe is no use.
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch
import torch.distributed as dist

from . import __version__
from ._cuda import build_info
from .integrations import status as integration_status

__all__ = ["report"]

#: Environment variables the report shows when set: prefixes, then exact names.
ENV_PREFIXES = ("RSDP_", "TORCH_RSDP_", "UCX_", "NCCL_")
ENV_NAMES = ("LOCAL_WORLD_SIZE", "LOCAL_RANK", "RANK", "WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "OMP_NUM_THREADS", "CUDA_VISIBLE_DEVICES")

#: The CI pins live in the source tree only (an installed wheel has no scripts/).
REQUIREMENTS = Path(__file__).resolve().parents[1] / "scripts" / "requirements-test.txt"


def _unavailable(e: Exception) -> str:
    return f"unavailable: {type(e).__name__}: {e}".splitlines()[0]


def _probe(fn: Callable[[], List[str]]) -> List[str]:
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - any failure is the answer to the probe
        return [_unavailable(e)]


def _table(rows: List[tuple], indent: str = "  ") -> List[str]:
    width = max((len(k) for k, _ in rows), default=0)
    return [f"{indent}{k:<{width}}  {v}" for k, v in rows]


def _gib(n: float) -> str:
    return f"{n / 2**30:.1f} GiB"


# ----------------------------------------------------------------------------- versions
def _ci_pins() -> Dict[str, str]:
    """``{distribution: version}`` of scripts/requirements-test.txt (what CI runs)."""
    pins = {}
    for line in REQUIREMENTS.read_text().splitlines():
        m = re.match(r"\s*([A-Za-z0-9_.-]+)==([^\s#]+)", line)
        if m:
            pins[m.group(1).lower().replace("_", "-")] = m.group(2)
    return pins


def _ucx_version() -> str:
    """The UCX the extension runs with: the libucp the loader mapped into this process (the
    extension links it), asked through its own ``ucp_get_version_string``; else
    ``ucx_info -v``; else unknown. build_info() does not record UCX."""
    try:
        with open("/proc/self/maps") as f:
            libs = sorted({ln.split()[-1] for ln in f if "/libucp.so" in ln})
    except OSError:
        libs = []
    for path in libs:
        fn = ctypes.CDLL(path).ucp_get_version_string
        fn.restype = ctypes.c_char_p
        return f"{fn().decode()} (libucp loaded by the extension: {path})"
    if shutil.which("ucx_info"):
        out = subprocess.run(["ucx_info", "-v"], capture_output=True, text=True, timeout=5)
        m = re.search(r"[Vv]ersion\s+(\S+)", out.stdout)
        if m:
            return f"{m.group(1)} (ucx_info -v)"
    return "unknown (libucp not loaded and no ucx_info)"


def _torch_line() -> str:
    cuda = torch.version.cuda
    if not cuda:
        return f"{torch.__version__} (built without CUDA)"
    nccl = _probe(lambda: [".".join(map(str, torch.cuda.nccl.version()))])[0]
    return f"{torch.__version__} (CUDA {cuda}, NCCL {nccl})"


def _libraries() -> List[tuple]:
    """Each trainer library the integrations patch, with its tested range (from the patch
    table, through integrations.status()), plus torchft, which has a CI pin only."""
    try:
        pins = _ci_pins()
    except OSError:  # not a source checkout
        pins = {}
    rows = []
    for lib in integration_status().libraries:
        lo, hi = lib.tested
        pin = pins.get(lib.name.replace("_", "-"))
        ci = f"; CI pin {pin}" if pin else ""
        if lib.version is None:
            rows.append((lib.name, f"not installed (tested {lo} to {hi}{ci})"))
        else:
            where = "inside" if lib.in_range else "OUTSIDE"
            rows.append((lib.name, f"{lib.version}: {where} the tested range {lo} to {hi}{ci}"))
    rows.append(("torchft", _torchft(pins.get("torchft"))))
    return rows


def _torchft(pin: Optional[str]) -> str:
    try:
        version = importlib.metadata.version("torchft")
    except importlib.metadata.PackageNotFoundError:
        return f"not installed (torch_rsdp.torchft is tested with {pin or 'unknown'})"
    if not pin:
        return f"{version} (no tested version recorded here)"
    same = version.split("+")[0] == pin
    return f"{version}: {'the' if same else 'NOT the'} tested version {pin} (CI pin)"


def _versions() -> List[str]:
    rows = [
        ("Python", f"{platform.python_version()} ({platform.python_implementation()}, "
                   f"{sys.executable})"),
        ("OS", f"{platform.platform()}, {os.cpu_count()} CPUs "
               f"({len(os.sched_getaffinity(0))} usable)"),
        ("torch", _probe(lambda: [_torch_line()])[0]),
        ("torch_rsdp", f"{__version__} ({Path(__file__).resolve().parent})"),
        ("UCX", _probe(lambda: [_ucx_version()])[0]),
    ]
    try:
        rows += _libraries()
    except Exception as e:  # noqa: BLE001 - as _probe, but the rows are pairs
        rows.append(("trainer libraries", _unavailable(e)))
    return _table(rows)


# ----------------------------------------------------------------------------- transports
def _shm() -> List[str]:
    st = os.statvfs("/dev/shm")
    size, free = st.f_frsize * st.f_blocks, st.f_frsize * st.f_bavail
    return [f"/dev/shm: {_gib(size)}, {_gib(free)} free (CPU tensors inside a node: each "
            f"group takes RSDP_SHM_BYTES per rank from it at init)"]


def _ucx_transports() -> List[str]:
    if not shutil.which("ucx_info"):
        return ["unavailable: ucx_info not found; install UCX's tools (Debian: ucx-utils) and "
                "run `ucx_info -d`, or run with RSDP_DEBUG=1 to print each group's UCX "
                "connections"]
    out = subprocess.run(["ucx_info", "-d"], capture_output=True, text=True, timeout=10)
    names = sorted(set(re.findall(r"^#\s*Transport:\s*(\S+)", out.stdout, re.M)))
    if not names:
        return [f"unavailable: `ucx_info -d` listed no transports (exit {out.returncode})"]
    tls = os.environ.get("UCX_TLS")
    return [f"transports (ucx_info -d): {', '.join(names)}"
            + (f"; UCX_TLS={tls} restricts them" if tls else "")]


def _cuda() -> List[str]:
    built = build_info().get("cuda")
    if not torch.version.cuda:
        return ["unavailable: torch is built without CUDA; CUDA tensors cannot be used"]
    if not torch.cuda.is_available():
        return [f"unavailable: torch {torch.__version__} sees no GPU "
                f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})"]
    n = torch.cuda.device_count()
    lines = [f"{n} GPU(s); torch_rsdp built "
             + ("with CUDA: CUDA tensors go over NCCL / CUDA IPC" if built else
                "WITHOUT CUDA: CUDA tensors are refused (rebuild where nvcc is installed)")]
    lines += [f"cuda:{i}: {torch.cuda.get_device_name(i)}" for i in range(n)]
    if n == 1:
        lines.append("one GPU: ranks sharing it use CUDA IPC (NCCL refuses two ranks on a GPU)")
    for i in range(n):
        peers = [f"{j} {'yes' if torch.cuda.can_device_access_peer(i, j) else 'NO'}"
                 for j in range(n) if j != i]
        if peers:
            lines.append(f"peer access from cuda:{i}: " + ", ".join(peers))
    return lines


def _transports() -> List[str]:
    rows = []
    for name, probe in (("shared memory", _shm), ("UCX", _ucx_transports), ("CUDA", _cuda)):
        lines = _probe(probe)
        rows += [(name, lines[0])] + [("", ln) for ln in lines[1:]]
    return _table(rows)


def _limits() -> List[str]:
    def show(v: int, unit: str) -> str:
        if v == resource.RLIM_INFINITY:
            return "unlimited"
        return f"{v / 2**20:g} MiB" if unit == "bytes" else str(v)
    rows = []
    for name, which, unit in (("open files", resource.RLIMIT_NOFILE, "files"),
                              ("locked memory", resource.RLIMIT_MEMLOCK, "bytes")):
        soft, hard = resource.getrlimit(which)
        rows.append((name, f"{show(soft, unit)} (hard {show(hard, unit)})"))
    return _table(rows)


# ----------------------------------------------------------------------------- environment
def _environment() -> List[str]:
    names = sorted(k for k in os.environ if k.startswith(ENV_PREFIXES)) + \
        [k for k in ENV_NAMES if k in os.environ]
    if not names:
        return ["  (none set of RSDP_*, TORCH_RSDP_*, UCX_*, NCCL_*, " + ", ".join(ENV_NAMES)
                + ")"]
    return [f"  {k}={os.environ[k]}" for k in names]


def _backends() -> List[str]:
    rows = []
    for name in ("gloo", "nccl", "mpi", "ucc"):
        fn = getattr(dist, f"is_{name}_available", None)
        rows.append((name, "available" if fn and fn() else "not available"))
    devices = dist.Backend.backend_capability.get("rsdp")
    rows.append(("rsdp", f"registered for {', '.join(devices)} tensors" if devices
                 else "NOT registered"))
    return _table(rows)


def report() -> str:
    """The whole report, as text."""
    sections = [
        ("versions", _versions),
        ("build_info()", lambda: _table([(k, repr(v)) for k, v in build_info().items()])),
        ("transports", _transports),
        ("limits", _limits),
        ("environment", _environment),
        ("torch.distributed backends", _backends),
    ]
    out = ["torch_rsdp report (python -m torch_rsdp; paste all of it into a bug report;",
           "`python -m torch_rsdp --check 2` runs every collective on 2 local ranks)"]
    for title, fn in sections:
        out += ["", f"== {title}"] + _probe(fn)
    return "\n".join(out)

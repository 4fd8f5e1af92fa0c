"""Builds and runs the standalone C++ test of the UCX network transport (rsdp::NetComm).

tests/native/test_net_comm.cpp forks 3 ranks that meet through a directory of files and checks ring
exchanges of 0 B .. 8 MiB, descriptor and size mismatches, timeouts, abort, point-to-point with
any source and tags, a peer that exits, traffic counters, and that no fd or thread is left after
a comm is destroyed. It needs neither torch nor the built extension, only g++ and UCX
(pkg-config ucx, or UCX_HOME). Its last output line is "N passed, M failed".

It runs twice: with UCX_TLS=tcp (the network path, over loopback) and with UCX's own transport
choice (shared memory between the ranks). UCX_NET_DEVICES defaults to "lo" here: UCX otherwise
uses every network interface it finds, and on a shared machine an interface that another job
creates and removes mid-run (e.g. a bridge of a multi-node simulation) silently kills the
connections on it.
"""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.native import sanitizer_flags

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ["tests/native/test_net_comm.cpp", "csrc/core/group.cpp", "csrc/core/op_desc.cpp",
           "csrc/core/error.cpp", "csrc/core/options.cpp", "csrc/core/test_hooks.cpp",
           "csrc/core/notice.cpp", "csrc/core/store_records.cpp"] + sorted(
    str(p.relative_to(ROOT)) for p in (ROOT / "csrc" / "transport" / "ucx").glob("*.cpp"))


def _ucx_flags():
    home = os.environ.get("UCX_HOME")
    if home:
        return [f"-I{home}/include"], [f"-L{home}/lib", f"-Wl,-rpath,{home}/lib", "-lucp", "-luct",
                                       "-lucs"]
    if shutil.which("pkg-config") is None:
        return None
    r = subprocess.run(["pkg-config", "--cflags", "--libs", "ucx"], capture_output=True, text=True)
    if r.returncode != 0:
        return None
    flags = r.stdout.split()
    return [f for f in flags if f.startswith("-I")], [f for f in flags if not f.startswith("-I")]


@pytest.fixture(scope="module")
def net_comm_exe(tmp_path_factory):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.fail("g++ is not on PATH; cannot build tests/native/test_net_comm.cpp")
    flags = _ucx_flags()
    if flags is None:
        pytest.fail("UCX not found (install libucx-dev or set UCX_HOME)")
    cflags, libs = flags
    exe = tmp_path_factory.mktemp("net_comm") / "test_net_comm"
    cmd = ([gxx, "-O1", *sanitizer_flags(), "-std=c++17", "-I", str(ROOT / "csrc")] + cflags +
           [str(ROOT / s) for s in SOURCES] + ["-o", str(exe)] + libs + ["-lpthread"])
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, f"{' '.join(cmd)}\nfailed:\n{build.stderr[-8000:]}"
    return exe


@pytest.mark.parametrize("tls", ["tcp", None], ids=["UCX_TLS=tcp", "UCX_TLS-unset"])
def test_net_comm_cpp(net_comm_exe, tls):
    env = dict(os.environ)
    env.pop("UCX_TLS", None)
    if tls:
        env["UCX_TLS"] = tls
    env.setdefault("UCX_NET_DEVICES", "lo")
    # The send-timeout case needs a send that waits for its receiver (rendezvous); over
    # TCP alone the backend would otherwise send every size eagerly (ucx_worker.cpp).
    env["UCX_RNDV_THRESH"] = "auto"
    # The binary kills its ranks after 55 s; this is only the last line of defence.
    run = subprocess.run([str(net_comm_exe)], capture_output=True, text=True, timeout=90, env=env)
    output = run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, output[-8000:]
    assert lines and lines[-1].endswith(" 0 failed"), output[-8000:]

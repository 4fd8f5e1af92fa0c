"""scripts/run_cuda_checks.sh, without a GPU: it parses, installs nothing, plans within its
limits, and stops cleanly where torch has no CUDA.

The GPU machine has no network, so the script must not reach for apt, pip or setup.sh (which
installs what is missing): checked in its text (and check_import.py's, which it runs) and, with
shims named apt-get, apt, pip, pip3, curl and wget first on PATH that note any call, in a dry
run (``DRY_RUN=1``: every stage recorded, nothing run) and in a run that stops at the CUDA torch
check. The dry run also shows the output contract: summary.txt plus one log per stage, at most
8 files, and stage limits that add up to at most 460 s (the run must end within 8 minutes).
"""
from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "run_cuda_checks.sh"
NETWORK_TOOLS = ("apt-get", "apt", "pip", "pip3", "curl", "wget")
# Commands, not words in messages ("run scripts/vendor_ucx.sh where apt works" is fine).
FORBIDDEN = re.compile(r"\bapt(-get)? +(install|update|download)\b|\bpip3? +(install|download)\b"
                       r"|-m +pip\b|scripts/setup\.sh|\bcurl\b|\bwget\b")
STAGES = ["build", "import", "sources", "ws1", "ws2-4", "rest", "bench"]


def _code_lines(path: Path):
    for n, line in enumerate(path.read_text().splitlines(), 1):
        code = line.split("#", 1)[0] if path.suffix == ".sh" else line
        yield n, code


def _run(tmp_path: Path, **env):
    shims = tmp_path / "shims"
    shims.mkdir()
    calls = tmp_path / "network-calls.txt"
    for tool in NETWORK_TOOLS:
        shim = shims / tool
        shim.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{calls}"\nexit 1\n')
        shim.chmod(0o755)
    out = tmp_path / "out"
    full_env = dict(os.environ, OUT=str(out), PATH=f"{shims}:{os.environ['PATH']}", **env)
    p = subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=full_env, capture_output=True,
                       text=True, timeout=120)
    return p, out, (calls.read_text() if calls.exists() else "")


def test_script_parses():
    p = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("path", [SCRIPT, ROOT / "scripts" / "check_import.py"],
                         ids=lambda p: p.name)
def test_no_install_commands(path):
    bad = [f"{path.name}:{n}: {code.strip()}" for n, code in _code_lines(path)
           if FORBIDDEN.search(code)]
    assert not bad, "the GPU machine has no network:\n" + "\n".join(bad)


def test_dry_run_plans_every_stage_within_the_limits(tmp_path):
    p, out, calls = _run(tmp_path, DRY_RUN="1")
    assert p.returncode == 0, p.stdout + p.stderr
    assert calls == ""
    files = sorted(f.name for f in out.iterdir())
    assert "summary.txt" in files and len(files) <= 8, files
    summary = (out / "summary.txt").read_text()
    table = [line.split()[0] for line in summary.splitlines() if re.match(r"\S+ +\d+ +\d+ +ok", line)]
    emulated = (ROOT / "tests" / "cuda" / "test_emulated_device.py").exists()
    assert table == STAGES + ["emulated"] * emulated, summary
    limits = re.search(r"^limits \(s\): (.*); total (\d+)$", summary, re.M)
    stage_sum = sum(int(n) for n in re.findall(r" (\d+)", " " + limits.group(1)))
    assert stage_sum <= 460 and int(limits.group(2)) <= 460, limits.group(0)
    # pytest is stopped with SIGINT (the failures so far still print), every stage has a limit.
    assert "timeout -s INT" in SCRIPT.read_text()
    assert all("would run (timeout " in (out / f).read_text() for f in files if f != "summary.txt")


@pytest.mark.skipif(__import__("torch").version.cuda is not None, reason="torch has CUDA here")
def test_without_cuda_torch_stops_with_a_message(tmp_path):
    p, out, calls = _run(tmp_path)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "has no CUDA" in p.stderr and "has no CUDA" in (out / "summary.txt").read_text()
    assert sorted(f.name for f in out.iterdir()) == ["summary.txt"]
    assert calls == ""

"""Builds and runs a standalone C++ test of tests/native/ (g++ against csrc/, nothing else):
its last output line must be "N passed, 0 failed" (tests/native/check.h) and its exit code 0."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


#: RSDP_NATIVE_SANITIZE (scripts/run_sanitized.sh sets it) -> the sanitizers to build with.
SANITIZERS = {"address": "address,undefined", "thread": "thread"}


def sanitizer_flags() -> list:
    """The compiler flags that build a native test under the sanitizer RSDP_NATIVE_SANITIZE
    names (none when it is unset): the same sanitizers the extension is built with there."""
    which = os.environ.get("RSDP_NATIVE_SANITIZE", "")
    if not which:
        return []
    if which not in SANITIZERS:
        pytest.fail(f"RSDP_NATIVE_SANITIZE={which!r}: expected one of {', '.join(SANITIZERS)}")
    flags = ["-g", "-fno-omit-frame-pointer", f"-fsanitize={SANITIZERS[which]}"]
    return flags + (["-fno-sanitize-recover=undefined"] if which == "address" else [])


def build_and_run(name: str, tmp_path: Path, *, sources=(), flags=("-O1",),
                  build_timeout: float = 300, run_timeout: float = 60) -> str:
    """Compiles tests/native/<name>.cpp with the csrc/ ``sources`` and runs it; returns its
    output."""
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.fail(f"g++ is not on PATH; cannot build tests/native/{name}.cpp")
    exe = tmp_path / name
    cmd = [gxx, *flags, *sanitizer_flags(), "-std=c++17", "-I", str(ROOT / "csrc"),
           str(ROOT / "tests" / "native" / f"{name}.cpp"),
           *(str(ROOT / "csrc" / s) for s in sources), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=build_timeout)
    assert build.returncode == 0, f"{' '.join(cmd)}\nfailed:\n{build.stderr[-8000:]}"
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=run_timeout)
    output = run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, output[-8000:]
    assert lines and lines[-1].endswith(" 0 failed"), output[-8000:]
    return output

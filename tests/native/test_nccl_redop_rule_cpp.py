"""Builds and runs the standalone C++ test of the NCCL reduction rule.

tests/native/test_nccl_redop_rule.cpp checks rsdp::nccl_redop_for
(csrc/transport/nccl/nccl_redop_rule.h): AVG on a one-rank communicator goes to NCCL as SUM
(NCCL up to 2.29.6 leaves a tail of the output unwritten for ncclAvg on one rank,
NVIDIA/nccl#1950), AVG on two or more ranks stays AVG, and no other operator changes. It needs
neither NCCL, CUDA, torch nor the built extension, only g++. Its last output line is
"N passed, M failed"; the exit code is non-zero on any failure.
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_nccl_redop_rule_cpp(tmp_path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.fail("g++ is not on PATH; cannot build tests/native/test_nccl_redop_rule.cpp")
    exe = tmp_path / "test_nccl_redop_rule"
    cmd = [gxx, "-O1", "-std=c++17", "-Wall", "-Werror", "-I", str(ROOT / "csrc"),
           str(ROOT / "tests" / "native" / "test_nccl_redop_rule.cpp"), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, f"{' '.join(cmd)}\nfailed:\n{build.stderr[-8000:]}"

    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    output = run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, output[-8000:]
    assert lines and lines[-1].endswith(" 0 failed"), output[-8000:]

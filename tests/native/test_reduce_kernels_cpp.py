"""Builds and runs the standalone C++ test of the reduction kernels.

tests/native/test_reduce_kernels.cpp checks rsdp::reduce_n (csrc/core/reduce_kernels.cpp) and the
fp16/bf16 conversions against scalar reference models; it needs neither torch nor the built
extension, only g++. Its last output line is "N passed, M failed"; the exit code is non-zero on
any failure. (Run the binary with --bench for a memory-bandwidth micro-benchmark.)
"""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # compiling the multiversioned kernels takes ~20-60 s
def test_reduce_kernels_cpp(tmp_path):
    gxx = shutil.which("g++")
    if gxx is None:
        pytest.fail("g++ is not on PATH; cannot build tests/native/test_reduce_kernels.cpp")
    exe = tmp_path / "test_reduce_kernels"
    cmd = [gxx, "-O2", "-std=c++17", "-I", str(ROOT / "csrc"),
           str(ROOT / "tests" / "native" / "test_reduce_kernels.cpp"),
           str(ROOT / "csrc" / "core" / "reduce_kernels.cpp"), "-o", str(exe)]
    build = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    assert build.returncode == 0, f"{' '.join(cmd)}\nfailed:\n{build.stderr[-8000:]}"

    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=900)
    output = run.stdout + run.stderr
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0, output[-8000:]
    assert lines and lines[-1].endswith(" 0 failed"), output[-8000:]

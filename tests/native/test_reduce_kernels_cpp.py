"""Builds and runs the standalone C++ test of the reduction kernels.

tests/native/test_reduce_kernels.cpp checks rsdp::reduce_n (csrc/core/reduce_kernels.cpp) and the
fp16/bf16 conversions against scalar reference models; it needs neither torch nor the built
extension, only g++. Its last output line is "N passed, M failed"; the exit code is non-zero on
any failure. (Run the binary with --bench for a memory-bandwidth micro-benchmark.)
"""

import pytest

from support.native import build_and_run


@pytest.mark.slow  # compiling the multiversioned kernels takes ~20-60 s
def test_reduce_kernels_cpp(tmp_path):
    build_and_run("test_reduce_kernels", tmp_path, sources=("core/reduce_kernels.cpp",),
                  flags=("-O2",), build_timeout=1800, run_timeout=900)

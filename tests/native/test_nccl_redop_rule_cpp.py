"""Builds and runs the standalone C++ test of the NCCL reduction rule.

tests/native/test_nccl_redop_rule.cpp checks rsdp::nccl_redop_for
(csrc/transport/nccl/nccl_redop_rule.h): AVG on a one-rank communicator goes to NCCL as SUM
(NCCL up to 2.29.6 leaves a tail of the output unwritten for ncclAvg on one rank,
NVIDIA/nccl#1950), AVG on two or more ranks stays AVG, and no other operator changes. It needs
neither NCCL, CUDA, torch nor the built extension, only g++. Its last output line is
"N passed, M failed"; the exit code is non-zero on any failure.
"""

from support.native import build_and_run


def test_nccl_redop_rule_cpp(tmp_path):
    build_and_run("test_nccl_redop_rule", tmp_path, flags=("-O1", "-Wall", "-Werror"))

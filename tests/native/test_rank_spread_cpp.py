"""Builds and runs tests/native/test_rank_spread.cpp: which rank of a node moves to which CPU
when the kernel stacked more ranks on one CPU than an even spread puts there
(csrc/transport/shm/rank_spread.cpp): only ranks beyond a CPU's share, each to a different
free slot, never on a partial picture or out of its mask; groups over overlapping ranks, each
spreading its own, settle from every stacking instead of trading ranks back and forth. Needs
only g++."""

from support.native import build_and_run


def test_rank_spread_cpp(tmp_path):
    build_and_run("test_rank_spread", tmp_path, sources=["transport/shm/rank_spread.cpp"])

"""Builds and runs tests/native/test_select.cpp: the automatic choice of the cross-node
all-reduce (csrc/algorithms/select.cpp) against the alpha-beta model of select.h, the ring or
recursive halving + doubling on the rails by size and node count, and the forced names. Needs
only g++ (select.cpp with the core sources it names; the algorithms' entry points stubbed)."""

from support.native import build_and_run


def test_select_cpp(tmp_path):
    build_and_run("test_select", tmp_path,
                  sources=("algorithms/select.cpp", "core/topology.cpp", "core/options.cpp",
                           "core/error.cpp", "core/test_hooks.cpp", "core/op_desc.cpp"))

"""Builds and runs tests/native/test_slow_watch.cpp: when group rank 0 counts its collectives as
slowed and asks for an early hand-off probe (csrc/transport/shm/slow_watch.cpp): kSlow of the
last kWindow at kFactor times the median of the first kWarm of their kind and size (a slowdown
that dips now and then included), never on noise below that, never against another kind or size, and not again after a probe made the slow time the
new normal. Needs only g++."""

from support.native import build_and_run


def test_slow_watch_cpp(tmp_path):
    build_and_run("test_slow_watch", tmp_path, sources=["transport/shm/slow_watch.cpp"])

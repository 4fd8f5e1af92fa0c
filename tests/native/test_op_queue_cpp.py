"""Builds and runs tests/native/test_op_queue.cpp: a process group's op queue, with threads that
wait by running queued tasks themselves (csrc/backend/op_queue.cpp, OpQueue::help): every task
runs once, in push order, one at a time, on whichever thread; help() is true only once its
task ran; stop(false) cancels the rest. Needs only g++; CI runs it under ThreadSanitizer too."""

from support.native import build_and_run


def test_op_queue_cpp(tmp_path):
    build_and_run("test_op_queue", tmp_path, sources=["backend/op_queue.cpp"],
                  flags=("-O1", "-pthread"))

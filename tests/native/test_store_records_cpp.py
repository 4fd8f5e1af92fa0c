"""Builds and runs tests/native/test_store_records.cpp: the records ranks leave for each other in
the store and the shared-memory segment header (csrc/core/store_records.cpp) round-trip, and
every malformed one (truncated, another version's or job's, another rank's, out of range) is
refused with an error naming the key, the writer and the fault. Needs only g++."""

from support.native import build_and_run


def test_store_records_cpp(tmp_path):
    build_and_run("test_store_records", tmp_path, sources=["core/store_records.cpp"])

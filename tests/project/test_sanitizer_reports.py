"""scripts/sanitizers/sanitizer_reports.py, the judge of a sanitized run, over planted logs:
an error of any sanitizer fails the run; a leak fails it only when its allocation passed
through our code (Python's, torch's and the compilers' leaks are theirs); an indirect leak is
judged with its direct one; an empty folder is clean."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "sanitizer_reports", ROOT / "scripts" / "sanitizers" / "sanitizer_reports.py")
reports = importlib.util.module_from_spec(spec)
spec.loader.exec_module(reports)

PYTHON_LEAK = """=================================================================
==4242==ERROR: LeakSanitizer: detected memory leaks

Direct leak of 952 byte(s) in 17 object(s) allocated from:
    #0 0x7f776a0b89cf in __interceptor_malloc asan_malloc_linux.cpp:69
    #1 0x7f7769cbcd74 in gc_alloc Modules/gcmodule.c:2283

Indirect leak of 64 byte(s) in 1 object(s) allocated from:
    #0 0x7f776a0b89cf in operator new(unsigned long) asan_new_delete.cpp:95
    #1 0x7f7769cbcd74 in rsdp::Group::key() /work/main/csrc/core/group.cpp:20

SUMMARY: AddressSanitizer: 1016 byte(s) leaked in 18 allocation(s).
"""
OUR_LEAK = PYTHON_LEAK.replace("gc_alloc Modules/gcmodule.c:2283",
                               "rsdp::ShmPool::ShmPool() /work/main/csrc/transport/shm/"
                               "shm_pool.cpp:31")
OOB = """==77==ERROR: AddressSanitizer: heap-buffer-overflow on address 0x6020 at pc 0x7f
WRITE of size 8 at 0x6020 thread T0
    #0 0x7f in __interceptor_memcpy
    #1 0x7f in rsdp::ucx_wire::check_header /work/main/csrc/transport/ucx/ucx_wire.cpp:40
"""
UB = ("/work/main/csrc/core/options.cpp:52:17: runtime error: signed integer overflow: "
      "9223372036854775807 + 1 cannot be represented in type 'long int'\n")
RUNTIME = ('AddressSanitizer: CHECK failed: asan_interceptors.cpp:320 '
           '"((__interception::real___cxa_throw)) != (0)" (0x0, 0x0) (tid=16397)\n')
RACE = """==================
WARNING: ThreadSanitizer: data race (pid=123)
  Write of size 8 at 0x7b04 by thread T1:
    #0 rsdp::UcxP2P::run() /work/main/csrc/transport/ucx/ucx_p2p.cpp:140
"""


def _judge(tmp_path, **files):
    for name, text in files.items():
        (tmp_path / f"report.{name}").write_text(text)
    return reports.main(["sanitizer_reports.py", str(tmp_path)])


def test_leaks_of_other_code_are_ignored(tmp_path, capsys):
    assert _judge(tmp_path, **{"1": PYTHON_LEAK}) == 0
    out = capsys.readouterr().out
    assert "clean: 0 report(s)" in out and "2 leak(s) of other code" in out, out


def test_a_leak_through_our_code_fails(tmp_path, capsys):
    assert _judge(tmp_path, **{"1": PYTHON_LEAK, "2": OUR_LEAK}) == 1
    out = capsys.readouterr().out
    assert "shm_pool.cpp:31" in out and "report.2" in out and "FAILED: 1 report(s)" in out, out


def test_every_sanitizer_error_fails(tmp_path, capsys):
    for i, text in enumerate([OOB, UB, RACE, RUNTIME]):
        folder = tmp_path / str(i)
        folder.mkdir()
        assert _judge(folder, **{"9": text}) == 1, text
        assert text.splitlines()[-1].strip() in capsys.readouterr().out


def test_no_reports_is_clean(tmp_path):
    assert _judge(tmp_path) == 0
    assert reports.main(["sanitizer_reports.py", str(tmp_path / "missing")]) == 0

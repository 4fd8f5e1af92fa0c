"""``python -m torch_rsdp`` (the report a user pastes into a bug) and ``--check N`` (every
collective once on N local ranks, rsdp and gloo), each run as a user runs it: a subprocess.

The report must add little to the import it needs and hold every section; a probe that raises
prints "unavailable" instead of ending it. ``--check 2`` must pass every op on both backends,
and a failure planted with ``RSDP_TEST_SELFCHECK_PLANT`` (a wrong result, a rank that exits, a rank
that hangs) must be named by op, backend and rank, with a non-zero exit code. About a minute
and a half on the 2-core machine, most of it the four ``--check`` launches.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import torch

import torch_rsdp
from torch_rsdp import _env_report as _report, _selfcheck

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, timeout: float = 120, **env: str):
    """(exit code, stdout + stderr, seconds) of ``python <args>`` from the source tree."""
    full = {k: v for k, v in os.environ.items() if k != _selfcheck.PLANT_ENV}
    full.update(env, PYTHONPATH=os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, *args], cwd=ROOT, env=full, capture_output=True,
                         text=True, timeout=timeout)
    return out.returncode, out.stdout + out.stderr, time.monotonic() - t0


def test_report_holds_every_section_and_costs_little_beyond_the_import():
    code, _, import_s = _run("-c", "import torch_rsdp")
    assert code == 0
    code, out, report_s = _run("-m", "torch_rsdp")
    print(out)
    print(f"import torch_rsdp {import_s:.1f} s, python -m torch_rsdp {report_s:.1f} s")
    assert code == 0, out
    # a loaded machine may take seconds to import torch_rsdp; the report itself must add little
    assert report_s < import_s + 5 and report_s < 30, (import_s, report_s)
    assert torch.__version__ in out and torch_rsdp.__version__ in out
    for key in torch_rsdp.build_info():
        assert re.search(rf"^\s+{key}\s", out, re.M), f"build_info key {key} missing"
    assert "/dev/shm:" in out and "GiB free" in out
    for lib in [lib.name for lib in torch_rsdp.integrations.status().libraries] + ["torchft"]:
        assert re.search(rf"^\s+{lib}\s+\S", out, re.M), f"library {lib} missing"
    for section in ("versions", "build_info()", "transports", "limits", "environment",
                    "torch.distributed backends"):
        assert f"== {section}\n" in out
    assert re.search(r"^\s+UCX\s+\d+\.\d+", out, re.M), "UCX version missing"
    assert re.search(r"^\s+rsdp\s+registered for cpu", out, re.M)
    assert "Traceback" not in out


def test_report_shows_set_variables_and_survives_a_failing_probe(monkeypatch):
    monkeypatch.setenv("RSDP_SHM_BYTES", "65536")
    monkeypatch.setenv("MASTER_PORT", "29511")

    def broken(path):
        raise OSError(f"planted: no {path}")
    monkeypatch.setattr(_report.os, "statvfs", broken)
    monkeypatch.setattr(_report, "integration_status", lambda: broken("status"))
    text = _report.report()
    assert re.search(r"^\s+shared memory\s+unavailable: OSError: planted: no /dev/shm$",
                     text, re.M), text
    assert re.search(r"^\s+trainer libraries\s+unavailable: OSError: planted: no status$",
                     text, re.M), text
    assert "  RSDP_SHM_BYTES=65536\n" in text and "  MASTER_PORT=29511\n" in text
    assert text.rstrip().splitlines()[-1].strip().startswith("rsdp ")  # the rest is there


def test_the_cuda_section_names_each_gpu_and_each_pair(monkeypatch):
    """No GPU here: torch's CUDA queries are faked, to prove the lines a GPU machine prints."""
    monkeypatch.setattr(torch.version, "cuda", "12.8")
    monkeypatch.setattr(_report, "build_info", lambda: {"cuda": True})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"Fake GPU {i}")
    monkeypatch.setattr(torch.cuda, "can_device_access_peer", lambda i, j: (i, j) != (1, 0))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    lines = _report._cuda()
    assert lines[0].startswith("2 GPU(s); torch_rsdp built with CUDA"), lines
    assert lines[1:] == ["cuda:0: Fake GPU 0", "cuda:1: Fake GPU 1",
                         "peer access from cuda:0: 1 yes", "peer access from cuda:1: 0 NO"]
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert any("ranks sharing it use CUDA IPC" in ln for ln in _report._cuda())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert _report._cuda()[0].startswith("unavailable: torch ")


def _check(*extra: str, timeout: float = 150, **env: str):
    code, out, seconds = _run("-m", "torch_rsdp", "--check", "2", *extra, timeout=timeout,
                              **env)
    print(out)
    print(f"--check 2 {' '.join(extra)} {env}: exit {code} in {seconds:.1f} s")
    return code, out, seconds


def test_check_2_passes_every_op_on_both_backends():
    code, out, seconds = _check()
    assert code == 0, out
    assert seconds < 60, seconds
    for backend in _selfcheck.BACKENDS:
        for op in _selfcheck.OPS:
            m = re.search(rf"^pass\s+{backend}\s+cpu\s+{op}\s+(\S+) us\s+(\S+)", out, re.M)
            assert m, f"no pass line for {op} on {backend}:\n{out}"
            assert float(m.group(1)) > 0
            assert op == "barrier" or float(m.group(2)) > 0, m.group(0)
    assert "FAIL" not in out and "self-check passed" in out


def test_a_wrong_result_is_named_by_op_backend_and_rank():
    code, out, _ = _check(RSDP_TEST_SELFCHECK_PLANT="reduce_scatter:1")
    assert code == 1, out
    for backend in _selfcheck.BACKENDS:
        assert re.search(rf"^FAIL reduce_scatter on {backend} \(cpu\): rank 1: 8 B: element 0 "
                         rf"is \d+, expected \d+", out, re.M), out
        assert re.search(rf"^pass\s+{backend}\s+cpu\s+reduce_scatter_tensor\s", out, re.M)
    assert len(re.findall(r"^FAIL \S+ on ", out, re.M)) == 2, out  # nothing else failed
    assert "self-check FAILED" in out


def test_a_rank_that_exits_is_named_with_its_op():
    code, out, seconds = _check(RSDP_TEST_SELFCHECK_PLANT="all_gather:1:die")
    assert code == 1, out
    assert re.search(r"^FAIL rank 1 died: exited with code 3 during all_gather on rsdp \(cpu\)",
                     out, re.M), out
    assert re.search(r"^FAIL all_gather on rsdp \(cpu\): rank 0: .*rank 1", out, re.M), out
    assert re.search(r"^pass\s+rsdp\s+cpu\s+all_reduce\s", out, re.M)  # the ops before it ran
    assert seconds < 60, seconds


def test_a_rank_that_hangs_is_named_with_its_op_and_stopped_at_the_deadline():
    code, out, seconds = _check("--timeout", "12", RSDP_TEST_SELFCHECK_PLANT="barrier:1:hang")
    assert code == 1, out
    assert re.search(r"^FAIL rank 1 hung: no end within the 12 s deadline, killed during "
                     r"barrier on rsdp \(cpu\)", out, re.M), out
    assert seconds < 12 + 20, seconds  # the deadline, plus the launcher's own import

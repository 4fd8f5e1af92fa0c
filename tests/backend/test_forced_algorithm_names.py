"""``RSDP_ALGO_<OP>`` is checked against the algorithm table when a group starts
(``check_forced_algorithms``, csrc/algorithms/select.cpp): a name the op does not take stops
``init_process_group`` with the variable, the name and the op's choices; a name it takes runs.
One process, one rank; a few seconds.
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.harness import backend_under_test

SCRIPT = """
import sys, torch, torch.distributed as dist, torch_rsdp
dist.init_process_group("rsdp", init_method="file://" + sys.argv[1], rank=0, world_size=1)
t = torch.ones(5)
dist.all_reduce(t)
print("sum", float(t.sum()))
dist.destroy_process_group()
"""


def _run(tmp_path, **env):
    full = dict(os.environ, **env)
    return subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "store")],
                          capture_output=True, text=True, timeout=120, env=full)


@pytest.mark.skipif(backend_under_test() != "rsdp", reason="an rsdp variable")
def test_a_name_the_op_does_not_take_stops_init(tmp_path):
    proc = _run(tmp_path, RSDP_ALGO_ALLREDUCE="tree")  # broadcast's and reduce's, not all_reduce's
    assert proc.returncode != 0, proc.stdout
    assert "environment variable RSDP_ALGO_ALLREDUCE='tree' names no algorithm; choose one " \
           "of: auto " in proc.stderr, proc.stderr[-3000:]
    assert "oneshot" in proc.stderr and "rs_ag" in proc.stderr, proc.stderr[-3000:]


@pytest.mark.skipif(backend_under_test() != "rsdp", reason="an rsdp variable")
def test_a_name_the_op_takes_runs(tmp_path):
    proc = _run(tmp_path, RSDP_ALGO_ALLREDUCE="rs_ag", RSDP_ALGO_BROADCAST="auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "sum 5.0" in proc.stdout

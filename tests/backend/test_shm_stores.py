"""Both ways of writing the staging halves give exact results.

A group whose hand-off probe finds streaming stores clearly faster (csrc/transport/shm/
adaptation.h) streams its copies into the staging halves past the cache (`streaming`,
non-temporal stores and a fence), and its rs+ag all-reduce reduces in place and streams the
result; others keep plain copies (`cached`). Which one a launch gets depends on where the
machine placed its CPUs, so without this test the streaming path would run only in the
launches that happen to need it. Both are forced here (the test hook RSDP_TEST_SHM_STORES)
on every family that moves data through the halves,
at 2 ranks (each with a core on a 2-core machine), with the reduced dtype x op matrix, and
each group reports the setting it runs with (`topology()["handoff"]["stores"]`). The
streaming case is also in the sanitized selection (tests/sanitized_selection.txt).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.collective_families import FAMILIES, use_reduced_matrix
from support.harness import assert_family, launch, launch_families, run_families

STAGED = ("broadcast", "all_reduce", "reduce", "all_gather_into_tensor", "gather", "scatter",
          "reduce_scatter_tensor", "all_to_all_single", "noncontiguous")
_RESULTS: dict[str, tuple] = {}


def _stores_worker(ctx, setting, names):
    import torch_rsdp

    stores = torch_rsdp.topology()["handoff"]["stores"]
    if stores != setting:
        raise AssertionError(f"RSDP_TEST_SHM_STORES={setting} but the group runs with {stores!r}")
    use_reduced_matrix(ctx)
    return run_families(ctx, FAMILIES, names)


def _batch(setting):
    if setting not in _RESULTS:
        results, errors, _ = launch_families(
            lambda names: launch(_stores_worker, 2, (setting, names), deadline=240,
                                 pg_timeout=30, env={"RSDP_TEST_SHM_STORES": setting}),
            STAGED, 2)
        _RESULTS[setting] = (results, errors)
    return _RESULTS[setting]


@pytest.mark.parametrize("family", STAGED)
@pytest.mark.parametrize("setting", ["streaming", "cached"])
def test_staging_stores(setting, family):
    results, errors = _batch(setting)
    assert_family(results, errors, family, f"RSDP_TEST_SHM_STORES={setting}, 2 ranks")


@pytest.mark.parametrize("var,value,says", [
    ("RSDP_SHM_ADAPT", "always", "is none of its choices: off once continuous"),
    ("RSDP_SHM_ADAPT", "once continuous", "is none of its choices: off once continuous"),
    ("RSDP_TEST_SHM_STORES", "stream", "is none of its choices: cached streaming"),
])
def test_a_bad_setting_is_refused_naming_the_variable(var, value, says):
    """A value that is none of the choices fails init_process_group with a ValueError that
    names the variable, the value and the choices."""
    code = ("import os, torch.distributed as dist, torch_rsdp\n"
            "os.environ.update(MASTER_ADDR='127.0.0.1', MASTER_PORT='0')\n"
            "try:\n"
            "    dist.init_process_group('rsdp', rank=0, world_size=1, "
            "init_method='tcp://127.0.0.1:0')\n"
            "except ValueError as e:\n"
            "    print(e)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, var: value})
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"environment variable {var}='{value}'" in p.stdout and says in p.stdout, \
        p.stdout + p.stderr[-2000:]

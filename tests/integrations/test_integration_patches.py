"""The integrations refuse loudly outside what was tested (torch_rsdp/integrations/_patch_table.py):

* a method a release dropped, planted before ``import torch_rsdp`` (transformers' Trainer and
  Lightning's Strategy), and a transformers version outside the tested range: one warning
  each at import, ``status()`` naming the missing rows, and a sharded model refused at the
  Trainer's door (HF ``Trainer(model=...)``, Lightning's ``fit`` by the stock DDP strategy, and
  ``strategy="rsdp"`` itself) instead of saving rank 0's shards; an unsharded model is served;
* the versions ``scripts/setup.sh`` installs lie inside the tested ranges, and
  docs/integrations.md lists every row of the table.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))


def test_planted_missing_methods_refuse_sharded_models(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("lightning")
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, os.path.join(HERE, "planted_patch_worker.py"),
                           str(tmp_path / "store")], capture_output=True, text=True,
                          timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])

    # reported once each, at import: the version and its range, each missing method
    from torch_rsdp.integrations._patch_table import LIBRARIES

    lo, hi = LIBRARIES["transformers"].tested
    version = [w for w in got["warnings"] if "outside the versions" in w]
    assert len(version) == 1 and "transformers 9.1.0" in version[0] and \
        f"{lo} to {hi}" in version[0], got["warnings"]
    # Lightning's missing method is two rows: the DDP route's patch, RSDPStrategy's override
    for target in ("Trainer._save_optimizer_and_scheduler", "Strategy.optimizer_state",
                   "DDPStrategy.optimizer_state"):
        hits = [w for w in got["warnings"] if f"has no {target}" in w]
        assert len(hits) == 1, (target, got["warnings"])
    assert len(got["warnings"]) == 4, got["warnings"]
    assert got["missing"] == ["transformers: Trainer._save_optimizer_and_scheduler",
                              "lightning: Strategy.optimizer_state",
                              "lightning: DDPStrategy.optimizer_state"], got["missing"]
    assert "OUTSIDE the tested range" in got["status"], got["status"]

    # the sharded model is refused before it trains, naming the method and the consequence
    hf = got["hf_sharded"]
    assert hf and re.search(r"rank 0: transformers\.Trainer got a model sharded by torch_rsdp",
                            hf), hf
    assert "Trainer._save_optimizer_and_scheduler is missing" in hf and "optimizer.pt" in hf, hf
    assert got["hf_unsharded"] is None, got["hf_unsharded"]
    ddp = got["lightning_ddp_sharded"]
    assert ddp and "DDPStrategy.connect" in ddp and "Strategy.optimizer_state is missing" in ddp, ddp
    rsdp = got["lightning_rsdp"]
    assert rsdp and "RSDPStrategy" in rsdp and "DDPStrategy.optimizer_state is missing" in rsdp, rsdp


def test_tested_range_is_by_minor_version(monkeypatch):
    from torch_rsdp.integrations import _patch_table as patch_table
    from torch_rsdp.integrations._patching import in_tested_range

    monkeypatch.setitem(patch_table.LIBRARIES, "transformers", patch_table.Library(
        "transformers", "transformers", "transformers", ("4.57", "5.24")))
    assert in_tested_range("transformers", "4.57.0") and in_tested_range("transformers", "5.24.9")
    assert in_tested_range("transformers", "5.3.0.dev0") and in_tested_range("transformers", "4.100")
    assert not in_tested_range("transformers", "4.56.2")
    assert not in_tested_range("transformers", "5.25.0")
    assert not in_tested_range("transformers", "garbage")


def _pins():
    with open(os.path.join(ROOT, "scripts", "requirements-test.txt")) as f:
        lines = [ln.split("#")[0].strip() for ln in f]
    return dict(ln.split("==") for ln in lines if ln)


def test_setup_pins_lie_inside_the_tested_ranges():
    from torch_rsdp.integrations._patch_table import LIBRARIES
    from torch_rsdp.integrations._patching import in_tested_range

    pins = _pins()
    for lib in LIBRARIES.values():
        if lib.name == "pytorch_lightning":
            continue  # not installed by setup.sh; lightning's copy is what CI tests
        assert lib.dist in pins, f"scripts/requirements-test.txt does not pin {lib.dist}"
        assert in_tested_range(lib.name, pins[lib.dist]), (lib.dist, pins[lib.dist], lib.tested)


def test_docs_list_every_patched_method():
    from torch_rsdp.integrations._patch_table import PATCHES

    with open(os.path.join(ROOT, "docs", "integrations.md")) as f:
        doc = f.read()
    for row in PATCHES:
        assert f"`{row.target}`" in doc, f"docs/integrations.md does not list {row.target}"


def test_status_lists_every_library_and_torch_change():
    import torch_rsdp  # noqa: F401
    from torch_rsdp.integrations import status
    from torch_rsdp.integrations._patch_table import LIBRARIES, PATCHES

    st = status()
    assert [lib.name for lib in st.libraries] == list(LIBRARIES)
    assert sum(len(lib.rows) for lib in st.libraries) == len(PATCHES)
    assert {r.target for r in st.torch} == {"optim: global optimizer step pre-hook",
                                           "distributed.shrink_group"}
    text = str(st)
    assert "torch (global" in text and "transformers" in text

"""The integrations refuse loudly outside what was tested (torch_rsdp/integrations/_patch_table.py):

* a method a release dropped, planted before ``import torch_rsdp`` (transformers' Trainer and
  Lightning's Strategy), and a transformers version outside the tested range: one warning
  each at import, ``status()`` naming the missing rows, and a sharded model refused at the
  Trainer's door (HF ``Trainer(model=...)``, Lightning's ``fit`` by the stock DDP strategy, and
  ``strategy="rsdp"`` itself) instead of saving rank 0's shards; an unsharded model is served;
* a transformers whose ``Trainer`` methods moved into a base class (moved_methods_worker.py,
  2 ranks): no warning, and the stock Trainer trains and saves a sharded model exactly as with
  the unmoved Trainer; one that renamed ``save_model`` and has no ``Trainer.__init__`` to guard:
  the warnings name both, and the first training step refuses the sharded model on every rank
  before anything changed, while the same model in the user's own loop and an unsharded model
  under that Trainer train; ``wrap_method``'s lookup through the MRO on plain classes;
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
    assert got["hf_model_init"] == hf, got["hf_model_init"]
    assert got["hf_unsharded"] is None, got["hf_unsharded"]
    ddp = got["lightning_ddp_sharded"]
    assert ddp and "DDPStrategy.connect" in ddp and "Strategy.optimizer_state is missing" in ddp, ddp
    rsdp = got["lightning_rsdp"]
    assert rsdp and "RSDPStrategy" in rsdp and "DDPStrategy.optimizer_state is missing" in rsdp, rsdp


def test_wrap_method_finds_a_moved_method_and_patches_the_named_class():
    from torch_rsdp.integrations._patching import find_method, wrap_method

    calls = []

    def make(tag):
        def make_wrapper(original):
            def wrapper(self, *a):
                calls.append(tag)
                return original(self, *a)
            return wrapper
        return make_wrapper

    class Base:
        def __init__(self, x):
            self.x = x

        def save(self):
            return ("saved", self.x)

    class Named(Base):      # the class the table names: its methods moved into Base
        pass

    class Sibling(Base):    # another subclass of the base: not the table's
        pass

    assert find_method(Named, "save") == (Base, Base.__dict__["save"])
    assert find_method(type("Bare", (), {}), "__init__") == (None, None)  # object's is none
    assert wrap_method(Named, "save", make("named"))
    assert wrap_method(Named, "__init__", make("init"))
    assert not wrap_method(Named, "gone", make("gone"))
    assert Named(1).save() == ("saved", 1) and calls == ["init", "named"]
    calls.clear()
    assert Sibling(2).save() == ("saved", 2) and Base(3).save() == ("saved", 3) and calls == []
    assert "save" in Named.__dict__ and not getattr(Base.save, "_torch_rsdp_wrapped", False)
    # idempotent: a second pass keeps the wrapper it finds on the named class
    first = Named.__dict__["save"]
    assert wrap_method(Named, "save", make("again")) and Named.__dict__["save"] is first
    # a wrapper further up the MRO belongs to another row (on the base class itself): this
    # row's wrapper goes around it, both run
    assert wrap_method(Base, "save", make("base"))

    class Sub(Base):
        pass

    assert wrap_method(Sub, "save", make("sub"))
    calls.clear()
    assert Sub(4).save() == ("saved", 4) and calls == ["sub", "base"]


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


@pytest.fixture(scope="module")
def releases(tmp_path_factory):
    """The three releases of moved_methods_worker.py, each under torchrun at 2 ranks."""
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("releases")
    env = dict(os.environ, TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1",
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for release in ("stock", "moved", "removed"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
               "2", os.path.join(HERE, "moved_methods_worker.py"), str(out), release]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, (release, proc.stdout[-3000:] + proc.stderr[-6000:])
    return out


def _ranks(out, release):
    got = []
    for rank in (0, 1):
        with open(out / release / f"rank{rank}.json") as f:
            got.append(json.load(f))
    return got


def test_methods_moved_into_a_base_class_are_patched_where_they_are(releases):
    import torch
    import transformers as tf

    stock, moved = _ranks(releases, "stock")[0], _ranks(releases, "moved")
    for rank, got in enumerate(moved):
        # found in the base class, patched on the Trainer itself: nothing missing, no warning
        assert got["warnings"] == [] and got["missing"] == [] and not got["armed"], (rank, got)
        assert got["trainer_owns"] == ["__init__", "_clip_grad_norm", "save_model"], got
        # the same run as under the unmoved Trainer: every logged loss and gradient norm
        assert got["loss"] == stock["loss"] and got["grad_norm"] == stock["grad_norm"], \
            (rank, got["loss"], stock["loss"], got["grad_norm"], stock["grad_norm"])
        assert len(got["loss"]) == 6
    # save_model wrote the whole model (what the unmoved Trainer writes), and the checkpoint's
    # optimizer.pt is the whole optimizer state, keyed by parameter name (the patched path)
    model = tf.AutoModelForCausalLM.from_pretrained(releases / "moved" / "final")
    a = model.state_dict()
    b = tf.AutoModelForCausalLM.from_pretrained(releases / "stock" / "final").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    opt = torch.load(releases / "moved" / "checkpoint-3" / "optimizer.pt", weights_only=False)
    assert sorted(opt["state"]) == sorted(n for n, _ in model.named_parameters()), \
        list(opt["state"])[:3]


def test_a_door_that_cannot_be_guarded_refuses_at_the_first_step(releases):
    for rank, got in enumerate(_ranks(releases, "removed")):
        # the import names both methods; both rows are missing and the first-step door is armed
        for target in ("Trainer.__init__", "Trainer.save_model"):
            assert [w for w in got["warnings"] if f"has no {target}" in w], \
                (target, got["warnings"])
        assert len(got["warnings"]) == 2, got["warnings"]
        assert got["missing"] == ["transformers: Trainer.__init__",
                                  "transformers: Trainer.save_model"], got["missing"]
        assert got["armed"]
        refused = got["refused"]
        err = refused["error"]
        assert err and re.match(rf"rank {rank}: transformers\.Trainer \(its training step",
                                err), err
        assert re.search(r"transformers \d[\w.]*: Trainer\.save_model is missing", err), err
        assert "Trainer.__init__ is missing" in err and "rank 0's shards only" in err, err
        # refused before the forward ran: no gradient, no optimizer step, no weight changed
        assert refused["global_step"] == 0 and refused["grads"] == [], refused
        assert refused["optimizer_state"] == 0 and refused["changed"] == [], refused
        # outside the library, the same kind of model trains; an unsharded one under it too
        assert got["own_loop"]["changed"] > 0, got["own_loop"]
        assert got["unsharded"]["global_step"] == 1, got["unsharded"]

"""One torchrun rank of tests/integrations/test_moved_methods.py: a transformers release planted
before ``import torch_rsdp``, then the stock ``transformers.Trainer`` over a model sharded by
``plan.apply(model, "rotate")``.

    torchrun --nproc_per_node 2 tests/integrations/moved_methods_worker.py OUT RELEASE

``RELEASE`` is

* ``stock``: transformers as installed (the reference);
* ``moved``: ``transformers.Trainer`` is a subclass of a base class holding every method of the
  stock Trainer (as a release that splits the Trainer into a base and the public class would
  have it: same behaviour for callers, ``Trainer.__dict__`` empty);
* ``removed``: a release that renamed ``Trainer.save_model`` (to ``save``) and builds its
  Trainer in ``__new__`` (no ``Trainer.__init__`` anywhere but ``object``'s), so that neither
  the patch nor the ``__init__`` guard can be installed.

Writes ``OUT/RELEASE/rank{r}.json``: the torch_rsdp warnings at import, ``status().missing``,
and, for ``stock`` / ``moved``, the logged losses and gradient norms of a short run (gradient
accumulation, clipping, a mid-run checkpoint) and its ``save_model`` in ``OUT/RELEASE/final``;
for ``removed``, what the first training step did (the IntegrationError, the step count, whether
any parameter, gradient or optimizer state changed), and that the same sharded model trains in
the user's own loop and an unsharded one under the same Trainer.
"""
from __future__ import annotations

import json
import os
import sys
import warnings

import torch
import torch.distributed as dist

import transformers
import transformers.trainer

RELEASE = sys.argv[2]
Stock = transformers.trainer.Trainer

if RELEASE == "moved":
    Trainer = type("Trainer", (Stock,), {"__module__": "transformers.trainer",
                                         "__qualname__": "Trainer"})
    transformers.trainer.Trainer = transformers.Trainer = Trainer
    assert not [k for k in Trainer.__dict__ if not k.startswith("__") or k == "__init__"]
elif RELEASE == "removed":
    _init, _save = Stock.__dict__["__init__"], Stock.__dict__["save_model"]
    del Stock.__init__, Stock.save_model
    Stock.save = _save  # (the release's own callers keep the old name: nothing here saves)

    def __new__(cls, *args, **kwargs):
        self = object.__new__(cls)
        _init(self, *args, **kwargs)
        return self

    Stock.__new__ = staticmethod(__new__)
else:
    assert RELEASE == "stock", RELEASE

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch_rsdp  # noqa: F401  (patches what is imported already)
    from torch_rsdp import integrations

sys.path.insert(0, sys.path[0])  # this directory: the workers import each other by name
from trainer_hf_worker import SAVE_AT, Tokens, build, logged, trainer  # noqa: E402

from torch.distributed.tensor import DTensor  # noqa: E402


def _local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if isinstance(t, DTensor) else t).detach().clone()


def train_and_save(out: str) -> dict:
    tr = trainer(build("rotate"), out, bf16=False)
    tr.train()
    tr.save_model(os.path.join(out, "final"))
    return {"loss": logged(tr, "loss"), "grad_norm": logged(tr, "grad_norm"),
            "checkpoint": sorted(os.listdir(os.path.join(out, f"checkpoint-{SAVE_AT}")))}


def first_step_refused(out: str) -> dict:
    model = build("rotate")
    before = {k: _local(v) for k, v in model.state_dict().items()}
    tr = trainer(model, out, bf16=False)
    got = {}
    try:
        tr.train()
        got["error"] = None
    except integrations.IntegrationError as e:
        got["error"] = str(e)
    got["global_step"] = tr.state.global_step
    got["changed"] = [k for k, v in model.state_dict().items()
                      if not torch.equal(_local(v), before[k])]
    got["grads"] = [n for n, p in model.named_parameters() if p.grad is not None]
    opt = tr.optimizer
    while opt is not None and not isinstance(opt, torch.optim.Optimizer):
        opt = getattr(opt, "optimizer", None)  # accelerate's AcceleratedOptimizer
    got["optimizer_state"] = None if opt is None else len(opt.state)
    return got


def own_loop() -> dict:
    """The same sharded model in the user's own loop, with the broken transformers imported:
    not the Trainer's step, not refused."""
    model = build("rotate")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    before = {k: _local(v) for k, v in model.state_dict().items()}
    batch = torch.utils.data.default_collate([Tokens()[i] for i in range(2)])
    model.train()
    for _ in range(2):
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()
    return {"changed": sum(not torch.equal(_local(v), before[k])
                           for k, v in model.state_dict().items())}


def unsharded_under_the_broken_trainer(out: str) -> dict:
    args = transformers.TrainingArguments(output_dir=out, per_device_train_batch_size=2,
                                          max_steps=1, save_strategy="no", report_to=[],
                                          use_cpu=True, disable_tqdm=True)
    tr = transformers.Trainer(model=build("none"), args=args, train_dataset=Tokens())
    tr.train()
    return {"global_step": tr.state.global_step}


def main() -> None:
    root = os.path.join(sys.argv[1], RELEASE)
    dist.init_process_group("rsdp")
    try:
        from torch_rsdp.integrations._first_step import armed

        out = {"warnings": [str(w.message) for w in caught
                            if issubclass(w.category, integrations.IntegrationWarning)],
               "missing": list(integrations.status().missing), "armed": armed(),
               "trainer_owns": sorted(k for k in transformers.Trainer.__dict__
                                      if k in ("__init__", "save_model", "_clip_grad_norm"))}
        if RELEASE == "removed":
            out["refused"] = first_step_refused(os.path.join(root, "refused"))
            out["own_loop"] = own_loop()
            out["unsharded"] = unsharded_under_the_broken_trainer(os.path.join(root, "none"))
        else:
            out.update(train_and_save(root))
        os.makedirs(root, exist_ok=True)
        with open(os.path.join(root, f"rank{dist.get_rank()}.json"), "w") as f:
            json.dump(out, f)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

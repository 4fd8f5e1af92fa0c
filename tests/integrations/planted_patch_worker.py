"""A process of tests/integrations/test_integration_patches.py: a release of transformers and
one of Lightning that each dropped a method torch_rsdp patches, planted before
``import torch_rsdp``, and a transformers version outside the tested range; then a sharded
model taken to both, and an unsharded one. Prints one JSON line of what happened.

    python tests/integrations/planted_patch_worker.py STORE_FILE
"""
from __future__ import annotations

import json
import sys
import warnings

import torch
import torch.distributed as dist

import transformers
import transformers.trainer
import lightning as L
from lightning.pytorch.strategies.strategy import Strategy

# A transformers release that renamed the method writing optimizer.pt, and is newer than any
# tested; a Lightning release without Strategy.optimizer_state.
del transformers.trainer.Trainer._save_optimizer_and_scheduler
transformers.__version__ = "9.1.0"
del Strategy.optimizer_state

with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch_rsdp  # noqa: F401  (patches what is imported already)
    from torch_rsdp import integrations
    from torch_rsdp.integrations._patch_table import PATCHES
    from torch_rsdp.integrations._patching import apply_rows
    # a second pass over the same module (a re-import) reports nothing again
    apply_rows([r for r in PATCHES if r.module == "trainer" and r.library == "transformers"],
               transformers.trainer)

sys.path.insert(0, sys.path[0])  # this directory: the workers import each other by name
from trainer_hf_worker import Tokens, build  # noqa: E402
from trainer_lightning_worker import LitLM  # noqa: E402

dist.init_process_group("rsdp", init_method=f"file://{sys.argv[1]}", rank=0, world_size=1)
out = {"warnings": [str(w.message) for w in caught
                    if issubclass(w.category, integrations.IntegrationWarning)],
       "missing": list(integrations.status().missing), "status": str(integrations.status())}


def attempt(fn):
    try:
        fn()
        return None
    except integrations.IntegrationError as e:
        return str(e)


args = transformers.TrainingArguments(output_dir=sys.argv[1] + ".out", report_to=[], use_cpu=True,
                                      max_steps=1)
out["hf_sharded"] = attempt(lambda: transformers.Trainer(model=build("rotate"), args=args,
                                                         train_dataset=Tokens()))
# a model the Trainer builds itself (model_init) comes in past the model= check: refused too
out["hf_model_init"] = attempt(lambda: transformers.Trainer(
    model_init=lambda: build("rotate"), args=args, train_dataset=Tokens()))
out["hf_unsharded"] = attempt(lambda: transformers.Trainer(model=build("none"), args=args,
                                                           train_dataset=Tokens()))


def fit(model, strategy):
    trainer = L.Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=1,
                        logger=False, enable_progress_bar=False, enable_model_summary=False,
                        enable_checkpointing=False)
    trainer.fit(LitLM(model), torch.utils.data.DataLoader(Tokens(4), batch_size=2))


out["lightning_ddp_sharded"] = attempt(lambda: fit(build("rotate"), "ddp"))
out["lightning_rsdp"] = attempt(lambda: fit(build("none"), "rsdp"))
dist.destroy_process_group()
print(json.dumps(out))

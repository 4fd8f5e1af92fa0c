"""Every third-party method torch_rsdp replaces or relies on, in one table.

A row names the library, the class and the method, what goes wrong for a sharded model without
it (the error and :func:`torch_rsdp.integrations.status` quote it), and how torch_rsdp uses it:

* ``patch``: the method is replaced by a wrapper (``make(original) -> wrapper``) that runs the
  library's own code for every model torch_rsdp did not shard;
* ``guard``: a wrapper at the door a sharded model comes in by (``Trainer(model=...)``,
  ``Accelerator.prepare``, Lightning's ``Strategy.connect``): it refuses the model, before any
  training, when a row it depends on (``needs``) is missing;
* ``override``: :class:`~torch_rsdp.integrations._lightning_strategy` subclasses the class and
  overrides the method; nothing is patched, but a base class without the method would leave
  the override uncalled, so its absence is checked the same way.

Each library has the range of versions the integration was tested with, oldest to newest
(``scripts/test_oldest_integrations.sh`` runs the trainer tests at the oldest; CI at the
versions ``scripts/setup.sh`` pins). A version outside it, or a row whose method is missing,
is reported once, as a warning, when the library is imported; a missing row then refuses
sharded models (:mod:`._patching`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from . import (_accelerate_hooks as accelerate_hooks, _lightning_hooks as lightning_hooks,
               _trainer_hooks as trainer_hooks)

__all__ = ["Library", "Patch", "LIBRARIES", "PATCHES", "library"]


@dataclass(frozen=True)
class Library:
    name: str                 # its top-level module, as the user imports it
    root: str                 # the package the rows' module paths are relative to
    dist: str                 # the distribution pip installs
    tested: Tuple[str, str]   # oldest and newest "major.minor" tested (every patch release)


@dataclass(frozen=True)
class Patch:
    library: str              # Library.name
    module: str               # the module holding the class, relative to Library.root
    owner: str                # the class
    method: str
    why: str                  # what would go wrong for a sharded model without this row
    kind: str = "patch"       # "patch", "guard" or "override"
    make: Optional[Callable] = None       # patch and guard: original -> wrapper
    needs: Tuple[str, ...] = ()           # guard: the libraries whose rows it requires
    optional: bool = False    # the class may be absent: a version without it has no such path

    @property
    def target(self) -> str:
        return f"{self.owner}.{self.method}"


LIBRARIES = {lib.name: lib for lib in (
    Library("transformers", "transformers", "transformers", ("5.18", "5.24")),
    Library("accelerate", "accelerate", "accelerate", ("1.3", "1.15")),
    Library("lightning", "lightning.pytorch", "lightning", ("2.5", "2.6")),
    Library("pytorch_lightning", "pytorch_lightning", "pytorch-lightning", ("2.5", "2.6")),
)}

_TRANSFORMERS = [
    Patch("transformers", "trainer", "Trainer", "__init__", kind="guard",
          make=trainer_hooks.guard_init, needs=("transformers", "accelerate"),
          why="a sharded model would reach a Trainer whose other patches are missing"),
    Patch("transformers", "trainer", "Trainer", "save_model", make=trainer_hooks.save_model,
          why="save_model and every checkpoint would write rank 0's shards only, not the "
              "whole model"),
    Patch("transformers", "trainer", "Trainer", "_save_optimizer_and_scheduler",
          make=trainer_hooks.save_optimizer_and_scheduler,
          why="every checkpoint's optimizer.pt would hold rank 0's part of the optimizer state "
              "only, and a resumed run would lose the other ranks' moments"),
    Patch("transformers", "trainer", "Trainer", "_clip_grad_norm",
          make=trainer_hooks.clip_grad_norm,
          why="max_grad_norm would clip without torch_rsdp's norm over every rank's shards"),
    Patch("transformers", "trainer", "Trainer", "_get_grad_norm",
          make=trainer_hooks.get_grad_norm,
          why="the logged grad_norm would not be the norm over every rank's shards"),
    Patch("transformers", "modeling_utils", "PreTrainedModel", "save_pretrained",
          make=trainer_hooks.save_pretrained,
          why="save_pretrained called on every rank would write rank 0's shards only"),
]

_ACCELERATE = [
    Patch("accelerate", "accelerator", "Accelerator", "prepare", kind="guard",
          make=accelerate_hooks.guard_prepare, needs=("accelerate",),
          why="a sharded model would reach an Accelerator whose other patches are missing"),
    Patch("accelerate", "accelerator", "Accelerator", "prepare_model",
          make=accelerate_hooks.prepare_model,
          why="the model would be wrapped in DistributedDataParallel, whose start-up broadcast "
              "overwrites every rank's shards with rank 0's"),
    Patch("accelerate", "accelerator", "Accelerator", "get_state_dict",
          make=accelerate_hooks.get_state_dict,
          why="get_state_dict and save_model would return rank 0's shards only"),
    Patch("accelerate", "accelerator", "Accelerator", "clip_grad_norm_",
          make=accelerate_hooks.clip_grad_norm,
          why="clip_grad_norm_ would clip without torch_rsdp's norm over every rank's shards"),
]


def _lightning(lib: str):
    return [
        Patch(lib, "strategies.strategy", "Strategy", "connect", kind="guard",
              make=lightning_hooks.guard_connect, needs=(lib,),
              why="a sharded model would reach a strategy whose other patches are missing"),
        Patch(lib, "strategies.ddp", "DDPStrategy", "setup", make=lightning_hooks.ddp_setup,
              why="validate/test/predict would broadcast rank 0's parameters over every "
                  "rank's shards"),
        Patch(lib, "strategies.ddp", "DDPStrategy", "configure_ddp",
              make=lightning_hooks.configure_ddp,
              why="the model would be wrapped in DistributedDataParallel, whose start-up "
                  "broadcast overwrites every rank's shards with rank 0's"),
        Patch(lib, "strategies.strategy", "Strategy", "lightning_module_state_dict",
              make=lightning_hooks.lightning_module_state_dict,
              why="checkpoints would hold rank 0's shards of the model only"),
        Patch(lib, "strategies.strategy", "Strategy", "optimizer_state",
              make=lightning_hooks.optimizer_state,
              why="checkpoints would hold rank 0's part of the optimizer state only"),
    ] + [
        Patch(lib, f"strategies.{mod}", cls, "setup", make=lightning_hooks.refuse_sharding_again,
              optional=True,
              why=f"{cls} would shard an already sharded model again")
        for mod, cls in (("fsdp", "FSDPStrategy"), ("deepspeed", "DeepSpeedStrategy"),
                         ("model_parallel", "ModelParallelStrategy"))
    ] + [
        # RSDPStrategy (lightning_strategy.py) overrides these; it patches nothing
        Patch(lib, "strategies.ddp", "DDPStrategy", m, kind="override", why=why)
        for m, why in (
            ("setup", "RSDPStrategy could not shard the model before the optimizers are built"),
            ("configure_ddp", "Lightning would wrap the model in DistributedDataParallel"),
            ("training_step", "the hooks on the sharded module's forward would not run "
                              "around the step"),
            ("validation_step", "the hooks on the sharded module's forward would not run "
                                "around the step"),
            ("test_step", "the hooks on the sharded module's forward would not run around "
                          "the step"),
            ("predict_step", "the hooks on the sharded module's forward would not run around "
                             "the step"),
            ("reduce", "logging with sync_dist=True would average an int64 batch size, which "
                       "the rsdp backend refuses on CUDA tensors"),
            ("lightning_module_state_dict", "checkpoints would hold rank 0's shards only"),
            ("optimizer_state", "checkpoints would hold rank 0's optimizer state only"))
    ]


PATCHES = _TRANSFORMERS + _ACCELERATE + _lightning("lightning") + _lightning("pytorch_lightning")


def library(name: str) -> Library:
    return LIBRARIES[name]

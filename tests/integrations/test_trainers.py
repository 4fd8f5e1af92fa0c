"""The stock trainers over sharded models, run as users run them (torchrun, 2 ranks, the
trainers' defaults: DDP wrapping, their own optimizer, gradient clipping at 1.0, their own
checkpoints), every strategy against the unsharded model under the same trainer:

* Hugging Face ``Trainer`` (tests/integrations/trainer_hf_worker.py): gradient accumulation, warm-up and
  linear decay, bf16 autocast; every logged loss and gradient norm, the model
  ``save_model`` writes (loaded back with ``from_pretrained``), a resume from the mid-run
  checkpoint at 2 ranks and at 1 rank.
* accelerate's own loop (``Accelerator.prepare``, ``accumulate``, ``clip_grad_norm_``,
  ``save_model``): the same, without the Trainer.
* Lightning (tests/integrations/trainer_lightning_worker.py): ``strategy="rsdp"`` sharding the
  module itself (``RSDPStrategy(plan=...)``) or training one sharded before it, and the stock
  DDP strategy; gradient accumulation and clipping, a checkpoint resumed, then validated.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from support.harness import launch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

#: Every strategy alone (RSDP per layer and in rotation units), the seven mixed in one Llama,
#: the planner's pick, and bf16 autocast.
HF_CASES = ["none", "rsdp", "rsdp-units", "no_shard", "shard_optim", "full_shard", "shard_grad_op",
            "hybrid_shard", "rotate", "split:2", "mix", "auto", "none+bf16", "rotate+bf16"]
RESUME_AT_1 = ["none", "rotate", "mix", "shard_optim"]
ACCELERATE_CASES = ["none", "rotate", "mix"]
#: strategy="rsdp" over every strategy (the strategy shards the module, or trains one sharded
#: before it), and the stock DDP strategy over a model sharded before it (torch_rsdp's patches).
LIGHTNING_CASES = ["none"] + [f"rsdp:{h}" for h in (
    "rsdp", "rsdp-units", "no_shard", "shard_optim", "full_shard", "shard_grad_op",
    "hybrid_shard", "rotate", "split:2", "mix", "auto")] + ["ddp:rsdp", "ddp:mix"]


def _torchrun(nproc: int, script: str, *args, timeout=900, env=None):
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               TRANSFORMERS_VERBOSITY="error", HF_HUB_OFFLINE="1", **(env or {}))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), os.path.join(HERE, script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


def _weights(path):
    import transformers as tf
    return tf.AutoModelForCausalLM.from_pretrained(path).state_dict()


def _close(got, want, rtol, what):
    assert len(got) == len(want), (what, got, want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert abs(g - w) <= rtol * abs(w), f"{what}[{i}]: {g} vs {w} (rtol {rtol})"


def _same_weights(got, want, atol, what):
    assert got.keys() == want.keys(), (what, set(got) ^ set(want))
    for k in want:
        d = (got[k].float() - want[k].float()).abs().max().item()
        assert d <= atol, f"{what}: {k} differs by {d} (atol {atol})"


@pytest.fixture(scope="module")
def hf_runs(tmp_path_factory):
    pytest.importorskip("transformers")
    out = tmp_path_factory.mktemp("hf_trainer")
    # accelerate's loop first: a Trainer leaves its mixed precision in accelerate's
    # process-wide state, which a later Accelerator() would take over
    _torchrun(2, "trainer_hf_worker.py", str(out), *[f"accelerate-{c}" for c in ACCELERATE_CASES],
              *HF_CASES)
    _torchrun(1, "trainer_hf_worker.py", str(out), "--resume", *RESUME_AT_1)
    return out


def _result(out, case, name="result.json"):
    with open(out / case / name) as f:
        return json.load(f)


@pytest.mark.parametrize("case", [c for c in HF_CASES if c != "none"])
def test_hf_trainer_trains_and_saves_like_unsharded(hf_runs, case):
    ref_case = "none+bf16" if case.endswith("+bf16") else "none"
    got, ref = _result(hf_runs, case), _result(hf_runs, ref_case)
    bf16 = case.endswith("+bf16")
    # every logged loss within 0.1 % (fp32: the same to rounding); the gradient norm the
    # Trainer clips with (max_grad_norm=1.0) and logs is one process's
    _close(got["loss"], ref["loss"], 1e-3 if bf16 else 1e-5, f"{case} loss")
    _close(got["grad_norm"], ref["grad_norm"], 1e-2 if bf16 else 1e-5, f"{case} grad_norm")
    # save_model writes the whole model, which from_pretrained loads: the unsharded run's
    _same_weights(_weights(hf_runs / case / "final"), _weights(hf_runs / ref_case / "final"),
                  2e-2 if bf16 else 1e-5, f"{case} saved model")
    _same_weights(_weights(hf_runs / case / "pretrained"), _weights(hf_runs / case / "final"),
                  0.0, f"{case} save_pretrained")


@pytest.mark.parametrize("case", HF_CASES)
def test_hf_trainer_resumes_exactly(hf_runs, case):
    got = _result(hf_runs, case)
    # resume_from_checkpoint (weights, optimizer state, scheduler, data position) = the run
    # that never stopped
    assert len(got["resumed_loss"]) == len(got["loss"]) - 3
    _close(got["resumed_loss"], got["loss"][3:], 1e-6, f"{case} resumed loss")
    _same_weights(_weights(hf_runs / case / "resumed"), _weights(hf_runs / case / "final"),
                  1e-6, f"{case} resumed model")


def test_hf_trainer_on_gloo(hf_runs, tmp_path):
    """The stock Trainer over torch's gloo, no rsdp backend: the ``rotate`` plan trains,
    saves and resumes as it does over rsdp (2 ranks: every sum has two terms, so the same
    numbers to rounding on any backend)."""
    _torchrun(2, "trainer_hf_worker.py", str(tmp_path), "rotate",
              env={"RSDP_TEST_TRAINER_BACKEND": "gloo"})
    got, want = _result(tmp_path, "rotate"), _result(hf_runs, "rotate")
    for key in ("loss", "grad_norm", "resumed_loss"):
        _close(got[key], want[key], 1e-6, f"gloo rotate {key}")
    for saved in ("final", "resumed"):
        _same_weights(_weights(tmp_path / "rotate" / saved), _weights(hf_runs / "rotate" / saved),
                      1e-6, f"gloo rotate {saved} model")


@pytest.mark.parametrize("case", RESUME_AT_1)
def test_hf_trainer_resumes_at_another_world_size(hf_runs, case):
    """A checkpoint written by 2 ranks, resumed by 1 (the same samples per step)."""
    got = _result(hf_runs, case)
    again = _result(hf_runs, case, "resumed_w1.json")
    _close(again["resumed_loss"], got["loss"][3:], 1e-5, f"{case} resumed at 1 rank")
    _same_weights(_weights(hf_runs / case / "resumed_w1"), _weights(hf_runs / case / "final"),
                  1e-5, f"{case} model resumed at 1 rank")


@pytest.mark.parametrize("case", [c for c in ACCELERATE_CASES if c != "none"])
def test_accelerate_loop_like_unsharded(hf_runs, case):
    from safetensors.torch import load_file

    got = _result(hf_runs, f"accelerate-{case}")
    ref = _result(hf_runs, "accelerate-none")
    _close(got["loss"], ref["loss"], 1e-5, f"accelerate {case} loss")
    _close(got["grad_norm"], ref["grad_norm"], 1e-5, f"accelerate {case} clipped norm")
    _same_weights(load_file(str(hf_runs / f"accelerate-{case}" / "model.safetensors")),
                  load_file(str(hf_runs / "accelerate-none" / "model.safetensors")), 1e-5,
                  f"accelerate {case} save_model")


@pytest.fixture(scope="module")
def lightning_runs(tmp_path_factory):
    pytest.importorskip("lightning")
    out = tmp_path_factory.mktemp("lightning")
    _torchrun(2, "trainer_lightning_worker.py", str(out), *LIGHTNING_CASES)
    return out


def _ckpt_weights(path):
    return torch.load(path, map_location="cpu", weights_only=False)["state_dict"]


@pytest.mark.parametrize("case", [c for c in LIGHTNING_CASES if c != "none"])
def test_lightning_trains_and_checkpoints_like_unsharded(lightning_runs, case):
    got, ref = _result(lightning_runs, ".", f"{case}.json"), _result(lightning_runs, ".",
                                                                      "none.json")
    _close(got["loss"], ref["loss"], 1e-5, f"{case} loss")
    _close([got["val_loss"]], [ref["val_loss"]], 1e-5, f"{case} validation loss")
    # the checkpoint Lightning wrote holds the whole model, equal to the unsharded run's
    _same_weights(_ckpt_weights(lightning_runs / case / "step=6.ckpt"),
                  _ckpt_weights(lightning_runs / "none" / "step=6.ckpt"), 1e-5,
                  f"{case} checkpoint")


@pytest.mark.parametrize("case", LIGHTNING_CASES)
def test_lightning_resumes_exactly(lightning_runs, case):
    got = _result(lightning_runs, ".", f"{case}.json")
    _close(got["resumed_loss"], got["loss"][len(got["loss"]) // 2:], 1e-6, f"{case} resumed")
    _same_weights(_ckpt_weights(lightning_runs / case / "again" / "step=6.ckpt"),
                  _ckpt_weights(lightning_runs / case / "step=6.ckpt"), 1e-6,
                  f"{case} resumed checkpoint")


def _to_on_sharded(ctx):
    """``model.to()`` that changes nothing keeps the gradient sync (the replicas stay equal);
    a cast raises, naming the rank and the tensor, and leaves the model as it was."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    from torch_rsdp import plan, rsdp
    from support.plan_cases import make_llama

    for how in ("no_shard", "rotate", "rsdp"):
        model = make_llama()
        rsdp.shard(model) if how == "rsdp" else plan.apply(model, how)
        model.to("cpu")
        model.to(torch.device("cpu"), torch.float32)
        ids = torch.randint(0, 50, (2, 5), generator=torch.Generator().manual_seed(ctx.rank))
        model(input_ids=ids, labels=ids).loss.backward()
        g = model.model.norm.weight.grad
        g = g.to_local() if isinstance(g, DTensor) else g
        mean = g.clone()
        dist.all_reduce(mean)
        assert torch.allclose(g, mean / ctx.world_size), f"{how}: gradient not averaged after .to()"
        before = model.model.norm.weight
        with pytest.raises(ValueError, match=rf"rank {ctx.rank}: .*would replace '.*'"):
            model.to(torch.bfloat16)
        assert model.model.norm.weight is before and before.dtype == torch.float32, how


def test_to_on_a_sharded_model():
    launch(_to_on_sharded, 2)


def _to_on_plain_shards(ctx):
    """``nn.MultiheadAttention`` split by heads keeps plain ``Parameter`` shards (its packed
    q/k/v pieces are not ``torch.chunk``'s); a conversion that returns an equal plain copy of
    them (what the Trainer's move to its device does under torchrun) leaves the model alone."""
    from torch.distributed.tensor import DTensor

    from torch_rsdp import rsdp

    torch.manual_seed(0)
    model = rsdp.shard(torch.nn.TransformerEncoderLayer(24, 3, 48, batch_first=True))
    plain = {n: p for n, p in model.named_parameters() if not isinstance(p, DTensor)}
    assert plain, "expected plain shard parameters"
    model._apply(lambda t: t.clone())
    after = dict(model.named_parameters())
    assert all(after[n] is p for n, p in plain.items()), "a parameter was replaced"
    with pytest.raises(ValueError, match=rf"rank {ctx.rank}: .*would replace '.*'"):
        model._apply(lambda t: t.clone().to(torch.float64))


def test_to_on_plain_shard_parameters():
    launch(_to_on_plain_shards, 3)


def _lightning_fsdp_refuses(ctx):
    from lightning.pytorch.strategies import FSDPStrategy

    from torch_rsdp import plan
    from support.plan_cases import make_llama

    sys.path.insert(0, HERE)  # the worker scripts import each other by name, as torchrun runs them
    from trainer_lightning_worker import LitLM

    model = make_llama()
    plan.apply(model, "rotate")
    strategy = FSDPStrategy()
    strategy.model = LitLM(model)
    with pytest.raises(ValueError, match=rf"FSDPStrategy \(rank {ctx.rank}\).*strategy=\"rsdp\""):
        strategy.setup(None)


def test_lightning_sharding_strategies_refuse_a_sharded_model():
    pytest.importorskip("lightning")
    launch(_lightning_fsdp_refuses, 2)


def test_rsdp_strategy_refuses_unknown_arguments_when_built():
    pytest.importorskip("lightning")
    import torch_rsdp  # noqa: F401
    from lightning.pytorch.strategies import StrategyRegistry

    from torch_rsdp.integrations import RSDPStrategy

    assert StrategyRegistry["rsdp"]["strategy"] is RSDPStrategy
    with pytest.raises(TypeError, match=r"RSDPStrategy got unexpected keyword arguments \['plan_name'\]"):
        RSDPStrategy(plan_name="rotate")
    with pytest.raises(TypeError, match=r"shard_options \['bucket_bytes'\] are not options of "
                                        r"torch_rsdp\.rsdp\.shard \(it takes"):
        RSDPStrategy(shard_options={"bucket_bytes": 1})  # plan.apply's, not rsdp.shard's
    strategy = RSDPStrategy(plan="rotate", shard_options={"bucket_bytes": 1 << 20})
    assert strategy.process_group_backend == "rsdp"
    # pytorch_lightning (the older package name) gets its own class, registered the same way
    import pytorch_lightning as pl  # lightning depends on it
    cls = pl.strategies.StrategyRegistry["rsdp"]["strategy"]
    assert issubclass(cls, pl.strategies.DDPStrategy) and cls is not RSDPStrategy


def _strategy_refuses_to_shard_again(ctx):
    from torch_rsdp import plan
    from support.plan_cases import make_llama
    from torch_rsdp.integrations import RSDPStrategy

    sys.path.insert(0, HERE)
    from trainer_lightning_worker import LitLM

    model = make_llama()
    plan.apply(model, "rotate")
    strategy = RSDPStrategy(plan="full_shard")
    with pytest.raises(ValueError, match=rf"RSDPStrategy \(rank {ctx.rank}\): the module holds a "
                                         r"model sharded by torch_rsdp already"):
        strategy._shard(LitLM(model))


def test_rsdp_strategy_refuses_to_shard_a_sharded_model_again():
    pytest.importorskip("lightning")
    launch(_strategy_refuses_to_shard_again, 2)

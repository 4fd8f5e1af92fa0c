"""One torchrun rank of tests/integrations/test_trainers.py: the stock ``transformers.Trainer`` (defaults
but for the few arguments a small run needs) over a small Llama, unsharded or sharded by
torch_rsdp, for each case on the command line; then a second Trainer resumes each case from
its mid-run checkpoint.

    torchrun --nproc_per_node 2 tests/integrations/trainer_hf_worker.py OUT CASE [CASE ...]
    torchrun --nproc_per_node 1 tests/integrations/trainer_hf_worker.py OUT --resume CASE [CASE ...]

A case is ``how[+bf16]``, or ``accelerate-how`` (accelerate's own loop, no Trainer), with
``how`` one of ``none``, ``rsdp``, ``rsdp-units``, a strategy name, ``mix``
(the seven strategies in one Llama) or ``auto`` (``plan.auto`` under a memory budget). Writes
``OUT/CASE/result.json`` (rank 0): the logged losses and gradient norms of the whole run and of
the resumed one; the saved models are in ``OUT/CASE/final`` and ``OUT/CASE/resumed``. With ``--resume``, only
the resumed run, at this world size (the per-device batch is 4 / world size, so every step
sees the same samples at 1 or 2 ranks): ``OUT/CASE/resumed_wN.json`` and ``OUT/CASE/resumed_wN``.
"""
from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist

import torch_rsdp  # noqa: F401  (registers "rsdp"; installs the trainer integrations)
from torch_rsdp import plan, rsdp
import transformers as tf

VOCAB, SEQ, STEPS, SAVE_AT = 64, 16, 6, 3
MIX = {"model.embed_tokens": "rotate", "model.layers.0.self_attn": "full_shard",
       "model.layers.0.mlp": "shard_grad_op", "model.layers.1.self_attn": "split:2",
       "model.layers.1.mlp": "shard_optim", "model.norm": "hybrid_shard", "lm_head": "no_shard"}


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int = 64):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = torch.randint(0, VOCAB, (SEQ,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": ids, "labels": ids}


def build(how: str):
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32)
    model = tf.LlamaForCausalLM(cfg)
    if how == "rsdp":
        rsdp.shard(model)
    elif how == "rsdp-units":  # rotation units from the model's own tensor-parallel plan
        rsdp.shard(model, tp_plan="auto")
    elif how == "mix":
        plan.apply(model, MIX)
    elif how == "auto":
        ids = torch.zeros(2, SEQ, dtype=torch.long)
        p = plan.auto(model, {"input_ids": ids, "labels": ids}, memory_budget="4GiB", verify=0)
        plan.apply(model, p)
    elif how != "none":
        plan.apply(model, how)
    return model


def trainer(model, out: str, bf16: bool):
    args = tf.TrainingArguments(
        output_dir=out, per_device_train_batch_size=4 // dist.get_world_size(), gradient_accumulation_steps=2,
        max_steps=STEPS, learning_rate=3e-3, warmup_steps=2, logging_steps=1,
        save_strategy="steps", save_steps=SAVE_AT, report_to=[], use_cpu=True, bf16=bf16,
        seed=0, disable_tqdm=True)
    return tf.Trainer(model=model, args=args, train_dataset=Tokens())


def logged(tr, key, after: int = 0):
    return [float(h[key]) for h in tr.state.log_history if key in h and h["step"] > after]


def resume_only(case: str, root: str) -> None:
    how, _, extra = case.partition("+")
    out, world = os.path.join(root, case), dist.get_world_size()
    tr = trainer(build(how), os.path.join(out, f"w{world}"), bf16=extra == "bf16")
    tr.train(resume_from_checkpoint=os.path.join(out, f"checkpoint-{SAVE_AT}"))
    tr.save_model(os.path.join(out, f"resumed_w{world}"))
    if dist.get_rank() == 0:
        with open(os.path.join(out, f"resumed_w{world}.json"), "w") as f:
            json.dump({"resumed_loss": logged(tr, "loss", after=SAVE_AT)}, f)


def accelerate_loop(how: str, root: str) -> None:
    """accelerate's own loop: ``prepare`` (model, optimizer, data, scheduler),
    ``accumulate``, ``backward``, ``clip_grad_norm_``, ``save_model``."""
    from accelerate import Accelerator

    acc = Accelerator(cpu=True, gradient_accumulation_steps=2)
    model = build(how)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    sched = torch.optim.lr_scheduler.LinearLR(opt, 1.0, 0.1, total_iters=STEPS)
    loader = torch.utils.data.DataLoader(Tokens(), batch_size=2)
    model, opt, loader, sched = acc.prepare(model, opt, loader, sched)
    losses, norms = [], []
    for batch in loader:
        with acc.accumulate(model):
            loss = model(**batch).loss
            acc.backward(loss)
            losses.append(float(acc.reduce(loss.detach(), "mean")))
            if acc.sync_gradients:
                norms.append(float(acc.clip_grad_norm_(model.parameters(), 1.0)))
            opt.step()
            sched.step()
            opt.zero_grad()
        if len(norms) == STEPS:
            break
    out = os.path.join(root, f"accelerate-{how}")
    acc.wait_for_everyone()
    acc.save_model(model, out)
    if acc.is_main_process:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump({"loss": losses, "grad_norm": norms}, f)


def run(case: str, root: str) -> None:
    if case.startswith("accelerate-"):
        return accelerate_loop(case[len("accelerate-"):], root)
    how, _, extra = case.partition("+")
    out = os.path.join(root, case)
    tr = trainer(build(how), out, bf16=extra == "bf16")
    tr.train()
    tr.save_model(os.path.join(out, "final"))
    # the model itself, saved on every rank as transformers documents for distributed runs
    tr.model.save_pretrained(os.path.join(out, "pretrained"),
                             is_main_process=dist.get_rank() == 0)
    result = {"loss": logged(tr, "loss"), "grad_norm": logged(tr, "grad_norm")}
    again = trainer(build(how), out, bf16=extra == "bf16")
    again.train(resume_from_checkpoint=os.path.join(out, f"checkpoint-{SAVE_AT}"))
    again.save_model(os.path.join(out, "resumed"))
    result["resumed_loss"] = logged(again, "loss", after=SAVE_AT)
    if dist.get_rank() == 0:
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)


def main() -> None:
    # the backend the test names (torch's gloo: the module layer needs no rsdp), rsdp by default
    dist.init_process_group(os.environ.get("RSDP_TEST_TRAINER_BACKEND", "rsdp"))
    try:
        resume = sys.argv[2] == "--resume"
        for case in sys.argv[3 if resume else 2:]:
            (resume_only if resume else run)(case, sys.argv[1])
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

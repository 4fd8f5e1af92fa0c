"""The stock Hugging Face ``Trainer`` fine-tuning a model that ``torch_rsdp.plan.auto`` sharded
under a memory budget.

    torchrun --nproc_per_node 2 examples/hf_trainer.py                  # plan.auto, 1 GiB a rank
    torchrun --nproc_per_node 2 examples/hf_trainer.py --plan rotate    # any plan, or "none"
    torchrun --nproc_per_node 2 examples/hf_trainer.py --resume          # from the newest checkpoint

A ``LlamaForCausalLM`` built from a config learns the chess games of ``chess_data.py``. The only
lines that are not a stock Trainer script are ``init_process_group("rsdp")`` (torchrun's
environment) and the plan: ``import torch_rsdp`` lets accelerate and the Trainer handle the
sharded model (no DDP around it, whole weights in ``save_model`` and in every checkpoint,
exact resumes at any world size: :mod:`torch_rsdp.integrations`). At the end rank 0 loads
what ``save_model`` wrote with ``from_pretrained``, as anyone would, and prints its held-out
loss before and after training.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch.distributed as dist

import torch_rsdp  # noqa: F401  (registers "rsdp", lets the trainers take sharded models)
from torch_rsdp import plan
import transformers as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chess_data import ChessMoves  # noqa: E402
from chess_lm import Games, chess_llama, held_out_loss  # noqa: E402



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", default="auto", help='"auto" (plan.auto), "none" or a plan')
    ap.add_argument("--budget", default="1GiB", help="plan.auto's memory budget per rank")
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--out", default="examples/results/hf_trainer")
    ap.add_argument("--resume", action="store_true", help="from the newest checkpoint in --out")
    args = ap.parse_args()

    dist.init_process_group("rsdp")
    data = ChessMoves(seq_len=64)
    model = chess_llama(data)
    before = held_out_loss(model, data) if dist.get_rank() == 0 else None

    if args.plan == "auto":
        example = Games(data, 8)[0]
        example = {k: v.repeat(8, 1) for k, v in example.items()}  # one micro-batch
        chosen = plan.auto(model, example, memory_budget=args.budget)
        if dist.get_rank() == 0:
            print(chosen.explain())
        plan.apply(model, chosen)
    elif args.plan != "none":
        plan.apply(model, args.plan)

    training = tf.TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=8, gradient_accumulation_steps=2,
        max_steps=args.steps, learning_rate=3e-3, warmup_steps=10, logging_steps=25,
        save_strategy="steps", save_steps=50, report_to=[], use_cpu=True, seed=0,
        disable_tqdm=True)
    trainer = tf.Trainer(model=model, args=training,
                         train_dataset=Games(data, args.steps * 16 * dist.get_world_size()))
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    trainer.save_model(os.path.join(args.out, "final"))

    if dist.get_rank() == 0:
        saved = tf.AutoModelForCausalLM.from_pretrained(os.path.join(args.out, "final"))
        print(f"held-out loss: {before:.3f} before, {held_out_loss(saved, data):.3f} after "
              f"{args.steps} steps (the model save_model wrote, loaded with from_pretrained)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""The stock Hugging Face ``Trainer`` fine-tuning LoRA adapters on a pretrained model that RSDP
shards, built on ``meta`` and loaded shard by shard.

    python examples/finetune_chess.py --nproc 2 --steps 150 --save-pretrained /tmp/chess-hf
    torchrun --nproc_per_node 2 examples/hf_trainer_lora.py --pretrained /tmp/chess-hf
    torchrun --nproc_per_node 2 examples/hf_trainer_lora.py --pretrained /tmp/chess-hf \
        --gradient-checkpointing

The recipe of docs/finetuning.md with the Trainer on top: the model is built on ``meta``,
wrapped by peft, sharded by ``rsdp.shard``, allocated by ``to_empty`` and loaded by
``rsdp.load_pretrained``; the Trainer trains the adapters (``import torch_rsdp`` lets it take
the sharded model: :mod:`torch_rsdp.integrations`) and ``save_model`` writes the adapter
(``adapter_model.safetensors``). The task is finetune_lora.py's: the games seen from Black's
side. At the end rank 0 loads the pretrained model with ``from_pretrained`` and the adapter
with ``PeftModel.from_pretrained``, as anyone would, and prints the held-out loss of the model
before and after.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

import torch_rsdp  # noqa: F401  (registers "rsdp", lets the trainers take sharded models)
import torch_rsdp.rsdp as rsdp
import transformers as tf
from peft import LoraConfig, PeftModel, get_peft_model

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chess_lm import Games, held_out_loss  # noqa: E402
from finetune_lora import TARGETS, MirroredMoves  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pretrained", required=True, help="a save_pretrained directory")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lora-r", type=int, default=8)
    ap.add_argument("--gradient-checkpointing", action="store_true",
                    help="the Trainer's activation checkpointing (RSDP rotates nothing again)")
    ap.add_argument("--out", default="examples/results/hf_trainer_lora")
    args = ap.parse_args()

    dist.init_process_group("rsdp")
    data = MirroredMoves(seq_len=64, seed=1)
    config = tf.AutoConfig.from_pretrained(args.pretrained)
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(config)
    model = get_peft_model(model, LoraConfig(r=args.lora_r, lora_alpha=2 * args.lora_r,
                                             target_modules=TARGETS, lora_dropout=0.0))
    rsdp.shard(model, tp_plan="auto")  # attention and MLP as rotation units
    model.to_empty(device="cpu")
    rsdp.load_pretrained(model, args.pretrained)
    if dist.get_rank() == 0:
        print(rsdp.rsdp_state(model).report())

    training = tf.TrainingArguments(
        output_dir=args.out, per_device_train_batch_size=16, max_steps=args.steps,
        learning_rate=3e-3, warmup_steps=5, logging_steps=20, save_strategy="no",
        report_to=[], use_cpu=True, seed=0, disable_tqdm=True,
        gradient_checkpointing=args.gradient_checkpointing)
    trainer = tf.Trainer(model=model, args=training,
                         train_dataset=Games(data, args.steps * 16 * dist.get_world_size()))
    trainer.train()
    trainer.save_model(os.path.join(args.out, "adapter"))

    if dist.get_rank() == 0:
        base = tf.AutoModelForCausalLM.from_pretrained(args.pretrained)
        before = held_out_loss(base, data)
        tuned = PeftModel.from_pretrained(base, os.path.join(args.out, "adapter"))
        print(f"held-out loss on mirrored games: {before:.3f} pretrained, "
              f"{held_out_loss(tuned, data):.3f} with the adapter save_model wrote "
              f"({args.steps} steps; loaded with PeftModel.from_pretrained)")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

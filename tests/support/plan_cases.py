"""Models, plans and the one-process reference shared by the plan tests (test_plan.py,
test_plan_multinode.py).

Every rank trains on its own slice of a global batch; the reference trains one process on the
whole batch (mean loss), so a correct strategy, or mix, gives the reference's parameters.
"""
from __future__ import annotations

import copy
from typing import Optional

import torch
import torch.nn as nn

VOCAB, DIM, SEQ, PER_RANK = 50, 16, 5, 2

#: Every strategy alone, and all seven mixed in one model.
MIX = {"emb": "rotate", "blocks.0": "full_shard", "blocks.1": "shard_grad_op",
       "blocks.2": "hybrid_shard", "blocks.3": "split:3", "blocks.4": "shard_optim",
       "blocks.5": "rotate", "blocks.6.fc2": "split:2", "head": "no_shard"}
ALONE = ["no_shard", "shard_optim", "full_shard", "shard_grad_op", "hybrid_shard", "rotate",
         "split:3"]


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, 2 * d + 1)  # odd sizes: shards and slices of unequal length
        self.fc2 = nn.Linear(2 * d + 1, d)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(self.ln(x))))


class PlanNet(nn.Module):
    def __init__(self, blocks: int = 7):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.ModuleList([Block(DIM) for _ in range(blocks)])
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, tokens):
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def make_net(seed: int = 0) -> PlanNet:
    torch.manual_seed(seed)
    return PlanNet()


def make_llama(seed: int = 0, tied: bool = False):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=32, tie_word_embeddings=tied)
    return LlamaForCausalLM(cfg)


def make_gpt2(seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(seed)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=4,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0,
                     eos_token_id=0)
    return GPT2LMHeadModel(cfg)


LLAMA_PLAN = {"model.embed_tokens": "rotate", "model.layers.0": "full_shard",
              "model.layers.1": "split:2", "model.layers.1.self_attn": "shard_grad_op",
              "model.norm": "shard_optim", "lm_head": "hybrid_shard"}
GPT2_PLAN = {"transformer.h.0": "rotate", "transformer.h.1": "split:2",
             "transformer.h.1.attn": "full_shard", "transformer.wpe": "shard_optim"}


def batch(step: int, world: int):
    g = torch.Generator().manual_seed(100 + step)
    x = torch.randint(0, VOCAB, (world * PER_RANK, SEQ), generator=g)
    y = torch.randint(0, VOCAB, (world * PER_RANK, SEQ), generator=g)
    return x, y


def loss_of(model, x, y):
    out = model(x)
    logits = out.logits if hasattr(out, "logits") else out
    return nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), y.reshape(-1))


# Adam's eps is raised from 1e-8: an element whose gradient is zero up to rounding would
# otherwise take a full-size step in a direction set by the rounding, in either process.
OPTIMS = {"sgd": (torch.optim.SGD, dict(lr=0.05, momentum=0.9)),
          "adamw": (torch.optim.AdamW, dict(lr=1e-2, weight_decay=0.01, eps=1e-4))}


def make_optim(name: str, params):
    cls, kw = OPTIMS[name]
    return cls(params, **kw)


def plan_optim(model, name: str):
    """The same optimizer for a planned model (state of shard_optim units sharded)."""
    import torch_rsdp.plan as plan
    cls, kw = OPTIMS[name]
    return plan.make_optimizer(model, cls, **kw)


def reference(model: nn.Module, opt_name: str, world: int, steps: int, start: int = 0,
              clip: Optional[float] = None, norms: Optional[list] = None):
    """Trains a copy of ``model`` in one process on the whole batch; returns its state dict.
    ``clip``: torch's ``clip_grad_norm_`` before every step (the norms appended to
    ``norms``)."""
    ref = copy.deepcopy(model)
    opt = make_optim(opt_name, ref.parameters())
    for step in range(start, start + steps):
        x, y = batch(step, world)
        loss_of(ref, x, y).backward()
        if clip is not None:
            n = torch.nn.utils.clip_grad_norm_(ref.parameters(), clip)
            if norms is not None:
                norms.append(n.item())
        opt.step()
        opt.zero_grad()
    return {k: v.detach().clone() for k, v in ref.state_dict().items()}


def train(model, opt, rank: int, world: int, steps: int, start: int = 0, micro: int = 1,
          clip: Optional[float] = None, norms: Optional[list] = None):
    """``steps`` optimizer steps on this rank's slice; ``micro`` micro-batches per step, all
    but the last under ``plan.no_sync``; ``clip``: torch's own ``clip_grad_norm_`` over
    ``model.parameters()`` before every step, as trainers call it (the norms appended to
    ``norms``)."""
    import torch_rsdp.plan as plan
    for step in range(start, start + steps):
        x, y = batch(step, world)
        x, y = x[rank * PER_RANK:(rank + 1) * PER_RANK], y[rank * PER_RANK:(rank + 1) * PER_RANK]
        xs, ys = x.chunk(micro), y.chunk(micro)
        for i in range(micro):
            if i < micro - 1:
                with plan.no_sync(model):
                    (loss_of(model, xs[i], ys[i]) / micro).backward()
            else:
                (loss_of(model, xs[i], ys[i]) / micro).backward()
        if clip is not None:
            n = torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
            if norms is not None:
                norms.append(full(n).item())
        opt.step()
        opt.zero_grad()


def loc(t):
    """A DTensor's local tensor (every parameter of a planned model is one), else ``t``."""
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def full(t):
    """A DTensor's whole value (a norm torch reduced over the mesh), else ``t``."""
    from torch.distributed.tensor import DTensor
    return t.full_tensor() if isinstance(t, DTensor) else t


def assert_close_sd(got: dict, want: dict, atol: float, what: str):
    assert set(got) == set(want), f"{what}: keys differ: {sorted(set(got) ^ set(want))[:6]}"
    worst = max(((k, (got[k].float() - want[k].float()).abs().max().item()) for k in want),
                key=lambda kv: kv[1])
    assert worst[1] <= atol, f"{what}: {worst[0]} differs from one process by {worst[1]:.3g}"

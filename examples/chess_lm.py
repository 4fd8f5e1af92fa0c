"""What the chess examples share: the games as a Hugging Face style dataset, the small Llama
that learns them, its held-out loss and its greedy next moves."""
from __future__ import annotations

import torch

from chess_data import IGNORE, PAD, ChessMoves


class Games(torch.utils.data.Dataset):
    """Games ``offset .. offset + n - 1`` as ``{"input_ids", "labels"}`` (the model shifts the
    labels itself; padding is not learnt)."""

    def __init__(self, data: ChessMoves, n: int, offset: int = 0):
        self.data, self.n, self.offset = data, n, offset

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        ids = self.data.tokens(self.offset + i)[:-1]
        labels = ids.clone()
        labels[labels == PAD] = IGNORE
        return {"input_ids": ids, "labels": labels}


def chess_llama(data: ChessMoves, seed: int = 0):
    """A ``LlamaForCausalLM`` from a config (4 layers, hidden 128, grouped-query attention,
    0.6 M parameters), the same weights for a given seed on every rank."""
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=data.vocab_size, hidden_size=128, intermediate_size=256,
                            num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                            max_position_embeddings=64, pad_token_id=PAD)
    torch.manual_seed(seed)
    return tf.LlamaForCausalLM(config)


def held_out_loss(model, data: ChessMoves, n: int = 64) -> float:
    """The language-model loss of ``model`` on ``n`` held-out games."""
    batch = [Games(data, n, ChessMoves.EVAL_OFFSET)[i] for i in range(n)]
    ids = torch.stack([b["input_ids"] for b in batch])
    labels = torch.stack([b["labels"] for b in batch])
    with torch.no_grad():
        return float(model(input_ids=ids, labels=labels).loss)


def greedy_next_words(logits_fn, prompts, seq_len: int, device="cpu"):
    """The text each prompt (``(token ids, moves)``, ``ChessMoves.move_prompts``) continues
    with, greedily, for up to 6 tokens (a move is at most 5 characters, then a space);
    ``logits_fn(token ids [n, seq_len]) -> logits``. Every call runs the same forwards
    whatever the prompts, so a sharded model's ranks stay in step."""
    buf = torch.full((len(prompts), seq_len), PAD, dtype=torch.long)
    pos = []
    for i, (ids, _) in enumerate(prompts):
        buf[i, :len(ids)] = torch.tensor(ids)
        pos.append(len(ids))
    start = list(pos)
    with torch.no_grad():
        for _ in range(6):
            logits = logits_fn(buf.to(device)).float().cpu()
            for i in range(len(prompts)):
                if pos[i] < seq_len:
                    buf[i, pos[i]] = logits[i, pos[i] - 1].argmax()
                    pos[i] += 1
    return [ChessMoves.decode(buf[i, start[i]:pos[i]].tolist()) for i in range(len(prompts))]

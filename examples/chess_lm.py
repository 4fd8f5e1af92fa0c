"""What the trainer examples (hf_trainer.py, lightning.py) share: the chess games as a
Hugging Face style dataset and the small Llama that learns them."""
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

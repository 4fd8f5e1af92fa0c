"""Tied parameters: one Parameter object used by several modules.

The usual case is a language model whose output head reuses the input embedding's table
(``lm_head.weight is embed_tokens.weight``, Hugging Face's ``tie_word_embeddings``). RSDP
shards the embedding by embedding dimension, which is exactly the head's input-feature split,
so both modules can run on *one* flat shard (:func:`._layers.sharded_linear.tie_linear`): the tie
survives sharding (``model.state_dict()``, ``tie_weights()`` and optimisers keep seeing one
Parameter) and both uses' gradients reach that one shard. Any other sharing is left whole:
sharding one user would silently untie it.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import torch.nn as nn

from ._coverage import classify

__all__ = ["find_ties", "TiedGroup", "tied_group"]

Use = Tuple[str, nn.Module, str]  # (module name, module, attribute name)


def find_ties(model: nn.Module) -> Dict[int, List[Use]]:
    """id(parameter) -> its uses, for every parameter held by more than one module."""
    uses: Dict[int, List[Use]] = {}
    for mname, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            uses.setdefault(id(p), []).append((mname, mod, pname))
    return {pid: u for pid, u in uses.items() if len(u) > 1}


class TiedGroup:
    """An embedding plus the ``nn.Linear`` head(s) that share its weight."""

    def __init__(self, embedding: Tuple[str, nn.Module], heads: List[Tuple[str, nn.Module]]):
        self.embedding = embedding
        self.heads = heads

    @property
    def members(self) -> List[Tuple[str, nn.Module]]:
        return [self.embedding] + self.heads


def tied_group(uses: List[Use]) -> Tuple[Optional[TiedGroup], str]:
    """(the group, "") when ``uses`` are one shardable embedding's ``weight`` and heads' ``weight``
    of the same ``[vocab, dim]`` shape; (None, why not) otherwise."""
    names = ", ".join(n or "<root>" for n, _, _ in uses)
    emb = [(n, m) for n, m, a in uses if classify(m)[0] == "embedding" and a == "weight"]
    heads = [(n, m) for n, m, a in uses if type(m) is nn.Linear and a == "weight"]
    if len(emb) != 1 or len(emb) + len(heads) != len(uses):
        return None, (f"tied ({names}): RSDP shares one shard only between an nn.Embedding "
                      f"and nn.Linear heads using its weight")
    shape = tuple(emb[0][1].weight.shape)
    for n, m in heads:
        if (m.out_features, m.in_features) != shape:
            return None, (f"tied ({names}): head {n} is {m.out_features}x{m.in_features}, "
                          f"the embedding {shape[0]}x{shape[1]}")
    return TiedGroup(emb[0], heads), ""

"""Hugging Face ``transformers`` models for the RSDP tests, built from small configs (nothing
is downloaded), and the helpers the test families share: per-rank token batches, the
language-model loss, tolerances, a sharded copy of a reference model, training loops.
Used inside worker processes (tests/rsdp/test_rsdp_hf.py, tests/support/rsdp_unit_families.py).
"""

from __future__ import annotations

import copy
import zlib

import torch

ATOL = RTOL = 1e-5
VOCAB, SEQ = 100, 7


# --------------------------------------------------------------------------------------------
# Models and data (run inside workers)
# --------------------------------------------------------------------------------------------


def _config(kind):
    import transformers as tf

    common = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                  bos_token_id=0, eos_token_id=1, pad_token_id=None)
    if kind in ("llama_u", "qwen2_u", "qwen3_u"):  # 12 KV heads (GQA 2): whole KV groups
        common.update(hidden_size=96, num_attention_heads=24, num_key_value_heads=12)  # 2-4 ranks
        if kind == "qwen3_u":  # per-head q_norm / k_norm inside the attention unit
            return tf.Qwen3ForCausalLM, tf.Qwen3Config(tie_word_embeddings=False, head_dim=4,
                                                       **common)
        cls = tf.LlamaForCausalLM if kind == "llama_u" else tf.Qwen2ForCausalLM
        cfg = tf.LlamaConfig if kind == "llama_u" else tf.Qwen2Config
        return cls, cfg(tie_word_embeddings=kind == "llama_u", **common)
    if kind == "wide":  # weights outweigh a small batch's activations, as in fine-tuning
        common.update(vocab_size=1000, hidden_size=256, intermediate_size=512)
        return tf.LlamaForCausalLM, tf.LlamaConfig(tie_word_embeddings=False, **common)
    if kind in ("llama", "llama_tied"):
        return tf.LlamaForCausalLM, tf.LlamaConfig(tie_word_embeddings=kind == "llama_tied",
                                                   **common)
    if kind == "qwen2":
        return tf.Qwen2ForCausalLM, tf.Qwen2Config(tie_word_embeddings=False, **common)
    if kind in ("gpt2", "gpt2_in"):
        return tf.GPT2LMHeadModel, tf.GPT2Config(
            vocab_size=VOCAB, n_embd=48, n_layer=2, n_head=4, n_positions=32, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=1)
    raise ValueError(kind)


MODELS = ("llama", "llama_tied", "qwen2", "gpt2", "gpt2_in")
TIED = {k: ("lm_head", "model.embed_tokens") for k in ("llama_tied", "llama_u")}
TIED.update({k: ("lm_head", "transformer.wte") for k in ("gpt2", "gpt2_in")})


def _shard_kw(kind):
    if kind == "gpt2_in":  # Conv1D split by input features (bias kept whole) for the c_proj's
        return {"linear_split": lambda name, m: "in" if name.endswith("c_proj") else "out"}
    return {}


def _make(kind, seed=0):
    cls, cfg = _config(kind)
    torch.manual_seed(seed)
    return cls(cfg)


def _on_meta(kind):
    with torch.device("meta"):
        return _make(kind)


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _lora(model):
    """peft's LoRA (r = 4) on every projection of a Llama-like ``model``."""
    from peft import LoraConfig, get_peft_model

    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=LORA_TARGETS,
                                            lora_dropout=0.0))


def _saved_adapter(model, kind, out):
    """The adapter of a sharded peft ``model``, gathered by ``plan.full_state_dict``
    (collective) and saved by peft on rank 0 into ``out``, loaded by every rank onto a fresh
    ``kind`` base with ``PeftModel.from_pretrained``."""
    import torch.distributed as dist
    from peft import PeftModel

    import torch_rsdp.plan as plan

    whole = plan.full_state_dict(model)  # whole tensors on rank 0
    if dist.get_rank() == 0:
        model.save_pretrained(out, state_dict=whole)
    dist.barrier()
    return PeftModel.from_pretrained(_make(kind), out)


def _gen(*key):
    return torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))


def _ids(q, step=0):
    """Rank q's token ids (rank-dependent batch size)."""
    return torch.randint(0, VOCAB, (1 + q % 3, SEQ), generator=_gen("ids", q, step))


def _loss(model, q, step=0):
    ids = _ids(q, step)
    out = model(input_ids=ids, labels=ids)
    return out.loss, out.logits


def _loc(t):
    """A DTensor's local tensor (shards and replicas are DTensors), else ``t``."""
    from torch.distributed.tensor import DTensor
    return t.to_local() if isinstance(t, DTensor) else t


def _close(got, exp, what, atol=ATOL, rtol=RTOL):
    got, exp = _loc(got), _loc(exp)
    assert got is not None and exp is not None, f"{what}: missing ({got is None}, {exp is None})"
    assert got.shape == exp.shape, f"{what}: shape {tuple(got.shape)} vs {tuple(exp.shape)}"
    if not torch.allclose(got.float(), exp.float(), atol=atol, rtol=rtol):
        raise AssertionError(f"{what}: max abs diff {(got.float() - exp.float()).abs().max():.3e}")


def _sharded(kind, **kw):
    import torch_rsdp.rsdp as rsdp

    ref = _make(kind)
    model = rsdp.shard(copy.deepcopy(ref), **dict(_shard_kw(kind), **kw))
    return model, ref


def _check_tie(model, kind):
    if kind in TIED:
        head, emb = (model.get_submodule(n) for n in TIED[kind])
        assert head.weight is emb.weight, f"{kind}: the head is no longer tied to the embedding"
        shard = emb.weight
        model.tie_weights()  # Hugging Face's own re-tying keeps the one (sharded) Parameter
        assert head.weight is emb.weight is shard, f"{kind}: tie_weights() replaced the shard"


# --------------------------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------------------------


def _train(model, params, r, W, steps, micro, reference):
    # eps 1e-6, not 1e-8: GPT-2's key biases get a gradient that is zero up to rounding
    # (softmax ignores a shift of every score), and Adam would blow that noise up to ~lr / 100
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.1, eps=1e-6)
    for step in range(steps):
        for k in range(micro):
            if reference:
                loss = sum(_loss(model, q, (step, k))[0] for q in range(W)) / (W * micro)
            else:
                loss = _loss(model, r, (step, k))[0] / micro
            loss.backward()
        opt.step()
        opt.zero_grad()

"""Dense decoders, and what every model has: its layers, hidden size and heads (multi-head, grouped-query and
multi-query attention), dtype, vocabulary and positions, MLP, rotary embedding and its scaling."""

from __future__ import annotations

import math
from typing import Any

from ..errors import KvsizeError
from .fields import (Fields, as_int, config_flag, dtype_name, is_architecture, optional_int, require_in_json,
                     within_limit)
from .reading import Reading
from .shape import DTYPE_NAMES

# every config field this module's readers look up
FIELDS = ("alibi", "attention_bias", "attention_head_dim", "attn_output_gate", "d_model", "dim", "dtype",
          "ffn_hidden_size", "final_logit_softcapping", "head_dim", "hidden_size", "hidden_size_per_layer_input",
          "intermediate_size", "kv_channels", "max_position_embeddings", "max_sequence_length", "mlp_hidden_act",
          "mtp_num_hidden_layers", "multi_query", "multi_query_group_num", "n_embd", "n_embed", "n_head",
          "n_head_kv", "n_heads", "n_inner", "n_layer", "n_layers", "n_positions", "n_vocab",
          "new_decoder_architecture", "num_attention_heads", "num_heads", "num_hidden_layers",
          "num_key_value_heads", "num_kv_heads", "num_layers", "num_nextn_predict_layers",
          "original_max_position_embeddings", "padded_vocab_size", "partial_rotary_factor",
          "position_embedding_type", "qk_rope_head_dim", "rope_parameters", "rope_scaling", "rotary_dim",
          "rotary_emb_base_dim", "seq_length", "tie_word_embeddings", "torch_dtype", "vocab_size",
          "vocab_size_per_layer_input")
# of them, those that change memory in vLLM's or SGLang's model code (unread.py)
MEMORY_FIELDS = ("head_dim", "hidden_size_per_layer_input", "kv_channels", "mtp_num_hidden_layers",
                 "multi_query_group_num", "num_key_value_heads", "num_nextn_predict_layers",
                 "vocab_size_per_layer_input")

_LAYERS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers")
_HIDDEN = ("hidden_size", "n_embd", "n_embed", "d_model", "dim")


def read_size(r: Reading) -> None:
    if r.parsed is None:
        # Without a transformers class there are no defaults: the core fields must be in the file.
        # With one, its defaults are the model's at every level (llava's text_config names llama and
        # leaves the rest to LlamaConfig), as transformers and vLLM build it.
        for names in (_LAYERS, _HIDDEN):
            require_in_json(r.raw_text, r.raw, *names)
    r.num_layers = within_limit(r.f.need_int(*_LAYERS), "num_hidden_layers")
    r.hidden = within_limit(r.f.need_int(*_HIDDEN), "hidden_size")
    r.heads = within_limit(r.f.need_int("num_attention_heads", "n_head", "num_heads", "n_heads"), "num_attention_heads")


def read_heads(r: Reading) -> None:
    f, heads = r.f, r.heads
    kv_heads = next((h for h in r.nas.kv_heads if h), heads) if r.nas else _kv_heads(f, heads)
    head_dim = as_int(f.get("head_dim", "kv_channels", "attention_head_dim", default=r.hidden // heads), "head_dim", 1)
    if kv_heads > heads:
        raise KvsizeError(f"config.json: num_key_value_heads {kv_heads} exceeds num_attention_heads {heads}")
    if heads % kv_heads:
        raise KvsizeError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                          f"{kv_heads}; grouped-query attention needs whole groups")
    r.kv_heads, r.head_dim = kv_heads, head_dim


def _kv_heads(f: Fields, heads: int) -> int:
    # Falcon-7B style: multi_query without the new decoder architecture means one KV head.
    if f.get("multi_query") and not f.get("new_decoder_architecture"):
        return 1
    value = f.get("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv", default=heads)
    return as_int(value, "num_key_value_heads", 1)


def read_dtype(r: Reading) -> None:
    f = r.f
    for given in (f.get("dtype", "torch_dtype"), Fields(r.parsed, r.raw).get("dtype", "torch_dtype")):
        if given is not None and dtype_name(given) is None and not isinstance(given, dict):
            # a dtype kvsize cannot read is never silently taken for bf16
            raise KvsizeError(f"config.json field 'torch_dtype' is {str(given)[:40]!r}; kvsize reads "
                              f"{', '.join(sorted(DTYPE_NAMES))}")
    r.config_dtype = (dtype_name(f.get("dtype", "torch_dtype"))
                      or dtype_name(Fields(r.parsed, r.raw).get("dtype", "torch_dtype")) or "bf16")


def read_vocabulary(r: Reading) -> None:
    f = r.f
    r.vocab = within_limit(f.need_int("vocab_size", "padded_vocab_size", "n_vocab"), "vocab_size")
    r.tied = config_flag(f.get("tie_word_embeddings", default=False), "tie_word_embeddings")
    max_pos = within_limit(as_int(f.get("max_position_embeddings", "n_positions", "max_sequence_length",
                                        "seq_length", default=0), "max_position_embeddings"),
                           "max_position_embeddings")
    if max_pos == 0:
        max_pos = 4096
        r.notes.append("config.json gives no max_position_embeddings; assumed 4096")
    r.max_pos = max_pos


# The models whose engine classes build per-layer input embeddings (vLLM's gemma3n.py and gemma4.py): elsewhere
# hidden_size_per_layer_input is not read, and a config setting it is named in a note
PER_LAYER_INPUT_MODEL_TYPES = ("gemma3n", "gemma3n_text", "gemma4", "gemma4_text")
PER_LAYER_INPUT_ARCHITECTURES = ("Gemma3nForCausalLM", "Gemma3nForConditionalGeneration", "Gemma4ForCausalLM",
                                 "Gemma4ForConditionalGeneration")


def read_per_layer_inputs(r: Reading) -> None:
    """Per-layer input embeddings (Gemma 3n, Gemma 4 E2B/E4B). vLLM's Gemma4Model builds, where
    hidden_size_per_layer_input d is above 0, embed_tokens_per_layer: a VocabParallelEmbedding of
    vocab_size_per_layer_input (vocab_size where the config has none) x num_hidden_layers * d, and
    per_layer_model_projection (hidden -> num_hidden_layers * d); each layer a per_layer_input_gate and a
    per_layer_projection (ReplicatedLinear, hidden x d each) and a norm."""
    if not is_architecture(r.raw, r.raw_text, PER_LAYER_INPUT_MODEL_TYPES, PER_LAYER_INPUT_ARCHITECTURES):
        return
    f = r.f
    size = as_int(f.get("hidden_size_per_layer_input", default=0), "hidden_size_per_layer_input")
    if not size:
        return
    vocab = within_limit(as_int(f.get("vocab_size_per_layer_input", default=r.vocab), "vocab_size_per_layer_input",
                                1), "vocab_size")
    r.per_layer_input_size, r.per_layer_input_vocab = within_limit(size, "hidden_size"), vocab


_UNGATED_MLP = {"falcon", "gpt2", "gpt_bigcode", "gpt_neox", "gptj", "opt", "bloom", "phi", "starcoder2", "mpt"}


def read_mlp(r: Reading) -> None:
    f = r.f
    r.intermediate = as_int(f.get("intermediate_size", "ffn_hidden_size", "n_inner", default=4 * r.hidden),
                            "intermediate_size", 1)
    r.gated = not (f.get("mlp_hidden_act") == "relu2"
                   or (f.get("ffn_hidden_size") is not None and f.get("intermediate_size") is None)
                   or r.model_type in _UNGATED_MLP)


def attention_params(f: Fields, hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    # an output gate (attn_output_gate) projects a gate beside each query: vLLM's qkv_proj holds 2 x the queries
    q = hidden * heads * head_dim * (2 if f.get("attn_output_gate", default=False) is True else 1)
    kv = 2 * hidden * kv_heads * head_dim
    o = heads * head_dim * hidden
    bias = (heads + 2 * kv_heads) * head_dim + hidden if f.get("attention_bias") else 0
    return q + kv + o + bias


def read_rotary(r: Reading) -> None:
    """The rotary embedding and its scalings, and the fields read last: the logit softcap, the attention output
    gate and the MTP layers."""
    f = r.f
    r.logit_softcap = _logit_softcap(f.get("final_logit_softcapping", default=None))
    r.rotary_dim = _rotary_dim(f, r.head_dim, r.mla_latent is not None)
    r.rope_scalings = _rope_scalings(f)
    r.mrope = _mrope(f)
    r.attention_output_gate = f.get("attn_output_gate", default=False) is True
    r.mtp_layers = as_int(f.get("num_nextn_predict_layers", "mtp_num_hidden_layers", default=0),
                          "num_nextn_predict_layers")
    r.original_max_pos = optional_int(f.get("original_max_position_embeddings"), "original_max_position_embeddings")


def _logit_softcap(value: Any) -> bool:
    """Whether the config caps its final logits (null or 0: no cap)."""
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise KvsizeError(f"config.json field 'final_logit_softcapping' must be a number of 0 or more (0 or null: no cap), got {value!r}")
    return value > 0


def _mrope(f: Fields) -> bool:
    """Whether the rope parameters (one dict, or one per layer type) carry an mrope_section."""
    params = f.get("rope_parameters", "rope_scaling")
    if not isinstance(params, dict):
        return False
    return "mrope_section" in params or any(isinstance(v, dict) and "mrope_section" in v for v in params.values())


def _rope_scalings(f: Fields) -> tuple[tuple[str, float | None, int | None], ...]:
    """transformers' rope_parameters (or the file's rope_scaling): one dict, or one per layer type."""
    params = f.get("rope_parameters", "rope_scaling")
    if not isinstance(params, dict):
        return ()
    entries = [v for v in params.values() if isinstance(v, dict)] if all(
        isinstance(v, dict) for v in params.values()) and params else [params]
    out = []
    for entry in entries:
        kind = entry.get("rope_type", entry.get("type", "default"))
        factor = entry.get("factor")
        if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                                   or not math.isfinite(factor) or factor <= 0):
            raise KvsizeError(f"config.json rope scaling 'factor' must be a positive number, got {factor!r}")
        out.append((str(kind), None if factor is None else float(factor),
                    optional_int(entry.get("original_max_position_embeddings"), "original_max_position_embeddings")))
    return tuple(out)


def _rotary_dim(f: Fields, head_dim: int, mla: bool) -> int:
    if mla:
        return as_int(f.get("qk_rope_head_dim", default=0), "qk_rope_head_dim")
    if f.get("position_embedding_type") in ("alibi", "absolute") or f.get("alibi"):
        return 0
    factor = f.get("partial_rotary_factor", default=None)
    params = f.get("rope_parameters", default=None)
    if factor is None and isinstance(params, dict):  # transformers 5 keeps it among the rope parameters
        factor = params.get("partial_rotary_factor")
    if factor is None:
        rotary = f.get("rotary_dim", "rotary_emb_base_dim", default=None)
        return as_int(rotary, "rotary_dim", 1) if rotary is not None else head_dim
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise KvsizeError(f"config.json field 'partial_rotary_factor' must be in (0, 1], got {factor!r}")
    return int(head_dim * factor)

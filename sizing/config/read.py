"""config.json to a ModelShape. transformers' config classes know each family's defaults (layer patterns, head
sizes, vocabulary sizes), so a config whose `model_type` transformers knows is read through its config class
(never with remote code, never over the network); unknown types are read from the raw JSON under the common
field names. The family readers then run in the order of READERS, each once, and build the shape."""

from __future__ import annotations

from typing import Any, Callable

from ..errors import KvsizeError
from .dense import (attention_params, read_dtype, read_heads, read_mlp, read_per_layer_inputs, read_rotary, read_size,
                    read_vocabulary)
from .fields import Fields, transformers_config
from .hybrid import read_nas_blocks, read_nas_kinds, read_recurrent
from .mla import compressed_attention_params, latent_attention_params, read_compression, read_latent, read_latent_sizes
from .moe import dense_intermediate, read_experts, shared_expert_params
from .multimodal import language_config, read_vision
from .nested import read_nested_configs
from .quantization import read_quantization
from .reading import Reading
from .shape import LayerParams, ModelShape
from .unread import unknown_fields_note, unread_memory_fields
from .windows import read_layer_kinds, read_windows


def resolve_shape(raw: dict[str, Any]) -> ModelShape:
    """The shape of the model a config.json describes."""
    if not isinstance(raw, dict):
        raise KvsizeError("config.json must hold a JSON object")
    raw_text = language_config(raw)
    rejected = None
    try:
        parsed = transformers_config(raw)
        if parsed is None and raw_text is not raw:
            # an outer model_type transformers does not know (Janus's multi_modality) around a language
            # model it does (llama): the language model's class gives its defaults
            parsed = transformers_config(raw_text)
    except KvsizeError as e:
        # transformers' class refuses a value (DeepSeek-VL2's kv_lora_rank null beside use_mla false,
        # which vLLM reads): kvsize reads the file alone and checks each field it uses where it uses it
        parsed, rejected = None, str(e)
    if rejected is not None:
        try:
            return _resolve(raw, raw_text, None, rejected)
        except KvsizeError as e:
            raise KvsizeError(f"{e} ({rejected})") from None
    return _resolve(raw, raw_text, parsed, None)


def _attention_params(f: Fields, hidden: int, heads: int, kv_heads: int, head_dim: int, kv_lora: Any) -> int:
    if kv_lora is not None:
        return latent_attention_params(f, hidden, heads, head_dim, kv_lora)
    return attention_params(f, hidden, heads, kv_heads, head_dim)


def read_layer_params(r: Reading) -> None:
    """Each layer's parameters from what the families read: its attention or recurrent mixer, its MLP or
    routed and shared experts, its norms and router."""
    f, hidden, heads, nas, blocks, gated = r.f, r.hidden, r.heads, r.nas, r.blocks, r.gated
    shared_attention = _attention_params(f, hidden, heads, r.kv_heads, r.head_dim, r.kv_lora)
    layer_params = []
    for i, kind in enumerate(r.kinds):
        attn = r.mixer_params if kind == "recurrent" else (shared_attention if kind != "none" else 0)
        if kind == "compressed":
            attn = compressed_attention_params(f, hidden, heads, r.head_dim, r.ratios[i])
        if (r.layer_kv_heads or r.layer_head_dims) and kind not in ("recurrent", "none"):
            attn = _attention_params(f, hidden, heads, r.layer_kv_heads[i] if r.layer_kv_heads else r.kv_heads,
                                     r.layer_head_dims[i] if r.layer_head_dims else r.head_dim, r.kv_lora)
        if nas:
            attn += nas.linear_attention[i] * hidden * hidden
            layer_params.append(LayerParams(attn, nas.mlp_params(i, hidden), 0, 2 * hidden))
            continue
        other = 2 * hidden + (r.mixer_other if kind == "recurrent" else 0)
        mlp = experts = 0
        block = blocks[i] if blocks else None
        if blocks is None or block in ("mlp", "moe"):
            if i in r.moe_layers:
                experts = r.num_experts * (3 if gated else 2) * hidden * r.moe_inter
                other += hidden * r.num_experts  # router
                mlp = shared_expert_params(f, hidden, r.moe_inter, r.intermediate, 3 if gated else 2)
            else:
                mlp = (3 if gated else 2) * hidden * dense_intermediate(f, r.intermediate, r.num_experts)
                if kind == "shared" and r.double_wide_shared_mlp:
                    mlp *= 2
        layer_params.append(LayerParams(attn, mlp, experts, other))
    r.layer_params = layer_params


# The family readers, in the order they run. Which family a config belongs to is never asked: each reader
# reads its fields where the config has them, so a model that is MLA, MoE and sliding-window at once is read by
# all three. The order is also the order in which a config's faults are found, and a config with two is
# refused for the first: a family that interleaves with others (dense, MLA, hybrid) has a reader at each
# point where its fields are needed. A new family is a module holding its readers, its FIELDS (and the
# MEMORY_FIELDS among them, joined in unread.py), and a row here below the readers whose values it uses.
READERS: tuple[Callable[[Reading], None], ...] = (
    read_nested_configs,  # nested: DBRX's attn_config and ffn_config under the names the families read
    read_size,  # dense: layers, hidden size, heads
    read_nas_blocks,  # hybrid: NAS block_configs, per-layer KV heads and FFN widths
    read_heads,  # dense: KV heads, head_dim
    read_latent,  # mla: kv_lora_rank + qk_rope_head_dim
    read_layer_kinds,  # windows: layer_types and hybrid patterns, each layer's kind
    read_compression,  # mla: DeepSeek-V4's compress ratios
    read_nas_kinds,  # hybrid: NAS blocks over any layer pattern
    read_windows,  # windows: kv-shared layers, sliding and chunked windows, per-layer heads and widths
    read_dtype,  # dense
    read_recurrent,  # hybrid: Mamba-2 / gated-delta-net state
    read_vocabulary,  # dense: vocabulary, tied embeddings, max positions
    read_per_layer_inputs,  # dense: Gemma 3n / Gemma 4's per-layer input embeddings
    read_mlp,  # dense
    read_experts,  # moe
    read_layer_params,  # each layer's parameters, from all of the above
    read_quantization,  # quantization
    read_vision,  # multimodal
    read_latent_sizes,  # mla: indexer key, per-head K width, kv_b_proj
    read_rotary,  # dense: rotary width and scalings, logit softcap, output gate, MTP layers
)


def _resolve(raw: dict[str, Any], raw_text: dict[str, Any], parsed: Any, rejected: str | None) -> ModelShape:
    if parsed is not None:
        text = parsed.get_text_config(decoder=True) if hasattr(parsed, "get_text_config") else parsed
        f = Fields(text, raw_text, parsed, raw)
        parsed_with = "transformers"
    else:
        f = Fields(raw_text, raw)
        parsed_with = "raw JSON"
    notes: list[str] = [f"{rejected}: read from the file alone"] if rejected else []
    r = Reading(f, raw, raw_text, parsed, parsed_with, notes, str(raw.get("model_type") or "unknown"))
    for reader in READERS:
        reader(r)
    return _shape(r)


def _shape(r: Reading) -> ModelShape:
    kinds = r.kinds
    embedding = r.vocab * r.hidden
    architectures = _architectures(r.raw)
    # last: the note on unread fields needs every look-up the readers made
    notes = (*r.notes, *unread_memory_fields(r.raw_text, r.raw, r.f), *unknown_fields_note(r.raw_text, r.raw))
    return ModelShape(
        model_type=r.model_type,
        config_dtype=r.config_dtype,
        num_layers=r.num_layers,
        layer_kinds=tuple(kinds),
        recurrent_checkpoint_alignment=r.checkpoint_alignment,
        index_head_dim=r.index_head_dim,
        layer_compress_ratios=tuple(r.ratios),
        window_without_layer_types=r.global_window,
        hidden_size=r.hidden,
        num_attention_heads=r.heads,
        num_kv_heads=r.kv_heads,
        head_dim=r.head_dim,
        sliding_window=r.sliding_window if "sliding" in kinds or "compressed" in kinds else None,
        attention_chunk_size=r.chunk if "chunked" in kinds else None,
        mla_latent_dim=r.mla_latent,
        layer_kv_heads=r.layer_kv_heads,
        sliding_window_size=r.window_size if "sliding" in kinds and r.window_size != r.sliding_window else None,
        layer_head_dims=r.layer_head_dims,
        layer_v_head_dims=r.layer_v_dims,
        mla_head_dim=r.mla_head_dim,
        mla_kv_b_proj_params=r.mla_kv_b_proj,
        recurrent_state_elements=r.state_elements,
        recurrent_conv_elements=r.conv_elements,
        recurrent_state_dtype=r.state_dtype,
        recurrent_ssm_dtype_named=r.ssm_dtype_named,
        vocab_size=r.vocab,
        logit_softcap=r.logit_softcap,
        max_position_embeddings=r.max_pos,
        tie_word_embeddings=r.tied,
        intermediate_size=r.intermediate,
        moe_intermediate_size=r.moe_inter if r.num_experts else 0,
        num_experts=r.num_experts,
        num_experts_per_tok=r.top_k,
        embedding_params=embedding,
        lm_head_params=0 if r.tied else embedding,
        vision_params=r.vision,
        vision_tower=r.vision_tower,
        per_layer_input_size=r.per_layer_input_size,
        per_layer_input_vocab=r.per_layer_input_vocab,
        layer_params=tuple(r.layer_params),
        weights_quantization=str(r.quant_method) if r.quant_method else None,
        weights_quantization_format=r.weights_format,
        attention_quantization_format=r.attention_format,
        dense_mlp_unquantized=r.mlp_unquantized,
        gated_mlp=r.gated,
        rotary_dim=r.rotary_dim,
        rope_scalings=r.rope_scalings,
        mrope=r.mrope,
        attention_output_gate=r.attention_output_gate,
        mtp_layers=r.mtp_layers,
        original_max_position_embeddings=r.original_max_pos,
        parsed_with=r.parsed_with,
        architectures=architectures,
        notes=notes,
        fields_read=frozenset(r.f.asked),
    )


def _architectures(raw: dict) -> tuple[str, ...]:
    value = raw.get("architectures")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise KvsizeError(f"config.json field 'architectures' must be a list of class names, got {value!r}")
    return tuple(value)

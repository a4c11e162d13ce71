"""Multi-head latent attention (DeepSeek-V2/V3, Kimi, GLM-5): one latent of kv_lora_rank plus the rotary key
per token, the DeepSeek sparse-attention indexer, and DeepSeek-V4's compressed attention (a window of
head_dim-wide latents plus one compressed latent per compress ratio tokens)."""

from __future__ import annotations

from typing import Any

from ..errors import KvsizeError
from .fields import Fields, as_int, is_architecture
from .reading import Reading

# every config field this module's readers look up
FIELDS = ("architectures", "compress_rates", "compress_ratios", "index_head_dim", "index_n_heads", "index_topk",
          "kv_lora_rank", "layer_types", "model_type", "num_nextn_predict_layers", "o_groups", "o_lora_rank",
          "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
# of them, those that change memory in vLLM's or SGLang's model code (unread.py)
MEMORY_FIELDS = ("compress_ratios", "index_head_dim", "index_n_heads", "index_topk", "kv_lora_rank", "layer_types",
                 "num_nextn_predict_layers", "q_lora_rank")


# The architectures vLLM builds with multi-head latent attention (its is_deepseek_mla model types, and the
# model classes whose attention is MLA: MiniCPM3, GLM-4.7-Flash, GLM-5), by the text config's model_type or the
# class named in architectures. kv_lora_rank on any other architecture is a field its model code never reads.
MLA_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "deepseek_mtp", "deepseek_vl_v2", "kimi_k2",
                   "kimi_k25", "kimi_k3", "kimi_linear", "kimi_vl", "longcat_flash", "pangu_ultra_moe",
                   "pangu_ultra_moe_mtp", "glm4_moe_lite", "glm_moe_dsa", "minicpm3")
MLA_ARCHITECTURES = ("DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV32ForCausalLM", "DeepSeekMTPModel",
                     "DeepseekVLV2ForCausalLM", "KimiK25ForConditionalGeneration", "KimiLinearForCausalLM",
                     "KimiVLForConditionalGeneration", "LongcatFlashForCausalLM", "PanguUltraMoEForCausalLM",
                     "Glm4MoeLiteForCausalLM", "GlmMoeDsaForCausalLM", "MiniCPM3ForCausalLM")


def read_latent(r: Reading) -> None:
    r.kv_lora = r.f.get("kv_lora_rank")
    r.f.get("model_type", "architectures")  # asked: the architecture decides whether kv_lora_rank is read
    if r.kv_lora is not None and not is_architecture(r.raw, r.raw_text, MLA_MODEL_TYPES, MLA_ARCHITECTURES):
        names = r.raw.get("architectures") or r.raw_text.get("architectures")
        name = names[0] if isinstance(names, list) and names and isinstance(names[0], str) else r.model_type
        r.notes.append(f"config.json sets kv_lora_rank, which {name} does not read: vLLM builds multi-head latent "
                       "attention only for the DeepSeek-V2/V3 family (DeepSeek, Kimi, GLM-4.7-Flash, GLM-5, "
                       "MiniCPM3); sized as the attention its heads give")
        r.kv_lora = None
    if r.kv_lora is not None:
        r.mla_latent = as_int(r.kv_lora, "kv_lora_rank", 1) + as_int(r.f.get("qk_rope_head_dim", default=0),
                                                                    "qk_rope_head_dim")


def read_compression(r: Reading) -> None:
    ratios = _compress_ratios(r.f, r.num_layers)
    if ratios:
        # Every attention layer keeps the window of latents; the ratio says what it keeps beyond it.
        r.kinds = ["compressed" if k in ("full", "sliding", "compressed") else k for k in r.kinds]
        r.global_window = False
        if r.kv_lora is not None:
            raise KvsizeError("config.json gives both compress ratios and kv_lora_rank; kvsize knows compressed "
                              "attention only with one head_dim-wide latent per token (DeepSeek-V4)")
        # One head_dim-wide latent per token serves as both K and V (vllm/models/deepseek_v4/attention.py).
        r.mla_latent = r.head_dim
    elif "compressed" in r.kinds:
        raise KvsizeError("config.json has compressed-attention layers but no compress_rates or compress_ratios")
    r.ratios = ratios


def _compress_ratios(f: Fields, num_layers: int) -> list[int]:
    """DeepSeek-V4's compress ratio per layer, 1 for window-only layers; [] for models without them.
    transformers' DeepseekV4Config turns the file's compress_ratios (one per layer, then one per MTP layer)
    into layer_types and compress_rates; vLLM reads the ratio of a layer's type, 0 meaning window only."""
    rates = f.get("compress_rates")
    layer_types = f.get("layer_types")
    if isinstance(rates, dict) and isinstance(layer_types, (list, tuple)):
        ratios = [as_int(rates.get(entry, 0), f"compress_rates[{entry!r}]") for entry in layer_types]
        name = "compress_rates"
    else:
        listed = f.get("compress_ratios")
        if listed is None:
            return []
        mtp = as_int(f.get("num_nextn_predict_layers", default=0), "num_nextn_predict_layers")
        if not isinstance(listed, (list, tuple)) or len(listed) not in (num_layers, num_layers + mtp):
            raise KvsizeError(f"config.json: compress_ratios needs one entry per layer ({num_layers}, or "
                              f"{num_layers + mtp} with the MTP layers)")
        ratios = [as_int(x, "compress_ratios") for x in listed[:num_layers]]
        name = "compress_ratios"
    if any(r not in COMPRESS_RATIOS for r in ratios):
        raise KvsizeError(f"config.json: {name} entries must be one of {', '.join(map(str, COMPRESS_RATIOS))}; "
                          f"got {sorted(set(ratios) - set(COMPRESS_RATIOS))}")
    return [max(1, r) for r in ratios]


# The ratios DeepSeek-V4's compressor is built for (vllm/models/deepseek_v4/compressor.py: 4 or 128; 0 is none).
COMPRESS_RATIOS = (0, 4, 128)


def latent_attention_params(f: Fields, hidden: int, heads: int, head_dim: int, kv_lora: Any) -> int:
    rope = f.get("qk_rope_head_dim", default=0)
    nope = f.get("qk_nope_head_dim", default=0)
    v_dim = f.get("v_head_dim", default=head_dim)
    q_lora = f.get("q_lora_rank")
    q_head = heads * (nope + rope)
    q = hidden * q_lora + q_lora + q_lora * q_head if q_lora else hidden * q_head
    kv = hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
    return q + kv + heads * v_dim * hidden


def compressed_attention_params(f: Fields, hidden: int, heads: int, head_dim: int, ratio: int) -> int:
    """DeepSeek-V4 attention (vllm/models/deepseek_v4/attention.py, compressor.py): low-rank Q, one
    head_dim-wide KV projection, a grouped low-rank output, and at ratio > 1 a compressor (KV and gate of
    coff × head_dim, coff 2 at ratio 4) whose ratio-4 layers also carry an indexer with its own compressor."""
    q_lora = as_int(f.get("q_lora_rank", default=0), "q_lora_rank")
    o_lora = as_int(f.get("o_lora_rank", default=0), "o_lora_rank")
    q = hidden * q_lora + q_lora * heads * head_dim if q_lora else hidden * heads * head_dim
    kv = hidden * head_dim
    o = heads * head_dim * o_lora + as_int(f.get("o_groups", default=1), "o_groups", 1) * o_lora * hidden \
        if o_lora else heads * head_dim * hidden
    params = q + kv + o
    if ratio > 1:
        coff = 2 if ratio == 4 else 1
        params += hidden * 2 * coff * head_dim + ratio * coff * head_dim  # fused KV/gate projection, ape
    if ratio == 4:
        index_heads = as_int(f.get("index_n_heads", default=0), "index_n_heads")
        index_dim = as_int(f.get("index_head_dim", default=0), "index_head_dim")
        params += q_lora * index_heads * index_dim + hidden * index_heads  # indexer queries, head weights
        params += hidden * 2 * 2 * index_dim + ratio * 2 * index_dim  # the indexer's compressor
    return params


def read_latent_sizes(r: Reading) -> None:
    """The indexer key's width, the per-head K width, and the kv_b_proj an absorbing engine copies."""
    f, kv_lora = r.f, r.kv_lora
    r.index_head_dim = as_int(f.get("index_head_dim", default=0), "index_head_dim") \
        if f.get("index_topk") is not None or "indexed_attention" in (f.get("layer_types") or ()) else 0
    r.mla_head_dim = as_int(f.get("qk_nope_head_dim", default=0), "qk_nope_head_dim") \
        + as_int(f.get("qk_rope_head_dim", default=0), "qk_rope_head_dim") if r.mla_latent and \
        f.get("qk_nope_head_dim") is not None else 0
    r.mla_kv_b_proj = r.heads * (as_int(f.get("qk_nope_head_dim", default=0), "qk_nope_head_dim")
                                 + as_int(f.get("v_head_dim", default=r.head_dim), "v_head_dim")) \
        * as_int(kv_lora, "kv_lora_rank", 1) if kv_lora is not None and not r.ratios else 0

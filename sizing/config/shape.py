"""A model's shape: the plain, frozen `ModelShape` that the rest of kvsize works from and that bundled
profiles store, resolved from a config.json by read.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ..errors import KvsizeError
from ..hashing import hash_once

DTYPE_NAMES = {
    "float32": "fp32", "float": "fp32", "fp32": "fp32",
    "float16": "fp16", "half": "fp16", "fp16": "fp16",
    "bfloat16": "bf16", "bf16": "bf16",
}
# a checkpoint's attention format where its attention projections are left unquantized (the model dtype)
MODEL_DTYPE = "model"
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class LayerParams:
    """Parameters of one decoder layer, by how they are stored."""

    attention: int  # q/k/v/o projections, MLA projections, or the recurrent mixer's projections
    mlp: int  # dense MLP and shared experts
    experts: int  # routed experts (what mxfp4 checkpoints quantize)
    other: int  # norms, routers, biases, convolution weights: kept in the model dtype


@hash_once
@dataclass(frozen=True)
class ModelShape:
    model_type: str
    config_dtype: str
    num_layers: int
    layer_kinds: tuple[str, ...]
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None
    attention_chunk_size: int | None
    mla_latent_dim: int | None
    recurrent_state_elements: int  # per sequence per recurrent layer, before TP sharding
    recurrent_state_dtype: str  # of the SSM / delta-rule state (mamba_ssm_cache_dtype)
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    intermediate_size: int
    moe_intermediate_size: int
    num_experts: int
    num_experts_per_tok: int
    embedding_params: int
    lm_head_params: int
    vision_params: int
    layer_params: tuple[LayerParams, ...]
    weights_quantization: str | None = None
    # a compressed-tensors or ModelOpt checkpoint's weight scheme as one of kvsize's weight formats (None: not
    # one); its attention projections' format where it differs (MODEL_DTYPE: left unquantized); and whether
    # its dense MLPs and shared experts are left unquantized (the routed experts alone quantized)
    weights_quantization_format: str | None = None
    attention_quantization_format: str | None = None
    dense_mlp_unquantized: bool = False
    gated_mlp: bool = True
    rotary_dim: int = 0  # rotary embedding width (vLLM caches max_position x rotary_dim cos/sin values)
    recurrent_conv_elements: int = 0  # of recurrent_state_elements: the conv state, kept in the model dtype
    # the SSM dtype the config's own mamba_ssm_dtype names, the one key SGLang reads ('' where unset)
    recurrent_ssm_dtype_named: str = ""
    # The window comes from a global sliding_window with no layer_types (Mistral-7B-v0.1): transformers
    # masks every layer with it, while vLLM applies windows only to layers layer_types marks sliding.
    window_without_layer_types: bool = False
    # Token alignment of a recurrent layer's prefill checkpoints in vLLM's prefix-caching "align" mode:
    # gated delta net with FlashInfer's prefill 64 (vllm/v1/attention/backends/gdn_attn.py), Mamba-2 1.
    recurrent_checkpoint_alignment: int = 1
    index_head_dim: int = 0  # DeepSeek sparse attention's indexer key width (DeepSeek-V3.2, GLM-5); 0: none
    # An MLA model's per-head K width, qk_nope_head_dim + qk_rope_head_dim: what an engine that does not
    # build the MLA cache keeps per head (vLLM's MiniCPM3); 0 when not MLA or not given.
    mla_head_dim: int = 0
    # An MLA layer's kv_b_proj parameters, heads x (qk_nope_head_dim + v_head_dim) x kv_lora_rank: the up-projection
    # an engine that absorbs it into the query and output keeps a second, contiguous copy of (SGLang's w_kc, w_vc)
    mla_kv_b_proj_params: int = 0
    # Per-layer attention geometry where layers differ (empty: every layer has num_kv_heads and head_dim):
    # NAS block_configs (n_heads_in_group per layer), sliding layers with their own KV heads or widths
    # (MiMo-V2's swa_*), V narrower than K (v_head_dim).
    layer_kv_heads: tuple[int, ...] = ()
    # config.json's sliding_window_size where transformers' window differs from it (MiMo-V2: transformers
    # attends sliding_window_size previous tokens plus the query, vLLM's model passes sliding_window_size).
    sliding_window_size: int | None = None
    layer_head_dims: tuple[int, ...] = ()
    layer_v_head_dims: tuple[int, ...] = ()
    # RoPE scalings as (rope_type, factor or None, original_max_position_embeddings or None), one per
    # rope_parameters entry (per layer type where the config gives one per type); engines derive their
    # default max_model_len from them and from the config's own original_max_position_embeddings.
    # Multi-token-prediction layers the checkpoint carries beside its decoder (num_nextn_predict_layers,
    # mtp_num_hidden_layers): speculative decoding with them adds their KV and weights (with_mtp_layers).
    mtp_layers: int = 0
    # final_logit_softcapping (Gemma-2): vLLM's LogitsProcessor caps the logits out of place, so two
    # model-dtype copies of them are live at once
    logit_softcap: bool = False
    rope_scalings: tuple[tuple[str, float | None, int | None], ...] = ()
    original_max_position_embeddings: int | None = None
    # multimodal RoPE (rope parameters with mrope_section): vLLM's MRotaryEmbedding caches 4 x the positions
    mrope: bool = False
    # attention with an output gate: the query projection doubles (attn_output_gate: Qwen3-Next, Qwen3.5)
    attention_output_gate: bool = False
    # DeepSeek-V4's compress ratio per layer (compress_ratios, or transformers' compress_rates by layer type):
    # 1 keeps only the sliding window of latents; 4 and 128 also keep one compressed latent per that many
    # tokens (4 with an indexer key). Empty for every other model.
    layer_compress_ratios: tuple[int, ...] = ()
    # Per-layer input embeddings (Gemma 3n, Gemma 4 E2B/E4B: hidden_size_per_layer_input, 0: none): a second
    # embedding table of vocab_size_per_layer_input rows x num_layers x this width, a projection from the hidden
    # state to the same width, and per layer a gate (hidden -> width) and a projection back (width -> hidden)
    per_layer_input_size: int = 0
    per_layer_input_vocab: int = 0  # vocab_size_per_layer_input (0 without per-layer inputs)
    vision_tower: tuple[int, int] | None = None  # (layers, hidden size) as SGLang's default fraction reads them
    parsed_with: str = "transformers"
    architectures: tuple[str, ...] = ()  # config.json's architectures: which vLLM model runner serves it
    notes: tuple[str, ...] = field(default=())
    # every config field the reader looked up (memory-relevant fields not among them are named in a note)
    fields_read: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    served_dtype: str | None = None  # --dtype given to the engine; None: the engine's auto rule

    @property
    def attention_unquantized(self) -> bool:
        return self.attention_quantization_format == MODEL_DTYPE

    @property
    def serving_dtype(self) -> str:
        if self.served_dtype:
            return self.served_dtype
        # vLLM serves fp32 checkpoints in bf16 (vllm/config/model.py, _resolve_auto_dtype)
        return "bf16" if self.config_dtype == "fp32" else self.config_dtype

    @property
    def is_mla(self) -> bool:
        return self.mla_latent_dim is not None

    @property
    def mla_kv_lora_rank(self) -> int:
        """The MLA latent less its rotary part (kv_lora_rank): what the absorbed decode outputs per head and what
        kv_b_proj up-projects from; 0 without MLA."""
        return self.mla_latent_dim - self.rotary_dim if self.is_mla else 0

    @property
    def per_layer_input_width(self) -> int:
        """The width of the per-layer embedding table and of its projection: layers x per-layer input size."""
        return self.num_layers * self.per_layer_input_size

    @property
    def per_layer_input_params(self) -> int:
        """Per-layer inputs' parameters: the table and the projection into it with its norm, then per layer
        the gate, the projection back and its norm."""
        d, h = self.per_layer_input_size, self.hidden_size
        if not d:
            return 0
        return ((self.per_layer_input_vocab + h) * self.per_layer_input_width + d
                + self.num_layers * (2 * h * d + h))

    @property
    def total_params(self) -> int:
        return (self.embedding_params + self.lm_head_params + self.vision_params + self.per_layer_input_params
                + sum(p.attention + p.mlp + p.experts + p.other for p in self.layer_params))

    @property
    def attention_class(self) -> str:
        if self.is_mla:
            return "MLA"
        if self.num_kv_heads == 1:
            return "MQA"
        return "MHA" if self.num_kv_heads == self.num_attention_heads else "GQA"

    def compress_ratio_of(self, layer: int) -> int:
        return self.layer_compress_ratios[layer] if self.layer_compress_ratios else 1

    def kv_heads_of(self, layer: int) -> int:
        return self.layer_kv_heads[layer] if self.layer_kv_heads else self.num_kv_heads

    def head_dim_of(self, layer: int) -> int:
        return self.layer_head_dims[layer] if self.layer_head_dims else self.head_dim

    def v_head_dim_of(self, layer: int) -> int:
        return self.layer_v_head_dims[layer] if self.layer_v_head_dims else self.head_dim_of(layer)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["fields_read"] = sorted(self.fields_read)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelShape:
        data = dict(data)
        data["layer_kinds"] = tuple(data["layer_kinds"])
        data["layer_params"] = tuple(LayerParams(**p) for p in data["layer_params"])
        data["notes"] = tuple(data.get("notes", ()))
        data["fields_read"] = frozenset(data.get("fields_read", ()))
        for key in ("layer_kv_heads", "layer_head_dims", "layer_v_head_dims", "layer_compress_ratios", "architectures"):
            data[key] = tuple(data.get(key, ()))
        data["rope_scalings"] = tuple(tuple(r) for r in data.get("rope_scalings", ()))
        if data.get("vision_tower") is not None:
            data["vision_tower"] = tuple(data["vision_tower"])
        return cls(**data)


def with_mtp_layers(shape: ModelShape, n: int) -> ModelShape:
    """The model with `n` of its MTP layers running as speculative-decoding drafters. Each is a decoder
    layer after the last (vLLM's deepseek_mtp.py: layers num_hidden_layers.. with their own attention,
    whose KV joins the target's pool and groups, v1/worker/gpu/attn_utils.py) plus a 2h x h projection
    (eh_proj) and two norms; embeddings and the head are the target's."""
    if n == 0:
        return shape
    if not shape.mtp_layers:
        raise KvsizeError(f"--mtp-layers {n}: config.json gives no MTP layers (num_nextn_predict_layers or "
                          "mtp_num_hidden_layers); this model has none to speculate with")
    if not 0 < n <= shape.mtp_layers:
        raise KvsizeError(f"--mtp-layers {n}: config.json gives {shape.mtp_layers} MTP layer(s) "
                          f"(num_nextn_predict_layers); use 1 to {shape.mtp_layers}")
    # The drafter's attention is the model's full attention (its last full-attention layer's shape);
    # DeepSeek-V4's keeps only the window of latents (vLLM gives layers past num_hidden_layers ratio 1).
    drafter = "compressed" if shape.layer_compress_ratios else "full"
    last = max(i for i, k in enumerate(shape.layer_kinds) if k == drafter)
    base = shape.layer_params[last]
    h = shape.hidden_size
    extra = LayerParams(base.attention, base.mlp, base.experts, base.other + 2 * h * h + 2 * h)

    def more(values: tuple) -> tuple:
        return values + (values[last],) * n if values else values

    ratios = shape.layer_compress_ratios + (1,) * n if shape.layer_compress_ratios else ()
    return replace(shape, num_layers=shape.num_layers + n, layer_kinds=shape.layer_kinds + (drafter,) * n,
                   layer_compress_ratios=ratios,
                   layer_params=shape.layer_params + (extra,) * n, layer_kv_heads=more(shape.layer_kv_heads),
                   layer_head_dims=more(shape.layer_head_dims), layer_v_head_dims=more(shape.layer_v_head_dims),
                   mtp_layers=shape.mtp_layers - n)

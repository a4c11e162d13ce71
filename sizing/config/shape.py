"""A model's shape, resolved from a Hugging Face config.json.

transformers' config classes know each family's defaults (layer patterns, head sizes,
vocabulary sizes), so a config whose `model_type` transformers knows is read through
its config class (never with remote code, never over the network). Unknown types fall
back to the raw JSON under the common field names. The result is a plain, frozen
`ModelShape` that the rest of kvsize works from and that bundled profiles store.
"""

from __future__ import annotations

import math

import json
import os
import re
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ..hashing import hash_once
from ..errors import KvsizeError
from ..inputs import limited_text, read_limited

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a real config.json is a few KiB; refuse anything huge

# What each layer holds. "full", "sliding" and "chunked" hold per-token K and V (or the
# MLA latent); "recurrent" holds a fixed-size state per sequence; "none" holds nothing; "shared"
# attends with an earlier layer's cache (Gemma 3n's and Gemma 4's num_kv_shared_layers) and holds nothing.
# "compressed" (DeepSeek-V4) keeps a window of latents plus, every compress ratio tokens, a compressed latent.
LAYER_TYPE_KINDS = {
    "compressed_sparse_attention": "compressed",  # DeepSeek-V4 C4A: ratio 4, with an indexer
    "heavily_compressed_attention": "compressed",  # DeepSeek-V4 HCA: ratio 128
    "full_attention": "full",
    "indexed_attention": "full",  # DeepSeek sparse attention: the MLA latent plus an indexer key (index_head_dim)
    "attention": "full",
    "global_attention": "full",
    "sliding_attention": "sliding",
    "local_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "recurrent",
    "mamba": "recurrent",
    "mamba2": "recurrent",
    "conv": "recurrent",
    "mlp": "none",
    "moe": "none",
}
HYBRID_PATTERN_KINDS = {"*": "full", "M": "recurrent", "-": "none", "E": "none"}
# Blocks that carry only a feed-forward part (Nemotron-H): their neighbours carry no MLP.
FEED_FORWARD_BLOCKS = {"mlp": "mlp", "moe": "moe", "-": "mlp", "E": "moe"}

DTYPE_NAMES = {
    "float32": "fp32", "float": "fp32", "fp32": "fp32",
    "float16": "fp16", "half": "fp16", "fp16": "fp16",
    "bfloat16": "bf16", "bf16": "bf16",
}
# a checkpoint's attention format where its attention projections are left unquantized (the model dtype)
MODEL_DTYPE = "model"
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


# Experts each token is routed to, under every spelling a published config uses (Mixtral/Qwen, gpt-oss,
# Hunyuan, Gemma 4, DeepSeek's n_activated in its reference configs)
TOP_K_FIELDS = ("num_experts_per_tok", "experts_per_token", "moe_top_k", "top_k_experts", "moe_topk",
                "n_activated_experts", "num_activated_experts", "num_experts_per_token", "num_selected_experts")

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
    def total_params(self) -> int:
        return (self.embedding_params + self.lm_head_params + self.vision_params
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
        return cls(**data)


# -- reading config.json ---------------------------------------------------------------


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A config.json (or a folder holding one) as a dict, with clear errors."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise KvsizeError(f"--model: no config.json at {path}")
    return parse_config_text(read_limited(path, MAX_CONFIG_BYTES, "--model", "a config.json"), str(path))


def parse_config_text(data: bytes | str, where: str = "config.json") -> dict[str, Any]:
    data = limited_text(data, MAX_CONFIG_BYTES, where, "a config.json")
    try:
        # Infinity and NaN are read as Python's json writes them (NVIDIA's Mamba hybrids publish
        # "time_step_limit": [0.0, Infinity]); a field kvsize uses is checked where it is used.
        config = json.loads(data)
    except json.JSONDecodeError as e:
        raise KvsizeError(f"{where} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except RecursionError:
        raise KvsizeError(f"{where} nests arrays or objects too deeply to be a config.json") from None
    if not isinstance(config, dict):
        raise KvsizeError(f"{where} must hold a JSON object, got {type(config).__name__}")
    return config


def _transformers_config(raw: dict[str, Any]) -> Any | None:
    """transformers' config object for a known model_type, or None for unknown types."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        return None
    hide_torch = "torch" not in sys.modules and "transformers" not in sys.modules
    advisory = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    if hide_torch:
        # Parsing a config needs no torch; importing it would cost seconds at every start. transformers
        # would then advise that PyTorch was not found, which is by design here, not news for the user.
        sys.modules["torch"] = None  # type: ignore[assignment]
        os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    finally:
        if hide_torch:
            del sys.modules["torch"]
            if advisory is None:
                os.environ.pop("TRANSFORMERS_NO_ADVISORY_WARNINGS", None)
            else:
                os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = advisory
    if model_type not in CONFIG_MAPPING:
        return None
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        return CONFIG_MAPPING[model_type].from_dict(dict(raw))
    except Exception as e:  # transformers validates values; surface its message as ours
        reason = " ".join(str(e).split())  # one line: transformers' validation messages span several
        raise KvsizeError(f"config.json ({model_type}) rejected by its transformers config class: "
                          f"{reason[:300]}") from None


def _lookup(source: Any, name: str) -> tuple[bool, Any]:
    if isinstance(source, dict):
        return name in source, source.get(name)
    try:
        return True, getattr(source, name)
    except AttributeError:
        return False, None
    except RuntimeError:
        # transformers' heterogeneous configs (Gemma 4) refuse a global read of a per-layer field;
        # the per-layer values are read with _Fields.per_layer, the file's global value stands here.
        return False, None


class _Fields:
    """Looks fields up on the text config, then the outer config, then the raw JSON."""

    def __init__(self, *sources: Any) -> None:
        self.sources = [s for s in sources if s is not None]
        self.asked: set[str] = set()  # every field name looked up: what a memory-relevant field's presence needs

    def get(self, *names: str, default: Any = None) -> Any:
        # The first source that has the field decides, even when it says None: transformers
        # sets sliding_window to None when use_sliding_window is false, and that must win.
        self.asked.update(names)
        for source in self.sources:
            for name in names:
                present, value = _lookup(source, name)
                if present:
                    return default if value is None else value
        return default

    def per_layer(self, name: str, num_layers: int) -> tuple | None:
        """A field transformers' heterogeneous configs keep per layer (per_layer_config), else None."""
        self.asked.add(name)
        for source in self.sources:
            if isinstance(source, dict):
                continue
            attributes, layers = _lookup(source, "per_layer_attributes")[1], _lookup(source, "per_layer_config")[1]
            if name in (attributes or ()) and layers is not None:
                if len(layers) != num_layers:
                    raise KvsizeError(f"config.json: per-layer {name} for {len(layers)} layers, "
                                      f"num_hidden_layers is {num_layers}")
                return tuple(getattr(layer, name) for layer in layers)
        return None

    def need_int(self, *names: str, minimum: int = 1) -> int:
        value = self.get(*names)
        if value is None:
            raise KvsizeError(f"config.json is missing {names[0]!r} (also looked for {', '.join(names[1:]) or 'nothing else'})")
        return _as_int(value, names[0], minimum)


def _logit_softcap(value: Any) -> bool:
    """Whether the config caps its final logits (null or 0: no cap)."""
    if value is None:
        return False
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise KvsizeError(f"config.json field 'final_logit_softcapping' must be a number of 0 or more (0 or null: no cap), got {value!r}")
    return value > 0


def _as_int(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise KvsizeError(f"config.json field {name!r} must be a finite integer, got {value}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise KvsizeError(f"config.json field {name!r} must be an integer, got {value!r}")
    if value < minimum:
        raise KvsizeError(f"config.json field {name!r} must be at least {minimum}, got {value}")
    return int(value)


def _config_flag(value: Any, name: str) -> bool:
    """A true/false config field as JSON gives it; a string ("false") or a number is refused, never read as
    its truthiness."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    raise KvsizeError(f"config.json field {name!r} is {type(value).__name__} {str(value)[:20]!r}; it must be "
                      "true or false")


def _dtype_name(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).removeprefix("torch.")
    return DTYPE_NAMES.get(text)


# No published model comes near these; larger values are typos or hostile files (and would make
# kvsize build millions of per-layer specs).
# max_position_embeddings: 2^27 tokens, 12.8 x the longest context a published config gives (Llama 4 Scout,
# 10,485,760); beyond it the rotary cache alone would be the figure an error blamed
SHAPE_LIMITS = {"num_hidden_layers": 4096, "hidden_size": 1 << 20, "num_attention_heads": 1 << 14,
                "vocab_size": 1 << 24, "max_position_embeddings": 1 << 27}


def _within_limit(value: int, name: str) -> int:
    if value > SHAPE_LIMITS[name]:
        raise KvsizeError(f"config.json field {name!r} is {value:,}; kvsize accepts at most {SHAPE_LIMITS[name]:,}")
    return value


# Where multimodal configs keep their language model: transformers' text_config, DeepSeek-VL2's and
# Janus's language_config, InternVL's llm_config.
NESTED_TEXT_KEYS = ("text_config", "language_config", "llm_config")


def _require_in_json(raw_text: dict, raw: dict, *names: str) -> None:
    """A core field must be in the file itself: transformers' class defaults describe some other model."""
    if not any(name in source for source in (raw_text, raw) for name in names):
        raise KvsizeError(f"config.json is missing {names[0]!r} (also looked for {', '.join(names[1:])}); "
                          "a config without it cannot be sized")


def resolve_shape(raw: dict[str, Any]) -> ModelShape:
    """The shape of the model a config.json describes."""
    if not isinstance(raw, dict):
        raise KvsizeError("config.json must hold a JSON object")
    for key in NESTED_TEXT_KEYS:
        if key in raw and raw[key] is not None and not isinstance(raw[key], dict):
            raise KvsizeError(f"config.json field {key!r} must be an object")
    raw_text = next((raw[k] for k in NESTED_TEXT_KEYS if isinstance(raw.get(k), dict) and raw[k]), raw)
    rejected = None
    try:
        parsed = _transformers_config(raw)
        if parsed is None and raw_text is not raw:
            # an outer model_type transformers does not know (Janus's multi_modality) around a language
            # model it does (llama): the language model's class gives its defaults
            parsed = _transformers_config(raw_text)
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


def _resolve(raw: dict[str, Any], raw_text: dict[str, Any], parsed: Any, rejected: str | None) -> ModelShape:
    if parsed is not None:
        text = parsed.get_text_config(decoder=True) if hasattr(parsed, "get_text_config") else parsed
        f = _Fields(text, raw_text, parsed, raw)
        parsed_with = "transformers"
    else:
        f = _Fields(raw_text, raw)
        parsed_with = "raw JSON"
    notes: list[str] = [f"{rejected}: read from the file alone"] if rejected else []

    model_type = str(raw.get("model_type") or "unknown")
    if parsed is None:
        # Without a transformers class there are no defaults: the core fields must be in the file.
        # With one, its defaults are the model's at every level (llava's text_config names llama and
        # leaves the rest to LlamaConfig), as transformers and vLLM build it.
        for names in (("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
                      ("hidden_size", "n_embd", "n_embed", "d_model", "dim")):
            _require_in_json(raw_text, raw, *names)
    num_layers = _within_limit(f.need_int("num_hidden_layers", "n_layer", "num_layers", "n_layers"), "num_hidden_layers")
    hidden = _within_limit(f.need_int("hidden_size", "n_embd", "n_embed", "d_model", "dim"), "hidden_size")
    heads = _within_limit(f.need_int("num_attention_heads", "n_head", "num_heads", "n_heads"), "num_attention_heads")

    nas = _nas_blocks(f, num_layers, heads, hidden)
    kv_heads = next((h for h in nas.kv_heads if h), heads) if nas else _kv_heads(f, heads)
    head_dim = _as_int(f.get("head_dim", "kv_channels", "attention_head_dim", default=hidden // heads), "head_dim", 1)
    if kv_heads > heads:
        raise KvsizeError(f"config.json: num_key_value_heads {kv_heads} exceeds num_attention_heads {heads}")
    if heads % kv_heads:
        raise KvsizeError(f"config.json: num_attention_heads {heads} is not a multiple of num_key_value_heads "
                          f"{kv_heads}; grouped-query attention needs whole groups")

    kv_lora = f.get("kv_lora_rank")
    mla_latent = None
    if kv_lora is not None:
        mla_latent = _as_int(kv_lora, "kv_lora_rank", 1) + _as_int(f.get("qk_rope_head_dim", default=0), "qk_rope_head_dim")

    kinds, blocks, global_window = _layer_kinds(f, num_layers)
    ratios = _compress_ratios(f, num_layers)
    if ratios:
        # Every attention layer keeps the window of latents; the ratio says what it keeps beyond it.
        kinds = ["compressed" if k in ("full", "sliding", "compressed") else k for k in kinds]
        global_window = False
        if kv_lora is not None:
            raise KvsizeError("config.json gives both compress ratios and kv_lora_rank; kvsize knows compressed "
                              "attention only with one head_dim-wide latent per token (DeepSeek-V4)")
        # One head_dim-wide latent per token serves as both K and V (vllm/models/deepseek_v4/attention.py).
        mla_latent = head_dim
    elif "compressed" in kinds:
        raise KvsizeError("config.json has compressed-attention layers but no compress_rates or compress_ratios")
    if nas:
        kinds = ["full" if h else "none" for h in nas.kv_heads]
    shared = _as_int(f.get("num_kv_shared_layers", default=0), "num_kv_shared_layers")
    if shared:
        # Gemma 3n / Gemma 4: the last num_kv_shared_layers layers attend with an earlier layer's K and V
        # and keep no cache of their own.
        if shared >= num_layers:
            raise KvsizeError(f"config.json: num_kv_shared_layers {shared} leaves no layer of the "
                              f"{num_layers} to hold the cache")
        kinds = kinds[:num_layers - shared] + ["shared"] * shared
    sliding_window = f.get("sliding_window", "sliding_window_size")
    if sliding_window is not None:
        sliding_window = _as_int(sliding_window, "sliding_window", 1)
    layer_kv_heads, layer_head_dims, layer_v_dims = _layer_geometry(f, kinds, kv_heads, head_dim, nas)
    window_size = f.get("sliding_window_size")
    window_size = _as_int(window_size, "sliding_window_size", 1) if window_size is not None else None
    if ("sliding" in kinds or "compressed" in kinds) and sliding_window is None:
        raise KvsizeError("config.json has sliding-attention layers but no 'sliding_window'")
    chunk = f.get("attention_chunk_size")
    chunk = _as_int(chunk, "attention_chunk_size", 1) if chunk is not None else None
    if "chunked" in kinds and chunk is None:
        raise KvsizeError("config.json has chunked-attention layers but no 'attention_chunk_size'")

    for given in (f.get("dtype", "torch_dtype"), _Fields(parsed, raw).get("dtype", "torch_dtype")):
        if given is not None and _dtype_name(given) is None and not isinstance(given, dict):
            # a dtype kvsize cannot read is never silently taken for bf16
            raise KvsizeError(f"config.json field 'torch_dtype' is {str(given)[:40]!r}; kvsize reads "
                              f"{', '.join(sorted(DTYPE_NAMES))}")
    config_dtype = (_dtype_name(f.get("dtype", "torch_dtype"))
                    or _dtype_name(_Fields(parsed, raw).get("dtype", "torch_dtype")) or "bf16")
    state_elements, conv_elements, state_dtype, mixer_params, mixer_other = _recurrent(f, hidden, config_dtype) \
        if "recurrent" in kinds else (0, 0, config_dtype, 0, 0)
    checkpoint_alignment = GDN_CHECKPOINT_ALIGNMENT if "recurrent" in kinds and \
        f.get("linear_num_value_heads") is not None else 1

    vocab = _within_limit(f.need_int("vocab_size", "padded_vocab_size", "n_vocab"), "vocab_size")
    tied = _config_flag(f.get("tie_word_embeddings", default=False), "tie_word_embeddings")
    max_pos = _within_limit(_as_int(f.get("max_position_embeddings", "n_positions", "max_sequence_length",
                                          "seq_length", default=0), "max_position_embeddings"),
                            "max_position_embeddings")
    if max_pos == 0:
        max_pos = 4096
        notes.append("config.json gives no max_position_embeddings; assumed 4096")

    intermediate = _as_int(f.get("intermediate_size", "ffn_hidden_size", "n_inner", default=4 * hidden),
                           "intermediate_size", 1)
    gated = not (f.get("mlp_hidden_act") == "relu2"
                 or (f.get("ffn_hidden_size") is not None and f.get("intermediate_size") is None)
                 or model_type in _UNGATED_MLP)
    num_experts = _as_int(f.get("n_routed_experts", "num_local_experts", "num_experts", "moe_num_experts",
                                default=0), "num_experts")
    top_k = _as_int(f.get(*TOP_K_FIELDS, default=0), "num_experts_per_tok")
    if num_experts and not top_k:
        # the fused-MoE workspace is sized by the experts each token is routed to: never a silent zero
        notes.append(f"config.json names {num_experts} experts but no experts-per-token field kvsize reads "
                     f"({', '.join(TOP_K_FIELDS)}); the MoE workspace of the profiling run is left out")
    moe_inter = _as_int(f.get("moe_intermediate_size", default=intermediate), "moe_intermediate_size")
    moe_layers = _moe_layers(f, num_layers, num_experts, blocks)

    attention_params = _attention_params(f, hidden, heads, kv_heads, head_dim)
    layer_params = []
    for i, kind in enumerate(kinds):
        attn = mixer_params if kind == "recurrent" else (attention_params if kind != "none" else 0)
        if kind == "compressed":
            attn = _compressed_attention_params(f, hidden, heads, head_dim, ratios[i])
        if (layer_kv_heads or layer_head_dims) and kind not in ("recurrent", "none"):
            attn = _attention_params(f, hidden, heads, layer_kv_heads[i] if layer_kv_heads else kv_heads,
                                     layer_head_dims[i] if layer_head_dims else head_dim)
        if nas:
            attn += nas.linear_attention[i] * hidden * hidden
            layer_params.append(LayerParams(attn, nas.mlp_params(i, hidden), 0, 2 * hidden))
            continue
        other = 2 * hidden + (mixer_other if kind == "recurrent" else 0)
        mlp = experts = 0
        block = blocks[i] if blocks else None
        if blocks is None or block in ("mlp", "moe"):
            if i in moe_layers:
                experts = num_experts * (3 if gated else 2) * hidden * moe_inter
                other += hidden * num_experts  # router
                mlp = _shared_expert_params(f, hidden, moe_inter, intermediate, 3 if gated else 2)
            else:
                mlp = (3 if gated else 2) * hidden * _dense_intermediate(f, intermediate, num_experts)
        layer_params.append(LayerParams(attn, mlp, experts, other))

    embedding = vocab * hidden
    quant = f.get("quantization_config")
    if quant is not None and not isinstance(quant, dict) and not hasattr(quant, "to_dict"):
        raise KvsizeError(f"config.json field 'quantization_config' is {type(quant).__name__} "
                          f"{str(quant)[:40]!r}; it must be an object such as {{\"quant_method\": \"fp8\"}}")
    if quant is not None and not isinstance(quant, dict):
        quant = quant.to_dict()
    quant_method = quant.get("quant_method") if isinstance(quant, dict) else None
    scheme = QUANTIZATION_SCHEMES.get(str(quant_method))
    if scheme is None and quant_method is None and isinstance(quant, dict):
        if "quant_algo" in quant:
            scheme = QUANTIZATION_SCHEMES["modelopt"]  # ModelOpt's exports that name only their quant_algo
        elif "load_in_4bit" in quant or "load_in_8bit" in quant:
            # transformers' BitsAndBytesConfig saved without its method
            scheme = QUANTIZATION_SCHEMES["bitsandbytes"]
    ct_format, ct_attention, ct_mlp_unquantized = scheme.read(quant, num_layers) if scheme else (None, None, False)
    if isinstance(quant, dict) and quant and quant_method is None and ct_format is None and not _kv_only(quant):
        notes.append("config.json quantization_config names no quant_method kvsize reads; the weights are sized in "
                     "the model dtype: give the checkpoint's format with --weights-dtype (e.g. int4_g128_sym)")
    if quant_method is not None and str(quant_method) not in FORMAT_BY_METHOD and ct_format is None \
            and not _kv_only(quant):
        if scheme is not None:
            given = ", ".join(f"{k} {_brief(quant[k])}" for k in scheme.fields if k in quant) or "none of its settings"
            what = f"quant_method {str(quant_method)!r} with {given} (kvsize reads {scheme.accepts})"
        else:
            what = (f"quant_method {_brief(quant_method)} is not a scheme kvsize reads "
                    f"({', '.join(sorted([*QUANTIZATION_SCHEMES, *FORMAT_BY_METHOD]))})")
        notes.append(f"config.json quantization_config: {what}; the weights are sized in the model dtype: give "
                     "the checkpoint's format with --weights-dtype (e.g. int4_g128_sym)")
    vision = _vision_params(raw.get("vision_config"))
    return ModelShape(
        model_type=model_type,
        config_dtype=config_dtype,
        num_layers=num_layers,
        layer_kinds=tuple(kinds),
        recurrent_checkpoint_alignment=checkpoint_alignment,
        index_head_dim=_as_int(f.get("index_head_dim", default=0), "index_head_dim")
        if f.get("index_topk") is not None or "indexed_attention" in (f.get("layer_types") or ()) else 0,
        layer_compress_ratios=tuple(ratios),
        window_without_layer_types=global_window,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        sliding_window=sliding_window if "sliding" in kinds or "compressed" in kinds else None,
        attention_chunk_size=chunk if "chunked" in kinds else None,
        mla_latent_dim=mla_latent,
        layer_kv_heads=layer_kv_heads,
        sliding_window_size=window_size if "sliding" in kinds and window_size != sliding_window else None,
        layer_head_dims=layer_head_dims,
        layer_v_head_dims=layer_v_dims,
        mla_head_dim=_as_int(f.get("qk_nope_head_dim", default=0), "qk_nope_head_dim")
        + _as_int(f.get("qk_rope_head_dim", default=0), "qk_rope_head_dim") if mla_latent and
        f.get("qk_nope_head_dim") is not None else 0,
        mla_kv_b_proj_params=heads * (_as_int(f.get("qk_nope_head_dim", default=0), "qk_nope_head_dim")
                                      + _as_int(f.get("v_head_dim", default=head_dim), "v_head_dim"))
        * _as_int(kv_lora, "kv_lora_rank", 1) if kv_lora is not None and not ratios else 0,
        recurrent_state_elements=state_elements,
        recurrent_conv_elements=conv_elements,
        recurrent_state_dtype=state_dtype,
        vocab_size=vocab,
        logit_softcap=_logit_softcap(f.get("final_logit_softcapping", default=None)),
        max_position_embeddings=max_pos,
        tie_word_embeddings=tied,
        intermediate_size=intermediate,
        moe_intermediate_size=moe_inter if num_experts else 0,
        num_experts=num_experts,
        num_experts_per_tok=top_k,
        embedding_params=embedding,
        lm_head_params=0 if tied else embedding,
        vision_params=vision,
        layer_params=tuple(layer_params),
        weights_quantization=str(quant_method) if quant_method else None,
        weights_quantization_format=ct_format,
        attention_quantization_format=ct_attention,
        dense_mlp_unquantized=ct_mlp_unquantized,
        gated_mlp=gated,
        rotary_dim=_rotary_dim(f, head_dim, mla_latent is not None),
        rope_scalings=_rope_scalings(f),
        mrope=_mrope(f),
        attention_output_gate=f.get("attn_output_gate", default=False) is True,
        mtp_layers=_as_int(f.get("num_nextn_predict_layers", "mtp_num_hidden_layers", default=0), "num_nextn_predict_layers"),
        original_max_position_embeddings=_optional_int(f.get("original_max_position_embeddings"),
                                                       "original_max_position_embeddings"),
        parsed_with=parsed_with,
        architectures=_architectures(raw),
        notes=(*notes, *unread_memory_fields(raw_text, raw, f)),
        fields_read=frozenset(f.asked),
    )



# Config fields that change memory in vLLM's or SGLang's model code (the KV cache's layers, heads and windows,
# the experts a token is routed to, shared experts, per-layer types, sinks, indexers, MTP layers, recurrent
# state): each is read, or its presence is named in a note, never passed over in silence.
MEMORY_RELEVANT_FIELDS = frozenset({
    *TOP_K_FIELDS, "n_shared_experts", "num_shared_experts", "shared_expert_intermediate_size",
    "moe_shared_expert_intermediate_size", "layer_types", "hybrid_override_pattern", "layers_block_type",
    "attn_type_list", "full_attention_interval", "sliding_window_pattern", "sliding_window", "attention_chunk_size",
    "index_topk", "index_head_dim", "index_n_heads", "num_nextn_predict_layers", "mtp_num_hidden_layers",
    "kv_lora_rank", "q_lora_rank", "num_key_value_heads", "head_dim", "first_k_dense_replace", "moe_layer_freq",
    "decoder_sparse_step", "mlp_only_layers", "num_kv_shared_layers", "global_attn_every_n_layers",
    "cross_attention_layers", "attention_sinks", "use_sinks", "linear_num_key_heads", "linear_num_value_heads",
    "linear_key_head_dim", "linear_value_head_dim", "mamba_d_state", "ssm_state_size", "mamba_n_heads",
    "mamba_head_dim", "compress_ratios", "kv_channels", "multi_query_group_num",
})


# Fields transformers turns into others that kvsize reads (Qwen3.5's full_attention_interval and Gemma 3's
# sliding_window_pattern into layer_types, DeepSeek-V4's compress_ratios into compress_rates by layer type)
SUBSUMED_BY = {"full_attention_interval": "layer_types", "sliding_window_pattern": "layer_types",
               "compress_ratios": "compress_rates"}


def unread_memory_fields(raw_text: dict, raw: dict, f: _Fields) -> tuple[str, ...]:
    """A note naming each memory-relevant field the config sets (not null, 0 or false) that the reader never
    looked up for this architecture."""
    # read through the field transformers made of them
    f.asked |= {name for name, by in SUBSUMED_BY.items() if by in f.asked and f.get(by) is not None}
    asked = set(f.asked)
    present = sorted(name for name in MEMORY_RELEVANT_FIELDS - asked
                     for source in {id(raw_text): raw_text, id(raw): raw}.values()
                     if source.get(name) not in (None, 0, False, [], {}))
    unread = list(dict.fromkeys(present))
    if not unread:
        return ()
    return (f"config.json sets {', '.join(unread)}, which change memory in vLLM or SGLang for some "
            "architectures; kvsize does not read them for this one, so what they change is not in its figures",)

def _kv_only(quant: dict) -> bool:
    """A quantization_config that quantizes only the KV cache (compressed-tensors with a kv_cache_scheme and no
    config_groups, ModelOpt with a kv_cache_quant_algo and no quant_algo): the weights are the model dtype's."""
    return (bool(quant.get("kv_cache_scheme")) and not quant.get("config_groups")) or \
        (bool(quant.get("kv_cache_quant_algo")) and quant.get("quant_algo") in (None, "null", "NONE"))


def _brief(value: Any, limit: int = 60) -> str:
    """A config value as a message shows it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _architectures(raw: dict) -> tuple[str, ...]:
    value = raw.get("architectures")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(a, str) for a in value):
        raise KvsizeError(f"config.json field 'architectures' must be a list of class names, got {value!r}")
    return tuple(value)


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


def _optional_int(value: Any, name: str) -> int | None:
    return None if value is None else _as_int(value, name, 1)


def _mrope(f: _Fields) -> bool:
    """Whether the rope parameters (one dict, or one per layer type) carry an mrope_section."""
    params = f.get("rope_parameters", "rope_scaling")
    if not isinstance(params, dict):
        return False
    return "mrope_section" in params or any(isinstance(v, dict) and "mrope_section" in v for v in params.values())


def _rope_scalings(f: _Fields) -> tuple[tuple[str, float | None, int | None], ...]:
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
                    _optional_int(entry.get("original_max_position_embeddings"), "original_max_position_embeddings")))
    return tuple(out)


def _rotary_dim(f: _Fields, head_dim: int, mla: bool) -> int:
    if mla:
        return _as_int(f.get("qk_rope_head_dim", default=0), "qk_rope_head_dim")
    if f.get("position_embedding_type") in ("alibi", "absolute") or f.get("alibi"):
        return 0
    factor = f.get("partial_rotary_factor", default=None)
    params = f.get("rope_parameters", default=None)
    if factor is None and isinstance(params, dict):  # transformers 5 keeps it among the rope parameters
        factor = params.get("partial_rotary_factor")
    if factor is None:
        rotary = f.get("rotary_dim", "rotary_emb_base_dim", default=None)
        return _as_int(rotary, "rotary_dim", 1) if rotary is not None else head_dim
    if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not 0 < factor <= 1:
        raise KvsizeError(f"config.json field 'partial_rotary_factor' must be in (0, 1], got {factor!r}")
    return int(head_dim * factor)


_UNGATED_MLP = {"falcon", "gpt2", "gpt_bigcode", "gpt_neox", "gptj", "opt", "bloom", "phi", "starcoder2", "mpt"}


@dataclass(frozen=True)
class _NasBlocks:
    """Per-layer blocks of a NAS model (Llama-Nemotron Super/Ultra, DeciLM: block_configs)."""

    kv_heads: tuple[int, ...]  # 0 where the attention is a no-op or a linear layer
    linear_attention: tuple[int, ...]  # 1 where attention is replaced by one hidden x hidden linear layer
    intermediate: tuple[int, ...]  # 0: no FFN; -1: one hidden x hidden linear layer

    def mlp_params(self, layer: int, hidden: int) -> int:
        inter = self.intermediate[layer]
        return hidden * hidden if inter < 0 else 3 * hidden * inter


def _nas_blocks(f: _Fields, num_layers: int, heads: int, hidden: int) -> _NasBlocks | None:
    """vllm/model_executor/models/nemotron_nas.py: a layer's KV heads are num_attention_heads //
    n_heads_in_group; no_op attention holds no cache; ffn_mult gives the FFN width
    (_ffn_mult_to_intermediate_size: 2 x ffn_mult x hidden / 3 rounded up to a multiple of 256)."""
    blocks = f.get("block_configs")
    if blocks is None:
        return None
    if not isinstance(blocks, (list, tuple)) or len(blocks) != num_layers:
        raise KvsizeError(f"config.json: block_configs must list one block per layer ({num_layers})")
    kv, linear, inter = [], [], []
    for i, block in enumerate(blocks):
        attention = block.get("attention") if isinstance(block, dict) else None
        ffn = block.get("ffn") if isinstance(block, dict) else None
        if not isinstance(attention, dict) or not isinstance(ffn, dict):
            raise KvsizeError(f"config.json: block_configs[{i}] must hold 'attention' and 'ffn' objects")
        if attention.get("no_op") or attention.get("replace_with_linear"):
            kv.append(0)
            linear.append(1 if attention.get("replace_with_linear") else 0)
        else:
            group = _as_int(attention.get("n_heads_in_group"), f"block_configs[{i}].attention.n_heads_in_group", 1)
            if heads % group:
                raise KvsizeError(f"config.json: block_configs[{i}].attention.n_heads_in_group {group} does not "
                                  f"divide num_attention_heads {heads}")
            kv.append(heads // group)
            linear.append(0)
        if ffn.get("no_op"):
            inter.append(0)
        elif ffn.get("replace_with_linear"):
            inter.append(-1)
        else:
            mult = ffn.get("ffn_mult")
            if isinstance(mult, bool) or not isinstance(mult, (int, float)) or not mult > 0:
                raise KvsizeError(f"config.json: block_configs[{i}].ffn.ffn_mult must be a positive number, got {mult!r}")
            width = int(2 * mult * hidden / 3)
            inter.append(-(-width // 256) * 256)
    return _NasBlocks(tuple(kv), tuple(linear), tuple(inter))


def _layer_geometry(f: _Fields, kinds: list[str], kv_heads: int, head_dim: int,
                    nas: _NasBlocks | None) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Per-layer (KV heads, K width, V width) where layers differ; empty tuples where they do not."""
    v_dim = f.get("v_head_dim")
    swa_heads, swa_dim, swa_v = (f.get("swa_num_key_value_heads"), f.get("swa_head_dim"), f.get("swa_v_head_dim"))
    if f.get("kv_lora_rank") is not None or f.get("use_mla") is False:
        # MLA's v_head_dim is the output width, not a cache width; with use_mla false (DeepSeek-VL2's
        # language model) the MLA fields are unused (0) and attention is multi-head of head_dim
        v_dim = None
    full_v = _as_int(v_dim, "v_head_dim", 1) if v_dim is not None else head_dim
    heads = [kv_heads] * len(kinds)
    dims = [head_dim] * len(kinds)
    v_dims = [full_v] * len(kinds)
    if nas:
        heads = [h or kv_heads for h in nas.kv_heads]
    for name, values in (("head_dim", dims), ("num_key_value_heads", heads)):
        per_layer = f.per_layer(name, len(kinds))
        if per_layer is not None:
            values[:] = [_as_int(x, name, 1) if x is not None else values[i] for i, x in enumerate(per_layer)]
            if name == "head_dim" and v_dim is None:
                v_dims[:] = list(dims)
    for i, kind in enumerate(kinds):
        if kind == "sliding":
            if swa_heads is not None:
                heads[i] = _as_int(swa_heads, "swa_num_key_value_heads", 1)
            if swa_dim is not None:
                dims[i] = _as_int(swa_dim, "swa_head_dim", 1)
            if swa_v is not None:
                v_dims[i] = _as_int(swa_v, "swa_v_head_dim", 1)
    return (tuple(heads) if len(set(heads)) > 1 else (),
            tuple(dims) if len(set(dims)) > 1 else (),
            tuple(v_dims) if v_dims != dims else ())


def _compress_ratios(f: _Fields, num_layers: int) -> list[int]:
    """DeepSeek-V4's compress ratio per layer, 1 for window-only layers; [] for models without them.
    transformers' DeepseekV4Config turns the file's compress_ratios (one per layer, then one per MTP layer)
    into layer_types and compress_rates; vLLM reads the ratio of a layer's type, 0 meaning window only."""
    rates = f.get("compress_rates")
    layer_types = f.get("layer_types")
    if isinstance(rates, dict) and isinstance(layer_types, (list, tuple)):
        ratios = [_as_int(rates.get(entry, 0), f"compress_rates[{entry!r}]") for entry in layer_types]
        name = "compress_rates"
    else:
        listed = f.get("compress_ratios")
        if listed is None:
            return []
        mtp = _as_int(f.get("num_nextn_predict_layers", default=0), "num_nextn_predict_layers")
        if not isinstance(listed, (list, tuple)) or len(listed) not in (num_layers, num_layers + mtp):
            raise KvsizeError(f"config.json: compress_ratios needs one entry per layer ({num_layers}, or "
                              f"{num_layers + mtp} with the MTP layers)")
        ratios = [_as_int(x, "compress_ratios") for x in listed[:num_layers]]
        name = "compress_ratios"
    if any(r not in COMPRESS_RATIOS for r in ratios):
        raise KvsizeError(f"config.json: {name} entries must be one of {', '.join(map(str, COMPRESS_RATIOS))}; "
                          f"got {sorted(set(ratios) - set(COMPRESS_RATIOS))}")
    return [max(1, r) for r in ratios]


# The ratios DeepSeek-V4's compressor is built for (vllm/models/deepseek_v4/compressor.py: 4 or 128; 0 is none).
COMPRESS_RATIOS = (0, 4, 128)


def _compressed_attention_params(f: _Fields, hidden: int, heads: int, head_dim: int, ratio: int) -> int:
    """DeepSeek-V4 attention (vllm/models/deepseek_v4/attention.py, compressor.py): low-rank Q, one
    head_dim-wide KV projection, a grouped low-rank output, and at ratio > 1 a compressor (KV and gate of
    coff × head_dim, coff 2 at ratio 4) whose ratio-4 layers also carry an indexer with its own compressor."""
    q_lora = _as_int(f.get("q_lora_rank", default=0), "q_lora_rank")
    o_lora = _as_int(f.get("o_lora_rank", default=0), "o_lora_rank")
    q = hidden * q_lora + q_lora * heads * head_dim if q_lora else hidden * heads * head_dim
    kv = hidden * head_dim
    o = heads * head_dim * o_lora + _as_int(f.get("o_groups", default=1), "o_groups", 1) * o_lora * hidden \
        if o_lora else heads * head_dim * hidden
    params = q + kv + o
    if ratio > 1:
        coff = 2 if ratio == 4 else 1
        params += hidden * 2 * coff * head_dim + ratio * coff * head_dim  # fused KV/gate projection, ape
    if ratio == 4:
        index_heads = _as_int(f.get("index_n_heads", default=0), "index_n_heads")
        index_dim = _as_int(f.get("index_head_dim", default=0), "index_head_dim")
        params += q_lora * index_heads * index_dim + hidden * index_heads  # indexer queries, head weights
        params += hidden * 2 * 2 * index_dim + ratio * 2 * index_dim  # the indexer's compressor
    return params


def _kv_heads(f: _Fields, heads: int) -> int:
    # Falcon-7B style: multi_query without the new decoder architecture means one KV head.
    if f.get("multi_query") and not f.get("new_decoder_architecture"):
        return 1
    value = f.get("num_key_value_heads", "num_kv_heads", "multi_query_group_num", "n_head_kv", default=heads)
    return _as_int(value, "num_key_value_heads", 1)


def _layer_kinds(f: _Fields, num_layers: int) -> tuple[list[str], list[str] | None, bool]:
    """Per-layer KV kinds, per-layer block names where blocks are single-purpose (Nemotron-H), and
    whether the windows come from a global sliding_window rather than layer_types."""
    layer_types = f.get("layer_types", "layers_block_type")
    flags = f.get("hybrid_layer_pattern")
    in_json = any(isinstance(src, dict) and "layer_types" in src for src in f.sources)
    if isinstance(flags, (list, tuple)) and not in_json:
        # MiMo-V2: one flag per layer, 1 = sliding-window attention. The file's pattern, not the layer_types
        # transformers' class synthesizes when the file gives none, is what vLLM's model reads.
        if len(flags) != num_layers or any(x not in (0, 1) for x in flags):
            raise KvsizeError(f"config.json: hybrid_layer_pattern needs one 0 or 1 per layer ({num_layers})")
        return ["sliding" if x else "full" for x in flags], None, False
    pattern = f.get("hybrid_override_pattern")
    if layer_types is None and isinstance(pattern, str):
        layer_types = list(pattern)
        table = HYBRID_PATTERN_KINDS
    else:
        table = LAYER_TYPE_KINDS
    if layer_types is not None:
        if not isinstance(layer_types, (list, tuple)) or len(layer_types) != num_layers:
            raise KvsizeError(
                f"config.json: layer_types must list one entry per layer ({num_layers}), got "
                f"{len(layer_types) if isinstance(layer_types, (list, tuple)) else type(layer_types).__name__}"
            )
        kinds = []
        for entry in layer_types:
            if not isinstance(entry, str) or entry not in table:
                raise KvsizeError(f"config.json: unknown layer type {entry!r}; known: {', '.join(sorted(table))}")
            kinds.append(table[entry])
        blocks = None
        if any(entry in FEED_FORWARD_BLOCKS for entry in layer_types):
            blocks = [FEED_FORWARD_BLOCKS.get(entry, "mixer") for entry in layer_types]
        return kinds, blocks, False
    window = f.get("sliding_window")
    if window is not None and f.get("use_sliding_window", default=True) is not False:
        return ["sliding"] * num_layers, None, True
    return ["full"] * num_layers, None, False


def _attention_params(f: _Fields, hidden: int, heads: int, kv_heads: int, head_dim: int) -> int:
    kv_lora = f.get("kv_lora_rank")
    if kv_lora is not None:
        rope = f.get("qk_rope_head_dim", default=0)
        nope = f.get("qk_nope_head_dim", default=0)
        v_dim = f.get("v_head_dim", default=head_dim)
        q_lora = f.get("q_lora_rank")
        q_head = heads * (nope + rope)
        q = hidden * q_lora + q_lora + q_lora * q_head if q_lora else hidden * q_head
        kv = hidden * (kv_lora + rope) + kv_lora + kv_lora * heads * (nope + v_dim)
        return q + kv + heads * v_dim * hidden
    # an output gate (attn_output_gate) projects a gate beside each query: vLLM's qkv_proj holds 2 x the queries
    q = hidden * heads * head_dim * (2 if f.get("attn_output_gate", default=False) is True else 1)
    kv = 2 * hidden * kv_heads * head_dim
    o = heads * head_dim * hidden
    bias = (heads + 2 * kv_heads) * head_dim + hidden if f.get("attention_bias") else 0
    return q + kv + o + bias


# vLLM's FlashInfer gated-delta-net prefill checkpoints every 64 tokens (FLASHINFER_GDN_CHECKPOINT_ALIGNMENT).
GDN_CHECKPOINT_ALIGNMENT = 64


def _recurrent(f: _Fields, hidden: int, config_dtype: str) -> tuple[int, int, str, int, int]:
    """(state elements per sequence, of which conv state, SSM state dtype, projection params, other params)
    of one recurrent layer. vLLM keeps the conv state in the model dtype and only the SSM state in
    mamba_ssm_cache_dtype (vllm/model_executor/layers/mamba/mamba_utils.py, MambaStateDtypeCalculator)."""
    state_dtype = _dtype_name(f.get("mamba_ssm_dtype", "mamba_ssm_cache_dtype")) or config_dtype
    kernel = _as_int(f.get("linear_conv_kernel_dim", "conv_kernel", "d_conv", default=4), "conv_kernel", 1)
    if f.get("linear_num_value_heads") is not None:  # gated delta net (Qwen3-Next, Qwen3.5)
        nk = _as_int(f.get("linear_num_key_heads"), "linear_num_key_heads", 1)
        nv = _as_int(f.get("linear_num_value_heads"), "linear_num_value_heads", 1)
        dk = _as_int(f.get("linear_key_head_dim"), "linear_key_head_dim", 1)
        dv = _as_int(f.get("linear_value_head_dim"), "linear_value_head_dim", 1)
        key_dim, value_dim = nk * dk, nv * dv
        conv_dim = 2 * key_dim + value_dim
        state = conv_dim * (kernel - 1) + nv * dk * dv
        projections = hidden * (2 * key_dim + 2 * value_dim) + hidden * 2 * nv + value_dim * hidden
        other = conv_dim * kernel + 2 * nv + dv
        return state, conv_dim * (kernel - 1), state_dtype, projections, other
    # Mamba-2 (Nemotron-H, Bamba, Jamba-style)
    n_heads = f.get("mamba_num_heads")
    head = f.get("mamba_head_dim")
    d_state = f.get("ssm_state_size", "state_size", "d_state")
    if d_state is None:
        raise KvsizeError("config.json has recurrent layers but no 'ssm_state_size' or 'linear_num_value_heads'")
    d_state = _as_int(d_state, "ssm_state_size", 1)
    if n_heads is not None and head is not None:
        d_inner = _as_int(n_heads, "mamba_num_heads", 1) * _as_int(head, "mamba_head_dim", 1)
    else:
        d_inner = _as_int(f.get("mamba_expand", "expand", default=2), "expand", 1) * hidden
        head = f.get("mamba_head_dim", default=64)
        n_heads = d_inner // head
    groups = _as_int(f.get("n_groups", "mamba_n_groups", default=1), "n_groups", 1)
    conv_dim = d_inner + 2 * groups * d_state
    state = conv_dim * (kernel - 1) + d_inner * d_state
    projections = hidden * (2 * d_inner + 2 * groups * d_state + n_heads) + d_inner * hidden
    other = conv_dim * kernel + conv_dim + 3 * n_heads + d_inner
    return state, conv_dim * (kernel - 1), state_dtype, projections, other


def _moe_layers(f: _Fields, num_layers: int, num_experts: int, blocks: list[str] | None) -> set[int]:
    if not num_experts:
        return set()
    if blocks is not None:
        return {i for i, b in enumerate(blocks) if b == "moe"}
    explicit = f.get("moe_layers")
    if isinstance(explicit, (list, tuple)):
        return {int(i) for i in explicit}
    freq = f.get("moe_layer_freq", default=1)
    if isinstance(freq, (list, tuple)):  # one 0/1 flag per layer (MiMo-V2-Flash)
        if len(freq) != num_layers or any(x not in (0, 1) for x in freq):
            raise KvsizeError(f"config.json: moe_layer_freq as a list needs one 0 or 1 per layer ({num_layers})")
        return {i for i, x in enumerate(freq) if x == 1}
    first_dense = _as_int(f.get("first_k_dense_replace", default=0), "first_k_dense_replace")
    freq = _as_int(freq, "moe_layer_freq", 1)
    step = _as_int(f.get("decoder_sparse_step", "interleave_moe_layer_step", default=1), "decoder_sparse_step", 1)
    dense_only = set(f.get("mlp_only_layers", default=[]) or [])
    return {
        i for i in range(num_layers)
        if i >= first_dense and i % freq == 0 and (i + 1) % step == 0 and i not in dense_only
    }


def _shared_expert_params(f: _Fields, hidden: int, moe_inter: int, intermediate: int, matrices: int) -> int:
    """Shared experts: gated (3 matrices) or, like the routed experts of relu² MoEs (Nemotron 3), ungated (2)."""
    shared = f.get("shared_expert_intermediate_size", "moe_shared_expert_intermediate_size")
    if shared:
        # the size given is all the shared experts' width (Qwen2-MoE, Nemotron 3 with n_shared_experts 1)
        _as_int(f.get("n_shared_experts", default=1), "n_shared_experts", 0)
        return matrices * hidden * int(shared) + hidden  # plus the shared-expert gate
    n_shared = f.get("n_shared_experts")
    if n_shared:
        return matrices * hidden * moe_inter * int(n_shared)
    if f.get("interleave_moe_layer_step") is not None:  # Llama 4: one shared expert of intermediate_size
        return matrices * hidden * intermediate
    return 0


def _dense_intermediate(f: _Fields, intermediate: int, num_experts: int) -> int:
    if num_experts and f.get("intermediate_size_mlp") is not None:  # Llama 4's dense layers
        return int(f.get("intermediate_size_mlp"))
    return intermediate


# a checkpoint scheme: (weight format, attention's format where it differs, dense MLPs and shared experts
# left unquantized)
Scheme = tuple[str | None, str | None, bool]


def _compressed_tensors_scheme(quant: dict, num_layers: int) -> Scheme:
    """A compressed-tensors quantization_config as a Scheme: the Linear group's weights (float 8-bit per channel or per
    128x128 block: fp8; float 4-bit in groups of 16: nvfp4; int 8-bit: int8; int 4-bit: int4 in its groups,
    symmetric or not; other schemes: None, sized by --weights-dtype), and what its `ignore` list keeps out
    for every language-model layer (RedHatAI's FP8-dynamic Llama 4: attention; Kimi-K2.5: attention, shared
    experts and dense MLPs, by pattern)."""
    groups = quant.get("config_groups")
    if not isinstance(groups, dict):
        return None, None, False
    weights = None
    for group in groups.values():
        targets = group.get("targets") if isinstance(group, dict) else None
        if isinstance(targets, list) and "Linear" in targets and isinstance(group.get("weights"), dict):
            weights = group["weights"]
            break
    if weights is None:
        return None, None, False
    bits, kind, strategy, size = (weights.get("num_bits"), weights.get("type"), weights.get("strategy"),
                                  weights.get("group_size"))
    fmt = None
    if kind == "float" and bits == 8:
        fmt = "fp8" if strategy == "block" else "fp8_channel"
    elif kind == "float" and bits == 4 and size == 16:
        fmt = "nvfp4"
    elif kind == "int" and bits == 8:
        fmt = "int8"
    elif kind == "int" and bits == 4 and isinstance(size, int) and not isinstance(size, bool) and 0 < size <= 4096:
        fmt = "int4" if size == 128 and not weights.get("symmetric") else f"int4_g{size}" + (
            "_sym" if weights.get("symmetric") else "")
    return (fmt, *_unquantized_modules(quant.get("ignore"), num_layers))


def _gptq_awq_scheme(quant: dict, num_layers: int) -> Scheme:
    """GPTQ and AWQ checkpoints (and AutoRound's GPTQ-style exports): `bits` (AWQ's older `w_bit`) integers
    per weight in groups of `group_size` (-1: one group per output channel), an fp16 scale per group, and a
    zero point of as many bits unless symmetric (GPTQ's `sym`, AWQ without `zero_point`), as stored (what the
    engine's kernels keep of the zeros is its release's rule: sizing/engines/memory.py engine_weight_format). The modules AWQ's
    `modules_to_not_convert` (or bitsandbytes-style `llm_int8_skip_modules`) names stay in the model dtype."""
    bits = quant.get("bits", quant.get("w_bit"))
    size = quant.get("group_size", quant.get("q_group_size", 128))
    if not isinstance(bits, int) or isinstance(bits, bool) or bits not in (2, 3, 4, 8):
        return None, None, False
    if not isinstance(size, int) or isinstance(size, bool) or not (size == -1 or 0 < size <= 99999):
        return None, None, False
    symmetric = quant.get("sym", True) if "zero_point" not in quant else quant.get("zero_point") is False
    if not isinstance(symmetric, bool) or not isinstance(quant.get("zero_point", True), bool):
        return None, None, False
    if quant.get("data_type", "int") != "int":  # AutoRound's float and mx schemes are not these integers
        return None, None, False
    fmt = f"int{bits}_g{'channel' if size == -1 else size}" + ("_sym" if symmetric else "")
    listed = _listed_modules(quant.get("modules_in_block_to_quantize"))
    if listed is not None:
        return fmt, *listed
    return (fmt, *_unquantized_modules(quant.get("modules_to_not_convert"), num_layers))


def _listed_modules(listed: Any) -> tuple[str | None, bool] | None:
    """GPTQ's modules_in_block_to_quantize (a list, or GPTQModel's list of lists, of module names in a layer):
    what it leaves out stays in the model dtype in vLLM (auto_gptq.py get_linear_quant_method); routed
    experts are quantized whatever it says. None where the config gives no list."""
    if not isinstance(listed, list) or not listed:
        return None
    names = [n for x in listed for n in (x if isinstance(x, list) else [x]) if isinstance(n, str)]
    attention = any(re.search(r"attn|attention", n) for n in names)
    mlp = any(_names_dense_mlp(n) for n in names)
    return (None if attention else MODEL_DTYPE), not mlp


def _bitsandbytes_scheme(quant: dict, num_layers: int) -> Scheme:
    """bitsandbytes checkpoints: 4-bit (NF4 or FP4) with an fp32 absmax per 64 weights, double-quantized ones
    too (vLLM's loader turns the nested 8-bit absmax back into fp32 as it loads: BitsAndBytesModelLoader
    _dequantize_dq); or LLM.int8 (int8 with an fp32 scale per row). `llm_int8_skip_modules` stays in the
    model dtype."""
    if quant.get("load_in_4bit") is True:
        fmt = "bnb4"
    elif quant.get("load_in_8bit") is True:
        fmt = "bnb8"
    else:
        return None, None, False
    return (fmt, *_unquantized_modules(quant.get("llm_int8_skip_modules"), num_layers))


_MODELOPT_FORMATS = {"NVFP4": "nvfp4", "W4A16_NVFP4": "nvfp4", "FP8": "fp8_tensor"}


def _modelopt_scheme(quant: dict, num_layers: int) -> Scheme:
    """A ModelOpt quantization_config (NVIDIA's checkpoints) as a Scheme: NVFP4 or per-tensor FP8 weights,
    with the modules its `ignore` (or `exclude_modules`) list keeps in the model dtype."""
    algo = str(quant.get("quant_algo")).upper()
    if algo == "MIXED_PRECISION":
        return _modelopt_mixed(quant)
    return (_MODELOPT_FORMATS.get(algo), *_unquantized_modules(quant.get("ignore", quant.get("exclude_modules")),
                                                               num_layers))


def _modelopt_mixed(quant: dict) -> Scheme:
    """ModelOpt MIXED_PRECISION: `quantized_layers` names each module's scheme; the MLP and experts' format and
    the attention's, the most common scheme of each kind (Qwen3.6-35B-A3B-NVFP4: experts and shared experts
    NVFP4, attention FP8); attention no module names takes the MLP's format."""
    layers = quant.get("quantized_layers")
    if not isinstance(layers, dict):
        return None, None, False
    kinds: dict[str, list[str]] = {"mlp": [], "attention": []}
    for name, scheme in layers.items():
        fmt = _MODELOPT_FORMATS.get(str(scheme.get("quant_algo")).upper()) if isinstance(scheme, dict) else None
        if fmt is None or not isinstance(name, str) or "vision" in name:
            continue
        kinds["attention" if "attn" in name else "mlp"].append(fmt)
    common = {k: max(set(v), key=v.count) if v else None for k, v in kinds.items()}
    return common["mlp"], common["attention"], False


@dataclass(frozen=True)
class QuantizationScheme:
    """How kvsize reads one quant_method: the reader of its settings, and (for saying which setting it could
    not read) the fields the reader takes and what it accepts."""

    read: Callable[[dict, int], Scheme]
    fields: tuple[str, ...]
    accepts: str


_INTEGER = QuantizationScheme(_gptq_awq_scheme, ("bits", "w_bit", "group_size", "q_group_size", "sym", "zero_point",
                                                 "data_type"),
                              "bits 2, 3, 4 or 8; group_size -1 or 1-99999; sym and zero_point true or false; "
                              "data_type int")
_AUTO_ROUND_METHODS = ("auto-round", "intel/auto-round", "auto_round")
QUANTIZATION_SCHEMES = {
    "compressed-tensors": QuantizationScheme(
        _compressed_tensors_scheme, ("config_groups",),
        "a config_groups entry targeting Linear with float 8-bit, float 4-bit in groups of 16, int 8-bit or int "
        "4-bit weights"),
    "modelopt": QuantizationScheme(_modelopt_scheme, ("quant_algo",),
                                   "quant_algo NVFP4, W4A16_NVFP4, FP8 or MIXED_PRECISION"),
    "gptq": _INTEGER, "awq": _INTEGER, **dict.fromkeys(_AUTO_ROUND_METHODS, _INTEGER),
    "bitsandbytes": QuantizationScheme(_bitsandbytes_scheme, ("load_in_4bit", "load_in_8bit"),
                                       "load_in_4bit or load_in_8bit true"),
}
# quant_methods whose name alone gives the weight format
FORMAT_BY_METHOD = {"fp8": "fp8", "mxfp4": "mxfp4"}
# checkpoints packed as GPTQ packs them (qweight, qzeros, scales), AutoRound's exports among them: they store
# zero points even when symmetric
GPTQ_PACKED_METHODS = ("gptq", *_AUTO_ROUND_METHODS)


def _unquantized_modules(ignore: Any, num_layers: int) -> tuple[str | None, bool]:
    """Whether a quantized checkpoint's ignore list keeps every language-model layer's attention (then its
    format is MODEL_DTYPE), and its dense MLPs and shared experts, in the model dtype: by pattern
    (`re:.*self_attn.*`, `*self_attn*`) or named for every layer (`model.layers.7.self_attn*`)."""
    names = [x for x in ignore if isinstance(x, str) and not re.search(_TOWER_NAMES, x)] \
        if isinstance(ignore, list) else []
    patterns = [x for x in names if x.startswith("re:") or not re.search(r"layers\.\d+", x)]
    # named layer by layer: every layer's attention (or linear-attention mixer) or MLP named
    attention_layers = {m.group(1) for x in names if (m := re.search(r"layers\.(\d+)\.\w*attn", x))}
    mlp_layers = {m.group(1) for x in names if (m := re.search(r"layers\.(\d+)\.", x)) and _names_dense_mlp(x)}
    attention = any("self_attn" in x for x in patterns) or len(attention_layers) >= num_layers
    mlp = any(_names_dense_mlp(x) for x in patterns) or len(mlp_layers) >= num_layers
    return MODEL_DTYPE if attention else None, mlp


# a multimodal model's towers and projectors, whose modules an ignore list names beside the language model's
_TOWER_NAMES = r"vision|visual|merger|mm_projector|multi_modal_projector|audio"


def _names_dense_mlp(entry: str) -> bool:
    """Whether a module name or pattern names dense MLPs or shared experts (`mlp`, `*mlp*`, `mlp.down_proj`,
    `re:.*shared_experts.*`), not an MoE router (`mlp.gate`, `re:.*mlp.gate$`, `shared_expert_gate`, `router`),
    which the scheme keeps in the model dtype beside quantized MLPs."""
    if re.search(r"(gate|router)[\\$)*]*$", entry) or re.search(r"(gate|router)\.weight$", entry):
        return False
    if re.search(r"shared_experts?\b", entry):
        return True
    if re.search(r"(^|[^_a-z])experts\b", entry):  # the routed experts, not a dense MLP
        return False
    return bool(re.search(r"(^|[^a-z])(mlp|feed_forward)($|[^a-z_])", entry))


def _vision_params(vision: Any) -> int:
    """A ViT encoder's parameters: per layer 4 h^2 (attention) + 2 h I (MLP), plus a patch embedding."""
    if not isinstance(vision, dict):
        return 0
    h = vision.get("hidden_size") or vision.get("embed_dim") or 0
    inter = vision.get("intermediate_size") or 4 * h
    layers = vision.get("num_hidden_layers") or vision.get("depth") or 0
    patch = vision.get("patch_size") or 14
    channels = vision.get("num_channels") or vision.get("in_channels") or 3
    try:
        return int(layers * (4 * h * h + 2 * h * inter) + channels * patch * patch * h)
    except TypeError:
        raise KvsizeError("config.json: vision_config fields must be numbers") from None

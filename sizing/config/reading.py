"""What the family readers hand on, one to the next: the config's fields, and each value the readers above
have settled (read.py READERS)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .fields import Fields
from .shape import LayerParams


@dataclass
class Reading:
    """One config.json being read. A reader sets the values it owns and uses only those of the readers above
    it in the table; the values are grouped here by the reader that sets them."""

    f: Fields
    raw: dict[str, Any]
    raw_text: dict[str, Any]  # the language model's own config (a multimodal wrapper's text_config) or raw
    parsed: Any  # transformers' config object; None: the file alone
    parsed_with: str
    notes: list[str]
    model_type: str
    # dense.read_size
    num_layers: int = 0
    hidden: int = 0
    heads: int = 0
    # hybrid.read_nas_blocks (a hybrid.NasBlocks, or None)
    nas: Any = None
    # dense.read_heads
    kv_heads: int = 0
    head_dim: int = 0
    # mla.read_latent, and mla.read_compression for DeepSeek-V4's window of latents
    kv_lora: Any = None
    mla_latent: int | None = None
    # windows.read_layer_kinds; rewritten by mla.read_compression, hybrid.read_nas_kinds and windows.read_windows
    kinds: list[str] = field(default_factory=list)
    blocks: list[str] | None = None
    global_window: bool = False
    # mla.read_compression
    ratios: list[int] = field(default_factory=list)
    # windows.read_windows
    sliding_window: int | None = None
    window_size: int | None = None
    chunk: int | None = None
    double_wide_shared_mlp: bool = False  # Gemma 4's use_double_wide_mlp: the KV-sharing layers' MLP twice as wide
    layer_kv_heads: tuple[int, ...] = ()
    layer_head_dims: tuple[int, ...] = ()
    layer_v_dims: tuple[int, ...] = ()
    # dense.read_dtype
    config_dtype: str = ""
    # hybrid.read_recurrent
    state_elements: int = 0
    conv_elements: int = 0
    state_dtype: str = ""
    ssm_dtype_named: str = ""
    mixer_params: int = 0
    mixer_other: int = 0
    checkpoint_alignment: int = 1
    # dense.read_vocabulary
    vocab: int = 0
    tied: bool = False
    max_pos: int = 0
    # dense.read_per_layer_inputs
    per_layer_input_size: int = 0
    per_layer_input_vocab: int = 0
    # dense.read_mlp
    intermediate: int = 0
    gated: bool = True
    # moe.read_experts
    num_experts: int = 0
    top_k: int = 0
    moe_inter: int = 0
    moe_layers: set[int] = field(default_factory=set)
    # read.read_layer_params
    layer_params: list[LayerParams] = field(default_factory=list)
    # quantization.read_quantization
    quant_method: Any = None
    weights_format: str | None = None
    attention_format: str | None = None
    mlp_unquantized: bool = False
    # multimodal.read_vision
    vision: int = 0
    vision_tower: tuple[int, int] | None = None
    # mla.read_latent_sizes
    index_head_dim: int = 0
    mla_head_dim: int = 0
    mla_kv_b_proj: int = 0
    # dense.read_rotary
    logit_softcap: bool = False
    rotary_dim: int = 0
    rope_scalings: tuple[tuple[str, float | None, int | None], ...] = ()
    mrope: bool = False
    attention_output_gate: bool = False
    mtp_layers: int = 0
    original_max_pos: int | None = None

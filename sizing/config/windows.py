"""Which layers hold what, and attention windows: layer_types and the hybrid patterns that name each layer's
kind, sliding and chunked windows, layers that share an earlier layer's cache (Gemma 3n, Gemma 4), and the
per-layer KV heads and widths where layers differ."""

from __future__ import annotations

from ..errors import KvsizeError
from .fields import Fields, as_int, config_flag, is_architecture
from .hybrid import NasBlocks
from .reading import Reading

# every config field this module's readers look up
FIELDS = ("attention_chunk_size", "attention_k_eq_v", "global_head_dim", "head_dim", "hybrid_layer_pattern",
          "hybrid_override_pattern", "layer_types", "layers_block_type", "max_window_layers",
          "no_rope_layer_interval", "no_rope_layers", "num_global_key_value_heads", "num_key_value_heads",
          "num_kv_shared_layers", "sliding_window", "sliding_window_size", "swa_head_dim", "swa_num_key_value_heads",
          "swa_v_head_dim", "use_double_wide_mlp", "use_mla", "use_sliding_window", "v_head_dim")
# of them, those that change memory in vLLM's or SGLang's model code (unread.py)
MEMORY_FIELDS = ("attention_chunk_size", "global_head_dim", "head_dim", "hybrid_override_pattern", "layer_types",
                 "layers_block_type", "no_rope_layers", "num_global_key_value_heads", "num_key_value_heads",
                 "num_kv_shared_layers", "sliding_window", "use_double_wide_mlp", "use_sliding_window")

# Llama 4 (transformers' Llama4TextConfig, vLLM's llama4.py): a layer with rotary embedding (no_rope_layers 1)
# attends within chunks of attention_chunk_size; every no_rope_layer_interval-th layer (NoPE) attends in full.
LLAMA4_TYPES = ("llama4", "llama4_text")
LLAMA4_ARCHITECTURES = ("Llama4ForCausalLM", "Llama4ForConditionalGeneration")
# Gemma 4's global (full) layers have their own head size (transformers' Gemma4TextConfig: 512 unless given)
GEMMA4_TYPES = ("gemma4", "gemma4_text")

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


def read_layer_kinds(r: Reading) -> None:
    llama4 = is_architecture(r.raw, r.raw_text, LLAMA4_TYPES, LLAMA4_ARCHITECTURES)
    r.kinds, r.blocks, r.global_window = _layer_kinds(r.f, r.num_layers, llama4)


def _llama4_chunked(f: Fields, num_layers: int) -> list[str]:
    """Llama 4's layers where transformers' class has not named them: chunked where rotary, full where NoPE."""
    flags = f.get("no_rope_layers")
    if isinstance(flags, (list, tuple)) and flags:
        if len(flags) != num_layers or any(x not in (0, 1) for x in flags):
            raise KvsizeError(f"config.json: no_rope_layers needs one 0 or 1 per layer ({num_layers})")
        return ["chunked" if x else "full" for x in flags]
    interval = as_int(f.get("no_rope_layer_interval", default=4), "no_rope_layer_interval", 1)
    return ["chunked" if (i + 1) % interval else "full" for i in range(num_layers)]


def _layer_kinds(f: Fields, num_layers: int, llama4: bool) -> tuple[list[str], list[str] | None, bool]:
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
    if llama4 and f.get("attention_chunk_size") is not None:
        return _llama4_chunked(f, num_layers), None, False
    window = f.get("sliding_window")
    if window is not None and _use_sliding_window(f):
        return ["sliding"] * num_layers, None, True
    return ["full"] * num_layers, None, False


def _use_sliding_window(f: Fields) -> bool:
    """Qwen2 and Qwen2-MoE's switch (vLLM's and transformers' reading): false means no sliding layer, whatever
    sliding_window says; absent means the window applies."""
    flag = f.get("use_sliding_window")
    # with the switch on, transformers builds Qwen2's layer_types from max_window_layers, which kvsize reads
    f.get("max_window_layers")
    return True if flag is None else config_flag(flag, "use_sliding_window")


def read_windows(r: Reading) -> None:
    """Layers sharing an earlier layer's cache, the windows, and each layer's KV heads and widths."""
    f, kinds, num_layers = r.f, r.kinds, r.num_layers
    shared = as_int(f.get("num_kv_shared_layers", default=0), "num_kv_shared_layers")
    if shared:
        # Gemma 3n / Gemma 4: the last num_kv_shared_layers layers attend with an earlier layer's K and V
        # and keep no cache of their own.
        if shared >= num_layers:
            raise KvsizeError(f"config.json: num_kv_shared_layers {shared} leaves no layer of the "
                              f"{num_layers} to hold the cache")
        kinds = kinds[:num_layers - shared] + ["shared"] * shared
        # vLLM's gemma4.py (0.33) and SGLang's build those layers' MLP at twice intermediate_size when it is set
        r.double_wide_shared_mlp = config_flag(f.get("use_double_wide_mlp", default=False), "use_double_wide_mlp")
    sliding_window = f.get("sliding_window", "sliding_window_size")
    if "sliding" not in kinds and not _use_sliding_window(f):
        # use_sliding_window false (Qwen1.5-MoE): the window is never used, and transformers sets it to 0
        sliding_window = None
    if sliding_window is not None:
        sliding_window = as_int(sliding_window, "sliding_window", 1)
    r.layer_kv_heads, r.layer_head_dims, r.layer_v_dims = _layer_geometry(
        f, kinds, r.kv_heads, r.head_dim, r.nas, r.kv_lora is not None,
        is_architecture(r.raw, r.raw_text, GEMMA4_TYPES, ()), [kind == "full" for kind in r.kinds])
    window_size = f.get("sliding_window_size")
    window_size = as_int(window_size, "sliding_window_size", 1) if window_size is not None else None
    if ("sliding" in kinds or "compressed" in kinds) and sliding_window is None:
        raise KvsizeError("config.json has sliding-attention layers but no 'sliding_window'")
    chunk = f.get("attention_chunk_size")
    chunk = as_int(chunk, "attention_chunk_size", 1) if chunk is not None else None
    if "chunked" in kinds and chunk is None:
        raise KvsizeError("config.json has chunked-attention layers but no 'attention_chunk_size'")
    if chunk is not None and "chunked" not in kinds:
        r.notes.append(f"config.json sets attention_chunk_size {chunk}, but no layer of this architecture is "
                       "chunked (only Llama 4's rotary layers, or a layer type chunked_attention, are): its layers "
                       "are sized with the full context or their window, which overstates the KV cache if an "
                       "engine chunks them")
    r.kinds, r.sliding_window, r.window_size, r.chunk = kinds, sliding_window, window_size, chunk


def _layer_geometry(f: Fields, kinds: list[str], kv_heads: int, head_dim: int, nas: NasBlocks | None, mla: bool,
                    gemma4: bool, full: list[bool]) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Per-layer (KV heads, K width, V width) where layers differ; empty tuples where they do not. `full`: the
    layers whose type is full attention, before any shares an earlier layer's cache."""
    v_dim = f.get("v_head_dim")
    swa_heads, swa_dim, swa_v = (f.get("swa_num_key_value_heads"), f.get("swa_head_dim"), f.get("swa_v_head_dim"))
    global_heads, global_dim = _global_geometry(f, gemma4)
    if mla or f.get("use_mla") is False:
        # MLA's v_head_dim is the output width, not a cache width; with use_mla false (DeepSeek-VL2's
        # language model) the MLA fields are unused (0) and attention is multi-head of head_dim
        v_dim = None
    full_v = as_int(v_dim, "v_head_dim", 1) if v_dim is not None else head_dim
    heads = [kv_heads] * len(kinds)
    dims = [head_dim] * len(kinds)
    v_dims = [full_v] * len(kinds)
    if nas:
        heads = [h or kv_heads for h in nas.kv_heads]
    for name, values, global_value in (("head_dim", dims, global_dim), ("num_key_value_heads", heads, global_heads)):
        per_layer = f.per_layer(name, len(kinds))
        if per_layer is None and global_value is not None:
            # the file alone (no transformers class to expand it per layer): the global layers' own value
            per_layer = tuple(global_value if is_full else None for is_full in full)
        if per_layer is not None:
            values[:] = [as_int(x, name, 1) if x is not None else values[i] for i, x in enumerate(per_layer)]
            if name == "head_dim" and v_dim is None:
                v_dims[:] = list(dims)
    for i, kind in enumerate(kinds):
        if kind == "sliding":
            if swa_heads is not None:
                heads[i] = as_int(swa_heads, "swa_num_key_value_heads", 1)
            if swa_dim is not None:
                dims[i] = as_int(swa_dim, "swa_head_dim", 1)
            if swa_v is not None:
                v_dims[i] = as_int(swa_v, "swa_v_head_dim", 1)
    return (tuple(heads) if len(set(heads)) > 1 else (),
            tuple(dims) if len(set(dims)) > 1 else (),
            tuple(v_dims) if v_dims != dims else ())


def _global_geometry(f: Fields, gemma4: bool) -> tuple[int | None, int | None]:
    """Gemma 4's global (full) layers: their KV heads (num_global_key_value_heads, where attention_k_eq_v
    gates it) and head size (global_head_dim), as transformers' Gemma4TextConfig expands them per layer."""
    dim = f.get("global_head_dim", default=512 if gemma4 else None)
    heads = f.get("num_global_key_value_heads")
    if heads is not None and gemma4 and not config_flag(f.get("attention_k_eq_v", default=False), "attention_k_eq_v"):
        heads = None  # transformers applies the global KV heads only to the models that declare attention_k_eq_v
    return (as_int(heads, "num_global_key_value_heads", 1) if heads is not None else None,
            as_int(dim, "global_head_dim", 1) if dim is not None else None)

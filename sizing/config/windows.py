"""Which layers hold what, and attention windows: layer_types and the hybrid patterns that name each layer's
kind, sliding and chunked windows, layers that share an earlier layer's cache (Gemma 3n, Gemma 4), and the
per-layer KV heads and widths where layers differ."""

from __future__ import annotations

from ..errors import KvsizeError
from .fields import Fields, as_int
from .hybrid import NasBlocks
from .reading import Reading

# every config field this module's readers look up
FIELDS = ("attention_chunk_size", "head_dim", "hybrid_layer_pattern", "hybrid_override_pattern", "kv_lora_rank",
          "layer_types", "layers_block_type", "num_key_value_heads", "num_kv_shared_layers", "sliding_window",
          "sliding_window_size", "swa_head_dim", "swa_num_key_value_heads", "swa_v_head_dim", "use_mla",
          "use_sliding_window", "v_head_dim")
# of them, those that change memory in vLLM's or SGLang's model code (unread.py)
MEMORY_FIELDS = ("attention_chunk_size", "head_dim", "hybrid_override_pattern", "kv_lora_rank", "layer_types",
                 "layers_block_type", "num_key_value_heads", "num_kv_shared_layers", "sliding_window")

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
    r.kinds, r.blocks, r.global_window = _layer_kinds(r.f, r.num_layers)


def _layer_kinds(f: Fields, num_layers: int) -> tuple[list[str], list[str] | None, bool]:
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
    sliding_window = f.get("sliding_window", "sliding_window_size")
    if sliding_window is not None:
        sliding_window = as_int(sliding_window, "sliding_window", 1)
    r.layer_kv_heads, r.layer_head_dims, r.layer_v_dims = _layer_geometry(f, kinds, r.kv_heads, r.head_dim, r.nas)
    window_size = f.get("sliding_window_size")
    window_size = as_int(window_size, "sliding_window_size", 1) if window_size is not None else None
    if ("sliding" in kinds or "compressed" in kinds) and sliding_window is None:
        raise KvsizeError("config.json has sliding-attention layers but no 'sliding_window'")
    chunk = f.get("attention_chunk_size")
    chunk = as_int(chunk, "attention_chunk_size", 1) if chunk is not None else None
    if "chunked" in kinds and chunk is None:
        raise KvsizeError("config.json has chunked-attention layers but no 'attention_chunk_size'")
    r.kinds, r.sliding_window, r.window_size, r.chunk = kinds, sliding_window, window_size, chunk


def _layer_geometry(f: Fields, kinds: list[str], kv_heads: int, head_dim: int,
                    nas: NasBlocks | None) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """Per-layer (KV heads, K width, V width) where layers differ; empty tuples where they do not."""
    v_dim = f.get("v_head_dim")
    swa_heads, swa_dim, swa_v = (f.get("swa_num_key_value_heads"), f.get("swa_head_dim"), f.get("swa_v_head_dim"))
    if f.get("kv_lora_rank") is not None or f.get("use_mla") is False:
        # MLA's v_head_dim is the output width, not a cache width; with use_mla false (DeepSeek-VL2's
        # language model) the MLA fields are unused (0) and attention is multi-head of head_dim
        v_dim = None
    full_v = as_int(v_dim, "v_head_dim", 1) if v_dim is not None else head_dim
    heads = [kv_heads] * len(kinds)
    dims = [head_dim] * len(kinds)
    v_dims = [full_v] * len(kinds)
    if nas:
        heads = [h or kv_heads for h in nas.kv_heads]
    for name, values in (("head_dim", dims), ("num_key_value_heads", heads)):
        per_layer = f.per_layer(name, len(kinds))
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

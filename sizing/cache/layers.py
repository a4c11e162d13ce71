"""Per-layer KV cache specs: one small frozen class per layer kind.

A model's cache on one GPU is a mapping from layer index to spec; every total is a sum
over that mapping. Byte counts are for the KV heads this GPU holds (after tensor
parallelism) and exclude nothing: payload plus every metadata tensor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from fractions import Fraction

from ..hashing import hash_once
from ..errors import KvsizeError
from .components import SideLayout
from .formats import FormatOptions, KVFormat, get_format, indexer_side
from ..config import DTYPE_BYTES, ModelShape
from ..units import cdiv, ceil_fraction


def vllm_full_blocks(max_model_len: int, block_size: int) -> int:
    """Blocks vLLM holds for one request of a full-attention cache (FullAttentionSpec.max_memory_usage_bytes)."""
    return cdiv(max_model_len, block_size)


def vllm_window_blocks(window: int, max_model_len: int, block_size: int, in_flight_tokens: int) -> int:
    """Blocks vLLM holds for one request of a sliding-window cache (SlidingWindowSpec): window - 1 tokens plus
    those still in flight (one step's, or two with async scheduling from 0.26), and one block more because
    the window need not start on a block boundary."""
    return cdiv(min(window - 1 + in_flight_tokens, max_model_len), block_size) + 1


@lru_cache(maxsize=16384)
def _page_split(spec: FullAttentionSpec, block_size: int) -> tuple[int, int]:
    # Pool rules ask for the same few pages for every request length they size.
    return spec._page_split(block_size)


@hash_once
@dataclass(frozen=True)
class FullAttentionSpec:
    """K and V for every token of the sequence (or the MLA latent, with `v` None)."""

    heads: int
    head_dim: int
    k: SideLayout
    v: SideLayout | None
    k_format: str
    v_format: str | None
    indexer: SideLayout | None = None  # DSA's per-token indexer key, kept beside the MLA latent
    v_head_dim: int | None = None  # V's width where it differs from K's (MiMo-V2: 192 and 128)

    kind = "full"

    def tokens_held(self, tokens: int) -> int:
        return tokens

    def sides(self) -> tuple[tuple[SideLayout, int], ...]:
        """Each stored side with the width of its head vector."""
        sides = ((self.k, self.head_dim),)
        if self.v is not None:
            sides += ((self.v, self.v_head_dim or self.head_dim),)
        return sides + (((self.indexer, self.head_dim),) if self.indexer is not None else ())

    def bytes_for(self, tokens: int) -> tuple[int, int]:
        """(payload, metadata) bytes this layer holds for one sequence of `tokens` tokens."""
        held = self.tokens_held(tokens)
        payload = metadata = 0
        for side, dim in self.sides():
            p, m = side.bytes_for(held, dim, self.heads)
            payload, metadata = payload + p, metadata + m
        return payload, metadata

    def token_bytes(self) -> tuple[Fraction, Fraction]:
        """Steady-state (payload, metadata) bytes per token, below any window."""
        payload = metadata = Fraction(0)
        for side, dim in self.sides():
            p, m = side.token_bytes(dim)
            payload, metadata = payload + p * self.heads, metadata + m * self.heads
        return payload, metadata

    def page_bytes(self, block_size: int) -> int:
        """Bytes of one page of `block_size` tokens (quantized layout, no full-precision residual)."""
        return sum(self.page_split(block_size))

    def page_split(self, block_size: int) -> tuple[int, int]:
        return _page_split(self, block_size)

    def _page_split(self, block_size: int) -> tuple[int, int]:
        payload = metadata = 0
        for side, dim in self.sides():
            p, m = SideLayout(side.components).bytes_for(block_size, dim, self.heads)
            payload, metadata = payload + p, metadata + m
        return payload, metadata

    def layer_bytes(self) -> int:
        """Bytes stored once per layer (per-tensor scales, codebooks)."""
        return sum(side.layer_bytes(dim) for side, dim in self.sides())

    def parameter_bytes(self) -> int:
        """The part of layer_bytes kept as layer parameters, outside the KV pool."""
        return sum(side.parameter_bytes(dim) for side, dim in self.sides())

    def sequence_extra_bytes(self) -> int:
        """Per-sequence bytes beyond whole pages: full-precision recent tokens (KIVI)."""
        extra = 0
        for side, dim in self.sides():
            r = side.recent_full_precision_tokens
            if r:
                extra += r * dim * self.heads * 2
        return extra

    def vllm_usage_bytes(self, max_model_len: int, block_size: int, in_flight_tokens: int) -> int:
        """vLLM's max_memory_usage_bytes for one request (vllm/v1/kv_cache_interface.py)."""
        return vllm_full_blocks(max_model_len, block_size) * self.page_bytes(block_size)

    @property
    def group_key(self) -> tuple:
        return (self.kind,)


@hash_once
@dataclass(frozen=True)
class SlidingWindowSpec(FullAttentionSpec):
    window: int = 0

    kind = "sliding"

    def tokens_held(self, tokens: int) -> int:
        return min(tokens, self.window)

    def vllm_usage_bytes(self, max_model_len: int, block_size: int, in_flight_tokens: int) -> int:
        return vllm_window_blocks(self.window, max_model_len, block_size, in_flight_tokens) \
            * self.page_bytes(block_size)

    @property
    def group_key(self) -> tuple:
        return (self.kind, self.window)


@hash_once
@dataclass(frozen=True)
class ChunkedLocalSpec(FullAttentionSpec):
    chunk: int = 0

    kind = "chunked"

    def tokens_held(self, tokens: int) -> int:
        return min(tokens, self.chunk)

    def vllm_usage_bytes(self, max_model_len: int, block_size: int, in_flight_tokens: int) -> int:
        tokens = min(self.chunk + in_flight_tokens, max_model_len)
        return cdiv(tokens, block_size) * self.page_bytes(block_size)

    @property
    def group_key(self) -> tuple:
        return (self.kind, self.chunk)


# DeepSeek-V4's compressor (vllm/models/deepseek_v4/compressor.py): at ratio 4 the windows of two groups
# overlap (coff 2), at 128 they do not; the state keeps KV and score partials in fp32 for the last
# coff × ratio tokens. Its indexer compresses its own 128-wide keys the same way at ratio 4.
COMPRESSOR_STATE_BYTES = 4  # fp32
INDEXED_RATIO = 4  # only ratio-4 layers select positions with an indexer (attention.py: "Only C4A ... has indexer")


def compressor_overlap(ratio: int) -> int:
    return 2 if ratio == INDEXED_RATIO else 1


@hash_once
@dataclass(frozen=True)
class CompressedAttentionSpec:
    """DeepSeek-V4 attention: the last `window` tokens' latents, and at `ratio` > 1 one compressed latent per
    `ratio` tokens, a compressor state over the last overlap × ratio tokens and (ratio 4) an indexer key per
    compressed latent with its own compressor state. One head_dim-wide latent serves as K and V."""

    head_dim: int
    k: SideLayout  # one latent record (the window's and the compressed ones are laid out alike)
    k_format: str
    window: int
    ratio: int  # 1: the window only
    indexer: SideLayout | None  # per compressed position, ratio 4 only
    index_head_dim: int = 0

    kind = "compressed"
    heads = 1
    v = None
    v_format = None
    v_head_dim = None

    @property
    def compressed(self) -> bool:
        return self.ratio > 1

    @property
    def state_width(self) -> int:
        """fp32 values per token of the compressor's state (KV and score partials), 0 at ratio 1."""
        return 2 * compressor_overlap(self.ratio) * self.head_dim if self.compressed else 0

    @property
    def indexer_state_width(self) -> int:
        return 2 * compressor_overlap(self.ratio) * self.index_head_dim if self.indexer is not None else 0

    @property
    def state_window(self) -> int:
        return compressor_overlap(self.ratio) * self.ratio

    def bytes_for(self, tokens: int) -> tuple[int, int]:
        """(payload, metadata) bytes for one sequence: the window's latents, every complete group's
        compressed latent and indexer key, and the compressor states (counted as payload)."""
        payload, metadata = self.k.bytes_for(min(tokens, self.window), self.head_dim, 1)
        if self.compressed:
            groups = tokens // self.ratio
            p, m = self.k.bytes_for(groups, self.head_dim, 1)
            payload, metadata = payload + p, metadata + m
            if self.indexer is not None:
                p, m = self.indexer.bytes_for(groups, self.index_head_dim, 1)
                payload, metadata = payload + p, metadata + m
            held = min(tokens, self.state_window)
            payload += held * (self.state_width + self.indexer_state_width) * COMPRESSOR_STATE_BYTES
        return payload, metadata

    def token_bytes(self) -> tuple[Fraction, Fraction]:
        """What each further token adds once past the window: 1/ratio of a compressed latent and of an
        indexer key. The window's latents and the compressor states stop growing at their windows; they
        are in bytes_for, per sequence, and not in this rate (ratio 1 layers add nothing per token)."""
        payload = metadata = Fraction(0)
        if self.compressed:
            p, m = self.k.token_bytes(self.head_dim)
            payload, metadata = p / self.ratio, m / self.ratio
            if self.indexer is not None:
                p, m = self.indexer.token_bytes(self.index_head_dim)
                payload, metadata = payload + p / self.ratio, metadata + m / self.ratio
        return payload, metadata

    def record_bytes(self) -> int:
        """One latent record."""
        return sum(self.k.bytes_for(1, self.head_dim, 1))

    def indexer_record_bytes(self) -> int:
        return sum(self.indexer.bytes_for(1, self.index_head_dim, 1)) if self.indexer is not None else 0

    def page_bytes(self, block_size: int) -> int:
        return sum(self.page_split(block_size))

    def page_split(self, block_size: int) -> tuple[int, int]:
        """What `block_size` tokens add below the window (for splitting a pool into payload and scales)."""
        return _page_split(self, block_size)

    def _page_split(self, block_size: int) -> tuple[int, int]:
        payload, metadata = self.token_bytes()
        window_payload, window_metadata = self.k.bytes_for(block_size, self.head_dim, 1)
        return ceil_fraction(payload * block_size) + window_payload, ceil_fraction(metadata * block_size) + window_metadata

    def layer_bytes(self) -> int:
        return 0

    def parameter_bytes(self) -> int:
        return 0

    def sequence_extra_bytes(self) -> int:
        return 0

    @property
    def group_key(self) -> tuple:
        return (self.kind, self.ratio)


@dataclass(frozen=True)
class RecurrentStateSpec:
    """A fixed-size state per sequence (Mamba, gated delta net): no per-token cache."""

    state_bytes: int
    checkpoint_alignment: int = 1  # tokens; vLLM aligns its hybrid block size to it (prefix caching)

    kind = "recurrent"


KVSpec = FullAttentionSpec | SlidingWindowSpec | ChunkedLocalSpec | CompressedAttentionSpec


@dataclass(frozen=True, eq=False)  # compared and hashed by identity: layouts are built once and cached
class CacheLayout:
    """The cache one GPU holds: KV-holding layers and recurrent layers, by layer index."""

    kv: dict[int, KVSpec]
    recurrent: dict[int, RecurrentStateSpec]

    @lru_cache(maxsize=8192)  # noqa: B019 - layouts are long-lived, cached and hashed by identity
    def distinct_kv(self) -> tuple[tuple[KVSpec, int], ...]:
        """Each distinct KV spec with how many layers hold it: most models repeat one or two specs."""
        counts: dict[KVSpec, int] = {}
        for spec in self.kv.values():
            counts[spec] = counts.get(spec, 0) + 1
        return tuple(counts.items())

    @lru_cache(maxsize=8192)  # noqa: B019
    def token_bytes(self) -> tuple[Fraction, Fraction]:
        payload = metadata = Fraction(0)
        for spec, layers in self.distinct_kv():
            p, m = spec.token_bytes()
            payload, metadata = payload + p * layers, metadata + m * layers
        return payload, metadata

    @lru_cache(maxsize=65536)  # noqa: B019
    def read_tokens(self, tokens: int) -> int:
        """The cached tokens one sequence of `tokens` has in all its KV layers, each layer's window or chunk
        respected: what a kernel that reads each layer's cache in its own program walks through, one layer after
        another."""
        return sum(spec.tokens_held(tokens) * layers for spec, layers in self.distinct_kv())

    @lru_cache(maxsize=65536)  # noqa: B019
    def sequence_bytes(self, tokens: int) -> tuple[int, int]:
        """Exact (payload, metadata) bytes for one sequence: every layer holds min(tokens, its window)."""
        payload = metadata = 0
        for spec, layers in self.distinct_kv():
            p, m = spec.bytes_for(tokens)
            payload, metadata = payload + p * layers, metadata + m * layers
        return payload, metadata

    def state_bytes_per_sequence(self) -> int:
        return sum(spec.state_bytes for spec in self.recurrent.values())

    @lru_cache(maxsize=8192)  # noqa: B019
    def layer_bytes(self) -> int:
        """Every tensor stored once per layer, in the pool or beside the weights."""
        return sum(spec.layer_bytes() * layers for spec, layers in self.distinct_kv())

    @lru_cache(maxsize=8192)  # noqa: B019
    def parameter_bytes(self) -> int:
        """Per-layer tensors kept as layer parameters (loaded with the weights, not in the pool)."""
        return sum(spec.parameter_bytes() * layers for spec, layers in self.distinct_kv())

    def pool_fixed_bytes(self) -> int:
        """Per-layer tensors the KV pool itself holds."""
        return self.layer_bytes() - self.parameter_bytes()


@dataclass(frozen=True)
class LayerGroup:
    """Layers that hold the same thing, for showing the per-token sum term by term."""

    kind: str
    window: int | None
    heads: int
    head_dim: int
    k_format: str
    v_format: str | None
    layers: int
    payload_bytes_per_token: Fraction  # one layer, below any window
    metadata_bytes_per_token: Fraction
    sequence_bytes: int  # all layers of the group, one sequence at the given length


def layer_groups(layout: CacheLayout, tokens: int) -> list[LayerGroup]:
    groups: dict[tuple, list] = {}
    for spec in layout.kv.values():
        key = (spec.kind, getattr(spec, "window", None) or getattr(spec, "chunk", None), spec.heads, spec.head_dim,
               spec.k_format, spec.v_format, getattr(spec, "ratio", None))
        groups.setdefault(key, []).append(spec)
    rows = []
    for (kind, window, heads, head_dim, k_format, v_format, _), specs in groups.items():
        payload, metadata = specs[0].token_bytes()
        rows.append(LayerGroup(kind, window, heads, head_dim, k_format, v_format, len(specs), payload, metadata,
                               sum(sum(spec.bytes_for(tokens)) for spec in specs)))
    return rows


def parse_layer_overrides(text: str | None, num_layers: int) -> dict[int, str]:
    """'first:2,last:2=bf16;10-12=fp8' -> {layer: format name}."""
    overrides: dict[int, str] = {}
    if not text:
        return overrides
    for item in filter(None, (part.strip() for part in text.split(";"))):
        if "=" not in item:
            raise KvsizeError(
                f"--layer-kv-dtype: {item!r} must look like SELECTION=FORMAT, e.g. 'first:2,last:2=bf16'"
            )
        selection, fmt = item.rsplit("=", 1)
        selections = [s.strip() for s in selection.split(",") if s.strip()]
        if not selections or not fmt.strip():
            # '=bf16' or 'first:2=' would change nothing: said, never ignored
            raise KvsizeError(f"--layer-kv-dtype: {item[:60]!r} needs layers before '=' and a format after it, "
                              "e.g. 'first:2,last:2=bf16'")
        for sel in selections:
            if len(sel) > 32:
                raise KvsizeError(f"--layer-kv-dtype: layer selection {sel[:32]!r}... is too long")
            overrides.update({i: fmt.strip() for i in _select(sel, num_layers)})
    return overrides


def _select(sel: str, num_layers: int) -> range:
    m = re.fullmatch(r"(first|last):(\d+)", sel)
    if m:
        n = int(m.group(2))
        if not 0 < n <= num_layers:
            raise KvsizeError(f"--layer-kv-dtype: {sel!r} needs 1..{num_layers} layers")
        return range(n) if m.group(1) == "first" else range(num_layers - n, num_layers)
    m = re.fullmatch(r"(\d+)(?:-(\d+))?", sel)
    if not m:
        raise KvsizeError(f"--layer-kv-dtype: layer selection {sel!r} must be first:N, last:N, I or I-J")
    lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
    if not lo <= hi < num_layers:
        raise KvsizeError(f"--layer-kv-dtype: layers {sel!r} out of range 0..{num_layers - 1}")
    return range(lo, hi + 1)


def kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    """ceil(kv_heads / tp): with more ranks than KV heads, each rank holds one replicated head."""
    return max(1, cdiv(kv_heads, tp))


def build_layout(
    shape: ModelShape,
    k_format: str,
    v_format: str,
    tp: int = 1,
    layers: range | None = None,
    overrides: dict[int, str] | None = None,
    options: FormatOptions | None = None,
) -> CacheLayout:
    """The cache layout one GPU holds for `layers` of the model at tensor parallelism `tp`."""
    overrides = overrides or {}
    layers = layers if layers is not None else range(shape.num_layers)
    dtype = shape.serving_dtype
    cache: dict[tuple[str, str], tuple[KVFormat, KVFormat]] = {}

    def formats(k_name: str, v_name: str) -> tuple[KVFormat, KVFormat]:
        if (k_name, v_name) not in cache:
            cache[(k_name, v_name)] = (
                get_format(k_name, dtype, options, "--k-cache-dtype"),
                get_format(v_name, dtype, options, "--v-cache-dtype"),
            )
        return cache[(k_name, v_name)]

    kv: dict[int, KVSpec] = {}
    recurrent: dict[int, RecurrentStateSpec] = {}
    # The conv state is held in the model dtype, the SSM state in its own (mamba_ssm_cache_dtype).
    conv = shape.recurrent_conv_elements
    state_bytes = (cdiv(conv, tp) * DTYPE_BYTES[shape.serving_dtype]
                   + cdiv(shape.recurrent_state_elements - conv, tp) * DTYPE_BYTES[shape.recurrent_state_dtype])
    for i in layers:
        kind = shape.layer_kinds[i]
        if kind in ("none", "shared"):
            continue
        if kind == "recurrent":
            recurrent[i] = RecurrentStateSpec(state_bytes, shape.recurrent_checkpoint_alignment)
            continue
        k_name = overrides.get(i, k_format)
        v_name = overrides.get(i, v_format)
        k_fmt, v_fmt = formats(k_name, v_name)
        if kind == "compressed":
            k_fmt.k.check(shape.mla_latent_dim, k_fmt.name)
            ratio = shape.compress_ratio_of(i)
            indexed = ratio == INDEXED_RATIO and shape.index_head_dim
            kv[i] = CompressedAttentionSpec(shape.mla_latent_dim, k_fmt.k, k_fmt.name, shape.sliding_window, ratio,
                                            indexer_side(shape.index_head_dim) if indexed else None,
                                            shape.index_head_dim if indexed else 0)
            continue
        heads = 1 if shape.is_mla else kv_heads_per_rank(shape.kv_heads_of(i), tp)
        head_dim = shape.mla_latent_dim if shape.is_mla else shape.head_dim_of(i)
        v_dim = None if shape.is_mla or shape.v_head_dim_of(i) == head_dim else shape.v_head_dim_of(i)
        k_fmt.k.check(head_dim, k_fmt.name)
        if not shape.is_mla:
            v_fmt.v.check(v_dim or head_dim, v_fmt.name)
        common = dict(
            heads=heads, head_dim=head_dim, k=k_fmt.k,
            v=None if shape.is_mla else v_fmt.v,
            k_format=k_fmt.name, v_format=None if shape.is_mla else v_fmt.name,
            indexer=indexer_side(shape.index_head_dim) if shape.index_head_dim else None, v_head_dim=v_dim,
        )
        if kind == "sliding":
            kv[i] = SlidingWindowSpec(**common, window=shape.sliding_window)
        elif kind == "chunked":
            kv[i] = ChunkedLocalSpec(**common, chunk=shape.attention_chunk_size)
        else:
            kv[i] = FullAttentionSpec(**common)
    return CacheLayout(kv, recurrent)

"""Serving engines' rules: how much memory goes to the KV cache and how it is cut into pages.

Each engine is one row of ENGINES: a budget rule (which memory the engine leaves for the
KV cache) and a pool (how that memory is split into blocks and how many blocks one
request needs). Sources are cited per engine; docs/engines.md shows worked examples.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Protocol

from ..hashing import hash_once
from ..errors import KvsizeError, unknown
from ..cache.layers import COMPRESSOR_STATE_BYTES, CacheLayout, vllm_full_blocks, vllm_window_blocks
from .releases import Release, find_release
from .started import ReleaseEvidence, newest_started, release_evidence
from ..config import ModelShape
from ..units import cdiv, ceil_fraction, round_up

LLAMACPP_CTX_PAD = 256  # llama.cpp pads n_ctx to a multiple of 256 (src/llama-context.cpp)


@dataclass(frozen=True)
class MemoryTerms:
    """Per-GPU memory that is not KV cache, and the GPU's total."""

    total_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    graphs_profiled: bool = True  # False: graphs are captured after the budget (vLLM's V2 runner)

    @property
    def model_bytes(self) -> int:
        return self.weights_bytes + self.activation_bytes + self.non_torch_bytes + self.cuda_graph_bytes


@dataclass(frozen=True)
class Budget:
    kv_budget_bytes: int  # memory the engine gives the KV cache (negative: the model does not fit)
    headroom_bytes: int  # memory the engine's rule leaves unused
    usable_bytes: int  # what the rule allows for model + KV together
    formula: str


# -- pools -----------------------------------------------------------------------------


class Pool(Protocol):
    unit_bytes: int  # bytes of one allocation unit (a block across the layers it spans, or one byte)
    fixed_bytes: int  # stored once per layer (per-tensor scales, codebooks)
    block_size: int  # tokens per block (1 for engines without paging)
    paged: bool
    holds_recurrent: bool  # recurrent state lives in the pool (vLLM's hybrid models), not beside it

    def request_units(self, context_len: int) -> int: ...

    def tokens(self, units: int) -> int: ...

    def payload_share(self) -> tuple[int, int]: ...


# vLLM 0.33 keeps a hybrid model's Mamba / linear-attention state in the block pool: a state page
# is padded to the attention page, and with prefix caching (on by default) mamba_cache_mode is
# "align", where a request holds 2 + 1 prefill-checkpoint state pages per Mamba group
# (vllm/v1/kv_cache_interface.py MambaSpec.max_memory_usage_bytes; mamba_mixer2.py and
# qwen_gdn_linear_attn.py set num_prefill_checkpoint_blocks=1).
MAMBA_PAGES_PER_REQUEST = 3  # the newest release's figure; each release file names its own
# FlashAttention's smallest kernel block (vllm/platforms/interface.py _align_hybrid_block_size).
VLLM_KERNEL_BLOCK_ALIGNMENT = 16


@dataclass(frozen=True)
class MambaPageSpec:
    """A recurrent layer's state as vLLM's pool holds it: one page padded to the attention page."""

    state_bytes: int
    attention_page_1_token: int
    pages_per_request: int = MAMBA_PAGES_PER_REQUEST

    def page_bytes(self, block_size: int) -> int:
        return block_size * self.attention_page_1_token

    def vllm_usage_bytes(self, max_model_len: int, block_size: int, in_flight_tokens: int) -> int:
        return self.pages_per_request * self.page_bytes(block_size)

    @property
    def group_key(self) -> tuple:
        return ("mamba",)


def hybrid_block_size(layout: CacheLayout, block_size: int, attn_1: int) -> int:
    """vLLM raises the attention block size until one attention page holds the largest state page
    (_align_hybrid_block_size: alignment × cdiv(state page, alignment × attention page of one token))."""
    state = max(r.state_bytes for r in layout.recurrent.values())
    align = math.lcm(max(VLLM_KERNEL_BLOCK_ALIGNMENT, block_size),
                     *(r.checkpoint_alignment for r in layout.recurrent.values()))
    return max(block_size, align * cdiv(state, align * attn_1))


@dataclass(frozen=True)
class UnifiedPageSpec:
    """A layer as vLLM's hybrid pool holds it after unify_kv_cache_spec_page_size
    (vllm/v1/core/kv_cache_planning.py): a smaller page whose size divides the largest gets a block of
    `scale` x the pool's block size; one that does not is padded to the largest page."""

    spec: object
    scale: int
    padded_bytes: int | None = None

    def page_bytes(self, block_size: int) -> int:
        return self.padded_bytes if self.padded_bytes is not None else self.spec.page_bytes(block_size * self.scale)

    def vllm_usage_bytes(self, max_model_len: int, block_size: int, in_flight_tokens: int) -> int:
        own = block_size * self.scale
        blocks = self.spec.vllm_usage_bytes(max_model_len, own, in_flight_tokens) // self.spec.page_bytes(own)
        return blocks * self.page_bytes(block_size)

    @property
    def group_key(self) -> tuple:
        return self.spec.group_key


def _unify_pages(specs: dict, block_size: int) -> dict:
    largest = max(spec.page_bytes(block_size) for spec in specs.values())
    out = {}
    for i, spec in specs.items():
        page = spec.page_bytes(block_size)
        if page == largest:
            out[i] = spec
        elif isinstance(spec, MambaPageSpec) or largest % page:
            if getattr(spec, "v", True) is None:  # vLLM cannot pad an MLA page (sparse MLA reads whole rows)
                raise KvsizeError("vLLM cannot unify this model's page sizes: an MLA page does not divide the "
                                  "largest page; use --engine ideal")
            out[i] = UnifiedPageSpec(spec, 1, largest)
        else:
            out[i] = UnifiedPageSpec(spec, largest // page)
    return out


# DeepSeek-V4's caches as vLLM 0.33 pages them (vllm/models/deepseek_v4/, v1/attention/backends/mla/sparse_swa.py):
# the window of latents 64 tokens a block; the compressor state 4 tokens a block at ratio 4 and 8 at 128 (its page
# must match the KV pages it shares a tensor with); under fp8_ds_mla every page is rounded up to 576 B (the
# FlashMLA decode kernel's TMA stride), otherwise to 512 B.
DSV4_WINDOW_BLOCK = 64
DSV4_STATE_BLOCK = {4: 4, 128: 8}
DSV4_PAGE_ALIGNMENT = {True: 576, False: 512}


@dataclass(frozen=True)
class VllmCache:
    """One cache tensor vLLM keeps for a layer, as its KVCacheSpec describes it: a layer may keep several
    (DeepSeek-V4: the window, the compressed latents, the compressor state, the indexer and its state)."""

    name: str
    kind: str  # "full" (every token's state kept) or "sliding" (the last `window` tokens')
    block_size: int  # tokens a page covers
    page_bytes: int
    window: int = 0

    def usage_bytes(self, max_model_len: int, in_flight_tokens: int) -> int:
        """max_memory_usage_bytes (vllm/v1/kv_cache_interface.py FullAttentionSpec, SlidingWindowSpec)."""
        if self.kind == "full":
            return vllm_full_blocks(max_model_len, self.block_size) * self.page_bytes
        return vllm_window_blocks(self.window, max_model_len, self.block_size, in_flight_tokens) * self.page_bytes

    @property
    def bucket(self) -> tuple:
        # UniformTypeKVCacheSpecs.is_uniform_type: one block size, one type (and window).
        return (self.block_size, self.kind, self.window)


def compressed_vllm_caches(spec, block_size: int) -> tuple[VllmCache, ...]:
    """The caches vLLM 0.33 builds for one DeepSeek-V4 attention layer."""
    packed = spec.k_format == "fp8_ds_mla_v4"
    align = DSV4_PAGE_ALIGNMENT[packed]

    def page(tokens: int, record_bytes: int, tokens_per_record: int = 1) -> int:
        return round_up(tokens // tokens_per_record * record_bytes, align)

    caches = [VllmCache("window", "sliding", DSV4_WINDOW_BLOCK, page(DSV4_WINDOW_BLOCK, spec.record_bytes()),
                        spec.window)]
    if spec.compressed:
        state_block = DSV4_STATE_BLOCK[spec.ratio]
        caches.append(VllmCache("compressed", "full", block_size, page(block_size, spec.record_bytes(), spec.ratio)))
        caches.append(VllmCache("compressor state", "sliding", state_block,
                                page(state_block, spec.state_width * COMPRESSOR_STATE_BYTES), spec.state_window))
        if spec.indexer is not None:
            caches.append(VllmCache("indexer", "full", block_size,
                                    page(block_size, spec.indexer_record_bytes(), spec.ratio)))
            caches.append(VllmCache("indexer state", "sliding", state_block,
                                    page(state_block, spec.indexer_state_width * COMPRESSOR_STATE_BYTES),
                                    spec.state_window))
    return tuple(caches)


def vllm_caches(layout: CacheLayout, block_size: int) -> list[VllmCache]:
    """Every cache tensor vLLM builds for the layout's attention layers, one KVCacheSpec each: DeepSeek sparse
    attention keeps its indexer keys in a cache of their own beside the latent."""
    caches = []
    for spec in layout.kv.values():
        if spec.kind == "compressed":
            caches.extend(compressed_vllm_caches(spec, block_size))
            continue
        window = getattr(spec, "window", 0) or getattr(spec, "chunk", 0)
        page = spec.page_bytes(block_size)
        if spec.indexer is not None:
            indexer = sum(spec.indexer.bytes_for(block_size, spec.head_dim, spec.heads))
            caches.append(VllmCache("indexer", "full", block_size, indexer))
            page -= indexer
        caches.append(VllmCache("kv", spec.kind, block_size, page, window))
    return caches


def _approximate_gcd(values: list[int], lower_bound: int) -> int:
    """vLLM's choice of pattern repeats per group: the d >= lower_bound that pads the values least
    (rounding each up to a multiple of d), ties to the larger d (kv_cache_planning.py _approximate_gcd)."""
    best, best_pad = lower_bound, None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad < best_pad or (pad == best_pad and d > best):
            best, best_pad = d, pad
    return best


@dataclass(frozen=True)
class PackedGroup:
    """A KV cache group of vLLM's block-outermost packing: pages of several sizes side by side in a block."""

    caches: tuple[VllmCache, ...]

    def page_bytes(self, block_size: int) -> int:
        return sum(c.page_bytes for c in self.caches)

    def vllm_usage_bytes(self, max_model_len: int, block_size: int, in_flight_tokens: int) -> int:
        # UniformTypeKVCacheSpecs.max_memory_usage_bytes: the most pages any member needs, of the whole group.
        pages = max(cdiv(c.usage_bytes(max_model_len, in_flight_tokens), c.page_bytes) for c in self.caches)
        return pages * self.page_bytes(block_size)

    @property
    def group_key(self) -> tuple:
        return ("packed",) + self.caches[0].bucket


def packed_groups(caches: list[VllmCache]) -> tuple[PackedGroup, ...]:
    """vLLM 0.33's _get_packed_kv_cache_groups for caches of mixed page sizes: bucket by block size and type;
    a bucket with as many caches of each page size is a repeating pattern, split into groups of the same
    number of repeats (the repeats that pad least); a sliding-window bucket with no pattern to follow is
    split into as many groups as a block of the widest other group holds."""
    buckets: dict[tuple, list[VllmCache]] = {}
    for cache in caches:
        buckets.setdefault(cache.bucket, []).append(cache)
    shaped = []
    for members in buckets.values():
        by_page: dict[int, list[VllmCache]] = {}
        for cache in members:
            by_page.setdefault(cache.page_bytes, []).append(cache)
        balanced = len({len(v) for v in by_page.values()}) == 1
        most = max(len(v) for v in by_page.values())
        shaped.append((members, by_page, balanced, most))
    floor = max((most for _, by_page, balanced, most in shaped if balanced and len(by_page) > 1), default=0)
    repeats = _approximate_gcd([most for _, _, balanced, most in shaped if balanced], floor) if floor else None

    def split(balanced: bool, most: int) -> int:
        return cdiv(most, repeats) if balanced and repeats is not None else 1

    def is_state(members: list[VllmCache]) -> bool:
        return repeats is None and members[0].kind == "sliding"

    def widest(by_page: dict[int, list[VllmCache]], n: int) -> int:
        return sum(cdiv(len(v), n) * page for page, v in by_page.items())

    anchor = max(widest(by_page, len(members) if is_state(members) else split(balanced, most))
                 for members, by_page, balanced, most in shaped)
    groups = []
    for members, by_page, balanced, most in shaped:
        n = split(balanced, most)
        if anchor and is_state(members):
            n = max(n, cdiv(len(members), max(anchor // members[0].page_bytes, 1)))
        if n == 1:
            groups.append(PackedGroup(tuple(members)))
            continue
        pattern = list(zip(*by_page.values()))
        groups.extend(PackedGroup(tuple(c for repeat in pattern[i::n] for c in repeat)) for i in range(n))
    return tuple(groups)


@hash_once
@dataclass(frozen=True)
class VllmPool:
    """vLLM v1 (vllm/v1/core/kv_cache_utils.py): one block pool; hybrid models group layers by
    type into groups of equal size and every block holds one page per layer of a group."""

    layout: CacheLayout
    block_size: int
    in_flight_tokens: int
    unit_bytes: int
    group_size: int
    groups: tuple  # one spec per KV cache group
    fixed_bytes: int
    holds_recurrent: bool = False  # Mamba state pages live in the pool (hybrid models)
    paged = True

    @classmethod
    def build(cls, layout: CacheLayout, block_size: int, in_flight_tokens: int,
              mamba_pages: int = MAMBA_PAGES_PER_REQUEST) -> VllmPool:
        if any(spec.kind == "compressed" for spec in layout.kv.values()):
            # DeepSeek-V4's backends lay the cache out block-outermost (BLHNC): mixed page sizes are packed.
            caches = [c for spec in layout.kv.values() for c in compressed_vllm_caches(spec, block_size)]
            groups = packed_groups(caches)
            widest = max(g.page_bytes(block_size) for g in groups)
            return cls(layout, block_size, in_flight_tokens, widest, len(caches), groups, layout.pool_fixed_bytes())
        specs: dict = dict(layout.kv)
        holds_recurrent = bool(layout.kv and layout.recurrent)
        if holds_recurrent:
            attn_1 = max(spec.page_bytes(1) for spec in layout.kv.values())
            block_size = hybrid_block_size(layout, block_size, attn_1)
            specs.update({i: MambaPageSpec(r.state_bytes, attn_1, mamba_pages) for i, r in layout.recurrent.items()})
        by_type: dict[tuple, list] = {}
        for spec in specs.values():
            by_type.setdefault(spec.group_key, []).append(spec)
        if len(by_type) <= 1:
            # Uniform type (also with per-layer page sizes): num_blocks = available // sum of pages.
            unit = sum(spec.page_bytes(block_size) for spec in specs.values())
            groups = tuple(next(iter(by_type.values()))[:1]) if by_type else ()
            return cls(layout, block_size, in_flight_tokens, unit, max(1, len(specs)), groups,
                       layout.pool_fixed_bytes(), holds_recurrent)
        specs = _unify_pages(specs, block_size)  # one page size across the types
        by_type = {}
        for spec in specs.values():
            by_type.setdefault(spec.group_key, []).append(spec)
        counts = [len(v) for v in by_type.values()]
        group_size = min(counts)
        if max(counts) < group_size * 1.5:
            group_size = max(counts)
        groups = tuple(layers[0] for layers in by_type.values() for _ in range(cdiv(len(layers), group_size)))
        page = next(iter(specs.values())).page_bytes(block_size)
        return cls(layout, block_size, in_flight_tokens, page * group_size, group_size, groups,
                   layout.pool_fixed_bytes(), holds_recurrent)

    def request_units(self, context_len: int) -> int:
        return _vllm_request_units(self, context_len)

    def _request_units(self, context_len: int) -> int:
        # get_max_concurrency_for_kv_cache_config: each group's pages for one request, from one shared pool.
        return sum(cdiv(g.vllm_usage_bytes(context_len, self.block_size, self.in_flight_tokens),
                        g.page_bytes(self.block_size)) for g in self.groups)

    def tokens(self, units: int) -> int:
        # "GPU KV cache size: N tokens" (vllm/v1/core/kv_cache_utils.py, _report_kv_cache_config)
        return units // max(1, len(self.groups)) * self.block_size

    def payload_share(self) -> tuple[int, int]:
        return _payload_share(self.layout, self.block_size)


@lru_cache(maxsize=65536)
def _vllm_request_units(pool: VllmPool, context_len: int) -> int:
    # Capacity searches ask each pool for the same lengths many times.
    return pool._request_units(context_len)


@hash_once
@dataclass(frozen=True)
class UniformBlockPool:
    """One block table for all layers: SGLang (page_size tokens, default 1), TensorRT-LLM
    (tokens_per_block), LMDeploy (cache_block_seq_len). Window layers are sized as full
    layers, which is how these engines allocate unless their hybrid pools are enabled."""

    layout: CacheLayout
    block_size: int
    unit_bytes: int
    fixed_bytes: int
    paged = True
    holds_recurrent = False

    @classmethod
    def build(cls, layout: CacheLayout, block_size: int) -> UniformBlockPool:
        unit = sum(spec.page_bytes(block_size) for spec in layout.kv.values())
        return cls(layout, block_size, unit, layout.pool_fixed_bytes())

    def request_units(self, context_len: int) -> int:
        return cdiv(context_len, self.block_size) if self.layout.kv else 0

    def tokens(self, units: int) -> int:
        return units * self.block_size

    def payload_share(self) -> tuple[int, int]:
        return _payload_share(self.layout, self.block_size)


@hash_once
@dataclass(frozen=True)
class ExactPool:
    """No paging: each layer holds exactly min(tokens, its window) for each sequence.
    llama.cpp (contiguous cache) also pads the context to a multiple of `pad` tokens."""

    layout: CacheLayout
    pad: int
    fixed_bytes: int
    per_token_bytes: int
    unit_bytes = 1
    block_size = 1
    paged = False
    holds_recurrent = False

    @classmethod
    def build(cls, layout: CacheLayout, pad: int = 1) -> ExactPool:
        payload, metadata = layout.token_bytes()
        per_token = ceil_fraction(payload) + ceil_fraction(metadata)
        return cls(layout, pad, layout.pool_fixed_bytes(), per_token)

    def request_units(self, context_len: int) -> int:
        p, m = self.layout.sequence_bytes(cdiv(context_len, self.pad) * self.pad)
        return p + m

    def tokens(self, units: int) -> int:
        return units // self.per_token_bytes if self.per_token_bytes else 0

    def payload_share(self) -> tuple[int, int]:
        payload, metadata = self.layout.token_bytes()
        return ceil_fraction(payload), ceil_fraction(metadata)


@lru_cache(maxsize=8192)
def _payload_share(layout: CacheLayout, block_size: int) -> tuple[int, int]:
    payload = metadata = 0
    for spec in layout.kv.values():
        p, m = spec.page_split(block_size)
        payload, metadata = payload + p, metadata + m
    return payload, metadata


# -- engines ---------------------------------------------------------------------------


def _subtracted(m: MemoryTerms, terms: frozenset[str]) -> int:
    return sum(getattr(m, {"cuda_graphs": "cuda_graph_bytes"}.get(t, f"{t}_bytes")) for t in terms)


def _named(terms: frozenset[str]) -> str:
    return " − ".join(t for t in ("weights", "activation", "non_torch", "cuda_graphs") if t in terms)


def _vllm_budget(m: MemoryTerms, fraction: float, headroom: float, release: Release | None) -> Budget:
    terms = release.subtracts if release else frozenset({"weights", "activation", "non_torch", "cuda_graphs"})
    if not m.graphs_profiled:
        terms = terms - {"cuda_graphs"}
    usable = release.requested(m.total_bytes, fraction) if release else int(m.total_bytes * fraction)
    graphs_outside = 0 if "cuda_graphs" in terms else m.cuda_graph_bytes  # captured in the unrequested rest
    return Budget(usable - _subtracted(m, terms), m.total_bytes - usable - graphs_outside, usable,
                  f"gpu_memory_utilization × total − {_named(terms)}"
                  + ("" if "cuda_graphs" in terms else " (CUDA graphs are captured later, not subtracted)"))


def _sglang_budget(m: MemoryTerms, fraction: float, headroom: float, release: Release | None) -> Budget:
    # profile_max_num_token: rest = free after weights − free_at_start × (1 − f), where free_at_start
    # is read after the CUDA context and NCCL are up (non_torch here), before the weights load.
    free_at_start = m.total_bytes - m.non_torch_bytes
    usable = int(free_at_start * fraction)
    kv = usable - m.weights_bytes
    return Budget(kv, free_at_start - usable - m.activation_bytes - m.cuda_graph_bytes, usable,
                  "mem_fraction_static × (total − non_torch at start) − weights "
                  "(activation and CUDA graphs live in the rest)")


def _trtllm_budget(m: MemoryTerms, fraction: float, headroom: float, release: Release | None) -> Budget:
    free = m.total_bytes - m.model_bytes
    kv = int(free * fraction)
    return Budget(kv, free - kv, m.total_bytes,
                  "free_gpu_memory_fraction × (total − weights − activation − non_torch − cuda_graphs)")


def _lmdeploy_budget(m: MemoryTerms, fraction: float, headroom: float, release: Release | None) -> Budget:
    free = m.total_bytes - m.weights_bytes - m.non_torch_bytes
    kv = int(free * fraction)
    return Budget(kv, free - kv - m.activation_bytes - m.cuda_graph_bytes, m.total_bytes,
                  "cache_max_entry_count × (total − weights − non_torch)")


def _headroom_budget(m: MemoryTerms, fraction: float, headroom: float, release: Release | None) -> Budget:
    usable = m.total_bytes - int(m.total_bytes * headroom)
    return Budget(usable - m.model_bytes, m.total_bytes - usable, usable,
                  "(1 − headroom) × total − weights − activation − non_torch − cuda_graphs")


def _vllm_pool(layout: CacheLayout, block_size: int, in_flight_tokens: int,
               mamba_pages: int = MAMBA_PAGES_PER_REQUEST) -> Pool:
    return VllmPool.build(layout, block_size, in_flight_tokens, mamba_pages)


def _no_compressed(layout: CacheLayout, engine: str) -> None:
    if any(spec.kind == "compressed" for spec in layout.kv.values()):
        raise KvsizeError(f"kvsize does not know how {engine} pages DeepSeek-V4's compressed caches (its layout "
                          "is unconfirmed); use --engine vllm or --engine ideal")


def _block_pool(layout: CacheLayout, block_size: int, in_flight_tokens: int, mamba_pages: int = 0) -> Pool:
    _no_compressed(layout, "this engine")
    return UniformBlockPool.build(layout, block_size)


def _exact_pool(layout: CacheLayout, block_size: int, in_flight_tokens: int, mamba_pages: int = 0) -> Pool:
    return ExactPool.build(layout)


def _llamacpp_pool(layout: CacheLayout, block_size: int, in_flight_tokens: int, mamba_pages: int = 0) -> Pool:
    _no_compressed(layout, "llama.cpp")
    return ExactPool.build(layout, LLAMACPP_CTX_PAD)


# -- how an engine builds a model ------------------------------------------------------

ModelRule = Callable[[ModelShape, str, str, "Release | None"], tuple[ModelShape, str, str, tuple[str, ...]]]


def vllm_default_context(shape: ModelShape, rule) -> int:
    """vLLM's derived max_model_len (vllm/config/model.py _get_and_verify_max_len; rule: the release's)."""
    derived = shape.max_position_embeddings
    if not any(part in shape.model_type for part in rule.factor_skipped_model_types):
        factor = 1.0
        for kind, value, original in shape.rope_scalings:
            if kind in rule.factor_exempt_rope_types:
                continue
            factor = value if value is not None else factor
            if kind == "yarn" and rule.yarn_length_from_original and original is not None:
                derived = original
        derived = int(derived * factor)
    if rule.longrope_uses_original and any(kind == "longrope" for kind, _, _ in shape.rope_scalings):
        return shape.original_max_position_embeddings or derived
    return derived


def _as_configured(shape: ModelShape, k_format: str, v_format: str, release: Release | None):
    return shape, k_format, v_format, ()


def _vllm_model(shape: ModelShape, k_format: str, v_format: str, release: Release | None):
    """The model and cache formats as vLLM builds them, where it departs from the config."""
    notes: list[str] = []
    if release is not None and shape.model_type in release.kv_dtype_ignored_model_types \
            and (k_format, v_format) != ("auto", "auto"):
        # The model class builds its Attention without the cache config (vllm/model_executor/models/falcon.py).
        k_format = v_format = "auto"
        notes.append(f"vLLM builds {shape.model_type} attention without the cache config: the cache stays in "
                     f"{shape.serving_dtype} whatever --kv-cache-dtype says")
    if (release is not None and release.mla_model_types is not None and shape.is_mla
            and shape.model_type not in release.mla_model_types):
        if not shape.mla_head_dim:
            raise KvsizeError(f"vLLM builds {shape.model_type} without an MLA cache, with per-head K and V of "
                              "qk_nope_head_dim + qk_rope_head_dim values, but config.json gives no qk_nope_head_dim")
        # e.g. MiniCPM3 (vllm/model_executor/models/minicpm3.py): K and V per attention head, V padded to K's width.
        shape = replace(shape, mla_latent_dim=None, index_head_dim=0, num_kv_heads=shape.num_attention_heads,
                        head_dim=shape.mla_head_dim)
        notes.append(f"vLLM does not build {shape.model_type} with an MLA cache: every attention head keeps K and "
                     f"V of {shape.mla_head_dim} values")
    if shape.layer_compress_ratios:
        if shape.model_type not in DSV4_MODEL_TYPES:
            # Each compressed-attention family has its own model class in vLLM (vllm/models/deepseek_v41/:
            # 528 B mxfp8 records, bounded window replay, KV shared across layers).
            raise KvsizeError(f"vLLM builds {shape.model_type}'s compressed caches with a model class kvsize does "
                              f"not model (it models {', '.join(DSV4_MODEL_TYPES)}); use --engine ideal")
        k_format, v_format, note = _dsv4_format(k_format, v_format, shape.serving_dtype)
        notes.append(note)
    elif shape.index_head_dim and k_format == "fp8_e4m3":
        # DeepSeek sparse attention's fp8 cache is fp8_ds_mla (FlashMLA sparse backend).
        k_format = v_format = "fp8_ds_mla"
        notes.append("vLLM stores this DSA model's fp8 cache as fp8_ds_mla (656 B per token per layer)")
    if shape.sliding_window_size is not None:
        # vLLM's model passes config.sliding_window_size as the window (vllm/model_executor/models/mimo_v2.py).
        shape = replace(shape, sliding_window=shape.sliding_window_size)
    if shape.window_without_layer_types and not (release is not None and release.global_window_every_layer):
        # vLLM 0.33 builds Mistral-7B-v0.1 with FullAttentionSpec on every layer: its attention
        # takes a window only from layer_types, which this config does not have.
        shape = replace(shape, layer_kinds=tuple("full" if k == "sliding" else k for k in shape.layer_kinds),
                        sliding_window=None)
        notes.append("vLLM builds this model with full attention on every layer: its sliding_window is "
                     "not applied without layer_types (use --engine ideal for the windowed cache)")
    return shape, k_format, v_format, tuple(notes)


# The model types vLLM builds with its deepseek_v4 model class (vllm/models/deepseek_v4/).
DSV4_MODEL_TYPES = ("deepseek_v4",)


def _dsv4_format(k_format: str, v_format: str, model_dtype: str) -> tuple[str, str, str]:
    """vLLM turns auto (here: the model's dtype) and every fp8 spelling into DeepSeek-V4's fp8_ds_mla record
    on CUDA and refuses the rest (vllm/models/deepseek_v4/attention.py _resolve_dsv4_kv_cache_dtype; FlashMLA
    and FlashInfer-SM120, the default classes, use the fp8_ds_mla layout)."""
    for name, option in ((k_format, "--k-cache-dtype"), (v_format, "--v-cache-dtype")):
        if name != model_dtype and not name.startswith("fp8"):
            raise KvsizeError(f"{option} {name}: vLLM stores DeepSeek-V4's cache only as its fp8_ds_mla record "
                              f"(584 B per token per layer); use --kv-cache-dtype fp8 or auto")
    return "fp8_ds_mla_v4", "fp8_ds_mla_v4", ("vLLM stores DeepSeek-V4's latents as fp8_ds_mla records "
                                              "(584 B per token per layer, pages rounded up to 576 B)")


def attention_family(spec) -> str | None:
    """Which attention backend family a layer needs, where its block size is the backend's own."""
    if spec.kind == "compressed":
        return "compressed_mla"
    if getattr(spec, "indexer", None) is not None:
        return "sparse_mla"
    return None


@hash_once
@dataclass(frozen=True)
class Engine:
    name: str
    fraction_option: str | None  # the engine's own memory-fraction setting
    fraction_default: float
    block_option: str | None
    block_default: int
    cuda_graphs: bool
    budget_rule: Callable[[MemoryTerms, float, float, Release | None], Budget]
    pool_rule: Callable[[CacheLayout, int, int], Pool]
    source: str
    release: Release | None = None  # the release range whose defaults and terms apply
    version: str | None = None  # the version asked for (None: no '@'); the default follows the newest started
    model_rule: ModelRule = _as_configured  # where the engine builds the model unlike its config

    @property
    def label(self) -> str:
        """The engine and the rules followed, as every output names them."""
        if self.release is None:
            return self.name
        return f"{self.release.name} rules: {self.release.label}"

    @property
    def followed_version(self) -> str | None:
        """The version whose rules apply: the one asked for, else the newest started release (None for an engine
        without release files, or with no started release)."""
        if self.release is None:
            return None

        return self.version or newest_started(self.name)

    @property
    def memory_fraction_default(self) -> float:
        return self.release.memory_fraction_default if self.release else self.fraction_default

    def default_fraction(self, gpu_mib: int, tp: int, pp: int, inputs=None) -> float:
        """The fraction the engine picks without one from the user (SGLang's depends on the GPU, the model's
        attention and the prefill and CUDA-graph settings: releases.FractionInputs)."""
        return self.release.default_fraction(gpu_mib, tp, pp, inputs) if self.release else self.fraction_default

    @property
    def block_size_default(self) -> int:
        return self.release.block_size_default if self.release else self.block_default

    def block_size_for(self, layout: CacheLayout) -> int:
        """The block size the engine pages this layout with when none is given: its attention backend's."""
        sizes = self.release.attention_block_sizes if self.release else {}
        families = {attention_family(spec) for spec in layout.kv.values()} - {None}
        if self.name == "vllm" and "compressed_mla" in families and "compressed_mla" not in sizes:
            raise KvsizeError(f"{self.label}: this release does not build DeepSeek-V4's compressed MLA pool; "
                              "kvsize models it as vLLM 0.33 builds it, a release never started here: use "
                              "--engine vllm@0.33")
        for family in ("compressed_mla", "sparse_mla"):
            if family in families and family in sizes:
                return sizes[family]
        return self.block_size_default

    def budget(self, m: MemoryTerms, fraction: float, headroom: float) -> Budget:
        return self.budget_rule(m, fraction, headroom, self.release)

    def default_max_model_len(self, shape: ModelShape) -> int:
        """The context the engine serves when no --max-model-len is given."""
        rule = self.release.default_context if self.release else None
        if rule is None:
            return shape.max_position_embeddings
        return vllm_default_context(shape, rule)

    def build_model(self, shape: ModelShape, k_format: str, v_format: str):
        """(shape, k format, v format, notes) as this engine release builds the model."""
        return self.model_rule(shape, k_format, v_format, self.release)

    def layer_overrides(self, shape: ModelShape, k_format: str, user: str | None) -> str | None:
        """--layer-kv-dtype as the engine applies it: its own boundary layers first, the user's after."""
        rule = self.release.boundary_layers_in_model_dtype if self.release else None
        if rule is None or k_format not in rule.formats or "recurrent" in shape.layer_kinds:
            return user
        n = min(rule.layers, shape.num_layers // 2)
        if n == 0:
            return user
        own = f"first:{n},last:{n}=auto"
        return f"{own};{user}" if user else own

    def pool(self, layout: CacheLayout, block_size: int, max_num_batched_tokens: int, pp: int = 1) -> Pool:
        batches = self.release.in_flight_batches(pp) if self.release else 1
        pages = self.release.mamba_pages_per_request if self.release else MAMBA_PAGES_PER_REQUEST
        return self.pool_rule(layout, block_size, max_num_batched_tokens * batches, pages)

    def reported_tokens(self, pool: Pool, units: int, concurrency: float, max_model_len: int) -> int:
        """The token count the engine logs for its pool (vLLM: "GPU KV cache size: N tokens")."""
        if pool.holds_recurrent or (self.release and self.release.kv_cache_size_tokens == "concurrency"):
            return int(concurrency * max_model_len)
        return pool.tokens(units)


ENGINES: dict[str, Engine] = {
    "vllm": Engine("vllm", "--gpu-memory-utilization", 0.9, "--block-size", 16, True, _vllm_budget, _vllm_pool,
                   "vllm/v1/worker/gpu_worker.py (determine_available_memory), vllm/v1/core/kv_cache_utils.py "
                   "(get_num_blocks, get_max_concurrency_for_kv_cache_config), vllm/v1/kv_cache_interface.py",
                   model_rule=_vllm_model),
    "sglang": Engine("sglang", "--mem-fraction-static", 0.88, "--page-size", 1, True, _sglang_budget, _block_pool,
                     "python/sglang/srt/model_executor/model_runner.py (profile_max_num_token: rest_memory = "
                     "available − total × (1 − mem_fraction_static); max_total_num_tokens = rest // cell_size)"),
    "trtllm": Engine("trtllm", "--free-gpu-memory-fraction", 0.9, "--tokens-per-block", 32, True, _trtllm_budget, _block_pool,
                     "tensorrt_llm/_torch/pyexecutor/_util.py (KvCacheCreator: free memory after the profiling "
                     "run × free_gpu_memory_fraction), KvCacheConfig.tokens_per_block"),
    "lmdeploy": Engine("lmdeploy", "--cache-max-entry-count", 0.8, "--cache-block-seq-len", 64, True, _lmdeploy_budget, _block_pool,
                       "lmdeploy/turbomind (cache_max_entry_count: share of free GPU memory after weights for "
                       "the k/v cache; cache_block_seq_len tokens per block)"),
    "llamacpp": Engine("llamacpp", None, 0.0, None, 1, False, _headroom_budget, _llamacpp_pool,
                       "src/llama-kv-cache.cpp (contiguous per-layer K and V tensors of n_ctx cells; "
                       "n_ctx padded to 256)"),
    "ideal": Engine("ideal", None, 0.0, None, 1, False, _headroom_budget, _exact_pool,
                    "no engine: each layer holds exactly min(tokens, its window); KIVI keeps its fp16 residual"),
}


def get_engine(name: str) -> Engine:
    """`vllm` (its newest release's rules) or `vllm@0.19` (the rules of the range holding 0.19)."""
    text = str(name).strip()
    base, at, version = text.partition("@")
    if at and not version.strip():
        raise KvsizeError(f"--engine {text}: give a version after '@' (e.g. {base}@0.22.1), or no '@' for the "
                          "newest rules")
    key = base.lower().replace("-", "").replace("_", "").replace(".", "")
    key = {"tensorrtllm": "trtllm", "llamacpp": "llamacpp", "trt": "trtllm"}.get(key, key)
    if key not in ENGINES:
        raise unknown("engine", base, ENGINES, "--engine")
    return _with_release(key, version.strip() or None)


@lru_cache(maxsize=64)
def _with_release(key: str, version: str | None) -> Engine:

    engine = ENGINES[key]
    # without a version, the rules of the newest release a real start confirmed, not the newest read from source
    version = version or newest_started(key)
    release = find_release(key, version)
    if release is None:
        if version is not None and version != newest_started(key):
            raise KvsizeError(f"--engine {key}@{version}: kvsize keeps no release rules for {key}; use --engine {key}")
        return engine
    return replace(engine, release=release, version=version)


def engine_formats(engine_name: str) -> list[str]:
    """The formats whose registry row names this engine (sizing/cache/formats.py)."""
    return list(_engine_formats(engine_name))


@lru_cache(maxsize=32)
def _engine_formats(engine_name: str) -> tuple[str, ...]:
    from ..cache.formats import FORMAT_NAMES, get_format

    return tuple(n for n in FORMAT_NAMES if engine_name in get_format(n).engines)


def check_format_supported(engine: Engine, fmt_name: str, engines_of_format: tuple[str, ...], option: str) -> None:
    if engine.name not in engines_of_format:
        raise KvsizeError(
            f"{option} {fmt_name} is not a KV cache format of {engine.name} (it supports: auto, "
            f"{', '.join(engine_formats(engine.name))}); "
            f"engines that store {fmt_name}: {', '.join(engines_of_format)}"
        )
    from .accepted_dtypes import check_release_accepts
    from .serve import LAUNCHERS

    launcher = LAUNCHERS.get(engine.name)
    spelling = launcher.spelling.get(fmt_name) if launcher else None
    if spelling is not None:
        check_release_accepts(engine.name, engine.followed_version, spelling, fmt_name)


def engine_evidence(spec: str) -> ReleaseEvidence | None:
    """release_evidence for an --engine value as typed (vllm, vllm@0.30, sglang@0.5.14, ...)."""
    engine = get_engine(spec)
    return release_evidence(engine.name, engine.version)

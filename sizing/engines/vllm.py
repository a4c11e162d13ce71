"""vLLM's rules: the memory it leaves the KV cache (gpu_memory_utilization of the GPU less what its profiling
run measured), its v1 block pool (KV cache groups of equal pages; hybrid models' Mamba state padded into the
pool; DeepSeek-V4's mixed page sizes packed block-outermost), the context it derives without --max-model-len,
and where it builds a model unlike its config."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from ..hashing import hash_once
from ..errors import KvsizeError
from ..cache.layers import COMPRESSOR_STATE_BYTES, CacheLayout, vllm_full_blocks, vllm_window_blocks
from .base import Budget, Engine, MemoryTerms, Pool, layout_payload_share
from .releases import Release
from ..config import ModelShape
from ..units import cdiv, round_up

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
        return layout_payload_share(self.layout, self.block_size)


@lru_cache(maxsize=65536)
def _vllm_request_units(pool: VllmPool, context_len: int) -> int:
    # Capacity searches ask each pool for the same lengths many times.
    return pool._request_units(context_len)


# -- budget ----------------------------------------------------------------------------


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


def _vllm_pool(layout: CacheLayout, block_size: int, in_flight_tokens: int,
               mamba_pages: int = MAMBA_PAGES_PER_REQUEST) -> Pool:
    return VllmPool.build(layout, block_size, in_flight_tokens, mamba_pages)


# -- how vLLM builds a model ------------------------------------------------------------


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


VLLM = Engine("vllm", "--gpu-memory-utilization", 0.9, "--block-size", 16, True, _vllm_budget, _vllm_pool,
              "vllm/v1/worker/gpu_worker.py (determine_available_memory), vllm/v1/core/kv_cache_utils.py "
              "(get_num_blocks, get_max_concurrency_for_kv_cache_config), vllm/v1/kv_cache_interface.py",
              model_rule=_vllm_model, context_rule=vllm_default_context)

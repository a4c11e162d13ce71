"""What every engine is made of: the memory beside the KV cache and the budget an engine's rule leaves for
it, the pool that cuts that budget into blocks, and the Engine record that ties an engine's rules to the
release whose defaults apply. The engines themselves are one module each, listed in registry.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Protocol

from ..hashing import hash_once
from ..errors import KvsizeError
from ..cache.layers import CacheLayout
from .releases import DefaultContextRule, Release
from .started import newest_started
from ..config import ModelShape
from ..units import cdiv, ceil_fraction


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
        return layout_payload_share(self.layout, self.block_size)


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
def layout_payload_share(layout: CacheLayout, block_size: int) -> tuple[int, int]:
    payload = metadata = 0
    for spec in layout.kv.values():
        p, m = spec.page_split(block_size)
        payload, metadata = payload + p, metadata + m
    return payload, metadata


def refuse_compressed(layout: CacheLayout, engine: str) -> None:
    if any(spec.kind == "compressed" for spec in layout.kv.values()):
        raise KvsizeError(f"kvsize does not know how {engine} pages DeepSeek-V4's compressed caches (its layout "
                          "is unconfirmed); use --engine vllm or --engine ideal")


def block_pool(layout: CacheLayout, block_size: int, in_flight_tokens: int, mamba_pages: int = 0) -> Pool:
    refuse_compressed(layout, "this engine")
    return UniformBlockPool.build(layout, block_size)


def exact_pool(layout: CacheLayout, block_size: int, in_flight_tokens: int, mamba_pages: int = 0) -> Pool:
    return ExactPool.build(layout)


# -- budgets ---------------------------------------------------------------------------


def headroom_budget(m: MemoryTerms, fraction: float, headroom: float, release: Release | None) -> Budget:
    usable = m.total_bytes - int(m.total_bytes * headroom)
    return Budget(usable - m.model_bytes, m.total_bytes - usable, usable,
                  "(1 − headroom) × total − weights − activation − non_torch − cuda_graphs")


# -- how an engine builds a model ------------------------------------------------------

ModelRule = Callable[[ModelShape, str, str, "Release | None"], tuple[ModelShape, str, str, tuple[str, ...]]]
ContextRule = Callable[[ModelShape, DefaultContextRule], int]


def as_configured(shape: ModelShape, k_format: str, v_format: str, release: Release | None):
    return shape, k_format, v_format, ()


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
    pool_rule: Callable[..., Pool]  # (layout, block size, in-flight tokens[, Mamba pages a request])
    source: str
    release: Release | None = None  # the release range whose defaults and terms apply
    version: str | None = None  # the version asked for (None: no '@'); the default follows the newest started
    model_rule: ModelRule = as_configured  # where the engine builds the model unlike its config
    # the context served without --max-model-len, from the release's default_context rule (None: the
    # model's max_position_embeddings)
    context_rule: ContextRule | None = None
    # the activation is sized at the served context (llama.cpp's compute buffer at its -c), so a stage's setup
    # holds for one context length only
    activation_reads_context: bool = False

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
        if rule is None or self.context_rule is None:
            return shape.max_position_embeddings
        return self.context_rule(shape, rule)

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
        if self.release is None:
            # no release file: the pool rule's own default for the Mamba pages a request holds
            return self.pool_rule(layout, block_size, max_num_batched_tokens)
        return self.pool_rule(layout, block_size, max_num_batched_tokens * self.release.in_flight_batches(pp),
                              self.release.mamba_pages_per_request)

    def reported_tokens(self, pool: Pool, units: int, concurrency: float, max_model_len: int) -> int:
        """The token count the engine logs for its pool (vLLM: "GPU KV cache size: N tokens")."""
        if pool.holds_recurrent or (self.release and self.release.kv_cache_size_tokens == "concurrency"):
            return int(concurrency * max_model_len)
        return pool.tokens(units)

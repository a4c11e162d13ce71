"""Decode and prefill speed from bytes moved and FLOPs (docs/formulas.md, 'Speed').

Decode is memory-bound: each step every TP rank reads its share of the weights and every
live token's KV (payload and metadata), so

    inter-token latency = weights read / (B × e_w) + KV read / (B × e_kv[format])

with B the GPU's HBM bandwidth (bytes/s, decimal GB) and e the fraction of it a kernel
reaches. The efficiencies are explicit parameters: by default an assumption, replaced by
the values a measurement report carries (`decode_efficiency` of `kvsize measure` reports).
Prefill is compute-bound: 2 FLOPs per active parameter per token plus causal attention,
over the GPU's dense bf16 throughput × MFU.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from types import MappingProxyType

from ..errors import KvsizeError
from ..cache.layers import CacheLayout
from ..engines.memory import WeightFormat, attention_format, attention_per_rank, expert_format, linear_format
from ..config import DTYPE_BYTES, ModelShape
from ..efficiency import GB, DecodeEfficiency
from ..units import cdiv, parse_assignments

def attention_seconds(bytes_read: int, hbm_bandwidth_gb_s: float, efficiency: DecodeEfficiency, fmt: str,
                      sequences: int, context_tokens: int) -> float:
    """One decode attention call over `sequences` sequences of `context_tokens` tokens: its fixed
    overhead, bytes over the bandwidth it reaches, and its per-sequence and per-token terms."""
    return (efficiency.overhead_s.get(fmt, 0.0) + bytes_read / (hbm_bandwidth_gb_s * GB * efficiency.for_format(fmt))
            + sequences * efficiency.per_sequence_s.get(fmt, 0.0)
            + context_tokens * efficiency.per_context_token_s.get(fmt, 0.0))


MIN_FRACTION = 1e-3


def parse_efficiency_overrides(text: str | None, base: DecodeEfficiency) -> DecodeEfficiency:
    """'fp8_e4m3=0.7,nvfp4=0.6,weights=0.8,default=0.7,mfu=0.4' over `base`."""
    if not text:
        return base
    kv = dict(base.kv)
    values = {"weights": base.weights, "default": base.kv_default, "mfu": base.mfu}
    given = set(base.given)
    for key, number in parse_assignments(text, "--kv-efficiency", "FORMAT=FRACTION", "fp8_e4m3=0.7").items():
        # below 0.1% of the copy bandwidth is no engine's: such a value only overflows the times it divides
        if not MIN_FRACTION <= number <= 1:
            raise KvsizeError(f"--kv-efficiency: {key}={number:g} must be a fraction from {MIN_FRACTION:g} to 1")
        if key in values:
            values[key] = number
            given.add(key)
        else:
            from ..cache.formats import get_format

            name = get_format(key, option="--kv-efficiency").name
            kv[name] = number
            given.add(name)
    return replace(base, weights=values["weights"], kv=MappingProxyType(kv), kv_default=values["default"],
                   mfu=values["mfu"], source=base.source + "; overridden: " + text, given=frozenset(given))


def experts_touched_fraction(num_experts: int, top_k: int, batch: float) -> float:
    """Expected share of routed experts a decode step reads with `batch` tokens routed uniformly."""
    if num_experts <= 0:
        return 0.0
    return 1.0 - (1.0 - min(top_k, num_experts) / num_experts) ** max(batch, 0.0)


@lru_cache(maxsize=4096)
def _weight_parts(shape: ModelShape, fmt: WeightFormat, tp: int) -> tuple[int, int]:
    """(bytes read every step, routed-expert bytes) of one TP rank."""
    dense = DTYPE_BYTES[shape.serving_dtype]
    linear, attention, routed = linear_format(shape, fmt), attention_format(shape, fmt), expert_format(fmt)
    always = experts = 0
    for i, p in enumerate(shape.layer_params):
        always += attention.bytes_for(attention_per_rank(shape, i, tp)) + linear.bytes_for(cdiv(p.mlp, tp))
        always += cdiv(p.other, tp) * dense
        experts += routed.bytes_for(cdiv(p.experts, tp))
    head = shape.lm_head_params or shape.embedding_params
    return always + cdiv(head, tp) * dense, experts


def weights_read_bytes(shape: ModelShape, fmt: WeightFormat, tp: int, batch: float) -> int:
    """Weight bytes one TP rank reads per decode step: every dense weight, the touched share of
    routed experts, and the lm_head; the embedding lookup reads only `batch` rows (ignored)."""
    always, experts = _weight_parts(shape, fmt, tp)
    touched = experts_touched_fraction(shape.num_experts, shape.num_experts_per_tok, batch)
    return always + int(experts * touched)


def _routed_share(shape: ModelShape) -> float:
    """The share of each layer's routed experts a token passes through: top_k / num_experts (0 for a dense model)."""
    return shape.num_experts_per_tok / shape.num_experts if shape.num_experts else 0


@lru_cache(maxsize=4096)
def active_params(shape: ModelShape) -> int:
    """Parameters every token of a step passes through: its layers (routed experts at top_k / num_experts). The
    lm_head is not among them: see head_params."""
    share = _routed_share(shape)
    return int(sum(p.attention + p.mlp + p.other + p.experts * share for p in shape.layer_params))


@lru_cache(maxsize=4096)
def routed_expert_params(shape: ModelShape) -> int:
    """Of active_params, the routed experts' (top_k / num_experts of them): the grouped GEMMs a MoE engine runs in
    its fused-expert kernels rather than the dense GEMMs of the rest."""
    share = _routed_share(shape)
    return int(sum(p.experts * share for p in shape.layer_params))


@lru_cache(maxsize=4096)
def head_params(shape: ModelShape) -> int:
    """The lm_head's parameters, which only a sampled position passes through: the engines compute logits for the
    last scheduled token of each request in a step (vLLM's logits_indices), not for every prompt token."""
    return shape.lm_head_params or shape.embedding_params


def gemm_flops(shape: ModelShape, step_tokens: int, sampled: int) -> int:
    """The GEMMs of a step of `step_tokens` tokens of which `sampled` get logits: 2 × (active × tokens + head ×
    sampled)."""
    return 2 * (active_params(shape) * step_tokens + head_params(shape) * sampled)


@dataclass(frozen=True)
class DecodeStep:
    """One decode step of one replica (every TP rank reads in parallel)."""

    batch: float
    weights_read_bytes: int  # per rank
    kv_read_bytes: int  # per rank, all live requests
    bandwidth_bytes_per_s: float
    weights_efficiency: float
    kv_efficiency: float

    @property
    def weights_seconds(self) -> float:
        return self.weights_read_bytes / (self.bandwidth_bytes_per_s * self.weights_efficiency)

    @property
    def kv_seconds(self) -> float:
        return self.kv_read_bytes / (self.bandwidth_bytes_per_s * self.kv_efficiency)

    @property
    def seconds(self) -> float:
        return self.weights_seconds + self.kv_seconds

    @property
    def tokens_per_second(self) -> float:
        return self.batch / self.seconds if self.seconds else 0.0


def kv_read_bytes(layout: CacheLayout, tokens: int) -> int:
    """KV bytes one rank reads for one request holding `tokens` tokens (windows respected)."""
    payload, metadata = layout.sequence_bytes(tokens)
    return payload + metadata


def decode_step(shape: ModelShape, layout: CacheLayout, weights: WeightFormat, tp: int,
                requests: list[tuple[float, int]], hbm_bandwidth_gb_s: float, efficiency: DecodeEfficiency,
                kv_format: str) -> DecodeStep:
    """`requests`: (count, tokens in cache) pairs; counts may be fractional (a mix's expectation)."""
    batch = sum(n for n, _ in requests)
    kv = sum(n * kv_read_bytes(layout, t) for n, t in requests)
    return DecodeStep(batch, weights_read_bytes(shape, weights, tp, batch), int(kv), hbm_bandwidth_gb_s * GB,
                      efficiency.weights, efficiency.for_format(kv_format))


def itl_slope_seconds_per_token(kv_bytes_per_token: int, batch: float, hbm_bandwidth_gb_s: float,
                                kv_efficiency: float) -> float:
    """Growth of inter-token latency per token of context of every live request."""
    return batch * kv_bytes_per_token / (hbm_bandwidth_gb_s * GB * kv_efficiency)


def attention_head_widths(shape: ModelShape) -> int:
    """A query head's QKᵀ width plus its PV width: 2 × head_dim; an MLA prompt's, whose keys are the up-projected
    latent's no-position part and the rotary part (qk_nope + qk_rope) and whose values are v_head_dim wide, both read
    from its kv_b_proj (heads × (qk_nope + v_head_dim) × kv_lora_rank)."""
    if not (shape.is_mla and shape.mla_head_dim and shape.mla_kv_b_proj_params):
        return 2 * shape.head_dim
    return shape.mla_kv_b_proj_params // (shape.num_attention_heads * shape.mla_kv_lora_rank) + shape.rotary_dim


def prefill_attention_flops(shape: ModelShape, prompt_tokens: int) -> int:
    """Causal attention over a prompt: QKᵀ and PV, 2 × heads × (QK width + PV width) × tokens² / 2 per attention
    layer."""
    attention_layers = sum(1 for k in shape.layer_kinds if k in ("full", "sliding", "chunked"))
    return attention_layers * shape.num_attention_heads * attention_head_widths(shape) * prompt_tokens ** 2


def prefill_seconds(shape: ModelShape, prompt_tokens: int, tp: int, tflops: float, mfu: float) -> float:
    """Compute-bound prefill of one prompt: its layers' GEMMs for every token, the lm_head for its last, and
    causal attention."""
    dense = gemm_flops(shape, prompt_tokens, 1)
    return (dense + prefill_attention_flops(shape, prompt_tokens)) / (tflops * 1e12 * mfu * tp)

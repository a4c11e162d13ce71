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

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from types import MappingProxyType
from typing import Annotated, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import KvsizeError
from .layers import CacheLayout
from .memory import WeightFormat, attention_format, attention_per_rank, expert_format, linear_format
from .shape import DTYPE_BYTES, ModelShape
from .units import cdiv, parse_assignments

GB = 10**9

DEFAULT_WEIGHTS_EFFICIENCY = 0.75
DEFAULT_KV_EFFICIENCY = 0.75
DEFAULT_MFU = 0.5
DEFAULT_EFFICIENCY_SOURCE = (
    "assumption: 75% of HBM bandwidth for weight GEMVs and for fused paged-attention reads of every format, "
    "50% MFU for prefill; replace with a measurement report (--efficiency-report) or --kv-efficiency"
)


# The fitted time terms of one attention call beside its bandwidth (attention_seconds), per format
KERNEL_TIME_TERMS = ("overhead_s", "per_sequence_s", "per_context_token_s")


@dataclass(frozen=True)
class DecodeEfficiency:
    """Fractions of HBM bandwidth reached; one value per KV format, `default` for the rest."""

    weights: float = DEFAULT_WEIGHTS_EFFICIENCY
    kv: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    kv_default: float = DEFAULT_KV_EFFICIENCY
    mfu: float = DEFAULT_MFU
    source: str = DEFAULT_EFFICIENCY_SOURCE
    # Fixed time of one attention call per format (launch and reduction); engines replay decode
    # as CUDA graphs, so the inter-token model leaves it out and kernel predictions add it.
    overhead_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # Kernel predictions also add time per sequence of the batch (its programs' start, partial
    # results and their reduction) and per token of context (one sequence's tiles walked in
    # order, which a small batch cannot hide); both fitted, both left out of the inter-token model.
    per_sequence_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    per_context_token_s: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    # The GPU the efficiencies were measured on (None: assumptions): its profile id, spec and measured
    # copy bandwidth, and its issue rate (SMs x boost clock in MHz), which on_gpu() carries them over from.
    reference_gpu: str | None = None
    reference_spec_gb_s: float | None = None
    reference_copy_gb_s: float | None = None
    reference_issue: float | None = None
    basis: str = ""  # how on_gpu() carried these figures over from the reference GPU; "" when not carried

    def __post_init__(self) -> None:
        for name, value in (("weights", self.weights), ("kv_default", self.kv_default), ("mfu", self.mfu),
                            *((f"kv[{k}]", v) for k, v in self.kv.items())):
            if not 0 < value <= 1:
                raise KvsizeError(f"efficiency {name} must be in (0, 1], got {value}")

    def for_format(self, fmt: str) -> float:
        return self.kv.get(fmt, self.kv_default)

    def on_gpu(self, gpu_id: str, spec_gb_s: float, copy_gb_s: float | None, issue: float | None) -> DecodeEfficiency:
        """The efficiencies on another GPU (docs/formulas.md, 'Decode time on another GPU'): a format's
        time per byte on the reference, t, is split into a memory part m = 1 / copy bandwidth and an
        issue part c = sqrt(t² − m²) (memory and instruction issue overlap as two orthogonal costs);
        on the target, t' = sqrt(m'² + (c × issue_ref / issue')²). Same GPU: unchanged."""
        if gpu_id == self.reference_gpu or self.reference_copy_gb_s is None or self.reference_spec_gb_s is None:
            return self
        ratio = self.reference_copy_gb_s / self.reference_spec_gb_s
        copy = copy_gb_s if copy_gb_s is not None else spec_gb_s * ratio
        scale = (self.reference_issue / issue) if (issue and self.reference_issue) else 1.0
        m_ref, m_new = 1 / self.reference_copy_gb_s, 1 / copy
        kv = {}
        for fmt, eff in self.kv.items():
            t = 1 / (self.reference_spec_gb_s * eff)
            c = math.sqrt(max(t * t - m_ref * m_ref, 0.0)) * scale
            kv[fmt] = min(1.0, 1 / (spec_gb_s * math.sqrt(m_new * m_new + c * c)))
        how = (f"measured copy bandwidth {copy_gb_s:,.0f} GB/s" if copy_gb_s is not None else
               f"copy bandwidth taken as {ratio:.1%} of its {spec_gb_s:,.0f} GB/s spec, as on {self.reference_gpu}")
        basis = (f"carried from {self.reference_gpu} to {gpu_id} ({how}; issue rate "
                 f"x{1 / scale:.2f}{'' if issue and self.reference_issue else ' (clock unknown: SMs only)'})")
        return replace(self, kv=MappingProxyType(kv), reference_gpu=None, basis=basis, source=f"{self.source}; {basis}")


class EfficiencySection(BaseModel):
    """A kernel benchmark report's decode_efficiency section, as kvsize uses it (numbers, never booleans or text;
    finite; bandwidths and efficiencies above zero). Other fields the benchmark records are kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    reference_bandwidth_gb_s: float = Field(gt=0, le=1e6)
    kv: dict[str, Annotated[float, Field(gt=0, le=10)]]
    overhead_s: dict[str, float] = {}
    per_sequence_s: dict[str, float] = {}
    per_context_token_s: dict[str, float] = {}
    weights: float = Field(default=DEFAULT_WEIGHTS_EFFICIENCY, gt=0, le=1)
    fitted_on_batch_at_least: int = Field(default=1, ge=1)


def efficiency_section(report: dict, where: str = "report") -> EfficiencySection:
    """The report's decode_efficiency section, checked; one line naming the field where it is not one."""
    section = report.get("decode_efficiency") if isinstance(report, dict) else None
    if not isinstance(section, dict) or not isinstance(section.get("kv"), dict):
        raise KvsizeError(f"{where} has no decode_efficiency section; run the kernel benchmark "
                          f"(benchmarks/bench_decode.py) to measure one")
    try:
        return EfficiencySection.model_validate(section)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"])
        raise KvsizeError(f"{where}: decode_efficiency.{field}: {err['msg']}") from None


def efficiency_from_report(report: dict, where: str = "report") -> DecodeEfficiency:
    """The measured efficiencies of a kernel benchmark report (benchmarks/bench_decode.py)."""
    section = efficiency_section(report, where)
    kv = dict(section.kv)
    terms = {name: MappingProxyType(dict(getattr(section, name))) for name in KERNEL_TIME_TERMS}
    device = report.get("device") if isinstance(report.get("device"), dict) else {}
    return DecodeEfficiency(
        weights=section.weights, kv=MappingProxyType(kv),
        kv_default=DEFAULT_KV_EFFICIENCY, **terms,
        source=f"measured on {device.get('name', 'a GPU')} ({where}): kv efficiency = bytes "
               f"read / kernel time / {section.reference_bandwidth_gb_s:g} GB/s; weights and formats "
               f"not measured: assumption {DEFAULT_WEIGHTS_EFFICIENCY:.0%} / {DEFAULT_KV_EFFICIENCY:.0%}",
    )


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
    for key, number in parse_assignments(text, "--kv-efficiency", "FORMAT=FRACTION", "fp8_e4m3=0.7").items():
        # below 0.1% of the copy bandwidth is no engine's: such a value only overflows the times it divides
        if not MIN_FRACTION <= number <= 1:
            raise KvsizeError(f"--kv-efficiency: {key}={number:g} must be a fraction from {MIN_FRACTION:g} to 1")
        if key in values:
            values[key] = number
        else:
            from .formats import get_format

            kv[get_format(key, option="--kv-efficiency").name] = number
    return replace(base, weights=values["weights"], kv=MappingProxyType(kv), kv_default=values["default"],
                   mfu=values["mfu"], source=base.source + "; overridden: " + text)


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


def active_params(shape: ModelShape) -> int:
    """Parameters one token passes through (routed experts at top_k / num_experts)."""
    share = shape.num_experts_per_tok / shape.num_experts if shape.num_experts else 0
    layers = sum(p.attention + p.mlp + p.other + p.experts * share for p in shape.layer_params)
    return int(layers) + (shape.lm_head_params or shape.embedding_params)


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


def prefill_seconds(shape: ModelShape, prompt_tokens: int, tp: int, tflops: float, mfu: float) -> float:
    """Compute-bound prefill of one prompt: 2 × active params × tokens + causal attention
    (QKᵀ and PV: 2 × 2 × heads × head_dim × tokens² / 2 per attention layer)."""
    attention_layers = sum(1 for k in shape.layer_kinds if k in ("full", "sliding", "chunked"))
    dense = 2 * active_params(shape) * prompt_tokens
    attn = 2 * attention_layers * shape.num_attention_heads * shape.head_dim * prompt_tokens ** 2
    return (dense + attn) / (tflops * 1e12 * mfu * tp)

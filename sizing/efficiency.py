"""How close a GPU's kernels come to its HBM bandwidth when decoding: the efficiencies the speed model
divides by, as a profile or a measurement report gives them (docs/formulas.md, 'Speed')."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Annotated, Mapping

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .errors import KvsizeError

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
    # the figures the user set (--kv-efficiency: format names, "weights"): an engine's measured share never
    # replaces them (step_model.engine_efficiency)
    given: frozenset[str] = frozenset()

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


TIME_SUFFIXES = ("_s", "_ms", "_us")  # a measured time: a finite number, never below zero


def _times_not_negative(fields: dict) -> None:
    """A report's other fields kept as they are, but a time among them (a name ending _s, _ms or _us) is a finite
    number of at least zero."""
    for name, value in fields.items():
        if isinstance(name, str) and name.endswith(TIME_SUFFIXES) and isinstance(value, (int, float)) and (
                isinstance(value, bool) or not math.isfinite(value) or value < 0):
            raise ValueError(f"{name} is {value!r}; a measured time is a finite number of at least 0")


_Seconds = Annotated[float, Field(ge=0, le=3600)]


class EfficiencySection(BaseModel):
    """A kernel benchmark report's decode_efficiency section, as kvsize uses it (numbers, never booleans or text;
    finite; bandwidths and efficiencies above zero, times at least zero). Other fields the benchmark records are
    kept as they are."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    reference_bandwidth_gb_s: float = Field(gt=0, le=1e6)
    kv: dict[str, Annotated[float, Field(gt=0, le=1)]]
    overhead_s: dict[str, _Seconds] = {}
    per_sequence_s: dict[str, _Seconds] = {}
    per_context_token_s: dict[str, _Seconds] = {}
    weights: float = Field(default=DEFAULT_WEIGHTS_EFFICIENCY, gt=0, le=1)
    fitted_on_batch_at_least: int = Field(default=1, ge=1)

    @model_validator(mode="after")
    def _times(self) -> "EfficiencySection":
        _times_not_negative(self.model_extra or {})
        return self


class _Device(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    name: str = Field(default="a GPU", min_length=1, max_length=256)


class _QualityPoint(BaseModel):
    """One decode point of a measurement report, as its attention error is shown beside a format."""

    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)

    # either may be left out (the point is then not shown), never null or of another type
    format: str = Field(default=None, min_length=1, max_length=64)  # type: ignore[assignment]
    attention_rel_error: float = Field(default=None, ge=0, le=1e6)  # type: ignore[assignment]

    @model_validator(mode="after")
    def _times(self) -> "_QualityPoint":
        _times_not_negative(self.model_extra or {})
        return self


class _QualityReport(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)

    decode: list[_QualityPoint] = []
    device: _Device = Field(default_factory=_Device)


def _refused(where: str, prefix: str, e: ValidationError) -> KvsizeError:
    from .errors import shown

    import re

    from .inputs import json_path

    err = e.errors()[0]
    field = json_path((*prefix, *err["loc"]))
    quotable = "input" in err and not isinstance(err["input"], (dict, list))
    given = f" (given {shown(err['input'], 40)})" if quotable else ""
    message = re.sub(r" or instance of \w+", "", err["msg"].removeprefix("Value error, "))
    return KvsizeError(f"{where}: {field}: {message}{given}")


def quality_section(report: dict, where: str = "report") -> dict:
    """The report a --quality-report names, checked where kvsize reads it (its decode points' formats, attention
    errors and times, its device's name): the report as given, or one line naming the field."""
    try:
        _QualityReport.model_validate({k: report[k] for k in ("decode", "device") if k in report})
    except ValidationError as e:
        raise _refused(where, (), e) from None
    return report


def efficiency_section(report: dict, where: str = "report") -> EfficiencySection:
    """The report's decode_efficiency section, checked; one line naming the field where it is not one."""
    section = report.get("decode_efficiency") if isinstance(report, dict) else None
    if not isinstance(section, dict) or not isinstance(section.get("kv"), dict):
        raise KvsizeError(f"{where} has no decode_efficiency section; run the kernel benchmark "
                          f"(benchmarks/bench_decode.py) to measure one")
    try:
        if "device" in report:
            _Device.model_validate(report["device"])
    except ValidationError as e:
        raise _refused(where, ("device",), e) from None
    try:
        return EfficiencySection.model_validate(section)
    except ValidationError as e:
        raise _refused(where, ("decode_efficiency",), e) from None


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

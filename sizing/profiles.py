"""Bundled profiles: one data file per model and per GPU under profiles/, file name as key.

Model files hold the unchanged config.json, where it came from, and the shape resolved
from it (so start-up needs no transformers; a test re-resolves every config and checks
the stored shape). Nothing is read at import time; loads are cached.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from .errors import KvsizeError, shown, unknown
from .config import ModelShape, read_config_file, resolve_shape
from .efficiency import KERNEL_TIME_TERMS, DecodeEfficiency

PROFILES_DIR = Path(__file__).resolve().parent.parent / "profiles"


class ModelProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    hf_id: str = Field(min_length=1)
    source: str = Field(min_length=1)
    config: dict[str, Any]
    shape: dict[str, Any]


class GpuProfile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    vendor: Literal["NVIDIA", "AMD"]
    architecture: str = Field(pattern=r"^(sm\d{2,3}|gfx\d{3,4})$")  # CUDA compute capability or AMD gfx target
    architecture_source: str = Field(min_length=1)
    memory_bytes: int = Field(gt=0)  # the total CUDA reports (cudaMemGetInfo), what engines size from
    memory_source: str = Field(min_length=1)
    nvml_memory_mib: int = Field(gt=0)  # what nvidia-smi shows, for display
    nvml_source: str = Field(min_length=1)
    multiprocessors: int = Field(gt=0)
    multiprocessors_source: str = Field(min_length=1)
    hbm_bandwidth_gb_s: float = Field(gt=0)
    copy_bandwidth_gb_s: float | None = Field(default=None, gt=0)  # measured device copy; None: not measured
    copy_bandwidth_source: str | None = None
    boost_clock_mhz: float | None = Field(default=None, gt=0)
    boost_clock_source: str | None = None
    bf16_dense_tflops: float = Field(gt=0)
    fp8_dense_tflops: float | None = Field(default=None, gt=0)
    fp8_native: bool
    nvfp4_native: bool  # FP4 tensor cores for NVIDIA's NVFP4 layout (Blackwell)
    nvfp4_source: str = Field(min_length=1)
    price_usd_per_hour: float = Field(gt=0)
    price_date: str = Field(pattern=r"^\d{4}-\d{2}(-\d{2})?$")
    price_source: str = Field(min_length=1)
    spec_source: str = Field(min_length=1)


class LinkProfile(BaseModel):
    """A link a KV tier or a disaggregated deployment moves blocks over (sizing/planners/tiers.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    kind: Literal["host", "peer", "disk", "remote"]
    bandwidth_gb_s: float = Field(gt=0)  # per direction, sustained (GB = 10^9 bytes)
    latency_us: float = Field(ge=0)
    per_transfer_us: float = Field(default=0.0, ge=0)  # each further transfer of a batch (NCCL sends)
    shared_by_gpus: bool  # one link for the node's GPUs (a drive, a NIC) rather than one per GPU
    source: str = Field(min_length=1)


class EfficiencyProfile(BaseModel):
    """Measured decode bandwidth efficiencies (a `decode_efficiency` report section, as data)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1)
    source: str = Field(min_length=1)
    device: str = Field(min_length=1)
    reference_bandwidth_gb_s: float = Field(gt=0)
    reference_gpu: str | None = None  # the bundled GPU profile id it was measured on
    kv: dict[str, float]
    overhead_s: dict[str, float]
    per_sequence_s: dict[str, float] = {}
    per_context_token_s: dict[str, float] = {}
    measured_in: dict[str, str] = {}  # format -> the report its terms were fitted from
    weights: float = Field(gt=0, le=1)
    weights_source: str = Field(min_length=1)
    kv_default: float = Field(gt=0, le=1)
    kv_default_source: str = Field(min_length=1)

    @field_validator("kv")
    @classmethod
    def _fractions(cls, kv: dict[str, float]) -> dict[str, float]:
        for fmt, value in kv.items():
            if not 0 < value <= 1:
                raise ValueError(f"kv[{fmt}] must be in (0, 1], got {value}")
        return kv

    @field_validator(*KERNEL_TIME_TERMS)
    @classmethod
    def _seconds(cls, terms: dict[str, float]) -> dict[str, float]:
        for fmt, value in terms.items():
            if value < 0:
                raise ValueError(f"[{fmt}] is a time and must be >= 0, got {value}")
        return terms


DEFAULT_EFFICIENCY_PROFILE = "h200-triton-fused"


def _ids(kind: str) -> list[str]:
    return sorted(p.stem for p in (PROFILES_DIR / kind).glob("*.json"))


@cache
def model_ids() -> tuple[str, ...]:
    return tuple(_ids("models"))


@cache
def gpu_ids() -> tuple[str, ...]:
    return tuple(_ids("gpus"))


def _load(kind: str, key: str, schema: type[BaseModel]) -> Any:
    path = PROFILES_DIR / kind / f"{key}.json"
    try:
        return schema.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (ValidationError, json.JSONDecodeError) as e:
        first = str(e).splitlines()[0:3]
        raise KvsizeError(f"profile {path.name} is invalid: {' '.join(first)}") from None


BUNDLED_PROFILE_LIMIT_BYTES = 1 << 20  # a bundled data file read whole (the largest, vllm-flags/0.33.0.json: 75 KB)


def validated_profile(path: Path, schema: type[BaseModel]) -> Any:
    """A bundled data file at `path`, bounded and validated by `schema`; one line naming the file where it is not."""
    try:
        if path.stat().st_size > BUNDLED_PROFILE_LIMIT_BYTES:
            raise KvsizeError(f"profile {path.name} is over {BUNDLED_PROFILE_LIMIT_BYTES:,} bytes")
        return schema.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the file"
        raise KvsizeError(f"profile {path.name} is invalid: {where}: {first['msg']}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise KvsizeError(f"profile {path.name} is invalid: {str(e).splitlines()[0]}") from None


# Suffixes of a checkpoint's name that keep its base model's architecture (the config.json that sizes it)
VARIANT_SUFFIXES = ("-instruct", "-chat", "-it", "-hf", "-base")


def _variant_base(name: str) -> str:
    name = name.lower().rsplit("/", 1)[-1]
    changed = True
    while changed:
        changed = False
        for suffix in VARIANT_SUFFIXES:
            if name.endswith(suffix) and len(name) > len(suffix):
                name, changed = name[: -len(suffix)], True
    return name


@cache
def _model_names() -> dict[str, str]:
    """Every name a planner types for a bundled model, lower-cased -> profile id: the id, the Hugging Face id
    and its last part, and each of these without -Instruct/-Chat/-it/-hf/-Base (same architecture)."""
    names: dict[str, str] = {}
    exact: dict[str, str] = {}
    for key in model_ids():
        data = json.loads((PROFILES_DIR / "models" / f"{key}.json").read_text(encoding="utf-8"))
        hf = str(data.get("hf_id") or "")
        for name in (key, hf, hf.rsplit("/", 1)[-1]):
            if name:
                exact.setdefault(name.lower(), key)
                names.setdefault(_variant_base(name), key)
    return {**names, **exact}


def resolve_model_id(name: str) -> str | None:
    """The bundled profile a typed name means (its id, its Hugging Face id, or a chat/instruct variant of
    either), or None."""
    names = _model_names()
    return names.get(name.lower()) or names.get(_variant_base(name))


@cache
def model_profile(key: str) -> ModelProfile:
    found = resolve_model_id(key)
    if found is None:
        raise unknown("model", key, model_ids(), "--model")
    return _load("models", found, ModelProfile)


def matching_gpus(name: str | None = None, total_bytes: int | None = None, total_slack_bytes: int = 0,
                  nvml_mib: int | None = None) -> list[str]:
    """The bundled GPUs a device's own report describes, in id order: the device name the profile's name
    begins with ("NVIDIA H100 80GB HBM3" of "... HBM3 (SXM)"), CUDA's total within a slack (engines
    print it rounded), nvidia-smi's total in MiB; each criterion where given."""
    out = []
    for key in gpu_ids():
        g = gpu_profile(key)
        if name is not None and not g.name.startswith(name):
            continue
        if total_bytes is not None and abs(g.memory_bytes - total_bytes) > total_slack_bytes:
            continue
        if nvml_mib is not None and g.nvml_memory_mib != nvml_mib:
            continue
        out.append(key)
    return out


@cache
def gpu_profile(key: str) -> GpuProfile:
    lookup = {k.lower(): k for k in gpu_ids()}
    if key.lower() not in lookup:
        raise unknown("GPU", key, gpu_ids(), "--gpu")
    return _load("gpus", lookup[key.lower()], GpuProfile)


@cache
def gpu_by_name(name: str) -> GpuProfile | None:
    """The bundled GPU whose profile name is `name` (a Scenario keeps the name, not the id)."""
    return next((gpu_profile(g) for g in gpu_ids() if gpu_profile(g).name == name), None)


@cache
def link_ids() -> tuple[str, ...]:
    return tuple(_ids("links"))


def link_profile(key: str, option: str = "--link") -> LinkProfile:
    if key not in link_ids():
        raise unknown("link", key, link_ids(), option)
    return _link(key)


@cache
def _link(key: str) -> LinkProfile:
    return _load("links", key, LinkProfile)


@cache
def efficiency_ids() -> tuple[str, ...]:
    return tuple(_ids("efficiency"))


@cache
def efficiency_profile(key: str = DEFAULT_EFFICIENCY_PROFILE) -> EfficiencyProfile:
    if key not in efficiency_ids():
        raise unknown("efficiency profile", key, efficiency_ids(), "--efficiency")
    return _load("efficiency", key, EfficiencyProfile)


def measured_efficiency(key: str = DEFAULT_EFFICIENCY_PROFILE, engine_kernels: bool = True) -> DecodeEfficiency:
    """The DecodeEfficiency of a bundled efficiency profile (by default kvsize's measured kernels),
    with the figures of the GPU it was measured on. `engine_kernels`: as a planner uses them, for the kernels an
    engine runs (a format measured only in software emulation is left to the assumption); False: every kernel
    measured, as a kernel benchmark predicts itself."""
    from .cache.formats import get_format

    p = efficiency_profile(key)
    reference, kv, emulated = {}, dict(p.kv), []
    if p.reference_gpu:
        g = gpu_profile(p.reference_gpu)
        reference = dict(reference_gpu=p.reference_gpu, reference_spec_gb_s=g.hbm_bandwidth_gb_s,
                         reference_copy_gb_s=g.copy_bandwidth_gb_s, reference_issue=issue_rate(g))
        # A format measured on a GPU without the hardware it needs ran in a software kernel no engine uses (nvfp4 on
        # Hopper): its figure describes no engine's kernel, on that GPU or one with the hardware.
        for name in sorted(kv) if engine_kernels else ():
            missing = [flag for flag in get_format(name, "bf16").needs_gpu if not getattr(g, flag)]
            if missing:
                emulated.append(f"{name} (measured in software on {p.reference_gpu}, which lacks "
                                f"{', '.join(missing)})")
                del kv[name]
    unmeasured = f"; not measured, so assumed like any format without a measured kernel: {', '.join(emulated)}" \
        if emulated else ""
    return DecodeEfficiency(weights=p.weights, kv=MappingProxyType(kv), kv_default=p.kv_default,
                            **{t: MappingProxyType(dict(getattr(p, t))) for t in KERNEL_TIME_TERMS},
                            source=f"{p.source}; weights: {p.weights_source}; formats not measured: "
                                   f"{p.kv_default_source}{unmeasured}", **reference)


def issue_rate(g: GpuProfile) -> float | None:
    """SMs x boost clock (MHz): the instruction issue rate decode kernels scale with; None without a clock."""
    return g.multiprocessors * g.boost_clock_mhz if g.boost_clock_mhz else None


@cache
def bundled_shape(key: str) -> ModelShape:
    profile = model_profile(key)
    try:
        return ModelShape.from_dict(profile.shape)
    except TypeError as e:
        raise KvsizeError(f"profile {key}.json has an invalid shape: {e}") from None


MAX_MODEL_SPEC = 4096  # PATH_MAX: no id or path is longer


def load_model(spec: str) -> tuple[str, ModelShape]:
    """--model: a bundled profile id, a path to a config.json, or a folder holding one."""
    spec = str(spec)
    if len(spec) > MAX_MODEL_SPEC or "\x00" in spec:
        raise KvsizeError(f"--model {shown(spec, 60)}: a profile id, a Hugging Face id or a path is at most "
                          f"{MAX_MODEL_SPEC:,} characters and holds no NUL")
    path = Path(spec)
    try:
        looks_like_path = path.suffix == ".json" or "/" in spec or "\\" in spec or path.is_dir()
        exists = looks_like_path and path.exists()
    except OSError as e:  # a name too long for the file system, a folder that cannot be read
        raise KvsizeError(f"--model {shown(spec, 60)}: {e.strerror or e}") from None
    if exists:
        config = read_config_file(path)
        name = config.get("_name_or_path") or (path.parent.name if path.name == "config.json" else path.stem)
        return str(name or spec), resolve_shape(config)
    if looks_like_path and (path.suffix == ".json" or path.name == "config.json"):
        raise KvsizeError(f"--model: no such file {spec}")
    return model_profile(spec).name, bundled_shape(spec)


def refresh_shapes() -> list[str]:
    """Re-resolve every bundled config and rewrite the stored shapes; returns changed ids."""
    changed = []
    for key in model_ids():
        path = PROFILES_DIR / "models" / f"{key}.json"
        data = json.loads(path.read_text(encoding="utf-8"))
        shape = resolve_shape(data["config"])
        if not data.get("shape") or ModelShape.from_dict(data["shape"]) != shape:
            data["shape"] = shape.to_dict()
            path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
            changed.append(key)
    return changed


if __name__ == "__main__":
    print("refreshed:", ", ".join(refresh_shapes()) or "nothing")

"""Which engine releases kvsize has started, and how close it came on their starts.

`profiles/engines/started.json` holds, per engine and started version, the count of starts, how many kvsize
predicted within 1% (both ways: estimate and check-log), the median absolute and the worst signed token error
and the GPUs; `benchmarks/vllm_starts.py --write` writes it from the corpora and a test recomputes it.
`profiles/engines/published.json` lists the releases a planner can install. Every answer names its release's
evidence: started, or never started with the nearest started release's figures beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import KvsizeError
from ..units import GiB
from .releases import ENGINES_DIR, version_key


class StartedRelease(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    starts: int = Field(ge=1)
    predictions: int = Field(ge=1)
    within_1pct: int = Field(ge=0)
    median_abs_token_error: float = Field(ge=0)
    worst_token_error: float
    gpus: tuple[str, ...]
    max_gpus_per_start: int = Field(default=1, ge=1)  # the most GPUs one of its starts ran on (TP x PP)
    max_pipeline_stages: int = Field(default=1, ge=1)  # the most pipeline stages one of its starts ran with


class EvidenceFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str
    vllm: dict[str, StartedRelease] = Field(default_factory=dict)
    sglang: dict[str, StartedRelease] = Field(default_factory=dict)
    # per engine: the config.json architectures some start ran, and each architecture family's figures
    architectures: dict[str, tuple[str, ...]] = Field(default_factory=dict)
    families: dict[str, dict[str, StartedRelease]] = Field(default_factory=dict)


class PublishedFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str
    vllm: tuple[str, ...]
    sglang: tuple[str, ...]


def _read(name: str, model):
    path = ENGINES_DIR / name
    try:
        return model.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValidationError, json.JSONDecodeError) as e:
        raise KvsizeError(f"engine profile {name} is invalid: {str(e).splitlines()[0]}") from None


@cache
def started(engine: str) -> dict[str, StartedRelease]:
    """Started versions of an engine (oldest first) and kvsize's figures on their starts."""
    rows = getattr(_evidence(), engine, None) or {}
    return dict(sorted(rows.items(), key=lambda kv: version_key(kv[0])))


@cache
def _evidence() -> EvidenceFile:
    return _read("started.json", EvidenceFile)


def architecture_evidence(engine: str, architectures: tuple[str, ...], family: str) -> str | None:
    """A sentence where no real start of the engine ran this architecture, with its family's figures (or the
    nearest started family's); None where one did, or for engines kvsize keeps no starts of."""
    data = _evidence()
    started_archs = data.architectures.get(engine)
    if not started_archs or not architectures or any(a in started_archs for a in architectures):
        return None
    families = data.families.get(engine, {})
    name = family if family in families else _nearest_family(family, families)
    if name is None:
        return f"no real {engine} start of {architectures[0]} is in kvsize's evidence"
    f = families[name]
    return (f"no real {engine} start of {architectures[0]} is in kvsize's evidence; its family, {name}"
            + ("" if name == family else f" (the nearest started to {family})")
            + f": {f.within_1pct} of {f.predictions} predictions within 1% on {f.starts} starts, worst token error "
            f"{100 * f.worst_token_error:+.2f}%")


@dataclass(frozen=True)
class CarriedTerms:
    """The terms of one answer that kvsize fitted on the GPUs it has started (bytes), beside the KV budget they
    leave: on a GPU never started they are carried, not confirmed."""

    profiling_peak_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv_budget_bytes: int

    @property
    def carried_bytes(self) -> int:
        return self.profiling_peak_bytes + self.non_torch_bytes + self.cuda_graph_bytes

    def kv_share_per_tenth(self) -> float | None:
        """How much of the KV budget moves when the carried terms are 10% off (None: no KV budget left)."""
        return 0.1 * self.carried_bytes / self.kv_budget_bytes if self.kv_budget_bytes > 0 else None


def gpu_evidence(engine: str, gpu_name: str, carried: CarriedTerms | None = None) -> str | None:
    """A sentence where no real start of the engine ran on this GPU (named as its profile names it), naming the GPUs
    the starts ran on and, given the answer's carried terms, what they weigh against its KV budget; None where one
    did, or for engines kvsize keeps no starts of."""
    from ..profiles import gpu_profile

    rows = started(engine) if engine in ("vllm", "sglang") else {}
    ids = sorted({g for row in rows.values() for g in row.gpus})
    if not ids or gpu_name in {gpu_profile(g).name for g in ids}:
        return None
    sentence = (f"no real {engine} start on {gpu_name} is in kvsize's evidence (its starts ran on {', '.join(ids)}): "
                "the profiling peak, the non-torch memory (NCCL buffers, the sampler's state), the CUDA-graph estimate "
                "and the batch defaults this GPU's size selects are read from source and fitted on those GPUs, not "
                "confirmed here, and on a smaller GPU a term that is off weighs more against its smaller KV pool")
    if carried is None:
        return sentence
    weight = carried.kv_share_per_tenth()
    return (sentence + f": here they come to {carried.carried_bytes / GiB:.2f} GiB (profiling peak "
            f"{carried.profiling_peak_bytes / GiB:.2f}, non-torch {carried.non_torch_bytes / GiB:.2f}, CUDA graphs "
            f"{carried.cuda_graph_bytes / GiB:.2f})"
            + (f", so every 10% they are off moves the KV budget ({carried.kv_budget_bytes / GiB:.2f} GiB) by "
               f"{100 * weight:.0f}%" if weight is not None else ", and no KV budget is left"))


def _nearest_family(family: str, families: dict) -> str | None:
    """The started family sharing the most words with this one (MLA MoE -> MLA, MoE + sliding -> MoE)."""
    words = set(family.replace("+", " ").split())
    scored = sorted(((len(words & set(n.replace("+", " ").split())), n) for n in families), reverse=True)
    return scored[0][1] if scored and scored[0][0] else None


@cache
def published(engine: str) -> tuple[str, ...]:
    return tuple(getattr(_read("published.json", PublishedFile), engine, ()) or ())


def newest_started(engine: str) -> str | None:
    rows = started(engine)
    return next(reversed(rows)) if rows else None


def _matches(version: str, candidate: str) -> bool:
    """0.23 names 0.23.0; 0.25.1 names only itself."""
    v, c = version_key(version), version_key(candidate)
    return c[:len(v)] == v


@dataclass(frozen=True)
class ReleaseEvidence:
    engine: str
    version: str | None  # as asked (None: the engine's newest started release)
    started_version: str | None  # the started version this answer's release is, or None
    figures: StartedRelease | None  # of the started version, or of the nearest started one
    nearest_version: str | None  # where never started: the nearest started release

    @property
    def started(self) -> bool:
        return self.started_version is not None

    def sentence(self) -> str:
        def figs(v: str, f: StartedRelease) -> str:
            return (f"{f.within_1pct} of {f.predictions} predictions within 1% on {f.starts} real starts of {v} "
                    f"({', '.join(f.gpus)}), worst token error {100 * f.worst_token_error:+.2f}%")

        if self.started_version and self.figures:
            return f"{self.engine} {self.started_version} was started: {figs(self.started_version, self.figures)}"
        asked = self.version or "this release"
        if self.nearest_version and self.figures:
            return (f"{self.engine} {asked} was never started, so its rules are read from source alone; the nearest "
                    f"started release, {self.nearest_version}: {figs(self.nearest_version, self.figures)}")
        return f"{self.engine} {asked} was never started and no release of {self.engine} was"


def release_evidence(engine: str, version: str | None) -> ReleaseEvidence | None:
    """What real starts say of the release an answer follows; None for engines kvsize keeps no starts of."""
    if engine not in ("vllm", "sglang"):
        return None
    rows = started(engine)
    if not rows:
        return ReleaseEvidence(engine, version, None, None, None)
    asked = version or newest_started(engine)
    hits = [v for v in rows if _matches(asked, v)]
    if hits:
        return ReleaseEvidence(engine, version, hits[-1], rows[hits[-1]], None)
    key = version_key(asked)
    nearest = min(rows, key=lambda v: (abs(_distance(version_key(v), key)), version_key(v)))
    return ReleaseEvidence(engine, version, None, rows[nearest], nearest)


@dataclass(frozen=True)
class ParallelEvidence:
    """The most GPUs a start ran on, and the most pipeline stages, among the started releases that follow the same
    parallel terms (non-torch at TP and PP) as the asked release: those terms are confirmed up to that many GPUs
    and stages, and carried beyond."""
    max_gpus: int
    version: str | None  # the started release that ran on them (None: no start of these terms at all)
    max_stages: int = 1
    stages_version: str | None = None  # the started release that ran the most stages (None: none ran PP > 1)

    def summary(self, engine: str) -> str:
        """What starts confirm of the terms, whatever the GPU count (a file's assumptions)."""
        if self.version is None:
            return ("no start ran with this release's TP and PP terms: on more than one GPU they are read from source "
                    "and public logs, not confirmed by a start")
        stages = (f"pipeline parallel up to {self.max_stages} stages by {engine} {self.stages_version}"
                  if self.stages_version else "no pipeline-parallel start")
        return (f"TP and PP terms confirmed by starts of {engine} {self.version} on up to {self.max_gpus} GPU(s), "
                f"{stages}; beyond they are carried from those starts, not confirmed")

    def note(self, engine: str, release_name: str, gpus: int, stages: int = 1) -> str | None:
        """What an answer on `gpus` GPUs in `stages` pipeline stages says of its TP/PP terms, or None where
        starts confirm them."""
        said = []
        if gpus > self.max_gpus:
            if self.version is None:
                said.append(f"no start of {engine} ran with {release_name}'s TP and PP terms (non-torch: NCCL's and "
                            f"the all-reduce's buffers): at {gpus} GPUs they are read from source and public logs, "
                            "not confirmed")
            else:
                said.append(f"{release_name}'s TP and PP terms (non-torch: NCCL's and the all-reduce's buffers) were "
                            f"confirmed by starts of {engine} {self.version} on at most {self.max_gpus} GPU(s): at "
                            f"{gpus} GPUs they are carried from those starts, not confirmed")
        if stages > self.max_stages:
            where = (f"starts of {engine} {self.stages_version} ran at most {self.max_stages} stages"
                     if self.stages_version else f"no start of {engine} ran with {release_name}'s terms at PP > 1")
            said.append(f"pipeline parallel {stages}: {where}, so each stage's own terms (its non-torch memory, "
                        "its CUDA-graph estimate) are read from source, not confirmed: where PP starts ran, "
                        "kvsize's stage terms were below the engine's and its KV pool above it (docs/accuracy.md)")
        return "; ".join(said) or None


def _parallel(release) -> tuple | None:
    return release.non_torch.parallel_terms if release.non_torch is not None else None


def parallel_evidence(engine: str, version: str | None) -> ParallelEvidence | None:
    """How far real starts confirm the TP/PP terms the asked release follows; None for engines kvsize keeps no
    starts of or releases it has no rules for."""
    from .releases import find_release

    if engine not in ("vllm", "sglang"):
        return None
    asked = find_release(engine, version)
    if asked is None:
        return None
    gpus, gpus_version, stages, stages_version = 1, None, 1, None
    for v, figures in started(engine).items():
        rule = find_release(engine, v)
        if rule is None or _parallel(rule) != _parallel(asked):
            continue
        if figures.max_gpus_per_start >= gpus:
            gpus, gpus_version = figures.max_gpus_per_start, v
        if figures.max_pipeline_stages > 1 and figures.max_pipeline_stages >= stages:
            stages, stages_version = figures.max_pipeline_stages, v
    return ParallelEvidence(gpus, gpus_version, stages, stages_version)


def _distance(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    width = max(len(a), len(b))
    a, b = a + (0,) * (width - len(a)), b + (0,) * (width - len(b))
    return sum((x - y) * 1000 ** (width - i) for i, (x, y) in enumerate(zip(a, b)))


def is_good_news(message: str) -> bool:
    """Whether a message of an estimate is the sentence of ReleaseEvidence for a release that was started (its
    figures on real starts of that very release): evidence that the answer holds, shown as a note, not a warning."""
    import re

    return re.match(r"\S+ \S+ was started: \d", message) is not None


def forget_evidence() -> None:
    """Drop what was read of the evidence files, so that the next question reads them again (after a rewrite)."""
    for cached in (started, _evidence, published):
        cached.cache_clear()

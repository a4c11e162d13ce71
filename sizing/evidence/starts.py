"""The corpus of real vLLM starts (tests/fixtures/vllm-starts): each start's settings, the lines vLLM
printed, and kvsize's prediction of the same start, term by term.

A start is one engine start on a config.json with dummy weights (measure/vllm_start.py): its log is
kept whole and its manifest line names the release, the GPU, the EngineArgs and what vLLM printed.
`check_start` predicts it twice, as a user would: with `estimate` on the start's settings, and with
check-log's reading of the log alone (the GPU given, as an INFO-level log does not name it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import KvsizeError
from ..units import GiB
from ..config.family import family

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm-starts"
MAX_MANIFEST_BYTES = 8 * 1024 * 1024


class Printed(BaseModel):
    """vLLM's lines as printed (GiB figures kept as the text shows them); one entry per rank that printed."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    version: str | None = None
    runner: Literal["v1", "v2"] | None = None
    model_loading_gib: tuple[str, ...] = ()
    cuda_graph_gib: tuple[str, ...] = ()
    available_kv_gib: tuple[str, ...] = ()
    kv_cache_tokens: tuple[int, ...] = ()
    max_concurrency: tuple[str, ...] = ()
    torch_peak_gib: tuple[str, ...] = ()  # DEBUG: the profiling run's torch peak increase
    non_torch_gib: tuple[str, ...] = ()  # DEBUG: the non-torch increase
    non_kv_gib: tuple[str, ...] = ()  # DEBUG (0.27+): weights + torch peak + non-torch, in one figure
    cuda_total_gib: tuple[str, ...] = ()  # DEBUG: CUDA's total at the init snapshot


def printed_non_torch_gib(p: Printed) -> float | None:
    """The non-torch memory a start printed: its own DEBUG line, or (0.27+) the non-KV total less the weights
    and the torch peak (vllm/v1/worker/gpu_worker.py determine_available_memory adds those three)."""
    if p.non_torch_gib:
        return max(map(float, p.non_torch_gib))
    if p.non_kv_gib and p.model_loading_gib and p.torch_peak_gib:
        return round(max(map(float, p.non_kv_gib)) - max(map(float, p.model_loading_gib))
                     - max(map(float, p.torch_peak_gib)), 2)
    return None


class Start(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(min_length=1)
    release: str = Field(pattern=r"^\d+\.\d+\.\d+$")
    gpu: str = Field(min_length=1)  # bundled GPU id
    gpu_name: str
    nvml_total_mib: int = Field(gt=0)
    gpus_used: int = Field(ge=0)
    config: str  # relative to the corpus folder
    context: Literal["serve", "llm"]
    args: dict
    log: str
    # unrepresentative: sized, but not as the checkpoint would load (a dummy-weights artefact the reason names)
    status: Literal["sized", "failed", "timeout", "unrepresentative"]
    printed: Printed
    reason: str | None = None


def read_manifest(path: Path, model: type[BaseModel]) -> list:
    """A corpus manifest (one JSON object a line), each line validated as `model`; a bad line is named."""
    if path.stat().st_size > MAX_MANIFEST_BYTES:
        raise KvsizeError(f"{path} is over {MAX_MANIFEST_BYTES:,} bytes")
    out = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append(model.model_validate(json.loads(line)))
        except (ValidationError, json.JSONDecodeError) as e:
            raise KvsizeError(f"{path.name} line {n}: {str(e).splitlines()[0]}") from None
    return out


def load_corpus(folder: Path = CORPUS) -> list[Start]:
    return read_manifest(folder / "manifest.jsonl", Start)


@lru_cache(maxsize=256)
def _config_model(path: str):
    """A start's config read once: many starts share one (the corpus holds 24 configs for 77 starts)."""
    from ..profiles import load_model

    return load_model(path)


def planned_scenario(config: Path, gpu: str, release: str, args: dict, context: str = "serve",
                     compile_cache_hit: bool = False):
    """A start, planned or made, as a kvsize scenario: its config, GPU, release and EngineArgs under vLLM's
    names. What kvsize predicts for a batch before it runs comes from here, as does the check of a made start."""
    from ..capacity.scenario import Scenario
    from ..profiles import gpu_profile
    from ..engines.vllm_args import read_engine_args

    name, shape = _config_model(str(config))
    g = gpu_profile(gpu)
    settings = read_engine_args(args, context)
    return Scenario(name, shape, g.name, g.memory_bytes, engine=f"vllm@{release}",
                    gpu_multiprocessors=g.multiprocessors, gpu_nvml_mib=g.nvml_memory_mib,
                    gpu_architecture=g.architecture, usage_context=context, compile_cache_hit=compile_cache_hit,
                    **settings.fields)


def start_scenario(start: Start, folder: Path = CORPUS):
    """The start as a kvsize scenario: its config, GPU, release and EngineArgs under vLLM's names."""
    from .logs import COMPILE_CACHE_LINE

    # a start after one of the same model and settings on that machine loaded its compiled graph, as its log
    # says: a condition of the start (kvsize estimate --compile-cache warm), not a setting
    warm = COMPILE_CACHE_LINE in (folder / start.log).read_text(encoding="utf-8", errors="replace")
    return planned_scenario(folder / start.config, start.gpu, start.release, start.args, start.context, warm)


@dataclass(frozen=True)
class TermCheck:
    term: str  # weights, cuda_graphs, kv_budget, kv_tokens
    predicted: float  # GiB for memory terms, tokens for kv_tokens
    printed: float

    @property
    def error(self) -> float:
        return self.predicted / self.printed - 1 if self.printed else 0.0


@dataclass(frozen=True)
class StartCheck:
    start: Start
    by: str  # "estimate" (the start's settings) or "check-log" (the log alone, with the GPU)
    runner: str  # the model runner kvsize predicts
    terms: tuple[TermCheck, ...]

    def term(self, name: str) -> TermCheck | None:
        return next((t for t in self.terms if t.term == name), None)


def _terms(e, printed: Printed) -> tuple[TermCheck, ...]:
    b = e.breakdown
    budget = e.printed_kv_budget_bytes
    rows = []
    if printed.model_loading_gib:
        rows.append(TermCheck("weights", b.weights_bytes / GiB, max(map(float, printed.model_loading_gib))))
    if printed.cuda_graph_gib:
        rows.append(TermCheck("cuda_graphs", b.cuda_graph_bytes / GiB, max(map(float, printed.cuda_graph_gib))))
    if printed.torch_peak_gib:
        rows.append(TermCheck("activation", b.activation_bytes / GiB, max(map(float, printed.torch_peak_gib))))
    non_torch = printed_non_torch_gib(printed)
    if non_torch is not None:
        rows.append(TermCheck("non_torch", b.non_torch_bytes / GiB, non_torch))
    if printed.available_kv_gib:
        rows.append(TermCheck("kv_budget", budget / GiB, min(map(float, printed.available_kv_gib))))
    if printed.kv_cache_tokens:
        rows.append(TermCheck("kv_tokens", e.max_tokens, min(printed.kv_cache_tokens)))
    return tuple(rows)


def check_start(start: Start, folder: Path = CORPUS) -> StartCheck:
    """kvsize's estimate of the start from its settings, against what vLLM printed."""
    from ..capacity.estimate import estimate

    e = estimate(start_scenario(start, folder))
    return StartCheck(start, "estimate", e.model_runner, _terms(e, start.printed))


def check_start_log(start: Start, folder: Path = CORPUS) -> StartCheck:
    """check-log's reading of the start's log (settings from the log, the GPU given), against the same lines."""
    from .logs import log_scenario, read_log
    from ..capacity.estimate import estimate
    from ..profiles import gpu_profile

    run = read_log((folder / start.log).read_text(encoding="utf-8", errors="replace"))
    name, shape = _config_model(str(folder / start.config))
    scenario, _ = log_scenario(run, name, shape, gpu_profile(start.gpu))
    e = estimate(scenario)
    return StartCheck(start, "check-log", e.model_runner, _terms(e, start.printed))


@dataclass(frozen=True)
class AccuracyRow:
    id: str
    release: str
    gpu: str
    family: str
    tp: int
    by: str  # estimate or check-log
    kv_budget_error: float | None  # predicted / printed − 1
    kv_tokens_error: float | None
    graphs_error_gib: float | None  # predicted − printed "Estimated CUDA graph memory"
    weights_error_gib: float | None
    runner_match: bool


def accuracy_rows(starts: list[Start] | None = None, folder: Path = CORPUS) -> list[AccuracyRow]:
    """Every sized start checked both ways, as rows of signed errors."""
    rows = []
    for start in starts if starts is not None else load_corpus(folder):
        if start.status != "sized":
            continue
        _, shape = _config_model(str(folder / start.config))
        for check in (check_start(start, folder), check_start_log(start, folder)):
            budget, tokens = check.term("kv_budget"), check.term("kv_tokens")
            graphs, weights = check.term("cuda_graphs"), check.term("weights")
            rows.append(AccuracyRow(
                start.id, start.release, start.gpu, family(shape), int(start.args.get("tensor_parallel_size", 1)),
                check.by, budget.error if budget else None, tokens.error if tokens else None,
                graphs.predicted - graphs.printed if graphs else None,
                weights.predicted - weights.printed if weights else None, check.runner == start.printed.runner))
    return rows


@dataclass(frozen=True)
class AccuracySummary:
    group: str
    starts: int
    within_1pct: int  # both the budget and the tokens
    median_abs: float  # of the token error
    worst: float  # the signed token error of largest magnitude
    over: int  # predictions above the engine's (the costly direction)


def summarize(rows: list[AccuracyRow], key) -> list[AccuracySummary]:
    """Per group (key(row) -> name): counts within 1%, the median absolute and the worst signed error."""
    import statistics

    groups: dict[str, list[AccuracyRow]] = {}
    for r in rows:
        groups.setdefault(key(r), []).append(r)
    out = []
    for name, members in sorted(groups.items()):
        errors = [r.kv_tokens_error for r in members if r.kv_tokens_error is not None]
        ok = sum(1 for r in members if all(abs(e) < 0.01 for e in (r.kv_budget_error, r.kv_tokens_error)
                                           if e is not None))
        out.append(AccuracySummary(name, len(members), ok, statistics.median(abs(e) for e in errors) if errors else 0.0,
                                   max(errors, key=abs) if errors else 0.0, sum(1 for e in errors if e > 0)))
    return out

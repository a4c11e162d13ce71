"""The corpus of real SGLang starts (tests/fixtures/sglang-starts): each start's ServerArgs, the lines SGLang
printed, and kvsize's prediction of the same start, by estimate (the settings) and by check-log (the log alone).

A start is one engine start with dummy weights on a config.json (the configs are the vLLM corpus's); its log is
kept whole and its manifest line names the version, the GPU, the ServerArgs the engine received and what it
printed: `max_total_num_tokens`, the pool's `#tokens`, the free memory at the weights' load and their size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..units import GiB

CORPUS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "sglang-starts"


class Printed(BaseModel):
    """SGLang's lines as printed (GiB figures kept as the text shows them; SGLang's "GB" are GiB)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    graphs_default_fraction: tuple[str, ...] = ()  # SGLang's own default with CUDA graphs (the tool's line)
    mem_fraction_static: tuple[str, ...] = ()  # as the server_args line gives it
    max_total_num_tokens: tuple[int, ...] = ()
    pool_tokens: tuple[int, ...] = ()
    avail_begin_gib: tuple[str, ...] = ()
    weights_gib: tuple[str, ...] = ()
    kv_gib: tuple[str, ...] = ()


class SglangStart(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    id: str = Field(min_length=1)
    version: str = Field(pattern=r"^\d+\.\d+\.\d+(\.post\d+)?$")
    gpu: str = Field(min_length=1)
    gpu_name: str
    nvml_total_mib: int = Field(gt=0)
    gpus_used: int = Field(ge=1)
    config: str  # relative to the corpus folder
    args: dict
    log: str
    status: Literal["sized", "failed"]
    printed: Printed
    reason: str | None = None  # why a start failed, or what a sized start's log lacks

    @property
    def printed_tokens(self) -> int:
        """The tokens SGLang gave the KV pool: the scheduler's max_total_num_tokens, else the pool's own #tokens
        where the log ends between the two lines (every start that printed both printed the same figure)."""
        return min(self.printed.max_total_num_tokens or self.printed.pool_tokens)


def load_corpus(folder: Path = CORPUS) -> list[SglangStart]:
    from .starts import read_manifest

    path = folder / "manifest.jsonl"
    return read_manifest(path, SglangStart) if path.exists() else []


@lru_cache(maxsize=64)
def _config_model(path: str):
    from ..profiles import load_model

    return load_model(path)


def planned_sglang_scenario(config: Path, gpu: str, version: str, args: dict):
    """An SGLang start, planned or made, as a kvsize scenario: its config, GPU, version and ServerArgs."""
    from ..capacity.scenario import Scenario
    from ..profiles import gpu_profile
    from ..engines.sglang_args import read_server_args

    name, shape = _config_model(str(config))
    g = gpu_profile(gpu)
    settings = read_server_args(args)
    return Scenario(name, shape, g.name, g.memory_bytes, engine=f"sglang@{version}",
                    gpu_multiprocessors=g.multiprocessors, gpu_nvml_mib=g.nvml_memory_mib,
                    gpu_architecture=g.architecture, **settings.fields)


def start_scenario(start: SglangStart, folder: Path = CORPUS):
    """The start as a kvsize scenario: its config, GPU, version and the ServerArgs it ran with."""
    return planned_sglang_scenario(folder / start.config, start.gpu, start.version, start.args)


@dataclass(frozen=True)
class SglangCheck:
    start: SglangStart
    by: str  # "estimate" or "check-log"
    predicted_tokens: int
    printed_tokens: int
    predicted_weights_gib: float
    printed_weights_gib: float | None
    predicted_free_gib: float  # free memory when the weights start loading (total − memory taken before)
    printed_free_gib: float | None

    @property
    def tokens_error(self) -> float:
        return self.predicted_tokens / self.printed_tokens - 1


def _check(start: SglangStart, scenario, by: str) -> SglangCheck:
    from ..capacity.estimate import estimate

    e = estimate(scenario)
    b = e.breakdown
    p = start.printed
    return SglangCheck(start, by, e.max_tokens, start.printed_tokens, b.weights_bytes / GiB,
                       max(map(float, p.weights_gib)) if p.weights_gib else None,
                       (b.total_bytes - b.non_torch_bytes) / GiB,
                       min(map(float, p.avail_begin_gib)) if p.avail_begin_gib else None)


def check_start(start: SglangStart, folder: Path = CORPUS) -> SglangCheck:
    """kvsize's estimate from the start's ServerArgs, against what SGLang printed."""
    return _check(start, start_scenario(start, folder), "estimate")


def check_start_log(start: SglangStart, folder: Path = CORPUS) -> SglangCheck:
    """check-log's reading of the start's log (settings from the server_args line, the GPU given)."""
    from dataclasses import replace

    from .logs import log_scenario, read_log
    from ..profiles import gpu_profile

    run = read_log((folder / start.log).read_text(encoding="utf-8", errors="replace"))
    name, shape = _config_model(str(folder / start.config))
    scenario, _ = log_scenario(run, name, shape, gpu_profile(start.gpu))
    # the free memory the log prints is the engine's reading, not a prediction: check-log's own rows hold
    # it; here the budget is predicted from the settings the log names, as a planner's would be
    return _check(start, replace(scenario, non_torch_bytes=None), "check-log")

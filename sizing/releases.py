"""Engine releases as data: each release range's defaults and the terms its KV budget subtracts.

One file per release range under profiles/engines/, validated on load. `--engine vllm` means the
newest release of vLLM; `--engine vllm@0.19` (any version inside a range: `vllm@0.18.1`) picks the
range holding that version. Every figure carries its source in the file's `sources`.
"""

from __future__ import annotations

import json
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import KvsizeError

ENGINES_DIR = Path(__file__).resolve().parent.parent / "profiles" / "engines"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchDefault(_Strict):
    """max_num_batched_tokens and max_num_seqs the engine picks on GPUs of at least min_gpu_bytes."""

    min_gpu_bytes: int = Field(ge=0)
    exclude_gpu_names: tuple[str, ...]
    max_num_batched_tokens: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)


class ProfilingRunModel(_Strict):
    """What the engine's profiling run keeps alive at its peak (docs/formulas.md, 'Profiling peak')."""

    forward_hidden_copies: float = Field(ge=0)
    forward_mlp_copies: float = Field(ge=0)
    sampler_extra_bytes_per_logit: int = Field(ge=0)  # beyond the model-dtype logits
    sampler_upcast_bytes_per_logit: int = Field(ge=0)  # the fp32 copy, absent when the model runs in fp32
    topk_buffer: bool  # Triton top-k/top-p keeps min(SMs, rows) x vocab fp32
    workspace_bytes: int = Field(ge=0)  # allocated by the first matmul of the run (cuBLAS workspace)


class NonTorchModel(_Strict):
    single_gpu_bytes: int = Field(ge=0)
    pipeline_bytes: int = Field(ge=0)
    tensor_parallel_bytes: int = Field(ge=0)
    tensor_parallel_per_rank_bytes: int = Field(ge=0)


class CudaGraphModel(_Strict):
    single_gpu_bytes: int = Field(ge=0)
    tensor_parallel_bytes: int = Field(ge=0)


class Release(_Strict):
    """One release range, as its data file holds it."""

    engine: Literal["vllm", "sglang", "trtllm", "lmdeploy", "llamacpp"]
    release: str = Field(min_length=1)
    first_version: str = Field(pattern=r"^\d+(\.\d+){1,3}$")
    last_version: str = Field(pattern=r"^\d+(\.\d+){1,3}$")
    label: str = Field(min_length=1)
    memory_fraction_default: float = Field(ge=0, le=1)
    block_size_default: int = Field(gt=0)
    batch_defaults: tuple[BatchDefault, ...] = Field(min_length=1)
    profile_tokens: Literal["max_num_batched_tokens", "v0_unchunked"]
    requested_memory: Literal["ceil", "floor"]
    subtracts: frozenset[Literal["weights", "activation", "non_torch", "cuda_graphs"]]
    activation: ProfilingRunModel
    non_torch: NonTorchModel
    cuda_graphs: CudaGraphModel
    sources: dict[str, str]

    def __hash__(self) -> int:  # estimates cache on the engine; one file per (engine, release)
        return hash((self.engine, self.release))

    @property
    def name(self) -> str:
        return f"{self.engine}@{self.release}"

    def covers(self, version: str) -> bool:
        """Ranges are whole minor releases: 0.19.1 and 0.19 are both in 0.17-0.20."""
        minor = version_key(version)[:2]
        return version_key(self.first_version)[:2] <= minor <= version_key(self.last_version)[:2]

    def batch_default(self, gpu_bytes: int, gpu_name: str) -> BatchDefault:
        name = gpu_name.lower()
        for row in self.batch_defaults:
            if gpu_bytes >= row.min_gpu_bytes and not any(x in name for x in row.exclude_gpu_names):
                return row
        return self.batch_defaults[-1]

    def non_torch_bytes(self, tp: int, pp: int) -> int:
        n = self.non_torch
        if tp > 1:
            return n.tensor_parallel_bytes + tp * n.tensor_parallel_per_rank_bytes
        return n.pipeline_bytes if pp > 1 else n.single_gpu_bytes

    def cuda_graph_bytes(self, tp: int) -> int:
        return self.cuda_graphs.tensor_parallel_bytes if tp > 1 else self.cuda_graphs.single_gpu_bytes

    def requested(self, total_bytes: int, fraction: float) -> int:
        """total x fraction as the engine rounds it."""
        exact = Fraction(total_bytes) * Fraction(str(fraction))
        return -(-exact.numerator // exact.denominator) if self.requested_memory == "ceil" else int(exact)


def version_key(text: str) -> tuple[int, ...]:
    parts = str(text).strip().lstrip("v").split(".")
    try:
        return tuple(int(p) for p in parts)
    except ValueError:
        raise KvsizeError(f"engine version {text!r} must look like 0.19 or 0.19.1") from None


@cache
def releases(engine: str) -> tuple[Release, ...]:
    """Every release range of one engine, oldest first."""
    out = []
    for path in sorted(ENGINES_DIR.glob(f"{engine}-*.json")):
        try:
            out.append(Release.model_validate(json.loads(path.read_text())))
        except (ValidationError, json.JSONDecodeError) as e:
            first = " ".join(str(e).splitlines()[0:3])
            raise KvsizeError(f"engine profile {path.name} is invalid: {first}") from None
    return tuple(sorted(out, key=lambda r: version_key(r.first_version)))


def find_release(engine: str, version: str | None) -> Release | None:
    """The release range of `engine` holding `version` (None: the newest); None when the engine has no files."""
    known = releases(engine)
    if not known:
        return None
    if version is None:
        return known[-1]
    version_key(version)
    for r in reversed(known):
        if r.covers(version):
            return r
    ranges = ", ".join(f"{r.first_version}-{r.last_version}" for r in known)
    raise KvsizeError(f"--engine {engine}@{version}: no rules for that version; kvsize knows {engine} {ranges}")

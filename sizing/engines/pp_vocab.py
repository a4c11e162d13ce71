"""Which pipeline stages hold the vocabulary tensors, per vLLM model class (profiles/engines/vllm-pp-vocab/).

Most of vLLM's model classes build the input embedding on the first pipeline rank only and the lm_head on the
last; some build one or both on every rank (Qwen3-MoE, Mixtral, gpt-oss: both; Gemma-2: the embedding). The
files are what scripts/scan_vllm_pp_vocab.py reads from each release's source; a release takes the newest scan at
or below it (the oldest scan for releases before it, which the answer names).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from pydantic import BaseModel, ConfigDict, ValidationError

from ..errors import KvsizeError
from ..inputs import load_json
from .releases import ENGINES_DIR, version_key

FOLDER = ENGINES_DIR / "vllm-pp-vocab"


class Placement(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    embedding_every_stage: bool
    lm_head_every_stage: bool


class ScanFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    source: str
    architectures: dict[str, Placement]


@dataclass(frozen=True)
class StageVocab:
    """Where a model's vocabulary tensors sit under pipeline parallelism, and the scan that says so."""

    embedding_every_stage: bool = False
    lm_head_every_stage: bool = False
    scanned_release: str | None = None


FIRST_AND_LAST = StageVocab()


@cache
def _scans() -> dict[str, ScanFile]:
    out = {}
    for path in sorted(FOLDER.glob("*.json"), key=lambda p: version_key(p.stem)):
        try:
            out[path.stem] = ScanFile.model_validate(load_json(path.read_bytes(), str(path.name), "a scan file"))
        except (OSError, ValidationError) as e:
            raise KvsizeError(f"engine profile vllm-pp-vocab/{path.name} is invalid: {str(e).splitlines()[0]}") \
                from None
    return out


def stage_vocab(release: str | None, architectures: tuple[str, ...]) -> StageVocab:
    """The placement vLLM `release` builds for the first of `architectures` it scanned (first and last stage
    where the scan lists none of them)."""
    scans = _scans()
    if not scans or not architectures:
        return FIRST_AND_LAST
    names = list(scans)
    key = version_key(release) if release else version_key(names[-1])
    at_or_below = [n for n in names if version_key(n) <= key]
    chosen = at_or_below[-1] if at_or_below else names[0]
    for architecture in architectures:
        placement = scans[chosen].architectures.get(architecture)
        if placement is not None:
            return StageVocab(placement.embedding_every_stage, placement.lm_head_every_stage, chosen)
    return StageVocab(scanned_release=chosen)

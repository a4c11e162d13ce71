"""Which KV format an engine runs on which GPU architecture, as data (profiles/support.json).

Each row cites the engine source, test or document it comes from; a pair no row covers is
"unconfirmed". Formats that need hardware a GPU profile lacks (KVFormat.needs_gpu) are unsupported
whatever the table says.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import KvsizeError

SUPPORT_FILE = Path(__file__).resolve().parents[2] / "profiles" / "support.json"
Status = Literal["supported", "unsupported", "unconfirmed"]


class SupportRow(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    engine: Literal["vllm", "sglang", "trtllm", "lmdeploy", "llamacpp"]
    formats: tuple[str, ...] = Field(min_length=1)
    architectures: tuple[str, ...] = Field(min_length=1)
    status: Literal["supported", "unsupported"]
    source: str = Field(min_length=1)


class SupportTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    rows: tuple[SupportRow, ...]


@dataclass(frozen=True)
class Support:
    status: Status
    source: str


@cache
def support_table() -> SupportTable:
    try:
        table = SupportTable.model_validate(json.loads(SUPPORT_FILE.read_text(encoding="utf-8")))
    except (ValidationError, json.JSONDecodeError) as e:
        raise KvsizeError(f"{SUPPORT_FILE.name} is invalid: {' '.join(str(e).splitlines()[:3])}") from None
    from ..cache.formats import canonical_format_name

    for row in table.rows:
        for name in row.formats:
            canonical_format_name(name, "bf16", "profiles/support.json")
    return table


def support(engine: str, format_name: str, architecture: str) -> Support:
    """The first row naming (engine, format, architecture); `ideal` runs everything."""
    if engine == "ideal":
        return Support("supported", "no engine: the ideal cache has no kernels to ask")
    for row in support_table().rows:
        if row.engine == engine and format_name in row.formats and architecture in row.architectures:
            return Support(row.status, row.source)
    return Support("unconfirmed", f"no engine source or test found for {engine} {format_name} on {architecture}")


def runs_on(engine: str, fmt, gpu) -> Support:
    """Whether `engine` runs the KV format `fmt` (a KVFormat) on `gpu` (a GpuProfile): unsupported when
    the GPU lacks hardware the format needs (each `<flag>_native` field has its `<flag>_source`),
    else what the table says for the GPU's architecture."""
    missing = [flag for flag in fmt.needs_gpu if not getattr(gpu, flag)]
    if missing:
        return Support("unsupported", "; ".join(f"needs {flag}: {getattr(gpu, flag.removesuffix('_native') + '_source')}"
                                                for flag in missing))
    verdict = support(engine, fmt.name, gpu.architecture)
    if verdict.status == "unsupported":
        return Support("unsupported", f"{engine} does not run {fmt.name} on {gpu.architecture}: {verdict.source}")
    return verdict

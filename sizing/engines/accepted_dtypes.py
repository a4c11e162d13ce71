"""Which KV cache dtype values each engine release accepts (profiles/engines/kv_cache_dtypes.json).

A format kvsize can size is refused for a release that would refuse its spelling at start: vLLM 0.26 has no
`ultraquant_4bit`, so a plan for it under 0.26's rules would name a command that does not start. Releases
outside the checked window are not judged.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import KvsizeError

DTYPES_FILE = Path(__file__).resolve().parents[2] / "profiles" / "engines" / "kv_cache_dtypes.json"


class AcceptedValue(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    value: str = Field(min_length=1)
    since: str = Field(min_length=1)  # the first checked release that accepts it


class EngineDtypes(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    checked: tuple[str, ...] = Field(min_length=1)  # releases read, oldest first
    option: str
    source: str = Field(min_length=1)
    values: tuple[AcceptedValue, ...] = Field(min_length=1)


class DtypesTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: str
    engines: dict[str, EngineDtypes]


@cache
def dtypes_table() -> DtypesTable:
    return parse_dtypes_table(DTYPES_FILE.read_bytes(), DTYPES_FILE.name)


def parse_dtypes_table(data: bytes | str, where: str) -> DtypesTable:
    """The per-release table from its JSON text through the bounded reader; one line naming the field that is wrong."""
    from ..inputs import json_path, load_json
    from .releases import version_key

    raw = load_json(data, where, "the per-release KV cache dtype table", 4 * 1024 * 1024, finite=True)
    try:
        table = DtypesTable.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        raise KvsizeError(f"{where} is invalid: {json_path(tuple(err['loc']))}: {err['msg']}") from None
    for name, row in table.engines.items():
        checked = [version_key(v) for v in row.checked]
        for value in row.values:
            if version_key(value.since) not in checked:
                raise KvsizeError(f"{where}: {name} {value.value} since {value.since}, a release not "
                                  "in its checked list")
    return table


def accepted_since(engine: str, spelling: str) -> str | None:
    """The first checked release of `engine` that accepts `spelling`; None when none does (or it is unchecked)."""
    row = dtypes_table().engines.get(engine)
    return next((v.since for v in row.values if v.value == spelling), None) if row else None


def check_release_accepts(engine: str, version: str | None, spelling: str, fmt_name: str) -> None:
    """Refuse a format whose spelling the release (inside the checked window) does not accept."""
    from .releases import version_key

    row = dtypes_table().engines.get(engine)
    if row is None or version is None:
        return
    asked = version_key(version)
    # a release named by its minor version (vllm@0.32) is in the window by that minor, and judged as its first patch
    if not version_key(row.checked[0])[:len(asked)] <= asked <= version_key(row.checked[-1])[:len(asked)]:
        return
    since = accepted_since(engine, spelling)
    if since is None or version_key(since) > asked + (0,) * (3 - len(asked)):
        when = f"it came in {engine} {since}" if since else f"no checked {engine} release accepts it"
        later = f"--engine {engine}@{since} or later, or " if since else ""
        raise KvsizeError(f"{fmt_name}: {engine} {version} does not accept {row.option} {spelling} ({when}; "
                          f"{row.source.split(' (')[0]}); use {later}another format")

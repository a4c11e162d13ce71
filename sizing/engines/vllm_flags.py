"""What each `vllm serve` flag kvsize does not read does to GPU memory, as vLLM's source has it
(profiles/engines/vllm-flags/0.33.0.json): "none" (it moves none of the weights, the profiling peak, the non-torch
memory, the CUDA graphs, the KV budget or its blocks) or "memory" (it moves one of them, in a way kvsize does not
model). A flag that is in neither, nor read by kvsize, is unknown to kvsize, and the answer names it as such."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from ..profiles import validated_profile

FLAGS_PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "engines" / "vllm-flags" / "0.33.0.json"


class FlagEffect(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)
    effect: Literal["none", "memory"] = Field(alias="class")
    reason: str = Field(min_length=1, max_length=200)
    source: str = Field(min_length=1, max_length=200)


class OlderFlagEffect(FlagEffect):
    releases: str = Field(pattern=r"^\d+\.\d+\.\d+-\d+\.\d+\.\d+$")  # the first and last release that take it


class FlagTable(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    release: str = Field(pattern=r"^\d+(\.\d+){1,3}$")  # the vLLM whose parser the flags were read from
    source: str = Field(min_length=1)
    parser_dests: tuple[str, ...] = Field(min_length=1)
    flags: dict[str, FlagEffect]
    # flags earlier releases take and this one's parser does not, classified from those releases' source
    older_source: str = ""
    older_flags: dict[str, OlderFlagEffect] = Field(default_factory=dict)


@cache
def flag_table() -> FlagTable:
    return validated_profile(FLAGS_PROFILE, FlagTable)


def flag_effect(name: str) -> str | None:
    """"none", "memory", or None where kvsize does not know the flag."""
    table = flag_table()
    found = table.flags.get(name) or table.older_flags.get(name)
    return found.effect if found is not None else None

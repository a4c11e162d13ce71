"""The engines kvsize knows, by name: ENGINES lists one Engine per module beside this one (its budget rule,
pool and sources; docs/engines.md shows worked examples), and get_engine pairs it with the rules of the release
asked for, read from profiles/engines."""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from ..errors import KvsizeError, unknown
from ..cache.formats import FORMAT_NAMES, get_format
from .accepted_dtypes import check_release_accepts
from .base import Engine
from .ideal import IDEAL
from .llamacpp import LLAMACPP
from .lmdeploy import LMDEPLOY
from .releases import find_release
from .serve import LAUNCHERS
from .sglang import SGLANG
from .started import ReleaseEvidence, newest_started, release_evidence
from .trtllm import TRTLLM
from .vllm import VLLM

# The order is the order every listing and error message names them in.
ENGINES: dict[str, Engine] = {engine.name: engine for engine in (VLLM, SGLANG, TRTLLM, LMDEPLOY, LLAMACPP, IDEAL)}


def get_engine(name: str) -> Engine:
    """`vllm` (its newest release's rules) or `vllm@0.19` (the rules of the range holding 0.19)."""
    text = str(name).strip()
    base, at, version = text.partition("@")
    if at and not version.strip():
        raise KvsizeError(f"--engine {text}: give a version after '@' (e.g. {base}@0.22.1), or no '@' for the "
                          "newest rules")
    key = base.lower().replace("-", "").replace("_", "").replace(".", "")
    key = {"tensorrtllm": "trtllm", "llamacpp": "llamacpp", "trt": "trtllm"}.get(key, key)
    if key not in ENGINES:
        raise unknown("engine", base, ENGINES, "--engine")
    return _with_release(key, version.strip() or None)


@lru_cache(maxsize=64)
def _with_release(key: str, version: str | None) -> Engine:
    engine = ENGINES[key]
    # without a version, the rules of the newest release a real start confirmed, not the newest read from source
    version = version or newest_started(key)
    release = find_release(key, version)
    if release is None:
        if version is not None and version != newest_started(key):
            raise KvsizeError(f"--engine {key}@{version}: kvsize keeps no release rules for {key}; use --engine {key}")
        return engine
    return replace(engine, release=release, version=version)


def engine_formats(engine_name: str) -> list[str]:
    """The formats whose registry row names this engine (sizing/cache/formats.py)."""
    return list(_engine_formats(engine_name))


@lru_cache(maxsize=32)
def _engine_formats(engine_name: str) -> tuple[str, ...]:
    return tuple(n for n in FORMAT_NAMES if engine_name in get_format(n).engines)


def check_format_supported(engine: Engine, fmt_name: str, engines_of_format: tuple[str, ...], option: str) -> None:
    if engine.name not in engines_of_format:
        raise KvsizeError(
            f"{option} {fmt_name} is not a KV cache format of {engine.name} (it supports: auto, "
            f"{', '.join(engine_formats(engine.name))}); "
            f"engines that store {fmt_name}: {', '.join(engines_of_format)}"
        )
    launcher = LAUNCHERS.get(engine.name)
    spelling = launcher.spelling.get(fmt_name) if launcher else None
    if spelling is not None:
        check_release_accepts(engine.name, engine.followed_version, spelling, fmt_name)


def engine_evidence(spec: str) -> ReleaseEvidence | None:
    """release_evidence for an --engine value as typed (vllm, vllm@0.30, sglang@0.5.14, ...)."""
    engine = get_engine(spec)
    return release_evidence(engine.name, engine.version)

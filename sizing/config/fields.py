"""Reading config.json: the file itself (size-limited, strict JSON), transformers' config class for a known
model_type, and field look-ups across both that record every name asked for (what names an unread field)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import KvsizeError
from ..inputs import load_json, read_limited
from .shape import DTYPE_NAMES

MAX_CONFIG_BYTES = 4 * 1024 * 1024  # a real config.json is a few KiB; refuse anything huge


def read_config_file(path: str | Path) -> dict[str, Any]:
    """A config.json (or a folder holding one) as a dict, with clear errors."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        raise KvsizeError(f"--model: no config.json at {path}")
    return parse_config_text(read_limited(path, MAX_CONFIG_BYTES, "--model", "a config.json"), str(path))


def parse_config_text(data: bytes | str, where: str = "config.json") -> dict[str, Any]:
    # Infinity and NaN are read as Python's json writes them (NVIDIA's Mamba hybrids publish
    # "time_step_limit": [0.0, Infinity]); a field kvsize uses is checked where it is used. Integers longer
    # than any figure of a config are refused by their field's name.
    config = load_json(data, where, "a config.json", MAX_CONFIG_BYTES)
    if not isinstance(config, dict):
        raise KvsizeError(f"{where} must hold a JSON object, got {type(config).__name__}")
    return config


def transformers_config(raw: dict[str, Any]) -> Any | None:
    """transformers' config object for a known model_type, or None for unknown types."""
    model_type = raw.get("model_type")
    if not isinstance(model_type, str):
        return None
    hide_torch = "torch" not in sys.modules and "transformers" not in sys.modules
    advisory = os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS")
    if hide_torch:
        # Parsing a config needs no torch; importing it would cost seconds at every start. transformers
        # would then advise that PyTorch was not found, which is by design here, not news for the user.
        sys.modules["torch"] = None  # type: ignore[assignment]
        os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = "1"
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    finally:
        if hide_torch:
            del sys.modules["torch"]
            if advisory is None:
                os.environ.pop("TRANSFORMERS_NO_ADVISORY_WARNINGS", None)
            else:
                os.environ["TRANSFORMERS_NO_ADVISORY_WARNINGS"] = advisory
    if model_type not in CONFIG_MAPPING:
        return None
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    try:
        return CONFIG_MAPPING[model_type].from_dict(dict(raw))
    except Exception as e:  # transformers validates values; surface its message as ours
        reason = " ".join(str(e).split())  # one line: transformers' validation messages span several
        raise KvsizeError(f"config.json ({model_type}) rejected by its transformers config class: "
                          f"{reason[:300]}") from None


def _lookup(source: Any, name: str) -> tuple[bool, Any]:
    if isinstance(source, dict):
        return name in source, source.get(name)
    try:
        return True, getattr(source, name)
    except AttributeError:
        return False, None
    except RuntimeError:
        # transformers' heterogeneous configs (Gemma 4) refuse a global read of a per-layer field;
        # the per-layer values are read with Fields.per_layer, the file's global value stands here.
        return False, None


class Fields:
    """Looks fields up on the text config, then the outer config, then the raw JSON."""

    def __init__(self, *sources: Any) -> None:
        self.sources = [s for s in sources if s is not None]
        self.asked: set[str] = set()  # every field name looked up: what a memory-relevant field's presence needs

    def get(self, *names: str, default: Any = None) -> Any:
        # The first source that has the field decides, even when it says None: transformers
        # sets sliding_window to None when use_sliding_window is false, and that must win.
        self.asked.update(names)
        for source in self.sources:
            for name in names:
                present, value = _lookup(source, name)
                if present:
                    return default if value is None else value
        return default

    def per_layer(self, name: str, num_layers: int) -> tuple | None:
        """A field transformers' heterogeneous configs keep per layer (per_layer_config), else None."""
        self.asked.add(name)
        for source in self.sources:
            if isinstance(source, dict):
                continue
            attributes, layers = _lookup(source, "per_layer_attributes")[1], _lookup(source, "per_layer_config")[1]
            if name in (attributes or ()) and layers is not None:
                if len(layers) != num_layers:
                    raise KvsizeError(f"config.json: per-layer {name} for {len(layers)} layers, "
                                      f"num_hidden_layers is {num_layers}")
                return tuple(getattr(layer, name) for layer in layers)
        return None

    def need_int(self, *names: str, minimum: int = 1) -> int:
        value = self.get(*names)
        if value is None:
            raise KvsizeError(f"config.json is missing {names[0]!r} (also looked for {', '.join(names[1:]) or 'nothing else'})")
        return as_int(value, names[0], minimum)


def as_int(value: Any, name: str, minimum: int = 0) -> int:
    if isinstance(value, float) and not math.isfinite(value):
        raise KvsizeError(f"config.json field {name!r} must be a finite integer, got {value}")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value:
        raise KvsizeError(f"config.json field {name!r} must be an integer, got {value!r}")
    if value < minimum:
        raise KvsizeError(f"config.json field {name!r} must be at least {minimum}, got {value}")
    return int(value)


def optional_int(value: Any, name: str) -> int | None:
    return None if value is None else as_int(value, name, 1)


def config_flag(value: Any, name: str) -> bool:
    """A true/false config field as JSON gives it; a string ("false") or a number is refused, never read as
    its truthiness."""
    if isinstance(value, bool):
        return value
    if value is None:
        return False
    raise KvsizeError(f"config.json field {name!r} is {type(value).__name__} {str(value)[:20]!r}; it must be "
                      "true or false")


def dtype_name(value: Any) -> str | None:
    if value is None:
        return None
    text = str(value).removeprefix("torch.")
    return DTYPE_NAMES.get(text)


def brief(value: Any, limit: int = 60) -> str:
    """A config value as a message shows it: its repr, cut to `limit` characters."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 1] + "…"


# No published model comes near these; larger values are typos or hostile files (and would make
# kvsize build millions of per-layer specs).
# max_position_embeddings: 2^27 tokens, 12.8 x the longest context a published config gives (Llama 4 Scout,
# 10,485,760); beyond it the rotary cache alone would be the figure an error blamed
SHAPE_LIMITS = {"num_hidden_layers": 4096, "hidden_size": 1 << 20, "num_attention_heads": 1 << 14,
                "vocab_size": 1 << 24, "max_position_embeddings": 1 << 27}


def within_limit(value: int, name: str) -> int:
    if value > SHAPE_LIMITS[name]:
        raise KvsizeError(f"config.json field {name!r} is {value:,}; kvsize accepts at most {SHAPE_LIMITS[name]:,}")
    return value


def require_in_json(raw_text: dict, raw: dict, *names: str) -> None:
    """A core field must be in the file itself: transformers' class defaults describe some other model."""
    if not any(name in source for source in (raw_text, raw) for name in names):
        raise KvsizeError(f"config.json is missing {names[0]!r} (also looked for {', '.join(names[1:])}); "
                          "a config without it cannot be sized")


def is_architecture(raw: dict, raw_text: dict, model_types: tuple[str, ...], architectures: tuple[str, ...]) -> bool:
    """Whether the config, or the language model it nests, is one of these model types or model classes: what
    an engine builds, and so which of the fields it reads."""
    types = {src.get("model_type") for src in (raw, raw_text) if isinstance(src.get("model_type"), str)}
    names = {a for src in (raw, raw_text) if isinstance(src.get("architectures"), list)
             for a in src["architectures"] if isinstance(a, str)}
    return bool(types & set(model_types)) or bool(names & set(architectures))

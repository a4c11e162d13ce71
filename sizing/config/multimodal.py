"""Multimodal wrappers: the language model a wrapper nests (text_config and its other spellings), and the
vision tower's parameters."""

from __future__ import annotations

from typing import Any

from ..errors import KvsizeError
from .reading import Reading

# Where multimodal configs keep their language model: transformers' text_config, DeepSeek-VL2's and
# Janus's language_config, InternVL's llm_config.
NESTED_TEXT_KEYS = ("text_config", "language_config", "llm_config")
# read from the file itself, not looked up as fields: a wrapper keeps them beside the language model
FIELDS = (*NESTED_TEXT_KEYS, "vision_config")


def language_config(raw: dict[str, Any]) -> dict[str, Any]:
    """The nested language model's config, or the config itself where nothing is nested."""
    for key in NESTED_TEXT_KEYS:
        if key in raw and raw[key] is not None and not isinstance(raw[key], dict):
            raise KvsizeError(f"config.json field {key!r} must be an object")
    return next((raw[k] for k in NESTED_TEXT_KEYS if isinstance(raw.get(k), dict) and raw[k]), raw)


def read_vision(r: Reading) -> None:
    r.vision = _vision_params(r.raw.get("vision_config"))
    r.vision_tower = _sglang_vision_tower(r.raw.get("vision_config"))


def _sglang_vision_tower(vision: Any) -> tuple[int, int] | None:
    """(layers, hidden size) of a vision tower as SGLang reads them to lower its default memory fraction
    (arg_groups/memory_hook.py adjust_mem_fraction_for_vlm: getattr of num_hidden_layers, else 24, and of hidden_size,
    else 1024, the ViT-L/14 baseline; a tower whose layers are named `depth` is read as 24); None without one."""
    if not isinstance(vision, dict):
        return None
    layers, hidden = vision.get("num_hidden_layers") or 24, vision.get("hidden_size") or 1024
    if not (isinstance(layers, int) and isinstance(hidden, int)):
        raise KvsizeError("config.json: vision_config num_hidden_layers and hidden_size must be whole numbers")
    return layers, hidden


def _vision_params(vision: Any) -> int:
    """A ViT encoder's parameters: per layer 4 h^2 (attention) + 2 h I (MLP), plus a patch embedding."""
    if not isinstance(vision, dict):
        return 0
    h = vision.get("hidden_size") or vision.get("embed_dim") or 0
    inter = vision.get("intermediate_size") or 4 * h
    layers = vision.get("num_hidden_layers") or vision.get("depth") or 0
    patch = vision.get("patch_size") or 14
    channels = vision.get("num_channels") or vision.get("in_channels") or 3
    try:
        return int(layers * (4 * h * h + 2 * h * inter) + channels * patch * patch * h)
    except TypeError:
        raise KvsizeError("config.json: vision_config fields must be numbers") from None

"""The model's own context limit, and the published rope-scaling recipes that extend it.

A length past max_position_embeddings (or past the length the engine derives from the config's own rope
scaling) is served only with a recipe from profiles/rope_recipes.json; the serve command then carries the
override (sizing/engines/serve.py). Without one the length is refused, naming the limit and what to do.
The recipes are read on first use, never at import.
"""

from __future__ import annotations

import json
import shlex
from functools import cache
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..config import ModelShape
from ..errors import KvsizeError

RECIPES_FILE = Path(__file__).resolve().parent.parent.parent / "profiles" / "rope_recipes.json"
ROPE_TYPES = ("yarn", "linear", "dynamic")


class RopeScaling(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    rope_type: str
    factor: float = Field(gt=1, le=64)
    original_max_position_embeddings: int = Field(gt=0)
    # the model's rope_theta: vLLM's --hf-overrides replaces the whole rope_parameters, the base included
    rope_theta: float = Field(gt=0)

    @model_validator(mode="after")
    def _known(self):
        if self.rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {self.rope_type!r} is not one of {', '.join(ROPE_TYPES)}")
        return self

    def as_config(self) -> dict:
        return {"rope_type": self.rope_type, "factor": self.factor,
                "original_max_position_embeddings": self.original_max_position_embeddings,
                "rope_theta": self.rope_theta}


class RopeRecipe(BaseModel):
    """One published recipe: the models it applies to (model_type and the config's max_position_embeddings),
    the rope_scaling to add, the context it reaches and where it is published."""
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1)
    model_types: tuple[str, ...] = Field(min_length=1)
    max_position_embeddings: int = Field(gt=0)
    # the checkpoints whose published cards give the recipe (Hugging Face ids); a model is matched by its name
    models: tuple[str, ...] = Field(min_length=1)
    # True where the recipe is published for the whole family: any config of these model_types with this
    # max_position_embeddings and no rope scaling of its own (an uploaded config.json) is matched too
    family: bool = False
    rope_scaling: RopeScaling
    max_context: int = Field(gt=0)
    source: str = Field(min_length=20)
    caveat: str = ""

    @model_validator(mode="after")
    def _consistent(self):
        r = self.rope_scaling
        reach = int(r.original_max_position_embeddings * r.factor)
        if self.max_context > reach:
            raise ValueError(f"max_context {self.max_context} is beyond original_max_position_embeddings x factor "
                             f"({reach})")
        if self.max_context <= self.max_position_embeddings:
            raise ValueError(f"max_context {self.max_context} does not extend max_position_embeddings "
                             f"{self.max_position_embeddings}")
        if any("/" not in m for m in self.models):
            raise ValueError("models are Hugging Face ids (owner/name)")
        if "http" not in self.source:
            raise ValueError("source must name where the recipe is published (an address)")
        return self

    def matches(self, model: str, shape: ModelShape) -> bool:
        if shape.model_type not in self.model_types or shape.max_position_embeddings != self.max_position_embeddings:
            return False
        name = model.strip().rstrip("/").rsplit("/", 1)[-1].lower()
        return self.family or name in {m.rsplit("/", 1)[-1].lower() for m in self.models}

    def sentence(self) -> str:
        r = self.rope_scaling
        return (f"rope_scaling {r.rope_type} factor {r.factor:g} over original_max_position_embeddings "
                f"{r.original_max_position_embeddings:,}, published for up to {self.max_context:,} tokens "
                f"({self.source.split(' (')[0]})")


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    about: str = ""
    recipes: tuple[RopeRecipe, ...]


@cache
def rope_recipes() -> tuple[RopeRecipe, ...]:
    """profiles/rope_recipes.json, validated (read once, on first use)."""
    try:
        data = _File.model_validate(json.loads(RECIPES_FILE.read_text(encoding="utf-8")))
    except (OSError, ValidationError, json.JSONDecodeError) as e:
        raise KvsizeError(f"profile {RECIPES_FILE.name} is invalid: {' '.join(str(e).splitlines()[:3])}") from None
    ids = [r.id for r in data.recipes]
    if len(ids) != len(set(ids)):
        raise KvsizeError(f"profile {RECIPES_FILE.name} is invalid: recipe ids repeat")
    return data.recipes


def context_limit(shape: ModelShape, engine=None) -> int:
    """The longest context the model serves as configured: max_position_embeddings, or the engine's derived length
    where the config's own rope scaling extends it (vLLM's _get_and_verify_max_len)."""
    limit = shape.max_position_embeddings
    if engine is not None:
        limit = max(limit, engine.default_max_model_len(shape))
    return limit


def _recipes_of(model: str, shape: ModelShape) -> list[RopeRecipe]:
    if _scaled(shape):
        return []  # the config already scales its RoPE: no recipe is stacked on it
    return [r for r in rope_recipes() if r.matches(model, shape)]


def recipe_for(model: str, shape: ModelShape, context: int, engine=None) -> RopeRecipe | None:
    """The published recipe that serves `context` for `model` (its name or Hugging Face id), where the model needs
    one and one exists (None otherwise)."""
    if context <= context_limit(shape, engine):
        return None
    return next((r for r in _recipes_of(model, shape) if context <= r.max_context), None)


def _scaled(shape: ModelShape) -> bool:
    return any(kind != "default" for kind, _, _ in shape.rope_scalings)


def context_refusal(model: str, shape: ModelShape, context: int, engine=None, option: str = "--max-model-len") -> str | None:
    """Why `context` cannot be served (beyond the model's limit with no published recipe reaching it), or None."""
    limit = context_limit(shape, engine)
    if context <= limit or recipe_for(model, shape, context, engine) is not None:
        return None
    reach = _recipes_of(model, shape)
    more = (f"; the published rope-scaling recipe reaches {reach[0].max_context:,} tokens ({reach[0].sentence()})"
            if reach else "; no published rope-scaling recipe extends it (profiles/rope_recipes.json)")
    fewer = (f"plan {reach[0].max_context:,} tokens or fewer (with that override) or {limit:,} (without)" if reach
             else f"plan {limit:,} tokens or fewer")
    return (f"{option} {context:,} exceeds the model's max_position_embeddings {limit:,} ({model}){more}: an engine "
            f"refuses it without a rope-scaling override; {fewer}, or use a long-context variant of the model")


def check_context(model: str, shape: ModelShape, context: int, engine=None, option: str = "--max-model-len") -> None:
    why = context_refusal(model, shape, context, engine, option)
    if why:
        raise KvsizeError(why)


def recipe_note(model: str, shape: ModelShape, context: int, engine=None) -> str | None:
    """What the estimate says where a recipe serves a length past the limit, or None."""
    r = recipe_for(model, shape, context, engine)
    if r is None:
        return None
    from ..engines.serve import rope_override_args, without_theta

    caveat = f"; {r.caveat}" if r.caveat else ""
    name = getattr(engine, "name", "vllm")
    args = rope_override_args("vllm" if name == "ideal" else name, r.rope_scaling.as_config())
    how = (f"start the engine with {shlex.join(args)} (kvsize plan's serve commands carry it)" if args else
           f"add \"rope_scaling\": {json.dumps(without_theta(r.rope_scaling.as_config()))} to the model's "
           f"config.json ({name} has no start option for it that kvsize writes)")
    return (f"context {context:,} is beyond max_position_embeddings {shape.max_position_embeddings:,}: served only "
            f"with {r.sentence()}; {how}{caveat}")


def rope_scaling_for(model: str, shape: ModelShape, context: int, engine=None) -> dict | None:
    """The rope_scaling a serve command adds to reach `context`, or None where none is needed (or none exists:
    the estimate refuses such a length)."""
    r = recipe_for(model, shape, context, engine)
    return r.rope_scaling.as_config() if r else None

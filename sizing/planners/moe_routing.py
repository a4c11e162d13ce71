"""A MoE model's routing, where vLLM runs it as torch ops one by one instead of its fused top-k kernel
(profiles/moe-routing.json, counted from the engine's model source): each such kernel costs a step what
one of the fused-MoE path's kernels does, the fitted per-MoE-layer cost over the kernels it prices."""

from __future__ import annotations

from functools import cache

from pydantic import BaseModel, ConfigDict, Field

from ..profiles import PROFILES_DIR, validated_profile

ROUTING_PROFILE = PROFILES_DIR / "moe-routing.json"


class RoutingKernels(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    extra_kernels: int = Field(ge=0, le=1000)  # beyond the fused top-k's one, a MoE layer a step
    source: str = Field(min_length=1)


class MoeRouting(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    schema_: str = Field(alias="schema", pattern=r"^kvsize\.moe-routing/1$")
    fused_moe_kernels: int = Field(ge=1, le=100)  # the kernels moe_layer_step_overhead_s prices
    fused_moe_kernels_source: str = Field(min_length=1)
    routing: dict[str, RoutingKernels]


@cache
def moe_routing() -> MoeRouting:
    return validated_profile(ROUTING_PROFILE, MoeRouting)


def routing_overhead_s(architectures: tuple[str, ...], moe_layer_overhead_s: float) -> float:
    """A MoE layer's routing kernels beyond the fused top-k, a step: their count (0 for an architecture the engine
    routes with its fused kernel) times the cost of one of the fused path's kernels."""
    table = moe_routing()
    extra = max((table.routing[a].extra_kernels for a in architectures if a in table.routing), default=0)
    return extra * moe_layer_overhead_s / table.fused_moe_kernels

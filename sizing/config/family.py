"""The architecture family a model is summarized under (the accuracy page, the evidence lines)."""

from __future__ import annotations

from .shape import ModelShape


def family(shape: ModelShape) -> str:
    """The architecture family a start is summarized under."""
    kinds = set(shape.layer_kinds)
    if "recurrent" in kinds:
        return "hybrid (Mamba/linear)"
    if shape.is_mla:
        return "MLA" + (" MoE" if shape.num_experts else "")
    if shape.num_experts:
        return "MoE" + (" + sliding" if "sliding" in kinds else "")
    if "sliding" in kinds:
        return "sliding + full" if "full" in kinds else "sliding (every layer)"
    return "dense MHA" if shape.num_kv_heads == shape.num_attention_heads else "dense GQA/MQA"

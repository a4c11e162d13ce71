"""Pure functions of SGLang's default memory fraction (server_args.py / arg_groups/memory_hook.py), which the
releases' reserve rule (releases.py FractionByReserve) reads."""

from __future__ import annotations


def prefill_graph_sizes(max_tokens: int) -> list[int]:
    """The token counts SGLang captures piecewise prefill graphs for (server_args.py,
    _generate_piecewise_cuda_graph_tokens)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return [x for x in sizes if x <= max_tokens]


def vlm_fraction(base: float, layers: int, hidden: int) -> float:
    """The factor SGLang lowers a multimodal model's default fraction by (memory_hook.py
    adjust_mem_fraction_for_vlm): base x (1 - 0.1 x (layers x hidden^2 / (24 x 1024^2) - 1)), the second factor
    kept within 0.8-1.05."""
    ratio = layers * hidden * hidden / (24 * 1024 * 1024)
    return base * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))

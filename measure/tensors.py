"""Real paged-cache tensors for a kvsize layout, on any torch device.

Every component of every format becomes a tensor in its true storage: fp16/bf16/fp32,
float8_e4m3fn/e5m2 scales and values, int8 and int32, sub-byte values packed into uint8
(two 4-bit values per byte, 2/3/5-bit rows packed bit-tight), and llama.cpp formats as
their byte structs (one uint8 block of 18..34 bytes per 32 values). The storage of these
tensors must equal sizing's page bytes exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sizing.cache.components import Component, SideLayout
from sizing.cache.layers import CacheLayout
from sizing.units import cdiv

from .tensors_math import layout_bytes

TORCH_DTYPES = {
    "fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
    "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2,
    "int8": torch.int8, "int32": torch.int32,
}
LLAMACPP_BLOCK = 32


@dataclass
class AllocatedCache:
    tensors: dict[str, torch.Tensor]

    @property
    def storage_bytes(self) -> int:
        return sum(t.untyped_storage().nbytes() for t in self.tensors.values())

    def release(self) -> None:
        self.tensors.clear()


def _component_tensor(c: Component, num_blocks: int, block_size: int, heads: int, head_dim: int,
                      device) -> torch.Tensor:
    per_row = c.granularity.elements(block_size, head_dim)  # elements for one head over one page
    dtype = TORCH_DTYPES.get(c.dtype)
    if not c.granularity.per_head:  # stored once per layer
        if dtype is not None:
            return torch.empty(c.granularity.elements(0, head_dim), dtype=dtype, device=device)
        return torch.empty(cdiv(c.granularity.elements(0, head_dim) * c.bits, 8), dtype=torch.uint8, device=device)
    if dtype is not None and dtype.itemsize * 8 == c.bits:
        return torch.empty((num_blocks, heads, per_row), dtype=dtype, device=device)
    # sub-byte: packed bit-tight per page and head (4-bit: two values per byte)
    return torch.empty((num_blocks, heads, cdiv(per_row * c.bits, 8)), dtype=torch.uint8, device=device)


def _is_llamacpp(side: SideLayout) -> bool:
    return any(getattr(c.granularity, "group", None) == LLAMACPP_BLOCK and c.name.startswith("scale d")
               for c in side.components)


def allocate_layout(layout: CacheLayout, num_blocks: int, block_size: int, device="cpu") -> AllocatedCache:
    """Allocate `num_blocks` pages of `block_size` tokens for every KV layer, plus per-layer tensors."""
    tensors: dict[str, torch.Tensor] = {}
    for index, spec in layout.kv.items():
        names = ["k"] + ([] if spec.v is None else ["v"]) + ([] if spec.indexer is None else ["indexer"])
        for side_name, (side, dim) in zip(names, spec.sides()):
            if _is_llamacpp(side):
                struct_bytes = sum(cdiv(c.granularity.elements(1, LLAMACPP_BLOCK) * c.bits, 8)
                                   if c.granularity.per_head else 0 for c in side.components)
                tensors[f"{index}.{side_name}.blocks"] = torch.empty(
                    (num_blocks, block_size, spec.heads, dim // LLAMACPP_BLOCK, struct_bytes),
                    dtype=torch.uint8, device=device)
                continue
            for c in side.components:
                tensors[f"{index}.{side_name}.{c.name}"] = _component_tensor(
                    c, num_blocks, block_size, spec.heads, dim, device)
    return AllocatedCache(tensors)


predicted_bytes = layout_bytes

"""Torch-free arithmetic shared by the allocator and the validator."""

from sizing.cache.layers import CacheLayout


def layout_bytes(layout: CacheLayout, num_blocks: int, block_size: int) -> int:
    """sizing's prediction for an allocation: pages x page bytes + per-layer tensors."""
    return num_blocks * sum(s.page_bytes(block_size) for s in layout.kv.values()) + layout.layer_bytes()

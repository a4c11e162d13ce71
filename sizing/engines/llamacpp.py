"""llama.cpp's rules: no paging (contiguous per-layer K and V tensors of n_ctx cells, n_ctx padded), and no
memory rule of its own: the headroom the user leaves."""

from __future__ import annotations

from ..cache.layers import CacheLayout
from .base import Engine, ExactPool, Pool, headroom_budget, refuse_compressed

LLAMACPP_CTX_PAD = 256  # llama.cpp pads n_ctx to a multiple of 256 (src/llama-context.cpp)


def _llamacpp_pool(layout: CacheLayout, block_size: int, in_flight_tokens: int, mamba_pages: int = 0) -> Pool:
    refuse_compressed(layout, "llama.cpp")
    return ExactPool.build(layout, LLAMACPP_CTX_PAD)


LLAMACPP = Engine("llamacpp", None, 0.0, None, 1, False, headroom_budget, _llamacpp_pool,
                  "src/llama-kv-cache.cpp (contiguous per-layer K and V tensors of n_ctx cells; "
                  "n_ctx padded to 256)")

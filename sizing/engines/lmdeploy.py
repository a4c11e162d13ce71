"""LMDeploy's rules (TurboMind): cache_max_entry_count of the memory free after the weights, in one block
table of cache_block_seq_len tokens."""

from __future__ import annotations

from .base import Budget, Engine, MemoryTerms, block_pool
from .releases import Release


def _lmdeploy_budget(m: MemoryTerms, fraction: float, headroom: float, release: Release | None) -> Budget:
    free = m.total_bytes - m.weights_bytes - m.non_torch_bytes
    kv = int(free * fraction)
    return Budget(kv, free - kv - m.activation_bytes - m.cuda_graph_bytes, m.total_bytes,
                  "cache_max_entry_count × (total − weights − non_torch)")


LMDEPLOY = Engine("lmdeploy", "--cache-max-entry-count", 0.8, "--cache-block-seq-len", 64, True,
                  _lmdeploy_budget, block_pool,
                  "lmdeploy/turbomind (cache_max_entry_count: share of free GPU memory after weights for "
                  "the k/v cache; cache_block_seq_len tokens per block)")

"""TensorRT-LLM's rules: free_gpu_memory_fraction of the memory its profiling run left free, in one block
table of tokens_per_block tokens."""

from __future__ import annotations

from .base import Budget, Engine, MemoryTerms, block_pool
from .releases import Release


def _trtllm_budget(m: MemoryTerms, fraction: float, headroom: float, release: Release | None) -> Budget:
    free = m.total_bytes - m.model_bytes
    kv = int(free * fraction)
    return Budget(kv, free - kv, m.total_bytes,
                  "free_gpu_memory_fraction × (total − weights − activation − non_torch − cuda_graphs)")


TRTLLM = Engine("trtllm", "--free-gpu-memory-fraction", 0.9, "--tokens-per-block", 32, True, _trtllm_budget, block_pool,
                "tensorrt_llm/_torch/pyexecutor/_util.py (KvCacheCreator: free memory after the profiling "
                "run × free_gpu_memory_fraction), KvCacheConfig.tokens_per_block")

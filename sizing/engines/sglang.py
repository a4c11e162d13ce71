"""SGLang's rules: mem_fraction_static of the memory free at start, less the weights, for the KV cache
(what the activation and CUDA graphs need lives in the rest), in one block table of page_size tokens."""

from __future__ import annotations

from .base import Budget, Engine, MemoryTerms, block_pool
from .releases import Release


def _sglang_budget(m: MemoryTerms, fraction: float, headroom: float, release: Release | None) -> Budget:
    # profile_max_num_token: rest = free after weights − free_at_start × (1 − f), where free_at_start
    # is read after the CUDA context and NCCL are up (non_torch here), before the weights load.
    free_at_start = m.total_bytes - m.non_torch_bytes
    usable = int(free_at_start * fraction)
    kv = usable - m.weights_bytes
    return Budget(kv, free_at_start - usable - m.activation_bytes - m.cuda_graph_bytes, usable,
                  "mem_fraction_static × (total − non_torch at start) − weights "
                  "(activation and CUDA graphs live in the rest)")


SGLANG = Engine("sglang", "--mem-fraction-static", 0.88, "--page-size", 1, True, _sglang_budget, block_pool,
                "python/sglang/srt/model_executor/model_runner.py (profile_max_num_token: rest_memory = "
                "available − total × (1 − mem_fraction_static); max_total_num_tokens = rest // cell_size)")

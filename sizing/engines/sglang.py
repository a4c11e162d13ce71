"""SGLang's rules: mem_fraction_static of the memory free at start, less the weights, for the KV cache
(what the activation and CUDA graphs need lives in the rest), in one block table of page_size tokens; a
hybrid model's recurrent state in a pool of its own beside it (state_pool.py)."""

from __future__ import annotations

from dataclasses import replace

from ..config import ModelShape
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


def _sglang_model(shape: ModelShape, k_format: str, v_format: str, release: Release | None):
    """The SSM state in SGLang's own dtype: the config's mamba_ssm_dtype, else the release's default
    (configs/mamba_utils.py mamba2_state_dtype reads no other key; vLLM's mamba_ssm_cache_dtype is not it)."""
    rule = release.recurrent_state_pool if release else None
    if rule is None or "recurrent" not in shape.layer_kinds:
        return shape, k_format, v_format, ()
    dtype = shape.recurrent_ssm_dtype_named or rule.ssm_dtype_default
    return replace(shape, recurrent_state_dtype=dtype), k_format, v_format, ()


SGLANG = Engine("sglang", "--mem-fraction-static", 0.88, "--page-size", 1, True, _sglang_budget, block_pool,
                "python/sglang/srt/model_executor/model_runner.py (profile_max_num_token: rest_memory = "
                "available − total × (1 − mem_fraction_static); max_total_num_tokens = rest // cell_size)",
                model_rule=_sglang_model)

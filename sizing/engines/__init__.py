"""Stage 3, engine rules: how each serving engine (vLLM, SGLang, TensorRT-LLM, LMDeploy, llama.cpp) budgets
GPU memory and pages the KV cache, each release's rules read from profiles/engines (docs/architecture.md)."""

from .base import Budget, Engine, MemoryTerms, Pool
from .registry import ENGINES, check_format_supported, engine_evidence, engine_formats, get_engine
from .vllm import VllmCache, packed_groups, vllm_caches

__all__ = ["ENGINES", "Budget", "Engine", "MemoryTerms", "Pool", "VllmCache", "check_format_supported",
           "engine_evidence", "engine_formats", "get_engine", "packed_groups", "vllm_caches"]

"""The planned panel of llama.cpp loads: every bundled model below (its config.json as published, from
profiles/models/) under every cache type llama.cpp accepts for K and V, mixed K/V, flash attention on and off, and
several n_ctx, n_seq_max and kv_unified settings. Fixed before any load is run; kvsize's predictions for it are
written by scripts/predict_llamacpp.py."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# llama.cpp's --cache-type-k/-v values (common/arg.cpp kv_cache_types)
CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")

# profile id -> the llama.cpp architecture its GGUF is converted to (convert_hf_to_gguf.py / conversion/__init__.py)
MODELS = {
    "llama-3.1-8b": "llama",  # GQA, 8 KV heads
    "llama-2-7b": "llama",  # MHA
    "qwen2.5-7b-instruct": "qwen2",
    "qwen3-8b": "qwen3",
    "qwen3-30b-a3b": "qwen3moe",
    "gemma-2-9b": "gemma2",  # sliding window 4096 on every other layer
    "gemma-3-27b-it": "gemma3",  # sliding window 1024, five of every six layers
    "phi-3-mini-128k-instruct": "phi3",  # its config's sliding_window 262144
    "mistral-7b-v0.1": "llama",  # MistralForCausalLM converts to llama; its config's sliding_window 4096
    "deepseek-v3": "deepseek2",  # MLA
    "qwen3-next-80b-a3b-thinking": "qwen3next",  # gated delta net + attention hybrid
}

N_BATCH = 2048  # llama_context_default_params().n_batch (src/llama-context.cpp)
N_UBATCH = 512  # llama_context_default_params().n_ubatch


@dataclass(frozen=True)
class Load:
    id: str
    model: str
    arch: str
    n_ctx: int
    n_seq_max: int
    type_k: str
    type_v: str
    flash_attn: bool
    kv_unified: bool
    n_batch: int = N_BATCH
    n_ubatch: int = N_UBATCH

    def as_dict(self) -> dict:
        return asdict(self)


def _loads_of(model: str, arch: str) -> list[Load]:
    rows: list[tuple[int, int, str, str, bool, bool]] = []
    for t in CACHE_TYPES:  # one type for K and V
        rows.append((2048, 1, t, t, True, False))
    for k, v in (("q8_0", "f16"), ("f16", "q4_0"), ("q4_0", "q8_0"), ("bf16", "q5_1")):  # mixed K/V
        rows.append((2048, 1, k, v, True, False))
    for k, v in (("f16", "f16"), ("q8_0", "f16"), ("f16", "q8_0")):  # without flash attention
        rows.append((2048, 1, k, v, False, False))
    for n_ctx, n_seq, unified in ((1000, 1, False), (5000, 3, False), (8192, 4, False), (8192, 4, True),
                                  (300, 2, False), (8192, 1, False)):
        rows.append((n_ctx, n_seq, "q8_0", "q8_0", True, unified))
    loads = []
    for n_ctx, n_seq, k, v, fa, unified in rows:
        tag = f"{model}/c{n_ctx}-s{n_seq}{'u' if unified else ''}-{k}-{v}-fa{'on' if fa else 'off'}"
        loads.append(Load(tag, model, arch, n_ctx, n_seq, k, v, fa, unified))
    return loads


def panel() -> list[Load]:
    return [load for model, arch in MODELS.items() for load in _loads_of(model, arch)]

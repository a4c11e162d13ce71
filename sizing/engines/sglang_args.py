"""SGLang's own settings, under SGLang's names (ServerArgs fields: `--context-length`, `context_length=` in the
`server_args=` log line, `sgl.Engine(...)` keywords), read into the scenario fields they move.

Every ServerArgs field that moves memory is read here once and checked where it is read; fields that move memory
in ways kvsize does not model are kept as "not modelled", so the front ends say so instead of guessing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import KvsizeError
from .vllm_args import STATE_DTYPES, _flag, _fraction, _positive

# SGLang's KV dtypes (server_args.py --kv-cache-dtype choices) and kvsize's format for each.
KV_DTYPES = {"auto": "auto", "bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16",
             "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "fp4_e2m1": "nvfp4"}


def _choice(value, name: str, table: dict[str, str]) -> str:
    """kvsize's name for one of SGLang's choices of a field, or a refusal naming the field and the choices."""
    text = str(value).lower()
    if text not in table:
        raise KvsizeError(f"{name} {str(value)[:40]!r} is not one SGLang takes; allowed: " + ", ".join(table))
    return table[text]


def _ratio(value, name: str) -> float:
    try:
        r = float(value)
    except (TypeError, ValueError):
        raise KvsizeError(f"{name} must be a ratio such as 0.9 (state memory over attention memory), "
                          f"got {str(value)[:40]!r}") from None
    if not 0 < r <= 100:
        raise KvsizeError(f"{name} must be a ratio in (0, 100] such as 0.9, got {str(value)[:40]!r}")
    return r


# Fields that move memory in ways kvsize does not model; their presence is reported, never guessed.
NOT_MODELLED = frozenset({
    "speculative_algorithm", "speculative_draft_model_path", "enable_lora", "lora_paths", "max_loras_per_batch",
    "cpu_offload_gb", "enable_hierarchical_cache", "hicache_ratio", "hicache_size", "enable_dp_attention",
    "ep_size", "enable_ep_moe", "dp_size", "max_total_tokens", "enable_double_sparsity",
    "max_mamba_cache_size", "enable_two_batch_overlap", "cuda_graph_bs", "enable_torch_compile",
    "piecewise_cuda_graph_max_tokens", "disable_radix_cache", "enable_mixed_chunk",
})
IGNORED = frozenset({
    "model_path", "tokenizer_path", "load_format", "skip_tokenizer_init", "random_seed", "log_level",
    "attention_backend", "sampling_backend", "trust_remote_code", "host", "port", "served_model_name",
    "prefill_attention_backend", "decode_attention_backend", "schedule_policy", "enable_metrics",
})


@dataclass(frozen=True)
class SglangSettings:
    fields: dict = field(default_factory=dict)  # Scenario field -> value
    used: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()
    not_modelled: tuple[str, ...] = ()


def read_server_args(args: dict) -> SglangSettings:
    """ServerArgs fields (name -> value, as keywords or from the log's `server_args=` line) into scenario
    fields; refuses a value outside what SGLang takes, naming the field."""
    fields: dict = {}
    used, ignored, not_modelled = [], [], []
    for raw_name, value in args.items():
        name = str(raw_name).lstrip("-").replace("-", "_")
        if value is None:
            continue
        if name == "context_length":
            fields["max_model_len"] = _positive(value, "context_length")
        elif name in ("tp_size", "tensor_parallel_size"):
            fields["tensor_parallel_size"] = _positive(value, name)
        elif name in ("pp_size", "pipeline_parallel_size"):
            fields["pipeline_parallel_size"] = _positive(value, name)
        elif name == "mem_fraction_static":
            fields["memory_fraction"] = _fraction(value, name)
        elif name == "page_size":
            fields["block_size"] = _positive(value, name)
        elif name == "kv_cache_dtype":
            fields["k_cache_dtype"] = fields["v_cache_dtype"] = _choice(value, name, KV_DTYPES)
        elif name == "dtype":
            fields["dtype"] = str(value)
        elif name == "chunked_prefill_size":
            try:
                chunked = int(value)
            except (TypeError, ValueError):
                chunked = 0
            if chunked == 0 or chunked < -1:
                raise KvsizeError(f"chunked_prefill_size {str(value)[:40]!r} is not allowed: a positive token count, "
                                  "or -1 to turn chunked prefill off")
            fields["max_num_batched_tokens"] = chunked if chunked > 0 else None
        elif name == "max_running_requests":
            fields["max_num_seqs"] = _positive(value, name)
        elif name == "disable_cuda_graph":
            if _flag(value, name):
                fields["cudagraph_mode"] = "NONE"  # SGLang captures CUDA graphs unless told not to
        elif name == "cuda_graph_max_bs":
            fields["cuda_graph_max_bs"] = _positive(value, name)
        elif name == "mamba_full_memory_ratio":
            fields["mamba_full_memory_ratio"] = _ratio(value, name)
        elif name in ("enable_multimodal", "language_only", "language_model_only"):
            # SGLang serves a multimodal architecture as one unless told otherwise, and then lowers its default
            # memory fraction for the vision tower (memory_hook.py adjust_mem_fraction_for_vlm)
            served = _flag(value, name) if name == "enable_multimodal" else not _flag(value, name)
            fields["serve_multimodal"] = fields.get("serve_multimodal", True) and served
        elif name == "mamba_ssm_dtype":
            fields["mamba_ssm_dtype"] = _choice(value, name, STATE_DTYPES)
        elif name == "disable_radix_cache" and not _flag(value, name):
            ignored.append(name)  # the default: the radix cache on
            continue
        elif name in NOT_MODELLED:
            not_modelled.append(name)
            continue
        else:
            ignored.append(name)
            continue
        used.append(name)
    return SglangSettings(fields, tuple(used), tuple(ignored), tuple(not_modelled))

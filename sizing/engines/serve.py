"""The command that starts a plan, in each engine's own spelling.

One table row per engine: how it names each KV format it can store, and how it is started.
A format an engine cannot store gets no command, but the list of engines that can.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, replace
from typing import Callable

from ..cache.formats import get_format

# kvsize format -> the engine's value for its KV cache dtype option.
# vLLM's names are vllm/config/cache.py's CacheDType values (0.33; each built in tests/fixtures/vllm-reference/
# formats-Llama-3.1-8B.json): kvsize keeps the same names for the formats vLLM alone defines.
_VLLM = {"bf16": "auto", "fp16": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
         "fp8_per_token_head": "fp8_per_token_head", "int8_per_token_head": "int8_per_token_head",
         "int4_per_token_head": "int4_per_token_head", "nvfp4": "nvfp4", "nvfp4_4over6": "nvfp4_4over6",
         "turboquant_k8v4": "turboquant_k8v4", "turboquant_4bit_nc": "turboquant_4bit_nc",
         "turboquant_k3v4_nc": "turboquant_k3v4_nc", "turboquant_3bit_nc": "turboquant_3bit_nc",
         "ultraquant_4bit": "ultraquant_4bit", "fp32": "auto"}
_SGLANG = {"bf16": "auto", "fp16": "auto", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2"}
_TRTLLM = {"bf16": "auto", "fp16": "auto", "fp8_e4m3": "fp8", "nvfp4": "nvfp4"}
_LMDEPLOY = {"bf16": "0", "fp16": "0", "lmdeploy_int8": "8", "lmdeploy_int4": "4"}
_LLAMACPP = {"fp32": "f32", "fp16": "f16", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1",
             "q5_0": "q5_0", "q5_1": "q5_1", "iq4_nl": "iq4_nl"}


@dataclass(frozen=True)
class ServeSettings:
    model: str  # Hugging Face id (or a GGUF path for llama.cpp)
    kv_format: str  # kvsize name, resolved (no "auto")
    serving_dtype: str
    tensor_parallel_size: int
    max_model_len: int
    memory_fraction: float | None
    block_size: int
    max_num_seqs: int
    cache_tokens: int  # tokens the replica's KV pool holds
    host_tier_bytes: int = 0  # host-memory KV tier per replica (engines configured by file read it here)
    language_model_only: bool = False  # a multimodal model served text-only (vLLM builds no vision tower)
    enforce_eager: bool = False  # planned without torch.compile and CUDA graphs
    # the config's rope_scaling a published recipe adds to serve past max_position_embeddings
    # (sizing/capacity/context_limit.py; {"rope_type", "factor", "original_max_position_embeddings"})
    rope_scaling: dict | None = None
    api_server_count: int = 1  # vLLM's API server processes (--api-server-count): a host-paced design's front end


@dataclass(frozen=True)
class ServeCommand:
    engine: str
    command: str | None  # None when the engine cannot store the format
    note: str


def _join(args: list[str]) -> str:
    return " ".join(shlex.quote(a) for a in args)


def _vllm(s: ServeSettings, dtype: str, extra: tuple[str, ...] = ()) -> str:
    args = ["vllm", "serve", s.model, "--kv-cache-dtype", dtype, "--max-model-len", str(s.max_model_len),
            "--gpu-memory-utilization", f"{s.memory_fraction or 0.9:g}", "--tensor-parallel-size",
            str(s.tensor_parallel_size), "--block-size", str(s.block_size), "--max-num-seqs", str(s.max_num_seqs)]
    if s.kv_format == "fp32":
        args += ["--dtype", "float32"]  # vLLM's KV follows the model dtype unless quantized
    if s.language_model_only:
        args.append("--language-model-only")
    if s.enforce_eager:
        args.append("--enforce-eager")
    if s.api_server_count > 1:
        args += ["--api-server-count", str(s.api_server_count)]
    return _join(args + list(extra))


def _sglang(s: ServeSettings, dtype: str, extra: tuple[str, ...] = ()) -> str:
    return _join(["python", "-m", "sglang.launch_server", "--model-path", s.model, "--kv-cache-dtype", dtype,
                  "--context-length", str(s.max_model_len), "--mem-fraction-static", f"{s.memory_fraction or 0.88:g}",
                  "--tp", str(s.tensor_parallel_size), "--max-running-requests", str(s.max_num_seqs), *extra])


def _trtllm(s: ServeSettings, dtype: str, extra: tuple[str, ...] = ()) -> str:
    # trtllm-serve takes the KV cache config through an extra LLM-API options file.
    options = (f"kv_cache_config:\\n  dtype: {dtype}\\n  free_gpu_memory_fraction: {s.memory_fraction or 0.9:g}\\n"
               f"  tokens_per_block: {s.block_size}")
    if s.host_tier_bytes:
        # KvCacheConfig.host_cache_size: bytes of host memory per rank for blocks offloaded from the GPU
        options += f"\\n  host_cache_size: {s.host_tier_bytes // s.tensor_parallel_size}"
    serve = _join(["trtllm-serve", s.model, "--tp_size", str(s.tensor_parallel_size), "--max_seq_len",
                   str(s.max_model_len), "--max_batch_size", str(s.max_num_seqs), "--extra_llm_api_options",
                   "kv_cache.yaml", *extra])
    return f"printf '{options}\\n' > kv_cache.yaml && {serve}"


def _lmdeploy(s: ServeSettings, policy: str, extra: tuple[str, ...] = ()) -> str:
    return _join(["lmdeploy", "serve", "api_server", s.model, "--quant-policy", policy, "--cache-max-entry-count",
                  f"{s.memory_fraction or 0.8:g}", "--tp", str(s.tensor_parallel_size), "--session-len",
                  str(s.max_model_len), "--max-batch-size", str(s.max_num_seqs), *extra])


def _llamacpp(s: ServeSettings, dtype: str, extra: tuple[str, ...] = ()) -> str:
    # -c is the whole cache in tokens; with a unified KV buffer (-kvu) the -np slots share it, so
    # a mix of lengths fits as the plan counts it (without -kvu each slot gets -c / -np tokens).
    return _join(["llama-server", "-m", "MODEL.gguf", "-ctk", dtype, "-ctv", dtype, "-fa", "on", "-c",
                  str(s.cache_tokens), "-np", str(s.max_num_seqs), "-kvu", *extra])


@dataclass(frozen=True)
class EngineLauncher:
    spelling: dict[str, str]
    build: Callable[..., str]  # (settings, the engine's dtype value, extra arguments) -> command
    note: str
    # Disaggregated prefill/decode: the arguments for a replica of a role ("prefill" or "decode").
    pd_args: Callable[[str], list[str]] | None = None
    pd_note: str = ""
    # A host-memory KV tier of `bytes` per replica at TP `tp`.
    offload_args: Callable[[int, int], list[str]] | None = None


LAUNCHERS: dict[str, EngineLauncher] = {
    "vllm": EngineLauncher(
        _VLLM, _vllm, "vLLM: --kv-cache-dtype auto keeps the model dtype",
        pd_args=lambda role: ["--kv-transfer-config",
                              json.dumps({"kv_connector": "NixlConnector", "kv_role": "kv_both"}, separators=(",", ":"))],
        pd_note="vLLM disaggregated prefilling with the NixlConnector (docs: features/nixl_connector_usage); "
                "a proxy routes each request to a prefill and then a decode instance",
        # --kv-offloading-size is GiB summed over the TP ranks (vllm/config/cache.py, 0.33: kv_offloading_size)
        offload_args=lambda host_bytes, tp: ["--kv-offloading-size", f"{host_bytes / 2**30:g}",
                                             "--kv-offloading-backend", "native"]),
    "sglang": EngineLauncher(
        _SGLANG, _sglang, "SGLang: --mem-fraction-static covers weights and KV",
        pd_args=lambda role: ["--disaggregation-mode", role],
        pd_note="SGLang PD disaggregation (--disaggregation-mode); sglang_router with --pd-disaggregation routes "
                "requests",
        # --hicache-size is GB (10^9 bytes) per rank: each rank's host pool is hicache_size * 1e9 bytes
        # (sglang/srt/mem_cache/memory_pool_host.py)
        offload_args=lambda host_bytes, tp: ["--enable-hierarchical-cache", "--hicache-size",
                                             f"{host_bytes / tp / 1e9:g}"]),
    "trtllm": EngineLauncher(_TRTLLM, _trtllm, "TensorRT-LLM: the KV cache dtype and fraction live in "
                                               "kv_cache_config",
                             offload_args=lambda host_bytes, tp: []),  # host_cache_size goes in kv_cache.yaml
    "lmdeploy": EngineLauncher(_LMDEPLOY, _lmdeploy, "LMDeploy: --quant-policy 8 = int8 KV, 4 = int4 KV; "
                                                     "--cache-max-entry-count is the share of free memory"),
    "llamacpp": EngineLauncher(_LLAMACPP, _llamacpp, "llama.cpp: quantized V needs flash attention (-fa on); "
                                                     "-c is the whole cache, shared by the -np slots with -kvu; "
                                                     "weights come as GGUF"),
}


def without_theta(rope_scaling: dict) -> dict:
    """A recipe's rope_scaling as a model card spells it in config.json (the base stays the config's own)."""
    return {k: v for k, v in rope_scaling.items() if k != "rope_theta"}


def rope_override_args(engine: str, rope_scaling: dict) -> list[str] | None:
    """The engine's own option that adds `rope_scaling` to the model's config, or None where kvsize knows none:
    vLLM --hf-overrides with rope_parameters, the base included (docs.vllm.ai, features/context_extension: the
    --rope-scaling option is gone), SGLang --json-model-override-args with rope_scaling as the model cards give it,
    llama.cpp's --rope-scaling/--rope-scale/--yarn-orig-ctx (YaRN only)."""
    if engine == "vllm":
        return ["--hf-overrides", json.dumps({"rope_parameters": rope_scaling}, separators=(",", ":"))]
    if engine == "sglang":
        return ["--json-model-override-args",
                json.dumps({"rope_scaling": without_theta(rope_scaling)}, separators=(",", ":"))]
    if engine == "llamacpp" and rope_scaling.get("rope_type") == "yarn":
        return ["--rope-scaling", "yarn", "--rope-scale", f"{rope_scaling['factor']:g}", "--yarn-orig-ctx",
                str(rope_scaling["original_max_position_embeddings"])]
    return None


def serve_command(engine: str, settings: ServeSettings, role: str | None = None,
                  host_tier_bytes: int = 0) -> ServeCommand:
    """The command for one replica; `role` "prefill" or "decode" for a disaggregated design, and a
    host-memory KV tier of `host_tier_bytes` per replica."""
    launcher = LAUNCHERS.get(engine)
    extra: list[str] = []
    notes = []
    if launcher is not None and role is not None:
        if launcher.pd_args is None:
            return ServeCommand(engine, None, f"kvsize writes no disaggregated command for {engine}; engines it "
                                              f"writes them for: {', '.join(e for e, l in LAUNCHERS.items() if l.pd_args)}")
        extra += launcher.pd_args(role)
        notes.append(launcher.pd_note)
    if launcher is not None and host_tier_bytes:
        if launcher.offload_args is None:
            return ServeCommand(engine, None, f"kvsize writes no host-tier option for {engine}; engines it writes "
                                              f"them for: {', '.join(e for e, l in LAUNCHERS.items() if l.offload_args)}")
        extra += launcher.offload_args(host_tier_bytes, settings.tensor_parallel_size)
        settings = replace(settings, host_tier_bytes=host_tier_bytes)
    if launcher is not None and settings.rope_scaling:
        rope = rope_override_args(engine, settings.rope_scaling)
        if rope is None:
            return ServeCommand(engine, None, f"--max-model-len {settings.max_model_len:,} needs a rope-scaling override "
                                              f"({json.dumps(settings.rope_scaling)}), which kvsize writes for vllm, "
                                              f"sglang and llamacpp only; add it to the model's config.json for {engine}")
        extra += rope
        r = settings.rope_scaling
        notes.append(f"the model's context is extended with rope_scaling {r['rope_type']} factor {r['factor']:g} "
                     f"over {r['original_max_position_embeddings']:,} positions: a published recipe, "
                     "whose source profiles/rope_recipes.json names")
    command = _serve_command(engine, settings, tuple(extra))
    return ServeCommand(command.engine, command.command, "; ".join([command.note, *notes]))


def _serve_command(engine: str, settings: ServeSettings, extra: tuple[str, ...]) -> ServeCommand:
    fmt = get_format(settings.kv_format, settings.serving_dtype)
    launcher = LAUNCHERS.get(engine)
    if launcher is None:
        return ServeCommand(engine, None, f"{engine} is kvsize's reference engine and has no command; "
                                          f"pick one of {', '.join(LAUNCHERS)}")
    name = fmt.name
    if name in ("bf16", "fp16") and name != settings.serving_dtype and engine != "llamacpp":
        name = "unsupported"  # 'auto' would store the model dtype, not this one
    spelled = launcher.spelling.get(name)
    if spelled is None:
        able = [e for e, row in LAUNCHERS.items() if fmt.name in row.spelling] or ["none of the engines"]
        return ServeCommand(engine, None, f"{engine} cannot store {fmt.name} KV; engines that can: {', '.join(able)}")
    return ServeCommand(engine, launcher.build(settings, spelled, extra), launcher.note)

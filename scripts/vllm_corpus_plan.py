"""Write the plans of real vLLM starts that make tests/fixtures/vllm-starts (one JSON list a machine).

usage: python scripts/vllm_corpus_plan.py four-gpus|one-gpu|four-h100s|two-h100s|one-h200|architectures|checkpoints|compile-cache|integer-checkpoints|one-h100|release-panels|torch-stage-panels|panel-gaps|tp2-0.33|tp4-0.33|panels-0.32-0.31|panels-0.29-0.27|tp-0.32-0.27|tp-0.30-0.27.1|small-gpu-defaults|pp2|pp-vocab|mla-graphs-0.33|mla-graphs-check-0.33|panels-0.20-patches > plan.json
Every start is an EngineArgs dict on a config in tests/fixtures/vllm-starts/configs/, in vLLM's
`vllm serve` usage context unless it says `llm`. Starts whose config is not there are left out.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-starts" / "configs"


def start(release, model, tag="", context="serve", **args):
    args.setdefault("max_model_len", 8192)
    variant = f"-{tag}" if tag else ""
    return {"id": f"{release}-{model}{variant}", "config": f"tests/fixtures/vllm-starts/configs/{model}.json",
            "args": args, "context": context, "release": release}


def four_gpus():
    """The first batch: four GPUs of one host, tensor parallel first."""
    r22, r26 = "0.22.1", "0.26.0"
    return [
        # tensor parallel first: they need free GPUs together
        start(r22, "llama-3.1-70b", "tp4", tensor_parallel_size=4, max_model_len=32768),
        start(r26, "qwen2.5-0.5b", "tp4", tensor_parallel_size=4, max_model_len=32768),
        start(r22, "qwen3-30b-a3b", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(r26, "deepseek-v2-lite", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(r22, "mixtral-8x7b-v0.1", "tp2-fp8", tensor_parallel_size=2, kv_cache_dtype="fp8"),
        start(r26, "llama-3.1-8b", "tp2", tensor_parallel_size=2, max_model_len=16384),
        # one GPU: architectures on 0.22.1
        start(r22, "llama-3.1-8b"),
        start(r22, "qwen3-8b"),
        start(r22, "qwen3-30b-a3b", max_model_len=32768),
        start(r22, "deepseek-v2-lite", max_model_len=32768),
        start(r22, "mistral-7b-v0.1", max_model_len=32768),
        start(r22, "gemma-2-9b", max_model_len=4096),
        start(r22, "llama-2-7b", max_model_len=4096, gpu_memory_utilization=0.5),
        start(r22, "qwen2.5-7b-instruct", "fp8", kv_cache_dtype="fp8", max_model_len=32768),
        start(r22, "phi-2", max_model_len=2048),
        start(r22, "falcon-7b", max_model_len=2048),
        start(r22, "nemotron-h-8b-base-8k"),
        start(r22, "gpt-oss-20b", max_model_len=32768),
        start(r22, "phi-3-mini-128k-instruct", max_model_len=131072, gpu_memory_utilization=0.95),
        start(r22, "minicpm3-4b", max_model_len=16384),
        start(r22, "qwen2.5-0.5b", max_model_len=32768, gpu_memory_utilization=0.5),
        # settings on 0.22.1
        start(r22, "llama-3.1-8b", "llm", context="llm"),
        start(r22, "llama-3.1-8b", "eager", enforce_eager=True),
        start(r22, "llama-3.1-8b", "fp8-128k", kv_cache_dtype="fp8", max_model_len=131072),
        start(r22, "qwen3-30b-a3b", "llm", context="llm", max_model_len=32768),
        start(r22, "llama-3.1-8b", "seqs64-bt2048", max_num_seqs=64, max_num_batched_tokens=2048),
        # 0.26.0 on one GPU
        start(r26, "llama-3.1-8b"),
        start(r26, "qwen3-8b"),
        start(r26, "qwen3-30b-a3b", max_model_len=32768),
        start(r26, "deepseek-v2-lite", max_model_len=32768),
        start(r26, "gemma-2-9b", max_model_len=4096),
        start(r26, "mistral-7b-v0.1", max_model_len=32768),
        start(r26, "nemotron-h-8b-base-8k"),
        start(r26, "gpt-oss-20b", max_model_len=32768),
        start(r26, "llama-3.1-8b", "kvmem8g", kv_cache_memory_bytes=8 * 2**30),
        start(r26, "qwen2.5-7b-instruct", "bs32-u95", block_size=32, gpu_memory_utilization=0.95),
        start(r26, "llama-3.1-8b", "llm", context="llm"),
        start(r26, "gemma-4-e2b"),
        start(r22, "mistral-nemo-instruct-2407", max_model_len=32768),
        start(r22, "llama-3.2-1b-instruct", "u60", max_model_len=65536, gpu_memory_utilization=0.6),
        start(r26, "glm-4.7-flash", max_model_len=16384),
    ]


def one_gpu():
    """The second batch: one GPU, three releases."""
    r20, r22, r26 = "0.20.0", "0.22.1", "0.26.0"
    return [
        start(r22, "llama-3.1-8b"),
        start(r22, "qwen3-30b-a3b", max_model_len=32768),
        start(r20, "llama-3.1-8b"),
        start(r20, "qwen3-30b-a3b", max_model_len=32768),
        start(r26, "llama-3.1-8b"),
        start(r26, "qwen3-30b-a3b", max_model_len=32768),
        start(r22, "deepseek-v2-lite", max_model_len=32768),
        start(r20, "deepseek-v2-lite", max_model_len=32768),
        start(r20, "qwen3-8b"),
        start(r22, "llama-3.1-8b", "llm", context="llm"),
        start(r20, "mistral-7b-v0.1", max_model_len=32768),
        start(r20, "gemma-2-9b", max_model_len=4096),
        start(r26, "qwen3-8b", "fp8", kv_cache_dtype="fp8", max_model_len=32768),
        start(r20, "phi-3-mini-128k-instruct", "u95", max_model_len=131072, gpu_memory_utilization=0.95),
        start(r22, "nemotron-h-8b-base-8k", "u80", gpu_memory_utilization=0.8),
        start(r20, "llama-2-7b", "eager", max_model_len=4096, enforce_eager=True),
        start(r26, "glm-4.7-flash", max_model_len=16384),
        start(r20, "mistral-nemo-instruct-2407", max_model_len=32768),
    ]


def four_h100s():
    """The third batch, for four GPUs of one host (four H200s ran it): tensor parallel 4 first (while all four
    GPUs are free), then 2, then one GPU."""
    r22, r26 = "0.22.1", "0.26.0"
    return [
        start(r26, "llama-3.1-70b", "tp4", tensor_parallel_size=4, max_model_len=32768),
        # 2 KV heads over 4 ranks: vLLM replicates each head on two ranks
        start(r26, "qwen2.5-1.5b", "tp4-fp8", tensor_parallel_size=4, kv_cache_dtype="fp8", max_model_len=32768),
        start(r22, "deepseek-v2-lite", "tp4", tensor_parallel_size=4, max_model_len=32768),
        start(r22, "qwen2.5-1.5b", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(r26, "mixtral-8x7b-v0.1", "tp2", tensor_parallel_size=2),
        start(r26, "gemma-3-27b-it", max_model_len=8192),
        start(r26, "qwen3-8b", "fp8", kv_cache_dtype="fp8", max_model_len=32768),
        start(r26, "glm-4.7-flash", "u70", max_model_len=16384, gpu_memory_utilization=0.7),
        start(r22, "nemotron-h-8b-base-8k", "u80", gpu_memory_utilization=0.8),
        start(r26, "falcon-7b", max_model_len=2048),
    ]


def two_h100s():
    """The fourth batch, on two of the four GPUs (the other two serve and verify): TP 2, then one GPU."""
    r22, r26 = "0.22.1", "0.26.0"
    return [
        start(r26, "qwen3-30b-a3b", "tp2-fp8", tensor_parallel_size=2, kv_cache_dtype="fp8", max_model_len=32768),
        start(r22, "llama-3.1-8b", "tp2-u80", tensor_parallel_size=2, gpu_memory_utilization=0.8),
        start(r26, "deepseek-v2-lite", "tp2-llm", context="llm", tensor_parallel_size=2, max_model_len=32768),
        start(r26, "phi-3-mini-128k-instruct", "u95", max_model_len=131072, gpu_memory_utilization=0.95),
        start(r26, "gpt-oss-20b", max_model_len=32768),
        start(r22, "mistral-nemo-instruct-2407", max_model_len=32768),
        start(r26, "llama-2-7b", "eager", max_model_len=4096, enforce_eager=True),
        start(r26, "qwen2.5-1.5b", "llm-bs32", context="llm", block_size=32, max_num_seqs=128),
        start(r26, "minicpm3-4b", max_model_len=16384),
        start(r26, "gemma-2-9b", "seqs32-u85", max_model_len=4096, max_num_seqs=32, gpu_memory_utilization=0.85),
    ]


def one_h200():
    """The fifth batch, one H200: fewer sequences (which of the V2 runner's forward and sampler peaks) and
    architectures not yet started."""
    r26 = "0.26.0"
    return [
        start(r26, "qwen3-8b", "seqs128", max_num_seqs=128),
        start(r26, "qwen3-8b", "fp8-seqs128", max_num_seqs=128, kv_cache_dtype="fp8"),
        start(r26, "llama-3.1-8b", "fp8-seqs64", max_model_len=4096, max_num_seqs=64, kv_cache_dtype="fp8"),
        start(r26, "qwen2.5-7b-instruct", "seqs128", max_num_seqs=128),
        start(r26, "gemma-3-1b-it", max_model_len=32768),
        start(r26, "stablelm-3b-4e1t", max_model_len=4096),
        start(r26, "gemma-7b", max_model_len=8192),
        start(r26, "mimo-7b-base", max_model_len=32768),
    ]


def architectures():
    """The sixth batch, one H200: architectures not yet started (sliding+full OLMo 3, Phi MoE, Cohere, a Mamba
    MoE hybrid, a gated-delta-net MoE hybrid) and multimodal models served text-only, where vLLM builds no
    vision tower; then the KV dtype not yet started."""
    r26 = "0.26.0"
    return [
        start(r26, "qwen3.5-35b-a3b", "text", language_model_only=True, max_model_len=32768),
        start(r26, "gemma-3-27b-it", "text", language_model_only=True, max_model_len=8192),
        start(r26, "olmo-3.1-32b-instruct", max_model_len=32768),
        start(r26, "phi-3.5-moe-instruct", max_model_len=8192),
        start(r26, "c4ai-command-r-v01", max_model_len=8192),
        start(r26, "qwen3-vl-2b-instruct", "text", language_model_only=True, max_model_len=32768),
        start(r26, "nemotron-3-nano-30b-a3b", max_model_len=32768),
        start(r26, "llama-3.1-8b", "fp8e5m2", kv_cache_dtype="fp8_e5m2"),
        start(r26, "qwen3.5-35b-a3b", "text-fp8", language_model_only=True, kv_cache_dtype="fp8", max_model_len=32768),
        start(r26, "olmo-3.1-32b-instruct", "u60", max_model_len=65536, gpu_memory_utilization=0.6),
    ]


def checkpoints():
    """The seventh batch, one H200: quantized checkpoints (fp8 blocks; compressed-tensors fp8 per channel on
    Llama 4's chunked attention, served text-only), and Nemotron-3-Nano's profiling peak at half the tokens and
    without torch.compile."""
    r26 = "0.26.0"
    return [
        start(r26, "llama-4-scout-17b-16e-instruct-fp8-dynamic", "text", language_model_only=True,
              max_model_len=32768),
        start(r26, "qwen3-30b-a3b-fp8", max_model_len=32768),
        start(r26, "qwen3-8b-fp8", "ckpt", max_model_len=32768),
        start(r26, "nemotron-3-nano-30b-a3b", "bt4096", max_model_len=32768, max_num_batched_tokens=4096),
        start(r26, "nemotron-3-nano-30b-a3b", "compile0", max_model_len=32768, compilation_config={"mode": 0}),
    ]


def compile_cache():
    """The eighth batch, one H200 (no H100 came): each start twice, the second loading the first's compiled
    graph from vLLM's compile cache, so it runs no compile-time autotuning."""
    r26 = "0.26.0"
    return [
        start(r26, "llama-3.1-8b", "cold"),
        start(r26, "llama-3.1-8b", "warm"),
        start(r26, "qwen3-8b", "cold", max_model_len=32768),
        start(r26, "qwen3-8b", "warm", max_model_len=32768),
    ]


def integer_checkpoints():
    """The ninth batch, one GPU: GPTQ and AWQ checkpoints (Marlin kernels on Hopper): AWQ int4 with zero
    points, GPTQ int8 symmetric, and GPTQ int4 experts."""
    r26 = "0.26.0"
    return [
        start(r26, "qwen3-8b-awq"),
        start(r26, "qwen3-8b-gptq-int8"),
        start(r26, "qwen3-30b-a3b-gptq-int4", max_model_len=32768),
        start(r26, "qwen3-30b-a3b-awq", max_model_len=32768),
        # as first started: without modules_in_block_to_quantize, which a dummy-weights start needs (vLLM reads
        # the quantized modules from the checkpoint's safetensors otherwise)
        start(r26, "qwen3-8b-gptq-int8-unlisted"),
        start(r26, "qwen3-30b-a3b-gptq-int4-unlisted", max_model_len=32768),
    ]


def one_h100():
    """The tenth batch, one H100: the integer checkpoints and the models whose weights the allocator's segment
    ends moved (MiniCPM3, Falcon, gpt-oss) on the other GPU."""
    r26 = "0.26.0"
    return [
        start(r26, "qwen3-8b-awq"),
        start(r26, "minicpm3-4b", max_model_len=16384),
        start(r26, "qwen3-8b-gptq-int8"),
        start(r26, "falcon-7b", max_model_len=2048),
        start(r26, "gpt-oss-20b", max_model_len=32768),
    ]


PANEL_RELEASES = ("0.21.0", "0.23.0", "0.24.0", "0.25.1")


def release_panel(release: str) -> list[dict]:
    """One release's common panel: a dense GQA model, Qwen3-8B, an MoE, an MLA model, a sliding-window model and
    an fp8-KV start, at the settings the earlier releases' H100 starts used."""
    return [
        start(release, "llama-3.1-8b"),
        start(release, "qwen3-8b"),
        start(release, "qwen3-30b-a3b", max_model_len=32768),
        start(release, "deepseek-v2-lite", max_model_len=32768),
        start(release, "gemma-2-9b"),
        start(release, "llama-3.1-8b", "fp8", kv_cache_dtype="fp8"),
    ]


def panels(releases) -> list[dict]:
    """The common panel on each of the releases, in turn."""
    return [row for release in releases for row in release_panel(release)]


def release_panels():
    """The eleventh batch, on H100s: the common panel on every torch-2.11 release not yet started (0.21.0,
    0.23.0, 0.24.0, 0.25.1), so that release ranges are drawn where starts show a change."""
    return panels(PANEL_RELEASES)


TORCH_STAGE_RELEASES = ("0.33.0", "0.27.1", "0.30.0")


def torch_stage_panels():
    """The twelfth batch: the common panel on the releases that pin a newer torch than 2.11 (each started with its
    own torch, triton, torchvision and NCCL), newest first."""
    return panels(TORCH_STAGE_RELEASES)


GAP_RELEASES = ("0.20.0", "0.26.0", "0.25.0", "0.22.0")


def panel_gaps():
    """The thirteenth batch, where the machine has time after the twelfth: the whole panel on the torch-2.11
    releases whose panel is incomplete on one GPU kind (0.20.0, 0.26.0) or never started (0.25.0, 0.22.0); starts
    already in the corpus for the machine's GPU kind are dropped before the run."""
    return panels(GAP_RELEASES)


PATCH_RELEASES = ("0.20.1", "0.20.2")


def panels_020_patches():
    """The common panel on 0.20.1 and 0.20.2, never started (their rules are 0.20.0's, started on H100s only): both
    are torch-2.11 releases the GPU machines run as they are, at the settings of 0.25.0's one-GPU panel."""
    return panels(PATCH_RELEASES)


TORCH_213_RELEASES = ("0.32.0", "0.31.0")


def panels_032_031():
    """The common panel on 0.32.0 and 0.31.0, never started so far (kvsize took their rules from a neighbour): both
    pin torch 2.13.0, and each runs on one GPU with its own vLLM over torch 2.13.0, beside 0.33.0; newest first, at
    the settings of 0.33.0's one-GPU panel."""
    return panels(TORCH_213_RELEASES)


def tp2_033():
    """Tensor parallel 2 on the default release, 0.33.0 (issue 49: its TP terms were 0.19's prior): dense, MoE,
    a 70B with fp8 KV, MLA, sliding windows and gpt-oss, bf16 and fp8 KV mixed; most useful first."""
    r = "0.33.0"
    return [
        start(r, "llama-3.1-8b", "tp2", tensor_parallel_size=2),
        start(r, "qwen3-30b-a3b", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(r, "llama-3.1-70b", "tp2-fp8", tensor_parallel_size=2, kv_cache_dtype="fp8", max_model_len=32768),
        start(r, "qwen3-8b", "tp2-fp8", tensor_parallel_size=2, kv_cache_dtype="fp8"),
        start(r, "mixtral-8x7b-v0.1", "tp2", tensor_parallel_size=2),
        start(r, "gemma-2-9b", "tp2", tensor_parallel_size=2),
        start(r, "gpt-oss-20b", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(r, "deepseek-v2-lite", "tp2", tensor_parallel_size=2, max_model_len=32768),
    ]


TORCH_213_OLDER_RELEASES = ("0.29.0", "0.28.0", "0.27.0")


def panels_029_027():
    """The common panel on 0.29.0, 0.28.0 and 0.27.0, never started (kvsize takes their rules from 0.27.1 and
    0.30.0, the sub-range's started releases): all three pin torch 2.13.0 and run on its overlay, as 0.31.0 and
    0.32.0 did; 0.29.0 first, where the V2 runner took every model and began subtracting its graph estimate."""
    return panels(TORCH_213_OLDER_RELEASES)


def tp4_033():
    """Tensor parallel 4 on the default release, 0.33.0, on four GPUs of one host (issue 49: TP 4 was started only
    on 0.22.1 and 0.26.0): a 70B, an MoE, gpt-oss-120b's MXFP4 experts, a small dense model (where the per-GPU
    terms weigh most), Mixtral with fp8 KV, MLA, sliding windows and Qwen3-8B with fp8 KV; most useful first."""
    r = "0.33.0"
    return [
        start(r, "llama-3.1-70b", "tp4", tensor_parallel_size=4, max_model_len=32768),
        start(r, "qwen3-30b-a3b", "tp4", tensor_parallel_size=4, max_model_len=32768),
        start(r, "gpt-oss-120b", "tp4", tensor_parallel_size=4, max_model_len=131072),
        start(r, "llama-3.1-8b", "tp4", tensor_parallel_size=4),
        start(r, "mixtral-8x7b-v0.1", "tp4-fp8", tensor_parallel_size=4, kv_cache_dtype="fp8"),
        start(r, "deepseek-v2-lite", "tp4", tensor_parallel_size=4, max_model_len=32768),
        start(r, "gemma-2-9b", "tp4", tensor_parallel_size=4),
        start(r, "qwen3-8b", "tp4-fp8", tensor_parallel_size=4, kv_cache_dtype="fp8"),
    ]


def tp_032_027():
    """Tensor parallel 2 and 4 on the torch-2.13 releases (0.32.0 down to 0.27.0), none started at TP so far
    (issue 49: their TP terms are taken from 0.33.0's starts): each on its vLLM overlay over torch 2.13.0, a dense
    model, an MoE, a 70B and MLA spread over the releases; TP 4 first, since it needs the whole host free."""
    return [
        start("0.32.0", "llama-3.1-70b", "tp4", tensor_parallel_size=4, max_model_len=32768),
        start("0.29.0", "llama-3.1-8b", "tp4", tensor_parallel_size=4),
        start("0.27.0", "qwen3-30b-a3b", "tp4", tensor_parallel_size=4, max_model_len=32768),
        start("0.32.0", "llama-3.1-8b", "tp2", tensor_parallel_size=2),
        start("0.31.0", "qwen3-30b-a3b", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start("0.29.0", "qwen3-30b-a3b", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start("0.28.0", "llama-3.1-8b", "tp2", tensor_parallel_size=2),
        start("0.27.0", "llama-3.1-8b", "tp2", tensor_parallel_size=2),
        start("0.31.0", "llama-3.1-70b", "tp2-fp8", tensor_parallel_size=2, kv_cache_dtype="fp8", max_model_len=32768),
        start("0.29.0", "deepseek-v2-lite", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start("0.32.0", "gemma-2-9b", "tp2", tensor_parallel_size=2),
        start("0.28.0", "qwen3-8b", "tp2-fp8", tensor_parallel_size=2, kv_cache_dtype="fp8"),
    ]


def tp_030_0271():
    """Tensor parallel 2 on 0.30.0 and 0.27.1, the last torch-2.13 releases never started at TP (issue 49 §1: every
    other release from 0.27.0 to 0.33.0 has TP 2 starts on H200), on two H200s: 0.27.1 from its own torch-2.13 stage,
    0.30.0 as a vLLM overlay on it. A dense model, an MoE and MLA on each, and a 70B and Qwen3-8B with fp8 KV on
    0.30.0; one of each release first, in case the machine is taken back."""
    a, b = "0.30.0", "0.27.1"
    return [
        start(a, "llama-3.1-8b", "tp2", tensor_parallel_size=2),
        start(b, "llama-3.1-8b", "tp2", tensor_parallel_size=2),
        start(a, "qwen3-30b-a3b", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(b, "qwen3-30b-a3b", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(a, "deepseek-v2-lite", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(b, "deepseek-v2-lite", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(a, "llama-3.1-70b", "tp2-fp8", tensor_parallel_size=2, kv_cache_dtype="fp8", max_model_len=32768),
        start(a, "qwen3-8b", "tp2-fp8", tensor_parallel_size=2, kv_cache_dtype="fp8"),
    ]


def small_gpu_defaults():
    """The batch defaults vLLM gives a GPU under 70 GiB (2,048 batched tokens, 256 sequences; arg_utils.py
    get_batch_defaults), set by hand on an H200: the 0.27-0.30 non-torch term that grows with the vocabulary was
    fitted on starts at 8,192 tokens and 1,024 sequences only, and on a 24 GB GPU it is a third of the pool (issue
    49: small GPUs). 0.31.0 beside them, where vLLM guards the profile run's pinned segments."""
    small = dict(max_num_seqs=256, max_num_batched_tokens=2048)
    return [
        start("0.29.0", "qwen3-8b", "small-defaults", **small),
        start("0.29.0", "llama-3.1-8b", "small-defaults", **small),
        start("0.31.0", "qwen3-8b", "small-defaults", **small),
    ]


def pp2():
    """Pipeline parallel 2, never started so far: kvsize's PP terms are vLLM 0.19's prior, and the V2 sampler's
    penalty state is held on the last stage only (read from 0.27-0.33's source, issue 49 §7). A dense model on
    0.33.0 (the default release) and on two torch-2.13 releases, a vocabulary of 152K beside 128K, and an MoE."""
    pp = dict(pipeline_parallel_size=2)
    return [
        start("0.33.0", "llama-3.1-8b", "pp2", **pp),
        start("0.33.0", "qwen3-8b", "pp2", **pp),
        start("0.33.0", "qwen3-30b-a3b", "pp2", max_model_len=32768, **pp),
        start("0.29.0", "qwen3-8b", "pp2", **pp),
        start("0.31.0", "llama-3.1-8b", "pp2", **pp),
    ]


def pp_vocab():
    """Pipeline parallel on the classes the stage-vocabulary scan places otherwise (profiles/engines/vllm-pp-vocab):
    Mixtral (embedding and lm_head on every stage), Gemma-2 (the embedding on every stage, its tied head reading it),
    gpt-oss-20b (both, MXFP4 experts), DeepSeek-V2-Lite (MLA; first and last), and PP 4 and TP 2 x PP 2 of a dense
    model, on 0.33.0; PP 4 and TP 2 x PP 2 need the whole 4-GPU host."""
    return [
        start("0.33.0", "qwen3-8b", "pp4", pipeline_parallel_size=4),
        start("0.33.0", "llama-3.1-8b", "tp2-pp2", tensor_parallel_size=2, pipeline_parallel_size=2),
        start("0.33.0", "mixtral-8x7b-v0.1", "pp2", pipeline_parallel_size=2),
        start("0.33.0", "gemma-2-9b", "pp2", pipeline_parallel_size=2),
        start("0.33.0", "gpt-oss-20b", "pp2", pipeline_parallel_size=2),
        start("0.33.0", "deepseek-v2-lite", "pp2", pipeline_parallel_size=2, max_model_len=32768),
    ]


def mla_graphs_033():
    """The CUDA-graph estimate of FLASH_ATTN_MLA (a 16-bit MLA cache on Hopper) under 0.33.0's Model Runner V2, whose
    FULL graphs it extrapolates from two captured samples (issue 49: GLM-4.7-Flash's server printed 3.24 GiB against
    kvsize's 2.36, DeepSeek-V2-Lite's 1.53 against 1.64): the two MLA models that fit one GPU, of 47 x 20 and 27 x 16
    layers x heads, each at the default 1,024 sequences and fewer (the FULL graphs' count and largest batch), and
    both at TP 2 (10 and 8 heads a rank). The staged engine prints profile_cudagraph_memory's samples
    (measure/graph_samples.py); its figures are unchanged."""
    r = "0.33.0"
    return [
        start(r, "glm-4.7-flash", max_model_len=32768),
        start(r, "deepseek-v2-lite", "s1024", max_model_len=32768),
        start(r, "glm-4.7-flash", "s256", max_model_len=32768, max_num_seqs=256),
        start(r, "deepseek-v2-lite", "s256", max_model_len=32768, max_num_seqs=256),
        start(r, "glm-4.7-flash", "s64", max_model_len=32768, max_num_seqs=64),
        start(r, "deepseek-v2-lite", "s64", max_model_len=32768, max_num_seqs=64),
        start(r, "glm-4.7-flash", "tp2", tensor_parallel_size=2, max_model_len=32768),
        start(r, "deepseek-v2-lite", "tp2-probe", tensor_parallel_size=2, max_model_len=32768),
    ]


def mla_graphs_check_033():
    """The FLASH_ATTN_MLA graph model of 0.33.0's V2 runner (fitted on mla-graphs-0.33) judged at sequence counts it
    was not fitted on, on one H200: GLM-4.7-Flash at 512 (the same FULL batches as 1,024, where its warm-ups' block
    was split) and 128, DeepSeek-V2-Lite at 512 and 128. The staged engine prints its estimate's parts as before."""
    r = "0.33.0"
    return [
        start(r, "glm-4.7-flash", "s512", max_model_len=32768, max_num_seqs=512),
        start(r, "deepseek-v2-lite", "s512", max_model_len=32768, max_num_seqs=512),
        start(r, "glm-4.7-flash", "s128", max_model_len=32768, max_num_seqs=128),
        start(r, "deepseek-v2-lite", "s128", max_model_len=32768, max_num_seqs=128),
    ]

if __name__ == "__main__":
    plan = {"four-gpus": four_gpus, "one-gpu": one_gpu, "four-h100s": four_h100s, "two-h100s": two_h100s,
            "one-h200": one_h200, "architectures": architectures,
            "checkpoints": checkpoints, "compile-cache": compile_cache,
            "integer-checkpoints": integer_checkpoints, "one-h100": one_h100,
            "release-panels": release_panels, "torch-stage-panels": torch_stage_panels,
            "panel-gaps": panel_gaps, "tp2-0.33": tp2_033, "tp4-0.33": tp4_033, "panels-0.29-0.27": panels_029_027,
            "panels-0.32-0.31": panels_032_031, "tp-0.32-0.27": tp_032_027, "tp-0.30-0.27.1": tp_030_0271,
            "small-gpu-defaults": small_gpu_defaults, "pp2": pp2, "pp-vocab": pp_vocab,
            "mla-graphs-0.33": mla_graphs_033, "mla-graphs-check-0.33": mla_graphs_check_033,
            "panels-0.20-patches": panels_020_patches}[sys.argv[1]]()
    plan = [s for s in plan if (CONFIGS / Path(s["config"]).name).exists()]
    json.dump(plan, sys.stdout, indent=1)
    print()

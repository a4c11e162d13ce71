"""Write the plan of real SGLang starts for tests/fixtures/sglang-starts (a JSON list), or the srun.sh command
lines that run it on a machine's GPUs.

usage: python scripts/sglang_corpus_plan.py first-h100s > plan.json      (or second, architectures, variants, first-0.5.23,
       hybrids-0.5.23, panels-0.5.16-0.5.17, tp2-0.5.23, panel-0.5.18)
       python scripts/sglang_corpus_plan.py first-h100s --lanes 2   (one srun.sh line per lane, TP starts last)
Every start is a dict of SGLang ServerArgs fields on a config in tests/fixtures/vllm-starts/configs/ (the same
configs the vLLM starts use), with the tool's defaults (dummy weights, triton attention, CUDA graphs off,
mem_fraction_static as a start with CUDA graphs would pick it) unless the start names another value.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

CONFIGS = Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "vllm-starts" / "configs"


def start(version, model, tag="", **args):
    args.setdefault("context_length", 8192)
    variant = f"-{tag}" if tag else ""
    return {"id": f"sglang-{version}-{model}{variant}", "config": f"tests/fixtures/vllm-starts/configs/{model}.json",
            "args": args, "version": version}


def core_layouts(v: str) -> list[dict]:
    """Dense GQA, Qwen3, MoE, MLA and sliding window at the settings every release's first batch starts them with."""
    return [
        start(v, "llama-3.1-8b"),
        start(v, "qwen3-8b"),
        start(v, "qwen3-30b-a3b", context_length=32768),
        start(v, "deepseek-v2-lite", context_length=32768),
        start(v, "gemma-2-9b"),
    ]


def first_h100s():
    """The first SGLang batch, on H100s: each layout (dense GQA and MHA, MoE, MLA, sliding window, Mamba
    hybrid), the KV dtype, page sizes, the fraction by hand and by default, context 4K to 128K, chunked prefill
    and running requests, CUDA graphs on and off, and TP 2."""
    v = "0.5.14"
    return [
        *core_layouts(v),
        start(v, "llama-2-7b", context_length=4096),
        start(v, "nemotron-h-8b-base-8k"),
        start(v, "llama-3.1-8b", "fp8", kv_cache_dtype="fp8_e4m3"),
        start(v, "llama-3.1-8b", "page16", page_size=16),
        start(v, "llama-3.1-8b", "page64-128k", page_size=64, context_length=131072),
        start(v, "llama-3.1-8b", "mfs0.8", mem_fraction_static=0.8),
        start(v, "llama-3.1-8b", "4k-cp4096-mrr64", context_length=4096, chunked_prefill_size=4096,
              max_running_requests=64),
        start(v, "qwen3-30b-a3b", "fp8-page64", kv_cache_dtype="fp8_e4m3", page_size=64, context_length=32768),
        start(v, "deepseek-v2-lite", "fp8", kv_cache_dtype="fp8_e4m3", context_length=32768),
        start(v, "mistral-7b-v0.1", context_length=32768),
        start(v, "llama-3.1-8b", "graphs", disable_cuda_graph=False),
        start(v, "llama-3.1-8b", "tp2", tp_size=2, context_length=16384),
        start(v, "qwen3-30b-a3b", "tp2", tp_size=2, context_length=32768),
    ]


def second():
    """The second SGLang batch: the core layouts again on the GPU kind the first batch lacked, the fa3 attention
    backend (SGLang's default on Hopper) with the Mamba hybrid that needs it and CUDA graphs on, the next release
    of the 0.5.12-0.5.23 range, and TP 2 and 4."""
    v, v16 = "0.5.14", "0.5.16"
    fa3 = {"attention_backend": "fa3"}
    return [
        start(v, "llama-3.1-8b"),
        start(v, "qwen3-30b-a3b", context_length=32768),
        start(v, "deepseek-v2-lite", context_length=32768),
        start(v, "gemma-2-9b"),
        start(v, "llama-3.1-8b", "fp8", kv_cache_dtype="fp8_e4m3"),
        start(v, "llama-3.1-8b", "fa3", **fa3),
        start(v, "qwen3-30b-a3b", "fa3", context_length=32768, **fa3),
        start(v, "deepseek-v2-lite", "fa3", context_length=32768, **fa3),
        start(v, "nemotron-h-8b-base-8k", "fa3", **fa3),
        start(v, "gemma-2-9b", "fa3", **fa3),
        start(v, "llama-3.1-8b", "fa3-graphs", disable_cuda_graph=False, **fa3),
        start(v16, "llama-3.1-8b"),
        start(v16, "qwen3-30b-a3b", context_length=32768),
        start(v16, "deepseek-v2-lite", context_length=32768),
        start(v16, "gemma-2-9b"),
        start(v16, "llama-3.1-8b", "fp8-page64", kv_cache_dtype="fp8_e4m3", page_size=64),
        start(v, "qwen3-30b-a3b", "tp2", tp_size=2, context_length=32768),
        start(v, "llama-3.1-8b", "tp4", tp_size=4, context_length=32768),
        start(v, "llama-3.1-70b", "tp4", tp_size=4, context_length=32768),
    ]


def architectures():
    """The second batch's extra lane, where a GPU waited for its stage: more architectures on one GPU (a large
    MoE, a second MLA MoE, dense models with more layers or a wider vocabulary)."""
    v = "0.5.14"
    return [
        start(v, "glm-4.7-flash", context_length=32768),
        start(v, "mixtral-8x7b-v0.1", context_length=32768),
        start(v, "olmo-3.1-32b-instruct"),
        start(v, "phi-3.5-moe-instruct", context_length=32768),
        start(v, "mistral-nemo-instruct-2407", context_length=32768),
        start(v, "qwen2.5-7b-instruct", context_length=32768),
    ]


def variants():
    """A last lane of the second batch on one GPU: page 16 on an MoE, 128K on MLA, fp8 on sliding windows,
    chunked prefill with running requests set by hand, an MHA model and a small model with tied embeddings."""
    v = "0.5.14"
    return [
        start(v, "qwen3-30b-a3b", "page16", page_size=16, context_length=32768),
        start(v, "deepseek-v2-lite", "128k", context_length=131072),
        start(v, "gemma-2-9b", "fp8", kv_cache_dtype="fp8_e4m3"),
        start(v, "llama-3.1-8b", "cp2048-mrr256", chunked_prefill_size=2048, max_running_requests=256),
        start(v, "phi-2", context_length=2048),
        start(v, "qwen2.5-1.5b", context_length=32768),
    ]


def first_0523():
    """The first starts of SGLang 0.5.23, the newest release, which pins torch 2.14.1 (not the 2.11.0 the 0.5.14
    batches ran on): the core layouts again (dense GQA, MoE, MLA, sliding window, Mamba hybrid), the fp8_e4m3 KV
    dtype on dense and MLA, the fa3 attention backend (SGLang's own choice on Hopper) with and without CUDA graphs,
    and TP 2, each also run by 0.5.14 in the earlier batches so that the two releases can be held side by side."""
    v = "0.5.23"
    fa3 = {"attention_backend": "fa3"}
    return [
        *core_layouts(v),
        start(v, "nemotron-h-8b-base-8k"),
        start(v, "llama-3.1-8b", "fp8", kv_cache_dtype="fp8_e4m3"),
        start(v, "deepseek-v2-lite", "fp8", kv_cache_dtype="fp8_e4m3", context_length=32768),
        start(v, "llama-3.1-8b", "fa3", **fa3),
        start(v, "deepseek-v2-lite", "fa3", context_length=32768, **fa3),
        start(v, "nemotron-h-8b-base-8k", "fa3", **fa3),
        start(v, "llama-3.1-8b", "fa3-graphs", disable_cuda_graph=False, **fa3),
        start(v, "qwen3-30b-a3b", "tp2", tp_size=2, context_length=32768),
    ]


def hybrids_0523():
    """SGLang 0.5.23's Mamba state pool (its slots from mamba_full_memory_ratio, the running requests they cap) on
    hybrid layouts beyond Nemotron-H-8B's: Mamba-2 with routed experts (Nemotron-3-Nano) and gated delta net with
    routed experts (Qwen3.5-35B-A3B), one GPU each."""
    v = "0.5.23"
    return [
        start(v, "nemotron-3-nano-30b-a3b", context_length=32768),
        start(v, "qwen3.5-35b-a3b", context_length=32768),
    ]


def tp2_0523():
    """SGLang 0.5.23 at TP 2 beside first-0.5.23's Qwen3-30B-A3B: a dense model (0.5.14 ran it at TP 2) and an MLA
    model, whose latent cache every rank holds whole, on two GPUs."""
    v = "0.5.23"
    return [
        start(v, "llama-3.1-8b", "tp2", tp_size=2, context_length=16384),
        start(v, "deepseek-v2-lite", "tp2", tp_size=2, context_length=32768),
    ]


def panels_0516_0517():
    """SGLang 0.5.16 and 0.5.17, both on the image's torch 2.11 and on either side of the Mamba pool's padding slot
    (0.5.17 counts it inside mamba_full_memory_ratio's share, 0.5.16 allocates it beside): the core layouts and
    Nemotron-H under flashinfer attention (both releases refuse triton for it in server_args.py; 0.5.23 took it)."""
    out = []
    for v in ("0.5.16", "0.5.17"):
        out += [*core_layouts(v), start(v, "nemotron-h-8b-base-8k", "flashinfer", attention_backend="flashinfer")]
    return out


def panel_0518():
    """SGLang 0.5.18, the first release that pins torch 2.13.0 (on the vLLM 0.27.1 stage's torch, not the image's
    2.11): the core layouts, Nemotron-H under flashinfer attention as 0.5.16 and 0.5.17 ran it, and a dense model at
    TP 2, so that 0.5.18 stands beside its started neighbours 0.5.17 and 0.5.23."""
    v = "0.5.18"
    return [*core_layouts(v), start(v, "nemotron-h-8b-base-8k", "flashinfer", attention_backend="flashinfer"),
            start(v, "llama-3.1-8b", "tp2", tp_size=2, context_length=16384)]


def lanes(plan: list[dict], n: int) -> list[str]:
    """srun.sh command lines: one-GPU starts dealt over n lanes (one GPU each), then the TP starts on all."""
    single = [s for s in plan if s["args"].get("tp_size", 1) == 1]
    multi = [s for s in plan if s["args"].get("tp_size", 1) > 1]

    def words(s):
        model_dir = f"models/{Path(s['config']).stem}"
        return [s["id"], model_dir] + [w for k, val in s["args"].items() for w in (f"--{k}", repr(val) if
                                                                               isinstance(val, bool) else str(val))]

    def line(starts):
        ws = []
        for s in starts:
            ws += (["--"] if ws else []) + words(s)
        return " ".join(shlex.quote(w) for w in ws)

    out = [line(single[i::n]) for i in range(n) if single[i::n]]
    if multi:
        out.append(line(multi))
    return out


if __name__ == "__main__":
    plan = {"first-h100s": first_h100s, "second": second, "architectures": architectures,
            "variants": variants, "first-0.5.23": first_0523, "hybrids-0.5.23": hybrids_0523,
            "panels-0.5.16-0.5.17": panels_0516_0517, "tp2-0.5.23": tp2_0523, "panel-0.5.18": panel_0518}[sys.argv[1]]()
    plan = [s for s in plan if (CONFIGS / Path(s["config"]).name).exists()]
    if sys.argv[2:3] == ["--lanes"]:
        print("\n".join(lanes(plan, int(sys.argv[3]))))
    else:
        json.dump(plan, sys.stdout, indent=1)
        print()

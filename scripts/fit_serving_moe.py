"""A MoE layer's prompt work, for profiles/serving.json (scripts/fit_serving_terms.py takes both): the host's launch
of its fused-MoE path in a step past the largest CUDA graph, read off the step traces of a prompt alone on the engine,
and the share of the prefill FLOP rate the routed experts' grouped GEMMs reach, fitted on one-request TTFTs of prompts
long enough that the GPU sets their steps.

One model is fitted, Qwen3-30B-A3B (48 MoE layers of 128 experts, 8 a token); every other MoE model measured
(DeepSeek-V2-Lite, Mixtral-8x7B, gpt-oss-20b) judges both terms. A 1,000-token prompt alone past the 512-token graph
spanned 86-109 ms on b35's host (its GEMMs about 20 ms): the launch of its layers, at 1.0 ms a dense layer's
(fit_launch), leaves about 1.2 ms a MoE layer. Prompts of 8,000 and 32,000 tokens run 20-25% longer than the dense
models' prefill rate gives their FLOPs: the Triton fused-MoE kernel's grouped GEMMs, a few hundred tokens an expert,
run at about half cuBLAS's dense rate.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sizing.evidence.serving import predict_point, served_settings  # noqa: E402
from measure.steps import lone_prompt_rows, traced_servers  # noqa: E402

MOE_LAUNCH_TERM, EXPERT_SHARE_TERM = "eager_moe_layer_launch_s", "moe_expert_gemm_share"
MOE_PROMPT_OFF = {MOE_LAUNCH_TERM: 0.0, EXPERT_SHARE_TERM: 1.0}
# the traced servers whose prompts alone past the graph the launch is read from (b35's Qwen3-30B-A3B: 1,000 tokens)
MOE_LAUNCH_SERVERS = ("b35-qwen3moe",)
HOST_BOUND = 2.0  # a step is the host's launch where it lasted this many times its simulated GPU part or more
# the one-request points the experts' share is fitted on: Qwen3-30B-A3B's servers, prompts this long or longer (their
# prompt steps' GPU part outlasts the launch several times)
EXPERT_SHARE_SERVERS = ("qwen3moe-bf16", "b7-qwen3moe", "b7-qwen3moe-cg2048", "b35-qwen3moe")
EXPERT_SHARE_LEAST_TOKENS = 8000
EXPERT_SHARE_GRID = [i / 100 for i in range(20, 101)]


def moe_launch_rows() -> list[dict]:
    """The host-bound prompt steps alone past the largest graph on MOE_LAUNCH_SERVERS (measure/steps.py
    lone_prompt_rows), each with its model's MoE layers."""
    rows = []
    for server in traced_servers():
        if server["tag"] in MOE_LAUNCH_SERVERS:
            rows += [r for r in lone_prompt_rows(server) if r["eager"] and not r["dense"]
                     and r["span_s"] >= HOST_BOUND * r["gpu_s"]]
    return rows


def fit_moe_launch(dense_layer_launch_s: float) -> tuple[float, list[str]]:
    """The launch of a MoE layer past the graph beyond a dense layer's: the median over the host-bound steps of the
    span less `dense_layer_launch_s` a layer, over the model's MoE layers; and the points it was read from."""
    rows = moe_launch_rows()
    per_layer = statistics.median((r["span_s"] - r["layers"] * dense_layer_launch_s) / r["moe_layers"] for r in rows)
    return round(max(per_layer, 0.0), 7), sorted({r["point"] for r in rows})


def expert_share_points(points: list[dict]) -> list[dict]:
    """The one-request closed-loop points the experts' share is fitted on."""
    return [p for p in points if p["server"] in EXPERT_SHARE_SERVERS and p["settings"]["loop"] == "closed"
            and p["settings"]["concurrency"] == 1 and p["settings"]["input_len"] >= EXPERT_SHARE_LEAST_TOKENS]


def fit_expert_share(points: list[dict], terms: dict) -> float:
    """The share of the prefill FLOP rate the routed experts' GEMMs reach, every other term in `terms` fixed: the
    grid value leaving the least squared relative error of the simulated against the measured median TTFT."""
    chosen = expert_share_points(points)

    def error(share: float) -> float:
        trial = {**terms, EXPERT_SHARE_TERM: share}
        return sum((predict_point(served_settings(p), ROOT, terms=trial).ttft_ms[50] / p["measured"]["ttft_p50_ms"]
                    - 1) ** 2 for p in chosen)

    return min(EXPERT_SHARE_GRID, key=error)

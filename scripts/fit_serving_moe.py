"""A MoE layer's prompt work, for profiles/serving.json (scripts/fit_serving_terms.py takes both): the host's launch
of its fused-MoE path in a step past the largest CUDA graph, read off the step traces of prompts alone on the engine,
and the fixed cost each tile of the fused-MoE GEMMs pays, in elements of its K loop, fitted on one-request TTFTs of
prompts long enough that the GPU sets their steps.

One model is fitted, Qwen3-30B-A3B (48 MoE layers of 128 experts, 8 a token, hidden size 2,048 and experts of 768);
every other MoE model measured (DeepSeek-V2-Lite, Mixtral-8x7B, gpt-oss-20b) judges both terms. A 1,000-token prompt
alone past the 512-token graph spanned 86-109 ms on b35's host and 58-63 on b39's (its GEMMs about 20 ms): the launch
of its layers, less 1.0 ms a dense layer's (fit_launch), leaves 0.3-1.2 ms a MoE layer by host. Prompts of 8,000 and
32,000 tokens ran 20-25% longer than the dense models' prefill rate gives their FLOPs, where Mixtral-8x7B's experts
(hidden size 4,096, experts of 14,336) ran near it: a tile's K loop over 768 or 2,048 elements pays its fixed cost
(loading its block's token indices, gathering their rows, scaling and writing its output) more often a FLOP than one
over 4,096 or 14,336.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sizing.evidence.serving import predict_point, served_settings  # noqa: E402
from measure.steps import lone_prompt_rows, traced_servers  # noqa: E402

MOE_LAUNCH_TERM, TILE_K_TERM = "eager_moe_layer_launch_s", "moe_tile_fixed_k"
MOE_PROMPT_OFF = {MOE_LAUNCH_TERM: 0.0, TILE_K_TERM: 0.0}
# the traced servers whose prompts alone past the graph the launch is read from, one vote each (Qwen3-30B-A3B on two
# hosts: b35's 1,000-token prompts, b39's 1,000- and 2,000-token ones)
MOE_LAUNCH_SERVERS = ("b35-qwen3moe", "b39-qwen3moe")
HOST_BOUND = 2.0  # a step is the host's launch where it lasted this many times its simulated GPU part or more
# the one-request points the tiles' fixed cost is fitted on: Qwen3-30B-A3B's servers, prompts this long or longer
# (their prompt steps' GPU part outlasts the launch several times)
TILE_K_SERVERS = ("qwen3moe-bf16", "b7-qwen3moe", "b7-qwen3moe-cg2048", "b35-qwen3moe", "b39-qwen3moe")
TILE_K_LEAST_TOKENS = 8000
TILE_K_GRID = [i * 25.0 for i in range(121)]  # 0-3,000 elements


def moe_launch_rows(terms: dict | None = None) -> list[dict]:
    """The host-bound prompt steps alone past the largest graph on MOE_LAUNCH_SERVERS (measure/steps.py
    lone_prompt_rows, their GPU part simulated with `terms`), each with its server and its model's MoE layers."""
    rows = []
    for server in traced_servers():
        if server["tag"] in MOE_LAUNCH_SERVERS:
            rows += [{**r, "server": server["tag"]} for r in lone_prompt_rows(server, terms)
                     if r["eager"] and not r["dense"] and r["span_s"] >= HOST_BOUND * r["gpu_s"]]
    return rows


def fit_moe_launch(terms: dict) -> tuple[float, list[str]]:
    """The launch of a MoE layer past the graph beyond a dense layer's, the rest of `terms` fixed: over the servers,
    the median of each one's median host-bound step's span less the dense launch a layer, over the model's MoE layers;
    and the points it was read from."""
    rows = moe_launch_rows(terms)
    dense_layer_launch_s = terms["eager_layer_launch_s"]
    votes = {}
    for r in rows:
        votes.setdefault(r["server"], []).append((r["span_s"] - r["layers"] * dense_layer_launch_s) / r["moe_layers"])
    per_layer = statistics.median(statistics.median(v) for v in votes.values())
    return round(max(per_layer, 0.0), 7), sorted({r["point"] for r in rows})


def tile_k_points(points: list[dict]) -> list[dict]:
    """The one-request closed-loop points the tiles' fixed cost is fitted on."""
    return [p for p in points if p["server"] in TILE_K_SERVERS and p["settings"]["loop"] == "closed"
            and p["settings"]["concurrency"] == 1 and p["settings"]["input_len"] >= TILE_K_LEAST_TOKENS]


def fit_tile_k(points: list[dict], terms: dict) -> float:
    """A fused-MoE GEMM tile's fixed cost in elements of its K loop, every other term in `terms` fixed: the grid value
    leaving the least squared relative error of the simulated against the measured median TTFT."""
    chosen = tile_k_points(points)

    def error(k0: float) -> float:
        trial = {**terms, TILE_K_TERM: k0}
        return sum((predict_point(served_settings(p), ROOT, terms=trial).ttft_ms[50] / p["measured"]["ttft_p50_ms"]
                    - 1) ** 2 for p in chosen)

    return min(TILE_K_GRID, key=error)

"""An MLA layer's work beyond a dense layer's, for profiles/serving.json (scripts/fit_serving_terms.py takes all three
terms): the host's launch of its prompt path, past the largest CUDA graph (every kernel from Python) and under it (the
attention launched between the graph's pieces), read off the step traces of prompts alone on the engine; and its
kernels' cost a step, fitted on one model's decode and judged on the other's.

vLLM's MLA prompt path up-projects the cached latent inside the attention op (kv_b_proj), splits keys from values, pads
the values to the keys' head size for FlashAttention's kernel and slices the output back: kernels a dense layer's
attention does not launch, under the graph as well as past it. The traces show it: DeepSeek-V2-Lite's 1,000- and
2,000-token prompts alone past the 512-token graph spanned 49-92 ms on b39's host, where its GEMMs take 11-21 ms and
the dense and MoE launches of its 27 layers give 46; GLM-4.7-Flash's 1,000-token ones 88-119 ms on b40's, against 81.

Each server of an MLA model whose prompts alone ran in a format whose prompt attention is FlashAttention's votes: the
grid value leaving the least squared relative error of its steps' simulated span (the longer of the GPU's part and
the launch, every other term fixed) against the measured one, over its prompts past the graph, or under it; the term
is the median of the votes. A least-squares fit of the span, not of the launch alone: a step the GPU sets says only
that the launch was no longer.

A decode step of an MLA layer runs kernels a dense layer's attention does not: the queries' no-position part through
the absorbed key up-projection (W_UK, a batched GEMM), the rotary part concatenated, the latent written to the cache,
and the attention's output through the absorbed value up-projection (W_UV) before o_proj. One request decoding alone
came 12-15% short of DeepSeek-V2-Lite's measured gap (3.1 ms, 27 layers) and 11-13% of GLM-4.7-Flash's (5.0 ms, 47
layers) without a term for them: about 14 us a layer in both. The cost is fitted on DeepSeek-V2-Lite's one-request
points of prompts up to 4,000 tokens (its KV read small beside the weights), a least-squares fit of the relative error
of the measured median inter-token gap; GLM-4.7-Flash's points, longer prompts and loaded ones judge it.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sizing.evidence.serving import point_replica  # noqa: E402
from measure.steps import FLASH_KV_CACHE_DTYPES, lone_prompt_rows, server_settings, traced_servers  # noqa: E402

EAGER_MLA_TERM, PIECEWISE_MLA_TERM = "eager_mla_layer_launch_s", "piecewise_mla_layer_launch_s"
MLA_LAYER_TERM = "mla_layer_step_overhead_s"
MLA_LAUNCH_OFF = {EAGER_MLA_TERM: 0.0, PIECEWISE_MLA_TERM: 0.0}
MLA_OFF = {**MLA_LAUNCH_OFF, MLA_LAYER_TERM: 0.0}
MLA_LAYER_MODELS = ("deepseek-v2-lite",)  # the model whose decode the cost is fitted on; GLM-4.7-Flash judges it
MLA_LAYER_MOST_TOKENS = 4000
MLA_LAUNCH_GRID = [i * 1e-5 for i in range(301)]  # 0-3 ms a layer, 10 us apart


def mla_launch_rows(terms: dict) -> dict[str, list[dict]]:
    """Per traced server of an MLA model in a FlashAttention-family format, its prompts alone (measure/steps.py
    lone_prompt_rows, their GPU part simulated with `terms`)."""
    rows = {}
    for server in traced_servers():
        if server_settings(server)["kv_cache_dtype"] not in FLASH_KV_CACHE_DTYPES:
            continue
        part = [r for r in lone_prompt_rows(server, terms) if r["mla_layers"]]
        if part:
            rows[server["tag"]] = part
    return rows


def server_vote(rows: list[dict]) -> float:
    """The MLA launch a layer leaving the least squared relative error of the rows' simulated spans (each row's
    launch simulated without the MLA terms)."""
    def error(per_layer: float) -> float:
        return sum((max(r["gpu_s"], r["launch_s"] + r["mla_layers"] * per_layer) / r["span_s"] - 1) ** 2
                   for r in rows)

    return min(MLA_LAUNCH_GRID, key=error)


def fit_mla_launch(terms: dict) -> tuple[dict[str, float], dict[str, dict[str, float]], list[str]]:
    """Both MLA launch terms, every other term in `terms` fixed: each the median of the servers' votes; the votes by
    term and server; and the points read."""
    by_server = mla_launch_rows({**terms, **MLA_LAUNCH_OFF})
    fitted, votes, points = {}, {}, set()
    for term, past_graph in ((EAGER_MLA_TERM, True), (PIECEWISE_MLA_TERM, False)):
        votes[term] = {}
        for tag, rows in by_server.items():
            chosen = [r for r in rows if (r["eager"] if past_graph else r["piecewise"])]
            if chosen:
                votes[term][tag] = server_vote(chosen)
                points |= {r["point"] for r in chosen}
        fitted[term] = round(statistics.median(votes[term].values()), 7) if votes[term] else 0.0
    return fitted, votes, sorted(points)


def mla_layer_points(points: list[dict]) -> list[dict]:
    """The closed-loop points of one request in flight the MLA layer's cost is fitted on."""
    return [p for p in points if p["settings"]["model"] in MLA_LAYER_MODELS and p["settings"]["loop"] == "closed"
            and p["settings"]["concurrency"] == 1 and p["settings"]["input_len"] <= MLA_LAYER_MOST_TOKENS
            and p["measured"].get("itl_p50_ms")]


def fit_mla_layer(points: list[dict], terms: dict) -> float:
    """The cost per MLA layer a step, every other term in `terms` fixed: a least-squares fit of the relative error of
    the measured median inter-token gap of mla_layer_points, each step taken at its request's median length."""
    num = den = 0.0
    for p in mla_layer_points(points):
        st = p["settings"]
        model, _ = point_replica(st, ROOT, terms={**terms, MLA_LAYER_TERM: 0.0})
        measured = p["measured"]["itl_p50_ms"] / 1e3
        x = model.mla_layers / measured
        y = (measured - model.decode_seconds(1, st["input_len"] + st["output_len"] // 2)) / measured
        num, den = num + x * y, den + x * x
    return round(max(num / den, 0.0), 9) if den else 0.0


if __name__ == "__main__":
    from sizing.planners.step_model import step_overhead

    import json

    terms = step_overhead().model_dump()
    points = json.loads((ROOT / "measure" / "serving" / "points.json").read_text())["points"]
    print(f"{MLA_LAYER_TERM}: {fit_mla_layer(points, terms) * 1e6:.1f} us a layer "
          f"({len(mla_layer_points(points))} points)")
    fit, by_term, _ = fit_mla_launch(terms)
    for term, value in fit.items():
        print(f"{term}: {value * 1e3:.3f} ms a layer "
              f"({', '.join(f'{tag} {v * 1e3:.2f}' for tag, v in sorted(by_term[term].items()))})")

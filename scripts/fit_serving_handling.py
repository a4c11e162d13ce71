"""What the host spends beside the GPU's work, for profiles/serving.json (scripts/fit_serving_terms.py takes both
before the MFU), read off the engine core's step traces apart from the simulation: the front end's handling of a
request (the traces of requests alone on the engine) and the launch of a step with a prompt chunk, past the largest
CUDA graph and under it."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import statistics  # noqa: E402

from measure.first_token import burst_rows  # noqa: E402
from measure.steps import (FLASH_KV_CACHE_DTYPES, launch_rows, gpu_paced_servers,  # noqa: E402
                           prompt_handling_rows, server_settings, traced_servers)
from least_squares import line  # noqa: E402

# the front end's handling of a request, read off the step traces of requests alone on the engine (measure/steps.py
# prompt_handling_rows), apart from the simulation: a part the same for every request and a part per prompt token, on
# the way in and on the first token's way back. Each part is read where it weighs most: the parts per prompt token on
# the long prompts of the one-request batches b22, b25 and b28 (2,000 and 8,000 tokens on six dense models), and the
# part the same for every request on the short prompts of b30-b33 (50-1,000 tokens on nine dense models in bf16),
# where the per-token parts are a few tenths of a millisecond. One line over every length (b30-b32 beside b22-b28)
# gave a fixed part of 1.4 ms and a steeper slope, and the prefill MFU fitted after it rose from 0.657 to 0.678, moving
# 9 most-requests-a-second answers across the 10% bar, 8 of them to promise more than the server held; b22-b28's line
# alone gives 0.09 ms at no prompt, where b33's 50-token prompts spend 2.5-4.2 ms outside their steps before the first
# token
HANDLING_BATCHES = ("b22-prompt-tiles", "b25-int4-pace", "b28-int4-judge")
SHORT_HANDLING_BATCHES = ("b30-front-door", "b31-eager-launch", "b32-piecewise-prompts", "b33-prompt-door")
SHORT_PROMPT_TOKENS = 1000  # a prompt this long or shorter reads the fixed part
HANDLING_TERM, PARSE_TERM = "request_handling_s", "request_parse_s"
PROMPT_IN_TERM, FIRST_TOKEN_TERM = "prompt_in_s_per_token", "first_token_s_per_prompt_token"
HANDLING_OFF = {HANDLING_TERM: 0.0, PARSE_TERM: 0.0, PROMPT_IN_TERM: 0.0, FIRST_TOKEN_TERM: 0.0}


def fit_handling() -> tuple[dict[str, float], list[str]]:
    """The request's handling: the way in's seconds per prompt token (the slope of the time a long-prompt request
    spends outside its steps, its last token's way out being the same at any length), the first token's way back's
    (the slope of a long-prompt request's first token's time outside the steps, less the way in's), and the first
    token's time outside the steps at no prompt (the median over the short-prompt requests of that time less both
    per-token parts); and the points they were read from."""
    batches = HANDLING_BATCHES + SHORT_HANDLING_BATCHES
    rows = {batch: [] for batch in batches}
    for server in traced_servers():
        if server["batch"] in rows:
            rows[server["batch"]].extend(prompt_handling_rows(server))
    long = [r for batch in HANDLING_BATCHES for r in rows[batch]]
    short = [r for batch in SHORT_HANDLING_BATCHES for r in rows[batch] if r["prompt"] <= SHORT_PROMPT_TOKENS]
    prompts = [r["prompt"] for r in long]
    way_in = max(line(prompts, [r["outside_s"] for r in long])[1], 0.0)
    first = line(prompts, [r["first_token_s"] for r in long])[1]
    fixed = round(max(statistics.median(r["first_token_s"] - first * r["prompt"] for r in short), 0.0), 6)
    parse, bursts = fit_parse()
    return ({HANDLING_TERM: fixed, PARSE_TERM: min(parse, fixed), PROMPT_IN_TERM: round(way_in, 11),
             FIRST_TOKEN_TERM: round(max(first - way_in, 0.0), 11)},
            sorted({r["point"] for r in long + short} | set(bursts)))


# the bursts the loop's parse is read from: every traced batch whose servers ran requests alone beside bursts at the
# same prompt length under one API server, but b15, kept out of every fit to judge the formats
PARSE_BATCHES = ("b28-int4-judge", "b32-piecewise-prompts", "b33-prompt-door", "b35-way-out", "b36-way-out-again")


def fit_parse() -> tuple[float, list[str]]:
    """The part of the handling an API server's loop spends on a request before its tokenizer: over the traced bursts
    of PARSE_BATCHES under one API server (measure/first_token.py burst_rows), the least-squares slope through the
    origin of the first request's wait beyond a request alone's on the other requests sent with it (their parses
    come before its hand-over: sizing/planners/front_end.py); and the points it was read from."""
    rows = [r for server in traced_servers() if server["batch"] in PARSE_BATCHES for r in burst_rows(server)]
    others = [r["together"] - 1 for r in rows]
    slope = sum(n * r["extra_s"] for n, r in zip(others, rows)) / sum(n * n for n in others)
    return round(max(slope, 0.0), 6), [r["point"] for r in rows]


# the host's launch of a step with prompt chunks, a layer at a time (measure/steps.py launch_rows), under load: past the
# largest CUDA graph every kernel launched from Python, under it the graph's pieces replayed and each layer's attention
# launched between them. Every dense GPU-paced server of the traced batches in a format whose prompt attention runs in
# FlashAttention's kernels (bf16, fp8), each model's median one vote (its servers' steps together), as the layers of
# the models measured launch at 0.74-1.11 ms each past the graph (Llama-3.1-8B the fastest, Qwen2.5-7B the slowest;
# per-head q and k norms are no cause: Qwen3-14B's 0.94 lies between) and 0.33-0.53 ms under it (b32). The
# per-token-head integer formats' prompt attention runs in Triton kernels, launched from Python more slowly (b14's
# Llama-3.1-8B: 1.2 and 1.5 ms a layer past the graph): a term of their own, not fitted
LAUNCH_BATCHES = ("b11-step-trace", "b12-step-ladder", "b29-knee-ladder", "b30-front-door", "b31-eager-launch",
                  "b32-piecewise-prompts")
LAUNCH_LEAST_STEPS = 20  # a model of fewer such steps gets no vote
LAUNCH_TERM, PIECEWISE_LAUNCH_TERM = "eager_layer_launch_s", "piecewise_layer_launch_s"
LAUNCH_OFF = {LAUNCH_TERM: 0.0, PIECEWISE_LAUNCH_TERM: 0.0}


def _launch_rows_by_model() -> dict[str, list[dict]]:
    """Per model, its dense servers' launch rows (launch_rows) in the formats the launches are fitted on, each trace
    read once for both launches."""
    rows = {}
    for server in gpu_paced_servers(LAUNCH_BATCHES):
        if server_settings(server)["kv_cache_dtype"] in FLASH_KV_CACHE_DTYPES:
            rows.setdefault(server["model"], []).extend(r for r in launch_rows(server) if r["dense"])
    return rows


def _votes(rows: dict[str, list[dict]], past_graph: bool) -> dict[str, list[dict]]:
    chosen = {model: [r for r in part if r["eager"] == past_graph] for model, part in rows.items()}
    return {model: part for model, part in chosen.items() if len(part) >= LAUNCH_LEAST_STEPS}


def launch_votes(past_graph: bool = True) -> dict[str, list[dict]]:
    """Per model that votes on the launch past the largest graph (or under it), its servers' rows."""
    return _votes(_launch_rows_by_model(), past_graph)


def fit_launch() -> tuple[dict[str, float], list[str]]:
    """The launch's seconds a layer past the largest graph and under it: each the median over the voting models of
    each one's median launch over its layers; and the points they were read from."""
    rows = _launch_rows_by_model()
    terms, points = {}, set()
    for term, past_graph in ((LAUNCH_TERM, True), (PIECEWISE_LAUNCH_TERM, False)):
        votes = _votes(rows, past_graph)
        terms[term] = round(statistics.median(statistics.median(r["launch_s"] / r["layers"] for r in part)
                                              for part in votes.values()), 7)
        points |= {r["point"] for part in votes.values() for r in part}
    return terms, sorted(points)

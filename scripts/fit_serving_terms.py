"""Fit the serving simulation's constants and write them to profiles/serving.json (sizing/planners/serving.py): the
share of HBM bandwidth the engine's GEMMs read the weights at, the fixed cost of an engine step per layer, each
layer's all-reduce where TP > 1, the host's floor under a step, the MFU chunked prefill reaches and the share of
HBM bandwidth the engine's own attention reads each KV format at.

The step terms and the MFU are fitted on the points where nothing but a decode step separates two tokens and nothing
but one prompt's prefill comes before the first: one request in flight on a dense model, of every size measured
(Llama-3.2-1B, Llama-3.1-8B, Qwen3-8B, Mistral-Nemo-12B and Qwen2.5-32B on one GPU; Qwen2.5-32B and Llama-3.1-70B at
TP 2). The step terms: a least-squares fit of the relative error of the measured median inter-token gap to

    max(weights bytes per rank / HBM bandwidth / weights efficiency + layers × (per-layer + TP all-reduce per layer)
        + the KV read, floor)

the floor chosen on a grid (10 us apart, 0 among them) as the one whose fit leaves the least squared error; a
point under the floor takes no part in the linear fit. The prefill MFU: the reference MFU scaled by the simulated
over the measured median TTFT, the median over those points. The engine's KV read efficiency, per format, and
the cost of each request in a step beside its KV read (the model runner's per-request work, the sampler's row, the
attention kernels' per-sequence work): on the step traces' decode-only steps (batches b11 and b12: Llama-3.1-8B in bf16 and fp8 KV at 16-256 requests decoding
over 1,000- and 8,000-token prompts, Qwen3-30B-A3B; the host-paced Llama-3.2-1B left out), grouped by point and
requests decoding, a least-squares fit of the relative error of each group's median period (see fit_trace); only
the ladders tell the two apart, since at one prompt length the KV read grows with the requests. They depend on the
step terms (through the one-request points' KV reads and requests) and the step terms on them, so they are fitted
in turn, twice. The KV formats the engine decodes in another kernel (batch b14: int4_per_token_head and
int8_per_token_head, which vLLM 0.33.0 runs under TRITON_ATTN only, on Llama-3.1-8B) get their read share from their
own traces, the request's cost fixed, and the share of the prefill FLOP rate their prompt attention reaches from their
points of 8,000-token prompts and longer (see fit_prefill_attention); b14's Qwen3-30B-A3B stays out of both. Where
the engine's kernel is compiled for another count of query heads a KV head (8: b16's Qwen3-30B-A3B and b18's Qwen3-32B
in int8_per_token_head), that count's waves come from those traces alike (see fit_query_groups). Then,
those terms fixed, the cost per MoE layer a step (the fused-MoE kernels' router, top-k,
block alignment and combine, which a dense MLP does not launch): a least-squares fit of the relative error of the
measured median gap of Qwen3-30B-A3B's one-request points of batch b2 (prompts of 1K, 8K and 32K tokens). Then, every
one of those fixed, a MoE layer's prompt work (scripts/fit_serving_moe.py): the host's launch of its fused-MoE path
in a step past the largest CUDA graph kvsize estimates the engine captured, read off the traces of Qwen3-30B-A3B's
prompts alone on b35's and b39's hosts, and the fixed cost each tile of its grouped GEMMs pays in elements of its K
loop, fitted on Qwen3-30B-A3B's one-request TTFTs of 8,000 tokens and more. Last, the front end's seconds
per streamed token, the engine core's (in the host's side of a step, after its floor) and the API servers' (a bound
of their own; see fit_frontend), on batch b8's closed-loop Llama-3.2-1B points (one and four API servers). The
request's handling by the front end (see fit_handling), a part the same for every request and one per prompt token,
and the host's launch of a step with a prompt chunk, past the largest CUDA graph and under it (see fit_launch), are read off the step traces
(scripts/fit_serving_handling.py), before the MFU is fitted. Batch b7's Llama-3.2-1B points stay out of every other
fit (see fitted_on).
Every other measured point
(Mixtral-8x7B, gpt-oss-20b, DeepSeek-V2-Lite, Qwen3-30B-A3B at more than one request in flight and in batches b4 and
b6, more than one request in flight elsewhere, the open loops, b7's Llama-3.2-1B prompts past their graph) is left out
of the fit, so the accuracy page reports those apart as out of the fit.

usage: python scripts/fit_serving_terms.py           (rewrites profiles/serving.json)
       python scripts/fit_serving_terms.py --terms=weights,layer,tp_layer,floor   (a subset; moe_layer, moe_prompt,
                                                                                   frontend, handling among them)
       python scripts/fit_serving_terms.py --check   (exit 1 if the file differs from the fit)
"""

from __future__ import annotations

import json
import statistics
import sys
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from sizing.evidence.serving import point_replica, predict_point, served_settings  # noqa: E402
from sizing.planners.step_model import SERVING_PROFILE, queries_per_kv_head  # noqa: E402
from sizing.profiles import matching_gpus, measured_efficiency  # noqa: E402
from measure.steps import LEAST_STEPS, decode_groups, gpu_paced_servers, server_settings  # noqa: E402
from least_squares import best_count, relative_least_squares  # noqa: E402
from fit_serving_handling import (HANDLING_BATCHES, HANDLING_OFF, LAUNCH_BATCHES, LAUNCH_OFF,  # noqa: E402
                                  SHORT_HANDLING_BATCHES, SHORT_PROMPT_TOKENS, fit_handling, fit_launch)
from fit_serving_moe import (MOE_LAUNCH_TERM, MOE_PROMPT_OFF, TILE_K_TERM, fit_moe_launch,  # noqa: E402
                             fit_tile_k, tile_k_points)
from fit_serving_mla import (EAGER_MLA_TERM, MLA_LAYER_TERM, MLA_OFF, PIECEWISE_MLA_TERM, fit_mla_launch,  # noqa: E402
                             fit_mla_layer, mla_layer_points)
from fit_serving_kernels import (PACE_TERM, PREFILL_ATTENTION_TERM, fit_prefill_attention,  # noqa: E402
                                 fit_program_pace, fit_query_group_sm, pace_fitted_on, paced_split_shares,
                                 prefill_attention_fitted_on, settings_format)

POINTS = ROOT / "measure" / "serving" / "points.json"
# the step terms fitted; the rest are left at their neutral values (weights: kvsize's kernels' efficiency; 0 s)
DENSE_TERMS = ("weights", "layer", "tp_layer", "floor")
TERMS = (*DENSE_TERMS, "moe_layer", "moe_prompt", "frontend", "handling", "launch", "mla")
FLOOR_GRID_S = 1e-5
FLOOR_MAX_S = 5e-3


def is_dense(p: dict) -> bool:
    return point_replica(p["settings"], ROOT)[0].shape.num_experts == 0


# batches run to measure one mechanism, not the step: kept out of the dense one-request fit (see fitted_on); b22's
# one request in int8_per_token_head and b25's in int4_per_token_head time the program pace (fit_serving_kernels.py),
# and b28's judge that pace on models the fit never saw; b30's, b33's and b34's judge the front end's handling; b31 and
# b32 the launch of a step with a prompt chunk (its one-request points are short prompts on an idle engine); b35's
# and b36's requests alone tie the client's clock to the trace's for their loaded points (the first token's way out);
# b37's and b38's judge the API server's event loop; b39's and b40's a MoE layer's launch and its GEMMs' tiles
NOT_STEP_BATCHES = ("b7-prefill-graphs", "b22-prompt-tiles", "b25-int4-pace", "b28-int4-judge", "b30-front-door",
                    "b31-eager-launch", "b32-piecewise-prompts", "b33-prompt-door", "b34-short-judge", "b35-way-out",
                    "b36-way-out-again", "b37-waves", "b38-burst-sizes", "b39-moe-launch", "b40-moe-tiles")


def fitted_on(points: list[dict]) -> list[dict]:
    """Closed-loop points of one request in flight on the dense servers, every batch but batch b7's: its
    Llama-3.2-1B points ran 32 output tokens (31 gaps a request, three requests) to time prompts against the CUDA
    graphs, and 14 of them beside the two of every other size would make the fit Llama-3.2-1B's, at the host's
    floor, where its gaps scatter 1.9-3.1 ms on one server and one setting."""
    return [p for p in points if p["settings"]["loop"] == "closed" and p["settings"]["concurrency"] == 1
            and p["batch"] not in NOT_STEP_BATCHES and is_dense(p)]


MFU_BATCHES = ("b1-llama8b",)  # the MFU: the one-request points of these batches (see mfu_fitted_on)


def mfu_fitted_on(points: list[dict]) -> list[dict]:
    """The one-request points the prefill MFU is fitted on: batch b1's (Llama-3.1-8B, prompts of 1K to 64K tokens).
    Fitted on every dense size instead, it moved to 0.578 and held fewer TTFTs out of the fit within 10% (the short
    prompts of the small models are mostly the server's own fixed cost, not compute)."""
    return [p for p in fitted_on(points) if p["batch"] in MFU_BATCHES]


REQUEST_TERM = "request_step_overhead_s"
# the traced batches the KV read and each request's cost are fitted on; a later traced batch (b13: Mistral-Nemo-12B)
# judges the fit from outside it
TRACE_FIT_BATCHES = ("b11-step-trace", "b12-step-ladder")
# the traced servers of KV formats whose decode attention the engine runs in another kernel (vLLM 0.33.0 runs the
# per-token-head integer formats under TRITON_ATTN only): each format's read share, the request's cost fixed at the
# one fitted above. Their ladder does not tell the two apart for that kernel (fitted together, int4_per_token_head's
# request would cost less than nothing), and fitted with the others' it would move bf16's share from 0.92 to 1.0.
# Batch b14's Qwen3-30B-A3B in int4_per_token_head stays out, to judge both from outside
FORMAT_TRACE_SERVERS = ("b14-llama8b-int4", "b14-llama8b-int8")
FORMAT_TRACE_BATCHES = ("b14-kv-formats",)
# formats no server ran that vLLM 0.33.0 runs through the same attention path as a measured one: fp8_per_token_head
# and int8_per_token_head are both the per-token-head branch of TRITON_ATTN's core unified kernel, dequantized inline
# (v1/attention/backends/triton_attn.py: the three per-token-head formats, TRITON_ATTN their only backend; int4 alone
# dispatches to the packed kernel), one byte an element and a scale per token and head
KERNEL_TWINS = {"fp8_per_token_head": "int8_per_token_head"}
# the programs an SM may run at once that the fit of a whole-request kernel's waves tries (step_model.StepModel)
PROGRAMS_PER_SM = range(1, 9)
NO_WAVES = {"engine_programs_per_sm": {}, "engine_split_kv_efficiency": {}, "engine_query_group_waves": {}}
# the traced servers whose kernel was compiled for another count of query heads a KV head than FORMAT_TRACE_SERVERS'
# (8 on Qwen3-30B-A3B and Qwen3-32B, against Llama-3.1-8B's 4): that count's waves (fit_query_groups). b19's
# Qwen2.5-3B (8, another family) stays out, to judge them from outside
QUERY_GROUP_TRACE_SERVERS = ("b16-qwen3moe-int8", "b18-qwen3-32b-int8")
QUERY_GROUP_TRACE_BATCHES = ("b16-wave-edges", "b18-wave-ratio")


# the traced servers whose ramps (a closed loop's last requests finishing one by one, every count of requests a step
# or two) show a format's SM terms where its format trace's groups cannot tell them apart: batch b26's
# Qwen2.5-7B-Instruct in int4_per_token_head climbed where its segments needed another round of 4 an SM (8 -> 9 and
# 16 -> 17 requests of 16,000 tokens) and where the launched grid put a third whole-cache program on an SM (40 -> 41
# of 8,000); batch b27's Llama-3.1-8B, predicted before it ran, climbed at 4 -> 5, 8 -> 9 and 12 -> 13 of 16,000 and
# 24 -> 25 of 8,000 (now in the fit: a later batch judges it). Every count's group is read, each counted once a step
RAMP_TRACE_SERVERS = ("b26-qwen25-7b-int4", "b27-llama8b-int4")
RAMP_TRACE_BATCHES = ("b26-held-ramps", "b27-ramps-check")


@cache
def trace_groups(batches: tuple[str, ...] = TRACE_FIT_BATCHES, servers: tuple[str, ...] | None = None,
                 least: int = LEAST_STEPS) -> tuple[tuple[dict, tuple[dict, ...]], ...]:
    """Each GPU-paced traced server of `batches` (those of them `servers` names, if given): its settings and its
    groups of decode-only steps (of `least` steps or more), read once for every round of the fit."""
    return tuple((server_settings(s), tuple(decode_groups(s, least))) for s in gpu_paced_servers(batches)
                 if servers is None or s["tag"] in servers)


def trace_rows(terms: dict, groups=None) -> list[dict]:
    """Per group of a traced server's decode-only steps (one point, one count of requests decoding): the simulated
    GPU step without its KV read and its per-request term, the KV read at the trial efficiency, the format, the
    requests and the measured median period (seconds)."""
    rows = []
    for settings, server_groups in trace_groups() if groups is None else groups:
        model, _ = point_replica(settings, ROOT, terms={**terms, REQUEST_TERM: 0.0})
        for g in server_groups:
            n, tokens = g["decoding"], g["decoding"] * g["cached"]
            _, kv = model.read_seconds(n, g["cached"])
            rows.append(dict(point=g["point"], format=model.kv_format, decoding=n, kv=kv, steps=g["steps"],
                             queries_per_kv=queries_per_kv_head(model.shape),
                             split=model.kv_kernel_factor(n, False)[1],
                             base=model.gpu_seconds(n, tokens, []) - kv, measured=g["measured_s"]))
    return rows


def ramp_groups() -> tuple[tuple[dict, tuple[dict, ...]], ...]:
    """The ramps' servers (RAMP_TRACE_SERVERS) with every count's group of decode-only steps, however few its steps."""
    return trace_groups(RAMP_TRACE_BATCHES, RAMP_TRACE_SERVERS, least=1)


def _group_points(groups) -> list[str]:
    """The points whose decode-only steps `groups` (trace_groups) hold, in order: the points a trace fit reads."""
    return sorted({g["point"] for _, server_groups in groups for g in server_groups})


def format_trace_rows(terms: dict) -> list[dict]:
    return trace_rows(terms, trace_groups(FORMAT_TRACE_BATCHES, FORMAT_TRACE_SERVERS))


def fit_trace(terms: dict) -> dict:
    """The engine's KV read efficiency per format and the cost of each request in a step, from the step traces'
    decode-only steps: a least-squares fit of the relative error of each group's median period to base + requests
    x cost + KV read x (trial efficiency / efficiency), one unknown per format beside the shared cost. Only the
    ladders of the traced servers tell the two apart: the KV a step reads moves with the prompt length at a fixed
    count of requests. Then each format of FORMAT_TRACE_SERVERS, the cost fixed: for each count of programs an SM
    runs at once on PROGRAMS_PER_SM, its two read efficiencies (a full wave of whole-request programs, and the split
    cache of few requests) by the same least squares, each group's squared error counted once a step (a ramp of a
    few steps, whose cached tokens are not the point's, must not weigh as much as the steady state a point's gaps
    are made of); the count leaving the least squared error is kept."""
    # every format the traces read at a trial share of 1, those kvsize's kernels never measured among them
    formats = set(measured_efficiency().kv) | {settings_format(settings) for settings, _ in
                                               trace_groups() + trace_groups(FORMAT_TRACE_BATCHES, FORMAT_TRACE_SERVERS)}
    trial = {**terms, "engine_kv_efficiency": {f: 1.0 for f in sorted(formats)}, **NO_WAVES}
    rows = trace_rows(trial)
    formats = sorted({r["format"] for r in rows})
    columns = [lambda r: r["decoding"]] + [lambda r, f=f: r["kv"] * (r["format"] == f) for f in formats]
    beta = relative_least_squares(rows, columns, lambda r: r["base"])
    shares = {f: round(min(1.0, 1 / b), 3) for f, b in zip(formats, beta[1:])}  # the trial read at a share of 1
    request = round(max(beta[0], 0.0), 9)
    others = sorted({settings_format(settings) for settings, _ in trace_groups(FORMAT_TRACE_BATCHES,
                                                                                 FORMAT_TRACE_SERVERS)} - set(shares))
    split, per_sm = {}, {}
    fixed = lambda r: r["base"] + request * r["decoding"]  # noqa: E731
    for f in others:
        def rows_at(k: int, f=f) -> list[dict]:
            return [r for r in format_trace_rows({**trial, "engine_split_kv_efficiency": {f: 1.0},
                                                  "engine_programs_per_sm": {f: k}}) if r["format"] == f]
        columns = [lambda r: r["kv"] * (not r["split"]), lambda r: r["kv"] * r["split"]]
        k, (whole, segments) = best_count(rows_at, columns, fixed, PROGRAMS_PER_SM)
        shares[f], split[f], per_sm[f] = round(min(1.0, 1 / whole), 3), round(min(1.0, 1 / segments), 3), k
    fitted = {"engine_kv_efficiency": shares, "engine_programs_per_sm": per_sm, "engine_split_kv_efficiency": split,
              REQUEST_TERM: request}
    query_groups = fit_query_groups({**terms, **fitted}, request)
    fitted_groups = {f: sorted(set(query_groups.get(f, {})) | {q}) for f, q in trace_query_groups(
        FORMAT_TRACE_BATCHES, FORMAT_TRACE_SERVERS) if f in per_sm}
    return {**fitted, "engine_query_group_waves": query_groups, "engine_waves_query_groups": fitted_groups}


def trace_query_groups(batches: tuple[str, ...], servers: tuple[str, ...]) -> list[tuple[str, int]]:
    """(KV format, query heads a KV head) of each traced server of `batches` that `servers` names."""
    out = []
    for settings, _ in trace_groups(batches, servers):
        model, _ = point_replica(settings, ROOT)
        out.append((model.kv_format, queries_per_kv_head(model.shape)))
    return out


def fit_query_groups(terms: dict, request: float) -> dict[str, dict[int, dict]]:
    """Per format and count of query heads a KV head that QUERY_GROUP_TRACE_SERVERS ran, the waves of the kernel
    compiled for that count: on their traces, every other term fixed (the request's cost, the format's split
    read), the programs an SM runs at once (PROGRAMS_PER_SM, the count leaving the least squared error, each
    group's error counted once a step) and the read share of a full wave of whole-request programs."""
    out: dict[str, dict[int, dict]] = {}
    for f, q in sorted(set(trace_query_groups(QUERY_GROUP_TRACE_BATCHES, QUERY_GROUP_TRACE_SERVERS))):
        def rows_at(k: int, f=f, q=q) -> list[dict]:
            waves = {"programs_per_sm": k, "kv_efficiency": 1.0}
            trial = {**terms, "engine_query_group_waves": {f: {q: waves}},
                     "engine_kv_efficiency": {**terms["engine_kv_efficiency"], f: 1.0},
                     "engine_split_kv_efficiency": {**terms["engine_split_kv_efficiency"], f: 1.0}}
            rows = trace_rows(trial, trace_groups(QUERY_GROUP_TRACE_BATCHES, QUERY_GROUP_TRACE_SERVERS))
            return [r for r in rows if r["format"] == f and r["queries_per_kv"] == q]

        def fixed(r: dict, split: float = terms["engine_split_kv_efficiency"][f]) -> float:
            return r["base"] + request * r["decoding"] + r["kv"] * r["split"] / split  # the split at its own share
        k, (whole,) = best_count(rows_at, [lambda r: r["kv"] * (not r["split"])], fixed, PROGRAMS_PER_SM)
        out.setdefault(f, {})[q] = {"programs_per_sm": k, "kv_efficiency": round(min(1.0, 1 / whole), 3)}
    return out


REFERENCE_MFU = 0.5  # any MFU: one prompt prefilled alone takes time inversely proportional to it
FIT_ROUNDS = 2  # the step terms read the KV at the engine's efficiency and that is fitted with the step terms
FRONTEND_OFF = {"frontend_core_s_per_token": 0.0, "frontend_api_s_per_token": 0.0}  # until fit_frontend
NEUTRAL = {"per_layer_step_overhead_s": 0.0, "tp_per_layer_step_overhead_s": 0.0, "step_floor_s": 0.0,
           REQUEST_TERM: 0.0,
           "moe_layer_step_overhead_s": 0.0, **MOE_PROMPT_OFF, **FRONTEND_OFF, **MLA_OFF}
# the MoE layer's cost: the one-request points of this server (Qwen3-30B-A3B, batch b2: prompts of 1K, 8K and 32K
# tokens); every other MoE point (Mixtral-8x7B, gpt-oss-20b, DeepSeek-V2-Lite, Qwen3-30B-A3B at more than one request
# in flight and in batch b4) stays out of the fit to judge it
MOE_FIT_SERVERS = ("qwen3moe-bf16",)


def moe_fitted_on(points: list[dict]) -> list[dict]:
    """Closed-loop points of one request in flight on the MoE servers the MoE layer's cost is fitted on."""
    return [p for p in points if p["settings"]["loop"] == "closed" and p["settings"]["concurrency"] == 1
            and p["server"] in MOE_FIT_SERVERS and not is_dense(p)]


def fit_moe_layer(points: list[dict], terms: dict) -> float:
    """The cost per MoE layer a step, the dense terms `terms` fixed: a least-squares fit of the relative error of the
    measured median inter-token gap of the MoE one-request points, each step taken at its request's median length
    (every MoE step of these points is over the floor)."""
    num = den = 0.0
    for p in moe_fitted_on(points):
        st = p["settings"]
        model, _ = point_replica(st, ROOT, terms={**terms, "moe_layer_step_overhead_s": 0.0})
        tokens = st["input_len"] + st["output_len"] // 2
        measured = p["measured"]["itl_p50_ms"] / 1e3
        x = sum(1 for q in model.shape.layer_params if q.experts > 0) / measured
        y = (measured - model.decode_seconds(1, tokens)) / measured
        num, den = num + x * y, den + x * x
    return round(max(num / den, 0.0), 9) if den else 0.0


# the front end's pace: the closed-loop points of these servers (Llama-3.2-1B, 128 tokens in and 256 out at 64-512 in
# flight, under one API server and under four), where the GPU's decode step is ~1.3-4 ms and the gaps 2.7-29 ms
FRONTEND_BATCHES = ("b8-frontend",)
FRONTEND_SERVERS = ("b8-llama1b", "b8-llama1b-api4")
CORE_GRID_S = [i * 2.5e-7 for i in range(401)]  # 0-100 us a token, by 0.25 us
API_GRID_S = [i * 2.5e-7 for i in range(801)]  # 0-200 us a token


def frontend_rows(points: list[dict], terms: dict) -> list[dict]:
    """Per point: requests in flight, API servers, the simulated gap with the front end off (the GPU's step or the
    floor) and the measured median gap (seconds)."""
    rows = []
    for p in points:
        st = p["settings"]
        if not (p["batch"] in FRONTEND_BATCHES and p["server"] in FRONTEND_SERVERS and st["loop"] == "closed"):
            continue
        gpu = predict_point(served_settings(p), ROOT, terms={**terms, **FRONTEND_OFF}).itl_ms[50] / 1e3
        rows.append(dict(point=p, streams=st["concurrency"], api_servers=st.get("api_server_count") or 1, gpu=gpu,
                         measured=p["measured"]["itl_p50_ms"] / 1e3))
    return rows


def fit_frontend(rows: list[dict], floor_s: float) -> dict[str, float]:
    """The front end's seconds per streamed token, the engine core's (in the host's side of a step, after the floor)
    and the API servers' (a bound of its own, shared among them): the grid pair whose gaps, the largest of the GPU's
    step, floor + streams x core and streams x API / API servers, leave the least squared relative error against the
    measured median gaps, every other term fixed."""
    def error(core: float, api: float) -> float:
        return sum((max(r["gpu"], floor_s + r["streams"] * core, r["streams"] * api / r["api_servers"])
                    / r["measured"] - 1) ** 2 for r in rows)

    _, core, api = min((error(c, a), c, a) for c in CORE_GRID_S for a in API_GRID_S)
    return {"frontend_core_s_per_token": round(core, 9), "frontend_api_s_per_token": round(api, 9)}


def step_rows(points: list[dict], engine_kv: dict[str, float], request: float) -> list[dict]:
    """Per one-request point: the weights read at the full bandwidth, the KV read at the engine's efficiency (at the
    request's median length) and the one request's cost a step, its layers and whether it runs at TP > 1, and the
    measured median gap (seconds)."""
    rows = []
    for p in fitted_on(points):
        st = p["settings"]
        model, _ = point_replica(st, ROOT, terms={**NEUTRAL, "engine_weights_efficiency": 1.0,
                                                  "engine_kv_efficiency": engine_kv})
        weights, kv = model.read_seconds(1, st["input_len"] + st["output_len"] // 2)
        rows.append(dict(weights=weights, kv=kv + request, layers=model.shape.num_layers, tp=model.tp > 1,
                         measured=p["measured"]["itl_p50_ms"] / 1e3,
                         kernel_weights=weights / measured_efficiency().weights))
    return rows


def _linear(rows: list[dict], terms: tuple[str, ...]) -> tuple[dict, callable]:
    """Least squares of the relative error over `rows`: the unknowns are 1 / weights efficiency, the per-layer cost
    and the TP all-reduce per layer, those of them `terms` names."""
    columns = [("weights", lambda r: r["weights"]), ("layer", lambda r: r["layers"]),
               ("tp_layer", lambda r: r["layers"] * r["tp"])]
    columns = [(n, c) for n, c in columns if n in terms]
    fixed = (lambda r: r["kv"]) if "weights" in terms else (lambda r: r["kv"] + r["kernel_weights"])
    beta = relative_least_squares(rows, [c for _, c in columns], fixed)
    coef = dict(zip([name for name, _ in columns], beta))
    return coef, lambda r: fixed(r) + sum(coef[name] * c(r) for name, c in columns)


def fit_step(points: list[dict], engine_kv: dict[str, float], terms: tuple[str, ...] = TERMS,
             request: float = 0.0) -> dict:
    """The step terms `terms` names, from the one-request points, the KV read at `engine_kv` and a request costing
    `request` a step."""
    rows = step_rows(points, engine_kv, request)
    terms = tuple(t for t in terms if t in DENSE_TERMS)
    best = None
    floors = [k * FLOOR_GRID_S for k in range(int(FLOOR_MAX_S / FLOOR_GRID_S) + 1)] if "floor" in terms else [0.0]
    for floor in floors:
        active = [r for r in rows if r["measured"] > floor]
        for _ in range(10):  # the points the GPU's part keeps over the floor: fit, drop those under it, again
            if len(active) <= len(terms):
                break
            coef, gpu = _linear(active, terms)
            now = [r for r in rows if gpu(r) >= floor]
            if now == active:
                break
            active = now
        if len(active) <= len(terms):
            continue
        loss = sum((max(gpu(r), floor) / r["measured"] - 1) ** 2 for r in rows)
        if best is None or loss < best[0] - 1e-12:
            best = (loss, floor, coef)
    _, floor, coef = best
    out = dict(NEUTRAL, step_floor_s=round(floor, 6), **{REQUEST_TERM: request},
               per_layer_step_overhead_s=round(coef.get("layer", 0.0), 9),
               tp_per_layer_step_overhead_s=round(max(coef.get("tp_layer", 0.0), 0.0), 9),
               engine_weights_efficiency=round(1 / coef["weights"], 4) if "weights" in coef else None)
    return out


def fit_mfu(points: list[dict], terms: dict) -> float:
    """The prefill MFU from the one-request points' median TTFT, the step terms `terms`."""
    mfus = []
    for p in mfu_fitted_on(points):
        # the request's handling is no part of the prefill's time
        model, _ = point_replica(p["settings"], ROOT, terms=terms)
        handling_ms = 1e3 * model.handling_seconds(p["settings"]["input_len"])
        simulated = predict_point(served_settings(p), ROOT, terms={**terms, "prefill_mfu": REFERENCE_MFU})
        mfus.append(REFERENCE_MFU * (simulated.ttft_ms[50] - handling_ms)
                    / (p["measured"]["ttft_p50_ms"] - handling_ms))
    return round(statistics.median(mfus), 4)


def fit(points: list[dict], terms: tuple[str, ...] = TERMS) -> dict:
    traced = {"engine_kv_efficiency": {}, **NO_WAVES, REQUEST_TERM: 0.0}
    # read off the traces apart from the simulation, so fixed before the MFU, which is fitted on the TTFT less it
    handling, handling_ids = fit_handling() if "handling" in terms else (dict(HANDLING_OFF), [])
    launch, launch_ids = fit_launch() if "launch" in terms else (dict(LAUNCH_OFF), [])
    host_terms = {**handling, **launch}  # the host's side, both read off the step traces
    host_points = [p for p in points if p["id"] in set(handling_ids) | set(launch_ids)]
    for _ in range(FIT_ROUNDS):
        # fit_step's terms start from NEUTRAL: every term fitted later (the front end's among them) is off here
        trial = {**fit_step(points, traced["engine_kv_efficiency"], terms, traced[REQUEST_TERM]), **traced,
                 PACE_TERM: {}, **host_terms}
        trial["prefill_mfu"] = fit_mfu(points, trial)
        trial["moe_layer_step_overhead_s"] = fit_moe_layer(points, trial) if "moe_layer" in terms else 0.0
        traced = fit_trace(trial)
    fixed = {**fit_step(points, traced["engine_kv_efficiency"], terms, traced[REQUEST_TERM]), **traced,
             PACE_TERM: {}, **host_terms}  # the pace is fitted last (fit_serving_kernels.py)
    fixed["prefill_mfu"] = fit_mfu(points, fixed)
    trace_points = _group_points(trace_groups())
    fixed["moe_layer_step_overhead_s"] = fit_moe_layer(points, fixed) if "moe_layer" in terms else 0.0
    moe_points = moe_fitted_on(points) if "moe_layer" in terms else []
    fixed.update(MOE_PROMPT_OFF)
    tile_k_fitted_on, moe_launch_ids = [], []
    if "moe_prompt" in terms:
        # the tiles' cost first, on prompts whose GPU part outlasts any launch; the launch's steps then told
        # host-bound by a GPU part simulated with it
        fixed[TILE_K_TERM] = fit_tile_k(points, fixed)
        tile_k_fitted_on = tile_k_points(points)
        fixed[MOE_LAUNCH_TERM], moe_launch_ids = fit_moe_launch(fixed)
    fixed.update(MLA_OFF)
    mla_ids = []
    if "mla" in terms:  # last: no other term reads an MLA model's points; the layer's cost before the launch, whose
        # lone prompts' GPU part it is in
        fixed[MLA_LAYER_TERM] = fit_mla_layer(points, fixed)
        mla_launch, _, mla_ids = fit_mla_launch(fixed)
        fixed.update(mla_launch)
        mla_ids += [p["id"] for p in mla_layer_points(points)]
    front = frontend_rows(points, fixed) if "frontend" in terms else []
    frontend = fit_frontend(front, fixed["step_floor_s"]) if front else dict(FRONTEND_OFF)
    fixed.update(frontend)
    def ramp_rows(trial: dict) -> list[dict]:
        return trace_rows(trial, ramp_groups())
    fixed["engine_split_kv_efficiency"] = paced_split_shares(points, fixed)
    fixed[PACE_TERM] = fit_program_pace(points, fixed, lambda trial: format_trace_rows(trial) + trace_rows(
        trial, trace_groups(QUERY_GROUP_TRACE_BATCHES, QUERY_GROUP_TRACE_SERVERS)) + ramp_rows(trial), REQUEST_TERM,
        ramp_rows)
    fixed["engine_query_group_waves"] = fit_query_group_sm(fixed, lambda trial, least: trace_rows(
        trial, trace_groups(QUERY_GROUP_TRACE_BATCHES, QUERY_GROUP_TRACE_SERVERS, least)), REQUEST_TERM)
    fixed[PREFILL_ATTENTION_TERM] = fit_prefill_attention(points, fixed, FORMAT_TRACE_SERVERS)
    trace_points += _group_points(trace_groups(FORMAT_TRACE_BATCHES, FORMAT_TRACE_SERVERS))
    trace_points += _group_points(trace_groups(QUERY_GROUP_TRACE_BATCHES, QUERY_GROUP_TRACE_SERVERS))
    trace_points += _group_points(ramp_groups())

    named = ([p["id"] for p in fitted_on(points) + moe_points + tile_k_fitted_on
              + [r["point"] for r in front] + host_points
              + pace_fitted_on(points) + prefill_attention_fitted_on(points, FORMAT_TRACE_SERVERS)]
             + trace_points + moe_launch_ids + mla_ids)
    fixed["engine_kernel_twins"] = KERNEL_TWINS
    return {**{k: fixed[k] for k in ("per_layer_step_overhead_s", "prefill_mfu", "engine_kv_efficiency",
                                     PREFILL_ATTENTION_TERM, "engine_kernel_twins", "engine_programs_per_sm",
                                     "engine_split_kv_efficiency", "engine_query_group_waves",
                                     "engine_waves_query_groups", PACE_TERM, "engine_weights_efficiency",
                                     "tp_per_layer_step_overhead_s", "step_floor_s",
                                     "moe_layer_step_overhead_s", MOE_LAUNCH_TERM, TILE_K_TERM,
                                     MLA_LAYER_TERM, EAGER_MLA_TERM, PIECEWISE_MLA_TERM)},
            **frontend,
            **host_terms, REQUEST_TERM: fixed[REQUEST_TERM],
            "fitted_on": named, **fitted_where(points, named),
            "source": "scripts/fit_serving_terms.py over the points it names (measure/serving/points.json): one "
                      "request in flight on the dense servers (Llama-3.2-1B, Llama-3.1-8B, Qwen3-8B, "
                      "Mistral-Nemo-12B, Qwen2.5-32B; Qwen2.5-32B and Llama-3.1-70B at TP 2): the weights "
                      "efficiency, per-layer cost and TP all-reduce per layer a least-squares fit of the relative "
                      "error of the measured median inter-token gap, the floor the grid value leaving the least "
                      "squared error; the reference MFU scaled by the simulated over the measured median TTFT, the "
                      "median; per KV format, the engine's read efficiency, and the cost of each request in a step, "
                      "a least-squares fit of the relative error of the median period of the step traces' decode-only "
                      "steps (batches b11 and b12; Llama-3.2-1B's host-paced steps left out), grouped by point and "
                      "requests decoding; for the formats the engine decodes in another kernel (batch b14's "
                      "Llama-3.1-8B in int4_per_token_head and int8_per_token_head, under TRITON_ATTN), on their own "
                      "traces, the request's cost fixed, each group's error counted once a step, the programs an SM "
                      "runs at once (1 to 8, the count leaving the least squared error) and the read efficiencies of a full wave of whole-request programs "
                      "and of the split cache of few requests; for a count of query heads a KV head whose kernel "
                      "runs other waves (batch b16's Qwen3-30B-A3B and b18's Qwen3-32B in int8_per_token_head, 8 "
                      "against Llama-3.1-8B's 4), on their traces, the split read and every other term fixed, that "
                      "count's programs an SM and full-wave read efficiency alike; the cached tokens one of their programs reads a "
                      "second, the grid value (0.1 a microsecond apart) leaving the least squared relative error of "
                      "the simulated against the measured median inter-token gap of batch b22's one-request points "
                      "of 8,000 and 32,000 tokens (five models, 2-8 KV heads; b25's two for int4_per_token_head), every "
                      "other term fixed, with what a split read costs each KV layer once a step (one request's gap is "
                      "linear in both, so three simulations a point and least squares give the pair); a paced "
                      "format's split read at its whole cache's share; the segment "
                      "programs an SM holds at once (1 to 8) and the cached tokens an SM reads a second across them, "
                      "the grid pair leaving the least squared relative error of the same traces' decode-only step "
                      "groups as the whole cache's pace, both paces fixed; then the same pair for the whole-cache "
                      "programs an SM holds at once, the split's fixed, fitted with the whole cache's pace of one "
                      "program alone (for each count, the SM's rate with that pace unbound, then the pace, then the "
                      "rate again); where the fit "
                      "reads a ramp of the format (batch b26's Qwen2.5-7B-Instruct and b27's Llama-3.1-8B in "
                      "int4_per_token_head, every count of requests their closed loops passed through), the count "
                      "whose simulated steps climb where the ramps' measured ones do, missing the fewest, of those "
                      "the one leaving the least squared error; for the kernel compiled for 8 query "
                      "heads a KV head, its own whole-cache pair on b16's and b18's Qwen3 traces, the count where "
                      "their ramps climb; and the share "
                      "of the prefill "
                      "FLOP rate their prompt attention reaches, the grid value (0.01 apart) leaving the least squared "
                      "relative error of the simulated against the measured median TTFT of their closed-loop points "
                      "of 8,000 tokens and more, every other term fixed; the cost per MoE layer "
                      "a step (router, top-k, block alignment and combine of the fused-MoE kernels), with those terms "
                      "fixed, a least-squares fit of the relative error of the measured median inter-token gap of "
                      "Qwen3-30B-A3B's one-request points of batch b2; the host's launch of a MoE layer's fused-MoE "
                      "path in a step past the largest CUDA graph kvsize estimates the engine captured, beyond a dense "
                      "layer's launch (below), over b35's and b39's Qwen3-30B-A3B servers (one vote each), the "
                      "median of each one's prompts alone past the graph, where the step lasted at least twice its "
                      "simulated GPU part, of the step's span less the dense launch, over the MoE layers; the fixed "
                      "cost a fused-MoE GEMM tile pays in elements of its K loop (the routed experts' FLOPs take "
                      "(2 (1 + k0 / hidden) + (1 + k0 / expert intermediate)) / 3 of the dense rate's time), the grid "
                      "value (25 apart) leaving the least squared relative error of the simulated against the "
                      "measured median TTFT of Qwen3-30B-A3B's one-request points of 8,000 tokens and more (batches "
                      "b2, b7, b35 and b39), every other term fixed; the cost per MLA layer a step (its absorbed "
                      "projections and cache write beyond a dense layer's attention), every other term fixed, a "
                      "least-squares fit of the relative error of the measured median inter-token gap of "
                      "DeepSeek-V2-Lite's one-request points of prompts up to 4,000 tokens (GLM-4.7-Flash's judge "
                      "it); the host's launch of an MLA layer's prompt path "
                      "beyond a dense layer's, past the graph and under it (between the graph's pieces), "
                      "every other term fixed, the median over the traced servers of MLA models in bf16 or fp8 "
                      "(DeepSeek-V2-Lite, GLM-4.7-Flash) of each one's grid value (10 us apart) leaving the least "
                      "squared relative error of its prompts alone, the longer of the simulated GPU part and the "
                      "launch against the measured step's span (scripts/fit_serving_mla.py); the front end's seconds per streamed token, the "
                      "engine core's (in the "
                      "host's side of a step, after its floor) and the API servers' (shared among --api-server-count "
                      "processes), every other term fixed, the grid pair leaving the least squared relative error of "
                      "the measured median inter-token gap of batch b8's closed-loop Llama-3.2-1B points to the "
                      "largest of the simulated GPU step, floor + streams x core and streams x API / API servers; "
                      "the request's handling by the front end (added to each TTFT, and taken off it before the MFU "
                      "is fitted), read off the step traces of requests alone on the engine: the front end's "
                      "seconds per prompt token, on the way in and on the first token's way back, the slopes of the "
                      f"least-squares lines on the prompt's tokens of the time each request of batches "
                      f"{named_batches(HANDLING_BATCHES)}'s one-request points (2,000 and 8,000 tokens) spent outside "
                      "the engine's steps (its "
                      "latency less its steps' span, and its TTFT less the span to the update of the step after its "
                      "prompt); and the part the same for every request, the median over the one-request points of "
                      f"batches {named_batches(SHORT_HANDLING_BATCHES)} of {SHORT_PROMPT_TOKENS:,} tokens or fewer "
                      "of the first token's time outside the steps less "
                      "those per-token parts, and its part on an API server's loop before the tokenizer, the "
                      "least-squares slope through the origin, over the traced bursts under one API server, of the "
                      "first request's wait beyond a request alone's on the requests sent with it; the host's launch "
                      "of a step with a prompt chunk, a layer at a time, past the largest "
                      "CUDA graph and under it (the graph's pieces, each layer's attention between them) apart: over "
                      f"the steps of batches {named_batches(LAUNCH_BATCHES)}'s dense bf16 and fp8 servers with a "
                      "prompt chunk after a step that only decoded, the period of that step (the launch, under async "
                      "scheduling) over the layers, where it lasted more than twice the decode-only step after the "
                      "chunk; each model's median, then the median over the models"}


def named_batches(batches: tuple[str, ...]) -> str:
    """Batches by their numbers, as the source text names them: 'b22, b25 and b28'."""
    numbers = [b.split("-", 1)[0] for b in batches]
    return numbers[0] if len(numbers) == 1 else ", ".join(numbers[:-1]) + " and " + numbers[-1]


def fitted_where(points: list[dict], named: list[str]) -> dict[str, str]:
    """The one engine release and bundled GPU every point `named` ran on (the simulation carries its terms to the
    others and says so: step_notes.simulation_source)."""
    ran = {(p["settings"]["vllm_version"], p["settings"]["gpu_name"]) for p in points if p["id"] in set(named)}
    if len(ran) != 1:
        raise SystemExit(f"the fitted points ran on more than one release or GPU: {sorted(ran)}")
    version, gpu_name = ran.pop()
    gpus = matching_gpus(gpu_name)
    if len(gpus) != 1:
        raise SystemExit(f"the fitted points' GPU {gpu_name!r} is not one bundled GPU: {gpus}")
    return {"fitted_engine": f"vllm {version}", "fitted_gpu": gpus[0]}


def main(argv: list[str]) -> int:
    points = json.loads(POINTS.read_text())["points"]
    terms = next((tuple(a.split("=", 1)[1].split(",")) for a in argv if a.startswith("--terms=")), TERMS)
    text = json.dumps(fit(points, terms), indent=1) + "\n"
    if "--check" in argv:
        same = SERVING_PROFILE.exists() and SERVING_PROFILE.read_text() == text
        print("profiles/serving.json " + ("is the fit" if same else "differs from the fit"))
        return 0 if same else 1
    tmp = SERVING_PROFILE.with_suffix(".json.tmp")
    tmp.write_text(text)
    tmp.replace(SERVING_PROFILE)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The fits of vLLM's CUDA-graph estimate under Model Runner V2 (0.29+) to the corpus of real starts: the per-layer
figure above the V1 model, FLASH_ATTN_MLA's estimate part by part, and FlashAttention 3's taken apart the same way
(reported, not adopted). scripts/fit_vllm_terms.py runs them with the other fits and writes what they give.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sizing.engines import get_engine  # noqa: E402
from sizing.engines.cudagraphs import graph_captures  # noqa: E402
from sizing.evidence.starts import CORPUS, load_corpus  # noqa: E402
from vllm_fit_corpus import (LOGIT_FILE, _edit_release, built_scenario, fitted_corpus,  # noqa: E402
                             graphs_built_otherwise)


def fit_v2_graph_per_layer(unsplit: bool = False) -> tuple[int, list[str]]:
    """Model Runner V2's CUDA-graph estimate (0.29+) above the V1 runner's model, per layer of the model: least
    squares (no intercept) over the starts that print it ('CUDA graph pool memory: ... (estimated)'), gpt-oss left
    out (graphs_built_otherwise); with `unsplit`, over the starts whose decode attention schedules its splits its
    own way instead (cudagraphs.own_decode_scratch: gpt-oss's sinks, the KV formats TRITON_ATTN serves, FlashMLA's
    fp8 MLA decode)."""
    from sizing.engines.cudagraphs import cuda_graph_estimate, flash_attn_mla_decode, own_decode_scratch
    from sizing.units import GiB

    layers, above, ids = [], [], []
    for start in fitted_corpus():
        p = start.printed
        if start.status != "sized" or p.runner != "v2" or not p.cuda_graph_gib \
                or start.args.get("tensor_parallel_size", 1) != 1 or start.args.get("pipeline_parallel_size", 1) != 1:
            continue
        s = built_scenario(start)
        release = get_engine(s.engine).release
        if release.cuda_graph_estimate is None or not release.model_runners.v2_profiles_cuda_graphs:
            continue
        own = own_decode_scratch(s.shape, release.cuda_graph_estimate, s.k_cache_dtype, s.gpu_architecture)
        if own != unsplit or (not unsplit and graphs_built_otherwise(s)) \
                or flash_attn_mla_decode(s.shape, release.cuda_graph_estimate, s.k_cache_dtype, s.gpu_architecture):
            continue  # FLASH_ATTN_MLA's V2 estimate is modelled part by part (fit_v2_flash_attn_mla)
        v1 = cuda_graph_estimate(s.shape, release.cuda_graph_estimate, "FULL_AND_PIECEWISE", 1,
                                 range(s.shape.num_layers), s.max_num_seqs, s.max_num_batched_tokens,
                                 s.cudagraph_capture_sizes, s.max_cudagraph_capture_size,
                                 architecture=s.gpu_architecture, kv_format=s.k_cache_dtype,
                                 multiprocessors=s.gpu_multiprocessors)
        layers.append(s.shape.num_layers)
        above.append(float(p.cuda_graph_gib[0]) * GiB - v1)
        ids.append(start.id)
    if not layers:
        return 0, []
    x = np.array(layers, float)
    return int(round(float(x @ np.array(above) / (x @ x)))), sorted(ids)


# the start whose second FULL warm-up released two copies of its accumulators (the allocator split the freed block):
# V2's estimate there is not the one-copy mechanism the fit models (tests/test_vllm_starts.py GLM_SPLIT_BLOCK)
SPLIT_BLOCK_STARTS = frozenset({"h200-0.33.0-glm-4.7-flash", "h200-0.33.0-glm-4.7-flash-s512",
                                "h200-0.33.0-glm-4.7-flash-s384"})


GRAPH_SAMPLES = "graph-samples-0.33-h200.json"


def _probed_estimates() -> dict[str, int]:
    """V2's estimate, exact, where measure/graph_samples.py printed its parts: measured - s1 + (FULL graphs - 1) x
    max(s1, 1 MiB) (cudagraph_utils.py profile_cudagraph_memory and _extrapolate_full_graph_memory)."""
    import json

    from measure.graph_samples import v2_estimate_bytes

    return {r["id"]: v2_estimate_bytes(r) for r in json.loads((CORPUS / GRAPH_SAMPLES).read_text())["starts"]}


def fit_v2_flash_attn_mla() -> tuple[int, int, list[str]]:
    """V2's CUDA-graph estimate where the decode runs FLASH_ATTN_MLA: what is left of each start's estimate once the
    FULL parts are taken off (the first two FULL batches' split accumulators and the floor per further FULL graph,
    from source), fitted as base + figure x (PIECEWISE graphs - 1) x attention layers, least squares over the V2
    starts with that decode whose estimate is printed or probed (graph-samples-0.33-h200.json), at any TP."""
    from sizing.engines.cudagraphs import flash_attn_mla_decode, v2_flash_attn_mla_full_bytes
    from sizing.units import GiB

    probed = _probed_estimates()
    xs, ys, ids = [], [], []
    for start in load_corpus():
        p = start.printed
        if start.status != "sized" or p.runner != "v2" or start.id in SPLIT_BLOCK_STARTS \
                or start.args.get("pipeline_parallel_size", 1) != 1:
            continue
        estimate = probed.get(start.id) or (round(float(p.cuda_graph_gib[0]) * GiB) if p.cuda_graph_gib else None)
        if estimate is None:
            continue
        s = built_scenario(start)
        model = get_engine(s.engine).release.cuda_graph_estimate
        if model is None or not model.v2_warmup_splits \
                or not flash_attn_mla_decode(s.shape, model, s.k_cache_dtype, s.gpu_architecture):
            continue
        c = graph_captures(s.shape, model, s.tensor_parallel_size, range(s.shape.num_layers), s.max_num_seqs,
                           s.max_num_batched_tokens, s.cudagraph_capture_sizes, s.max_cudagraph_capture_size)
        xs.append((len(c.piecewise) - 1) * c.splitting_layers)
        ys.append(estimate - v2_flash_attn_mla_full_bytes(s.shape, model, s.tensor_parallel_size, c.full))
        ids.append(start.id)
    if len(ids) < 2:
        return 0, 0, []
    a = np.column_stack([np.ones(len(xs)), np.array(xs, float)])
    base, per_graph_layer = np.linalg.lstsq(a, np.array(ys, float), rcond=None)[0]
    return int(round(base)), int(round(per_graph_layer)), sorted(ids)


# a probed FlashAttention 3 start whose second sample released more than this many copies of its accumulators had its
# freed block split by the allocator (tests/test_graph_samples_starts.py SPLIT_BLOCK_FA3)
SPLIT_RELEASE_COPIES = 1.5


def fa3_part_by_part() -> dict:
    """FlashAttention 3's V2 estimate taken apart as FLASH_ATTN_MLA's is (fit_v2_flash_attn_mla), not adopted
    (docs/formulas.md, 'CUDA graphs'): each probed start's estimate less the two largest FULL batches' split
    accumulators (32 x batch x query heads x value width x 4 B) and the floor per further FULL graph, least squares
    as base + figure x (PIECEWISE graphs - 1) x attention layers over the one-GPU starts whose second sample released
    one copy; the starts whose second sample released more (the allocator's split) are kept out and their distance
    from the fit reported."""
    from sizing.engines.cudagraphs import (flash_attn_mla_decode, flash_attn_version, split_kv_accumulator_bytes,
                                           unsplit_attention)

    probed, samples = _probed_estimates(), _probed_samples()
    rows = []
    for start in load_corpus():
        if start.id not in samples or start.status != "sized" or start.args.get("tensor_parallel_size", 1) != 1:
            continue
        s = built_scenario(start)
        model = get_engine(s.engine).release.cuda_graph_estimate
        if model is None or not model.v2_warmup_splits or s.shape.is_mla or flash_attn_version(s.gpu_architecture) != 3 \
                or unsplit_attention(s.shape, model, s.k_cache_dtype) \
                or flash_attn_mla_decode(s.shape, model, s.k_cache_dtype, s.gpu_architecture):
            continue
        c = graph_captures(s.shape, model, 1, range(s.shape.num_layers), s.max_num_seqs, s.max_num_batched_tokens,
                           s.cudagraph_capture_sizes, s.max_cudagraph_capture_size)
        if len(c.full) < 2:
            continue
        copy = split_kv_accumulator_bytes(s.shape, model, 1, c.full[-2], s.k_cache_dtype, s.gpu_architecture)
        full = (sum(split_kv_accumulator_bytes(s.shape, model, 1, b, s.k_cache_dtype, s.gpu_architecture)
                    for b in c.full[-2:]) + (len(c.full) - 1) * model.v2_full_graph_floor_bytes)
        rows.append((start.id, (len(c.piecewise) - 1) * c.splitting_layers, probed[start.id] - full,
                     -samples[start.id][1] > SPLIT_RELEASE_COPIES * copy))
    one = [r for r in rows if not r[3]]
    if len(one) < 2:
        return {}
    a = np.column_stack([np.ones(len(one)), np.array([r[1] for r in one], float)])
    base, per_graph_layer = np.linalg.lstsq(a, np.array([r[2] for r in one], float), rcond=None)[0]
    return {"base_bytes": int(round(base)), "per_graph_layer_bytes": int(round(per_graph_layer)),
            "starts": sorted(r[0] for r in one),
            "above_fit_bytes": {r[0]: int(round(r[2] - base - per_graph_layer * r[1])) for r in rows}}


def _probed_samples() -> dict[str, list[int]]:
    import json

    return {r["id"]: r["samples_bytes"] for r in json.loads((CORPUS / GRAPH_SAMPLES).read_text())["starts"]
            if len(r["samples_bytes"]) == 2}


def write_v2_flash_attn_mla(base: int, per_graph_layer: int, ids: list[str]) -> None:
    def change(data: dict) -> None:
        data["cuda_graph_estimate"]["v2_mla_piecewise_base_bytes"] = base
        data["cuda_graph_estimate"]["v2_mla_piecewise_graph_layer_bytes"] = per_graph_layer
        data["sources"]["cuda_graph_estimate.v2_mla_piecewise"] = (
            "scripts/fit_vllm_terms.py --write (fit_v2_flash_attn_mla): V2's estimate where the decode runs "
            "FLASH_ATTN_MLA, less its FULL parts from source, as base + figure x (PIECEWISE graphs - 1) x attention "
            "layers, least squares over " + ", ".join(ids) + " (the estimate printed, or probed exactly by "
            "measure/graph_samples.py: tests/fixtures/vllm-starts/" + GRAPH_SAMPLES + "); "
            + ", ".join(sorted(SPLIT_BLOCK_STARTS)) + " kept out, whose warm-up released two copies")

    _edit_release(LOGIT_FILE, change)


def write_v2_graph_per_layer(per_layer: int, ids: list[str], unsplit_per_layer: int,
                             unsplit_ids: list[str]) -> None:
    """V2's graph estimate above the V1 model per layer, and where the decode attention runs unsplit (if any start
    had one), into the release file in one edit, naming the starts of each."""
    def change(data: dict) -> None:
        data["cuda_graph_estimate"]["v2_per_layer_bytes"] = per_layer
        data["sources"]["cuda_graph_estimate.v2_per_layer"] = (
            "scripts/fit_vllm_terms.py --write: Model Runner V2's estimate (0.29+, v1/worker/gpu/cudagraph_utils.py "
            "profile_cudagraph_memory: a throwaway KV cache and pool, FULL graphs extrapolated from samples) printed "
            "as 'CUDA graph pool memory: ... (estimated)', less the V1 runner's model, per layer, least squares over "
            + ", ".join(ids))
        if unsplit_ids:
            data["cuda_graph_estimate"]["unsplit_v2_per_layer_bytes"] = unsplit_per_layer
            data["sources"]["cuda_graph_estimate.unsplit_v2_per_layer"] = (
                "scripts/fit_vllm_terms.py --write: as v2_per_layer, over the starts whose decode attention runs "
                "its own way (sizing/engines/cudagraphs.py own_decode_scratch): " + ", ".join(unsplit_ids) + ". Held from "
                "outside it to the servers measure/serving started with the per-token-head formats "
                "(tests/test_serving_server_logs.py)")

    _edit_release(LOGIT_FILE, change)

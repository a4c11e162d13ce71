"""vLLM 0.33.0's Model Runner V2 CUDA-graph estimate, taken apart on real starts (measure/graph_samples.py printed its
parts; tests/fixtures/vllm-starts/graph-samples-0.33-h200.json): kvsize's capture counts against the engine's, and
the warm-up accumulators its second FULL sample releases against kvsize's figure for them."""

import json
import re
from pathlib import Path

import pytest

from sizing.capacity.scenario import built_shape, with_engine_defaults
from sizing.engines import get_engine
from sizing.engines.cudagraphs import flash_attn_mla_accumulator_bytes, graph_captures, split_kv_accumulator_bytes
from sizing.evidence.starts import planned_scenario

ROOT = Path(__file__).resolve().parent.parent
STARTS = ROOT / "tests" / "fixtures" / "vllm-starts"
SAMPLES = json.loads((STARTS / "graph-samples-0.33-h200.json").read_text())["starts"]
PLAN = {f"h200-{p['id']}": p for batch in ("mla-graphs-0.33", "mla-graphs-check-0.33", "graphs-edge-0.33",
                                                            "dense-probe-0.33", "small-pool-0.33", "small-pool-b-0.33")
        for p in json.loads((STARTS / "predictions" / f"{batch}-plan.json").read_text())}
PROBE = re.compile(r"KVSIZE-GRAPH-SAMPLES measured=(-?\d+) samples=\[(-?\d+), (-?\d+)\] full_graphs=(\d+) "
                   r"piecewise_graphs=(\d+)")
# the starts where the second sample released two copies: PyTorch's allocator split the freed accumulator block and
# cudaMalloc'd another (1,340,080,128 B printed against 650,117,120 for one copy); GLM-4.7-Flash at 1,024 and 512
# sequences capture the same graphs (up to 512 requests) and printed the same line
SPLIT_BLOCK = {"h200-0.33.0-glm-4.7-flash", "h200-0.33.0-glm-4.7-flash-s512"}
# GLM-4.7-Flash at 384 sequences split otherwise: its first sample released one copy (524,288,000 B) and its second
# two (983,564,288 B against 492,175,360 for one), three where the others release one
SPLIT_BLOCK_384 = "h200-0.33.0-glm-4.7-flash-s384"
# the same split under FlashAttention 3 (small-pool-0.33): the first sample released one copy of the accumulators and
# the second two (Gemma-3-27B 287 and 541 MB against 260 for one; Llama-3.1-70B with fp8 weights 575 and 1,080
# against 520; Qwen3-30B-A3B at 0.5 268 and 518 against 260), where the same models' other starts release one
SPLIT_BLOCK_FA3 = {"h200-0.33.0-gemma-3-27b-it-text-u45", "h200-0.33.0-gemma-3-27b-it-text-u45-l8k",
                   "h200-0.33.0-llama-3.1-70b-fp8w-u60", "h200-0.33.0-qwen3-30b-a3b-u50"}
FA3_SPLIT_GRAPHS = ("FlashAttention 3's V2 estimate where the allocator split the freed accumulator block "
                    "(SPLIT_BLOCK_FA3): kvsize's per-layer V2 figure gives Gemma-3-27B 1.48 GiB (1.42 probed), "
                    "Llama-3.1-70B with fp8 weights 2.08 (2.25) and Qwen3-30B-A3B at 0.5 1.20 (1.23): the split's "
                    "second copy is not modelled for FlashAttention 3, whose estimate kvsize does not take apart; "
                    "KV -0.62%, +1.90% and within 1%")
# MiniCPM3-4B decodes with FLASH_ATTN (vLLM builds it without an MLA cache), whose V2 part kvsize does not take apart:
# its estimate is the V1 model plus a per-layer figure fitted on the dense models, 0.41 GiB over at 62 layers
MINICPM3_V2_GRAPHS = ("MiniCPM3-4B (62 layers, FLASH_ATTN) on 0.33.0: V2's estimate is 1.11 GiB (the probe's parts "
                      "give it to the byte) where kvsize's V1 model and per-layer V2 figure give 1.52: its part above "
                      "the V1 model is 0.36 GB, 5.8 MB a layer against the dense models' 11-16 (scripts/"
                      "vllm_fit_corpus.py HELD_OUT); KV tokens -0.13% and -0.30%, both predicted before they ran")


def _scenario(start_id: str):
    p = PLAN[start_id]
    return with_engine_defaults(planned_scenario(ROOT / p["config"], "h200", p["release"], p["args"], p["context"]))


def _terms(s):
    model = get_engine(s.engine).release.cuda_graph_estimate
    layers = range(s.shape.num_layers)
    return model, layers


def _captures(row):
    """The start's scenario, its model terms and kvsize's CUDA-graph captures of it."""
    s = _scenario(row["id"])
    model, layers = _terms(s)
    return s, model, graph_captures(s.shape, model, s.tensor_parallel_size, layers, s.max_num_seqs,
                                    s.max_num_batched_tokens, s.cudagraph_capture_sizes, s.max_cudagraph_capture_size)


@pytest.mark.parametrize("row", [r for r in SAMPLES if r["source"] == "log"], ids=lambda r: r["id"])
def test_the_fixture_is_what_the_log_printed(row):
    m = PROBE.search((STARTS / "logs" / f"{row['id']}.log").read_text(errors="replace"))
    assert m is not None
    assert [int(m[1]), [int(m[2]), int(m[3])], int(m[4]), int(m[5])] == [
        row["measured_bytes"], row["samples_bytes"], row["full_graphs"], row["piecewise_graphs"]]


@pytest.mark.parametrize("row", SAMPLES, ids=lambda r: r["id"])
def test_kvsize_captures_as_many_graphs_of_each_mode(row):
    _, _, c = _captures(row)
    assert (len(c.full), len(c.piecewise)) == (row["full_graphs"], row["piecewise_graphs"])


UNSPLIT_RELEASE = ("gpt-oss-120b at 0.6 (attention sinks: the decode runs unsplit and holds no split "
                   "accumulators), yet its second sample released 120 MB and its first 107: what that warm-up frees "
                   "is not modelled; its estimate is within 0.02 GiB of kvsize's")


def _release_rows():
    return [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=UNSPLIT_RELEASE))
            if r["id"] == "h200-0.33.0-gpt-oss-120b-u60" else r for r in SAMPLES]


@pytest.mark.parametrize("row", _release_rows(), ids=lambda r: r["id"])
def test_the_second_sample_releases_the_warm_up_accumulators(row):
    s, model, c = _captures(row)
    built = built_shape(s)
    # FLASH_ATTN_MLA's accumulators (kv_lora_rank wide) or, where vLLM builds no MLA cache, FlashAttention 3's
    one_copy = (flash_attn_mla_accumulator_bytes(s.shape, model, s.tensor_parallel_size, c.full[-2]) if built.is_mla
                else split_kv_accumulator_bytes(built, model, s.tensor_parallel_size, c.full[-2], s.k_cache_dtype,
                                                s.gpu_architecture))
    released = -row["samples_bytes"][1]
    copies = 2 if row["id"] in SPLIT_BLOCK | SPLIT_BLOCK_FA3 or row["id"] == SPLIT_BLOCK_384 else 1
    # the warm-up frees its other transients beside the accumulators: 0 to +44 MB here, under one copy's size on
    # every start, so the bound tells one copy from two
    slack = 48 << 20
    assert slack < one_copy
    assert copies * one_copy - (4 << 20) <= released <= copies * one_copy + slack


DENSE_V2_GRAPHS = ("dense-probe-0.33 on 0.33.0 (FLASH_ATTN): the V1 model plus the per-layer V2 figure gives "
                   "Qwen2.5-7B-Instruct 0.80 GiB (0.83 printed), Llama-3.2-1B 0.46 (0.52), Phi-3-mini-128k 0.85 "
                   "(0.78) and Gemma-3-1B 0.64 (0.46), 35-186 MB from the probe's figure; their second samples "
                   "release one copy of FlashAttention 3's split accumulators, as FLASH_ATTN_MLA's do, so the "
                   "estimate can be taken apart the same way (not yet done); KV tokens within 0.12%, predicted "
                   "before they ran")


def _estimate_rows():
    named = {"h200-0.33.0-minicpm3-4b": MINICPM3_V2_GRAPHS, "h200-0.33.0-minicpm3-4b-s512": MINICPM3_V2_GRAPHS,
             **{f"h200-0.33.0-{m}": DENSE_V2_GRAPHS for m in ("qwen2.5-7b-instruct", "llama-3.2-1b-instruct",
                                                              "phi-3-mini-128k-instruct", "gemma-3-1b-it")},
             **{sid: FA3_SPLIT_GRAPHS for sid in SPLIT_BLOCK_FA3},
             SPLIT_BLOCK_384: "GLM-4.7-Flash at 384 sequences: the allocator's split held one more copy of the "
                              "accumulators, 0.42 GiB above kvsize's estimate (one copy at 384 requests: 0.47), "
                              "within the 0.93 GiB its answer names as a risk; KV tokens +0.97%, predicted before "
                              "it ran"}
    return [pytest.param(r, marks=pytest.mark.xfail(strict=True, reason=named[r["id"]])) if r["id"] in named else r
            for r in SAMPLES]


@pytest.mark.parametrize("row", _estimate_rows(), ids=lambda r: r["id"])
def test_kvsize_makes_the_estimate_the_probe_shows(row):
    # vLLM's estimate from its printed parts (measured - s1 + (FULL graphs - 1) x max(s1, 1 MiB)) against kvsize's
    # CUDA-graph term: within 0.03 GiB, the split-block start apart, where it holds both FULL warm-ups' accumulators
    # once more (split_block_risk_bytes)
    from sizing.capacity.estimate import estimate
    from sizing.engines.cudagraphs import split_block_risk_bytes

    from measure.graph_samples import v2_estimate_bytes

    engine = v2_estimate_bytes(row)
    s = _scenario(row["id"])
    model, layers = _terms(s)
    kvsize = estimate(s).breakdown.cuda_graph_bytes
    if row["id"] in SPLIT_BLOCK:
        kvsize += split_block_risk_bytes(s.shape, model, s.cudagraph_mode, s.tensor_parallel_size, layers,
                                         s.max_num_seqs, s.max_num_batched_tokens, s.cudagraph_capture_sizes,
                                         s.max_cudagraph_capture_size, s.k_cache_dtype, s.gpu_architecture)
    assert abs(kvsize - engine) < 0.03 * (1 << 30)


def test_the_answer_names_the_second_copy_where_it_may_be_added_back():
    from sizing.capacity.estimate import estimate

    s = _scenario("h200-0.33.0-glm-4.7-flash")
    note = [w for w in estimate(s).warnings if "allocator split" in w]
    # 32 splits x (512 + 496 requests, the two largest FULL graphs) x 20 heads x 512 latent x 4 B = 1,321,205,760 B
    assert len(note) == 1 and "up to 1.23 GiB smaller here" in note[0]
    # FlashMLA's dense decode (an fp8 MLA cache) releases no such accumulators
    fp8 = planned_scenario(ROOT / PLAN["h200-0.33.0-glm-4.7-flash"]["config"], "h200", "0.33.0",
                           {"max_model_len": 32768, "kv_cache_dtype": "fp8"})
    assert not [w for w in estimate(with_engine_defaults(fp8)).warnings if "allocator split" in w]


def test_the_answer_names_flash_attention_3s_second_copy():
    from sizing.capacity.estimate import estimate

    # FlashAttention 3's split (SPLIT_BLOCK_FA3) held about one more copy of the largest FULL batch's accumulators:
    # 32 splits x 512 requests x 64 query heads x 128 values x 4 B = 536,870,912 B (0.50 GiB) for Llama-3.1-70B
    note = [w for w in estimate(_scenario("h200-0.33.0-llama-3.1-70b-fp8w-u60")).warnings if "allocator split" in w]
    assert len(note) == 1 and "up to 0.50 GiB smaller here" in note[0]
    # gpt-oss's attention sinks run the decode unsplit: no accumulators, no note
    assert not [w for w in estimate(_scenario("h200-0.33.0-gpt-oss-120b-u60")).warnings if "allocator split" in w]


def test_flash_attention_3s_estimate_part_by_part_leaves_the_split_copy():
    # docs/formulas.md 'CUDA graphs': FA3's V2 estimate taken apart as FLASH_ATTN_MLA's is fits the starts whose second
    # sample released one copy within 0.03 GiB, and the split starts stand about one copy of the largest FULL
    # batch's accumulators above it: the mechanism the answer names (split_block_risk_bytes) instead of holding it
    import importlib.util

    spec = importlib.util.spec_from_file_location("fit_vllm_graphs", ROOT / "scripts" / "fit_vllm_graphs.py")
    fit = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fit)
    result = fit.fa3_part_by_part()
    assert len(result["starts"]) >= 6
    for sid, above in result["above_fit_bytes"].items():
        if sid in SPLIT_BLOCK_FA3:
            s, model, c = _captures(next(r for r in SAMPLES if r["id"] == sid))
            copy = split_kv_accumulator_bytes(built_shape(s), model, 1, c.full[-1], s.k_cache_dtype,
                                              s.gpu_architecture)
            assert 0.7 * copy < above < 1.2 * copy, sid
        else:
            assert abs(above) < 0.03 * (1 << 30), sid

"""The KV read of a format vLLM decodes in whole-request programs (TRITON_ATTN, the only backend of its per-token-head
integer formats): waves of as many programs as the GPU runs at once, and the split cache of a few requests
(sizing/planners/step_model.py, sizing/planners/graph_steps.py; docs/formulas.md)."""

import json

from dataclasses import replace

import pytest

from conftest import ROOT
from helpers import scenario
from sizing.planners.graph_steps import SPLIT_KV_GRID, split_kv_requests
from sizing.planners.serving import serving_replica
from sizing.planners.step_model import StepOverhead, step_overhead
from sizing.profiles import gpu_profile, measured_efficiency


def _replica(model="llama-3.1-8b", gpu="h200", fmt="int4_per_token_head", tp=1, **kw):
    g = gpu_profile(gpu)
    s = scenario(model, gpu, max_model_len=32768, memory_fraction=0.9, max_num_batched_tokens=8192,
                 max_num_seqs=1024, k_cache_dtype=fmt, v_cache_dtype=fmt, tensor_parallel_size=tp, **kw)
    return serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors, measured_efficiency())


def _kv(model, decoding: int, tokens: int = 8128, chunks=()) -> float:
    """The KV read's seconds in a step: the step less the same step reading no cache."""
    return (model.gpu_seconds(decoding, decoding * tokens, list(chunks))
            - model.gpu_seconds(decoding, decoding * 0, list(chunks)))


def test_the_split_threshold_is_vllms_grid_over_the_kv_heads_at_the_nearest_capture_size():
    fit = step_overhead()
    per_sm = fit.engine_programs_per_sm["int4_per_token_head"]
    llama, _ = _replica()
    assert llama.kv_heads_per_rank == 8 and llama.split_kv_requests == SPLIT_KV_GRID // 8 == 16
    assert llama.kv_wave_programs == gpu_profile("h200").multiprocessors * per_sm
    moe, _ = _replica("qwen3-30b-a3b")  # 4 KV heads: 32 requests, a capture size
    assert moe.split_kv_requests == 32
    # Llama-3.1-70B at TP 2: 4 heads a rank; on an H100 (132 SMs too) the same threshold, the same wave
    tp2, _ = _replica("llama-3.1-70b", "h100-sxm", tp=2)
    assert tp2.kv_heads_per_rank == 4 and tp2.split_kv_requests == 32
    # another GPU's SMs make another wave
    l40s, _ = _replica(gpu="l40s")
    assert l40s.kv_wave_programs == gpu_profile("l40s").multiprocessors * per_sm != llama.kv_wave_programs


def test_the_threshold_moves_to_the_nearest_capture_size_only_under_full_graphs():
    class Engine:
        name, cuda_graphs = "vllm", True

    from sizing.capacity.estimate import estimate

    e = estimate(scenario("llama-3.1-8b", "h200", max_model_len=32768, k_cache_dtype="int8_per_token_head",
                          v_cache_dtype="int8_per_token_head"))
    # 128 // 3 KV heads = 42: graphs are captured at 40 and 48, so 40; without graphs the grid's own 42
    assert split_kv_requests(e.scenario, e.engine, 3) == 40
    eager = estimate(scenario("llama-3.1-8b", "h200", max_model_len=32768, cudagraph_mode="NONE"))
    assert split_kv_requests(eager.scenario, eager.engine, 3) == 42


def test_a_partly_filled_wave_reads_as_long_as_a_full_one():
    # the waves alone: a program's pace (tests/test_program_pace.py) also bounds a lone wave's read
    model = replace(_replica()[0], kv_whole_pace_tokens_per_s=0.0)
    wave = model.kv_wave_programs // model.kv_heads_per_rank  # requests whose programs fill one wave (49 of 8 heads)
    one_over = wave + 1  # two waves, the second holding one request's programs
    two_full = 2 * model.kv_wave_programs // model.kv_heads_per_rank
    assert _kv(model, one_over) == pytest.approx(_kv(model, two_full) * one_over / two_full
                                                * model.kv_kernel_factor(one_over, False)[0], rel=1e-9)
    assert _kv(model, one_over) == pytest.approx(_kv(model, two_full), rel=0.03)  # the same two waves
    assert _kv(model, one_over) > 1.9 * _kv(model, wave)


def test_a_few_requests_split_their_cache_and_read_at_the_split_share():
    fit = step_overhead()
    model, _ = _replica(fmt="int8_per_token_head")
    ratio = fit.engine_kv_efficiency["int8_per_token_head"] / fit.engine_split_kv_efficiency["int8_per_token_head"]
    assert model.kv_kernel_factor(16, False) == (pytest.approx(ratio), True)
    assert model.kv_kernel_factor(17, False)[1] is False
    # a step with a prompt chunk runs the whole-request grid whatever its requests (vLLM: max_seqlen_q > 1)
    assert model.kv_kernel_factor(16, True)[1] is False


def test_formats_of_other_kernels_read_linearly():
    bf16, _ = _replica(fmt="auto")
    fp8, _ = _replica(fmt="fp8")
    for model in (bf16, fp8):
        assert model.kv_wave_programs == 0 and model.split_kv_requests == 0
        assert model.kv_kernel_factor(50, False) == (1.0, False)
        assert _kv(model, 50) == pytest.approx(_kv(model, 100) / 2, rel=0.02)


def test_fp8_per_token_head_reads_in_int8s_waves():
    int8, _ = _replica(fmt="int8_per_token_head")
    twin, _ = _replica(fmt="fp8_per_token_head")
    assert (twin.kv_wave_programs, twin.split_kv_requests, twin.split_kv_time_ratio) == (
        int8.kv_wave_programs, int8.split_kv_requests, int8.split_kv_time_ratio)


@pytest.mark.parametrize("change, message", [
    ({"engine_programs_per_sm": {"int4_per_token_head": 0}}, "engine_programs_per_sm int4_per_token_head must be"),
    ({"engine_programs_per_sm": {"bf16": 3}}, "engine_programs_per_sm bf16: needs its"),
    ({"engine_split_kv_efficiency": {"int4_per_token_head": 0.07, "int8_per_token_head": 0.2, "bf16": 0.5}},
     "every format needs its"),
    ({"engine_split_kv_efficiency": {"int4_per_token_head": 1.5, "int8_per_token_head": 0.2}},
     "engine_split_kv_efficiency int4_per_token_head must be in"),
])
def test_a_wave_term_without_its_partner_or_out_of_range_is_refused(change, message):
    raw = json.loads((ROOT / "profiles" / "serving.json").read_text())
    raw.update(change)
    with pytest.raises(ValueError, match=message):
        StepOverhead.model_validate(raw)

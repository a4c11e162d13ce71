"""When the serving simulation's tokens reach the client (sizing/planners/serving.py): with async scheduling the
engine launches step N+1 before it processes step N's output, so a token is seen when the step after its own ends;
a release without async scheduling hands it over at the end of its own step."""

from dataclasses import replace

import pytest

from helpers import scenario
from sizing.planners.serving import Load, serving_replica, simulate
from sizing.profiles import gpu_profile, measured_efficiency


def _replica(engine="vllm@0.33.0"):
    g = gpu_profile("h200")
    s = scenario("llama-3.1-8b", "h200", engine=engine, max_model_len=32768, memory_fraction=0.9,
                 max_num_batched_tokens=8192, max_num_seqs=1024)
    model, engine = serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors, measured_efficiency())
    # the front end's handling of each request, a constant on every TTFT, is held apart (test_serving_sim)
    return replace(model, request_handling_s=0.0, prompt_in_s_per_token=0.0, first_token_s_per_prompt_token=0.0), engine


def test_async_scheduling_releases_delay_the_output_one_step_and_older_ones_do_not():
    # vLLM 0.26 and later keep one batch in flight beyond the pipeline stages (async scheduling, on by default)
    assert _replica("vllm@0.33.0")[1].output_delay_steps == 1
    assert _replica("vllm@0.26.0")[1].output_delay_steps == 1
    assert _replica("vllm@0.25.0")[1].output_delay_steps == 0


def test_a_bursts_first_token_lands_one_full_prefill_step_late():
    model, engine = _replica()
    load = Load(1000, 16, 16, concurrency=16)  # 16 prompts of 1,000 tokens sent together
    delayed, prompt = simulate(model, engine, load), simulate(model, replace(engine, output_delay_steps=0), load)
    # the first eight prompts (8,000 of the 8,192-token budget, and 192 tokens of the ninth) share the first step,
    # the other eight the second; without the delay their first tokens come at the end of those steps, with it at
    # the end of the step after: the first eight after the second step, a whole prefill step late
    first = model.seconds(0, 0, [(0, 1000)] * 8 + [(0, 192)])
    second = model.seconds(8, 8 * 1001, [(192, 1000)] + [(0, 1000)] * 7)
    third = model.seconds(16, 8 * 1002 + 8 * 1001, [])
    assert prompt.ttft_ms[50] == pytest.approx((first + (first + second)) / 2 * 1e3)
    assert delayed.ttft_ms[50] == pytest.approx(((first + second) + (first + second + third)) / 2 * 1e3)
    assert second > 0.8 * first  # a prefill step, not a decode step


def test_the_delay_moves_every_token_together_so_the_gaps_keep_their_length():
    model, engine = _replica()
    load = Load(1000, 64, 1, concurrency=1)
    delayed, prompt = simulate(model, engine, load), simulate(model, replace(engine, output_delay_steps=0), load)
    assert delayed.itl_ms[50] == pytest.approx(prompt.itl_ms[50], rel=0.02)
    assert delayed.ttft_ms[50] > prompt.ttft_ms[50]
    # the last token is sampled by the last step: no step follows, so it is not delayed
    assert delayed.duration_s == pytest.approx(prompt.duration_s)


def test_an_older_release_hands_each_token_over_at_the_end_of_its_own_step():
    model, engine = _replica("vllm@0.25.0")
    served = simulate(model, engine, Load(1000, 64, 2, concurrency=1))
    assert served.ttft_ms[50] == pytest.approx(model.seconds(0, 0, [(0, 1000)]) * 1e3)

"""The front end's handling of a request (sizing/planners/serving.py at_engine, _deliver): a part the same for every
request and a part per prompt token, on the way in and on the first token's way back, read off the step traces of requests alone on the engine (measure/steps.py prompt_handling_rows,
scripts/fit_serving_terms.py fit_handling)."""

import sys
from dataclasses import replace

import pytest

from conftest import ROOT
from measure.steps import prompt_handling_rows, traced_servers
from sizing.planners.serving import Load, serving_replica, simulate
from sizing.planners.step_model import step_overhead
from sizing.profiles import gpu_profile, measured_efficiency
from helpers import scenario

sys.path.insert(0, str(ROOT / "scripts"))


def _replica():
    g = gpu_profile("h200")
    s = scenario("qwen3-8b", "h200", max_model_len=32768, memory_fraction=0.9, max_num_batched_tokens=8192,
                 max_num_seqs=1024)
    return serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors, measured_efficiency())


def test_the_traces_time_outside_the_steps_grows_with_the_prompt():
    from fit_serving_handling import HANDLING_BATCHES

    rows = [r for server in traced_servers() if server["batch"] in HANDLING_BATCHES
            for r in prompt_handling_rows(server)]
    assert len(rows) >= 30 and {r["prompt"] for r in rows} == {2000, 8000}
    by_length = {n: sorted(r["first_token_s"] for r in rows if r["prompt"] == n) for n in (2000, 8000)}
    # b22-b28: 3-14 ms outside the steps at 2,000 tokens, 18-50 ms at 8,000 (docs/formulas.md, 'handling')
    assert max(by_length[2000]) < 0.015 and min(by_length[8000]) > 0.015
    outside = {n: sorted(r["outside_s"] for r in rows if r["prompt"] == n) for n in (2000, 8000)}
    assert outside[8000][len(outside[8000]) // 2] > outside[2000][len(outside[2000]) // 2] + 0.005


def test_the_profiles_handling_is_what_the_traces_give():
    from fit_serving_handling import fit_handling

    fitted, points = fit_handling()
    terms = step_overhead()
    assert fitted == {"request_handling_s": terms.request_handling_s,
                      "prompt_in_s_per_token": terms.prompt_in_s_per_token,
                      "first_token_s_per_prompt_token": terms.first_token_s_per_prompt_token}
    assert set(points) <= set(terms.fitted_on)
    # about 1.6 us a prompt token on the way in and 2.5 more on the first token's way back
    assert 1e-6 < terms.prompt_in_s_per_token < 3e-6 and 1e-6 < terms.first_token_s_per_prompt_token < 4e-6


def test_a_longer_prompt_waits_longer_outside_the_engine():
    model, engine = _replica()
    bare = replace(model, prompt_in_s_per_token=0.0, first_token_s_per_prompt_token=0.0)
    for tokens in (2000, 16000):
        with_it = simulate(model, engine, Load(tokens, 32, 3, concurrency=1)).ttft_ms[50]
        without = simulate(bare, engine, Load(tokens, 32, 3, concurrency=1)).ttft_ms[50]
        per_token = model.prompt_in_s_per_token + model.first_token_s_per_prompt_token
        assert with_it - without == pytest.approx(1e3 * per_token * tokens, rel=0.05)


def test_an_api_server_hands_a_burst_over_one_request_after_another():
    model, engine = _replica()
    slow = replace(model, request_handling_s=0.01, prompt_in_s_per_token=0.0, first_token_s_per_prompt_token=0.0)

    def first_token_ms(api_servers: int, request: int) -> float:
        # eight 200-token prompts sent together, a 10 ms way in each; the first token of one of them
        scheduler = replace(engine, api_servers=api_servers)
        load = Load(200, 16, 8, concurrency=8, measured=(request, request + 1))
        return simulate(slow, scheduler, load).ttft_ms[50]

    one, four, eight = ([first_token_ms(n, request) for request in (0, 7)] for n in (1, 4, 8))
    # one API server takes them one after another, the last 70 ms after the first: the first prompt is alone in the
    # engine's first step, sooner than any when eight take them together, in one step
    assert one[1] - one[0] > 60 and one[0] < eight[0] == pytest.approx(eight[1])
    # four take them in two rounds of 10 ms: the first four share the first step, the last comes sooner than with one
    assert one[0] < four[0] < four[1] < one[1]


def test_the_engines_first_step_of_a_burst_carries_its_first_prompt_alone():
    # b32's bursts of 4 and 16 prompts of 200-300 tokens sent together: the first request reached an idle engine
    # before the others, which came in the next step (the one API server took them one after another)
    from measure.steps import point_windows, server_trace

    seen = 0
    for server in traced_servers():
        if server["batch"] != "b32-piecewise-prompts":
            continue
        steps = server_trace(server)
        for t0, t1, point in point_windows(server):
            if point.get("concurrency") not in (4, 16):
                continue
            burst = [s for s in steps if t0 <= s.scheduled_at <= t1][:3]
            assert burst[0].prompt_requests == 1 and burst[0].decoding == 0, point["id"]
            # the rest came in the next step or two (a budget of 8,192 tokens holds 16 of 300 tokens and more)
            assert burst[1].prompt_requests + burst[2].prompt_requests == point["concurrency"] - 1, point["id"]
            seen += 1
    assert seen == 14


def test_a_prefilled_request_pays_no_handling_on_the_decode_replica():
    model, engine = _replica()
    bare = replace(model, request_handling_s=0.0, prompt_in_s_per_token=0.0, first_token_s_per_prompt_token=0.0)
    load = Load(8000, 64, 16, concurrency=16, prefilled=True)
    assert simulate(model, engine, load).ttft_ms[50] == pytest.approx(simulate(bare, engine, load).ttft_ms[50])

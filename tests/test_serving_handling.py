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


def test_each_request_of_a_burst_pays_its_own_way_in():
    model, engine = _replica()
    at_once = replace(model, prompt_in_s_per_token=0.0)

    def first_token_ms(m, request: int) -> float:
        # thirty-two 1,000-token prompts sent together; the figures of one of them
        return simulate(m, engine, Load(1000, 64, 32, concurrency=32, measured=(request, request + 1))).ttft_ms[50]

    # every prompt reaches the engine its own way in later, none queued behind another's (whether an API server
    # takes a burst one prompt after another is what batch b30 was planned to show): the burst moves as one
    way_in_ms = 1e3 * 1000 * model.prompt_in_s_per_token
    for request in (0, 31):
        assert first_token_ms(model, request) == pytest.approx(first_token_ms(at_once, request) + way_in_ms, rel=0.02)


def test_a_prefilled_request_pays_no_handling_on_the_decode_replica():
    model, engine = _replica()
    bare = replace(model, request_handling_s=0.0, prompt_in_s_per_token=0.0, first_token_s_per_prompt_token=0.0)
    load = Load(8000, 64, 16, concurrency=16, prefilled=True)
    assert simulate(model, engine, load).ttft_ms[50] == pytest.approx(simulate(bare, engine, load).ttft_ms[50])

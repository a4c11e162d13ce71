"""The front end's handling of a request (sizing/planners/front_end.py, serving.py _deliver): a part the same for
every request and a part per prompt token, on the way in and on the first token's way back, read off the step traces of
requests alone on the engine (measure/steps.py prompt_handling_rows, scripts/fit_serving_handling.py fit_handling), and
the part an API server's loop spends before the tokenizer, read off the traces of bursts (measure/first_token.py
burst_rows)."""

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
    assert fitted == {"request_handling_s": terms.request_handling_s, "request_parse_s": terms.request_parse_s,
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


def test_an_api_server_reads_a_whole_burst_before_it_hands_the_first_request_over():
    model, engine = _replica()
    slow = replace(model, request_handling_s=0.01, request_parse_s=0.008, prompt_in_s_per_token=0.0,
                   first_token_s_per_prompt_token=0.0)

    def first_token_ms(api_servers: int, request: int) -> float:
        # eight 200-token prompts sent together, 8 ms of each one's 10 ms way in before the tokenizer
        scheduler = replace(engine, api_servers=api_servers)
        load = Load(200, 16, 8, concurrency=8, measured=(request, request + 1))
        return simulate(slow, scheduler, load).ttft_ms[50]

    lone = simulate(slow, engine, Load(200, 16, 1, concurrency=1)).ttft_ms[50]
    one, four, eight = ([first_token_ms(n, request) for request in (0, 7)] for n in (1, 4, 8))
    # one API server's loop reads all eight (64 ms) before it hands the first over, 56 ms later than a request alone,
    # alone in the engine's first step; the rest follow 2 ms apart (their hand-overs), in the next step, whose end
    # lets the first one's token out (async scheduling)
    assert one[0] - lone > 7 * 8 and one[0] < one[1]
    # eight servers read one each: every request is handed over 10 ms after it was sent, all in one step
    assert eight[0] == pytest.approx(eight[1]) and eight[0] < one[0]
    # four read two each: the first is handed over after two reads, sooner than with one server
    assert eight[0] < four[0] < one[0]


def test_a_bursts_first_request_waits_for_the_others_reads():
    # the first-sent request of a burst under one API server reached the engine later than a request alone, by more
    # the more requests were sent with it (front_end.py: the loop reads them before it hands the first over): on each
    # server, a burst of 32 or more 1,000-token prompts waited longer than one of 8-16, and b38's bursts alone of 256
    # longer than of 32 (80-86 ms against 19-29). How much a request adds is the host's: 59-74 ms at 32 on b35's and
    # b36's hosts (about 2 ms each); past 32 it varies (b37's closed loops: 31-71 ms at 32-128)
    from fit_serving_handling import fit_parse
    from measure.first_token import burst_rows

    servers = 0
    for server in traced_servers():
        rows = [r for r in burst_rows(server) if r["prompt"] == 1000]
        small = [r["extra_s"] for r in rows if r["together"] <= 16]
        large = [r["extra_s"] for r in rows if r["together"] >= 32]
        if small and large:
            assert max(small) + 0.005 < min(large), server["tag"]
            servers += 1
        alone = {r["together"]: r["extra_s"] for r in rows if server["batch"] == "b38-burst-sizes"}
        if alone:
            assert alone[256] > alone[32] + 0.04, server["tag"]
    assert servers >= 8
    parse, points = fit_parse()
    assert parse == step_overhead().request_parse_s and set(points) <= set(step_overhead().fitted_on)
    assert 0.001 < parse < step_overhead().request_handling_s


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

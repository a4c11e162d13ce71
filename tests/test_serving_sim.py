"""The serving simulation (sizing/planners/serving.py): its scheduler against cases worked by hand, its fitted
constants against the fit script, and its figures against the real server on the points it was fitted on."""

import json
import statistics
import math
import re
import subprocess
import sys
from dataclasses import replace

import pytest

from helpers import scenario
from sizing.errors import KvsizeError
from sizing.planners.serving import Load, Scheduler, serving_replica, simulate
from sizing.profiles import gpu_profile, measured_efficiency
from conftest import ROOT


def _replica(**kw):
    g = gpu_profile("h200")
    s = scenario("llama-3.1-8b", "h200", max_model_len=65536, memory_fraction=0.9, max_num_batched_tokens=8192,
                 max_num_seqs=1024, **kw)
    return serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors, measured_efficiency())


def test_one_request_alone_waits_one_prefill_and_then_one_decode_step_a_token():
    model, engine = _replica()
    served = simulate(model, engine, Load(1000, 64, 2, concurrency=1))
    prefill = model.seconds(0, 0, [(0, 1000)])
    # async scheduling (vLLM 0.33): the first token reaches the client once the next step, a decode, has run
    assert engine.output_delay_steps == 1
    # and the front end handles the request before the engine sees it
    assert served.ttft_ms[50] == pytest.approx((model.handling_seconds(1000) + prefill + model.seconds(1, 1001, []))
                                               * 1e3)
    # every later token is one decode step of one request, its cache 1,001 to 1,063 tokens long
    steps = [model.seconds(1, 1000 + k, []) for k in range(1, 64)]
    assert min(steps) * 1e3 <= served.itl_ms[50] <= max(steps) * 1e3
    assert served.preemptions == 0


def test_a_prompt_past_the_token_budget_is_prefilled_in_chunks():
    model, engine = _replica()
    served = simulate(model, engine, Load(20000, 8, 1, concurrency=1))
    # 20,000 tokens in chunks of 8,192: three steps before the first token
    chunks = [(0, 8192), (8192, 16384), (16384, 20000)]
    steps = sum(model.seconds(0, 0, [c]) for c in chunks) + model.seconds(1, 20001, [])  # and the step after
    assert served.ttft_ms[50] == pytest.approx((model.handling_seconds(20000) + steps) * 1e3)


def test_requests_that_arrive_together_wait_for_each_others_prefill():
    model, engine = _replica()
    served = simulate(model, engine, Load(8000, 4, 8, concurrency=8))
    # eight 8,000-token prompts share 8,192-token steps: the last first token comes about eight prefills in
    one = model.seconds(0, 0, [(0, 8000)])
    assert served.ttft_ms[99] > 6 * one * 1e3 and served.ttft_ms[50] > 3 * one * 1e3


def test_a_pool_too_small_for_the_load_preempts_and_still_finishes_every_request():
    model, engine = _replica()
    small = Scheduler(engine.max_num_batched_tokens, engine.max_num_seqs, engine.block_size, num_blocks=200)
    served = simulate(model, small, Load(1000, 600, 12, concurrency=6))
    assert served.preemptions > 0
    assert served.requests_per_s * served.duration_s == pytest.approx(12)


def test_an_open_loop_at_a_low_rate_queues_nothing():
    model, engine = _replica()
    served = simulate(model, engine, Load(1000, 32, 20, request_rate=0.5, seed=3))
    # its own prefill and, with async scheduling, the step after it: at most another prompt's
    assert served.ttft_ms[99] < (model.handling_seconds(1000) + 2.2 * model.seconds(1, 1000, [(0, 1000)])) * 1e3


@pytest.mark.parametrize("kw, needle", [
    (dict(concurrency=None, request_rate=None), "closed loop (concurrency) or an open loop"),
    (dict(concurrency=4, request_rate=2.0), "closed loop (concurrency) or an open loop"),
    (dict(concurrency=0), "concurrency must be at least 1"),
    (dict(request_rate=math.inf), "request rate must be a positive number"),
])
def test_a_load_that_is_not_one_is_refused_in_one_line(kw, needle):
    with pytest.raises(KvsizeError, match=re.escape(needle)):
        Load(1000, 16, 4, **kw)


def test_the_shipped_constants_are_the_fit():
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "fit_serving_terms.py"), "--check"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr


def test_on_the_points_it_was_fitted_on_the_median_gap_is_within_ten_percent():
    # one request in flight (the step terms): each point within 10%; the front end's points below; the traced
    # servers' points are fitted on their steps, not their gaps (test_the_traced_decode_steps_are_what_was_fitted)
    from measure.steps import traced_servers
    from sizing.evidence.serving import predict_point
    from sizing.planners.step_model import step_overhead

    points = {p["id"]: p for p in json.loads((ROOT / "measure" / "serving" / "points.json").read_text())["points"]}
    traced = {s["tag"] for s in traced_servers()}
    front, ones = [], 0
    for name in step_overhead().fitted_on:
        p = points[name]
        if p["batch"] == "b7-prefill-graphs" or p["server"] in traced:
            # b7: fitted on its TTFT alone (the eager step: test_serving_eager_steps)
            continue
        error = predict_point(p["settings"], ROOT).itl_ms[50] / p["measured"]["itl_p50_ms"] - 1
        if p["batch"] == "b8-frontend":
            front.append(error)
        elif p["settings"]["concurrency"] == 1:
            # a step at the host's side, its floor and one stream's work (Llama-3.2-1B: its two points' gaps are 1.68
            # and 2.30 ms, 37% apart, so one floor holds neither within 10%) is held within 20%; every step the GPU's
            # part sets within 10%
            host_ms = (step_overhead().step_floor_s + step_overhead().frontend_core_s_per_token) * 1e3
            floor_bound = predict_point(p["settings"], ROOT).itl_ms[50] <= host_ms + 1e-9
            assert abs(error) <= (0.20 if floor_bound else 0.10), name
            ones += 1
    assert ones >= 20
    # the front end's two parts (b8's Llama-3.2-1B at 64-512 in flight, one API server and four): within 10% in the
    # median and 11% at worst (four API servers at 128 in flight, 10.3% short)
    assert len(front) >= 8 and abs(statistics.median(front)) <= 0.10 and max(map(abs, front)) <= 0.11


def test_the_traced_decode_steps_are_what_was_fitted():
    # the engine's KV read per format and each request's cost a step are fitted on the step traces' decode-only
    # steps (Llama-3.1-8B in bf16 and fp8 KV at 1,000- and 8,000-token prompts, Qwen3-30B-A3B): every group of them
    # (one point, one count of requests decoding) is simulated within 10% of its median period, 3% in the median
    from helpers import load_script
    from measure.steps import decode_groups, gpu_paced_servers, server_settings
    from sizing.evidence.serving import point_replica
    from sizing.planners.step_model import step_overhead

    batches = load_script("fit_serving_terms").TRACE_FIT_BATCHES
    servers = gpu_paced_servers(batches)
    # the fit names the points of every server it read
    assert {p["id"] for s in servers for p in s["points"]} <= set(step_overhead().fitted_on)
    errors, formats = [], set()
    for server in servers:
        model, _ = point_replica(server_settings(server), ROOT)
        formats.add(model.kv_format)
        for g in decode_groups(server):
            simulated = model.decode_seconds(g["decoding"], g["decoding"] * g["cached"])
            errors.append(simulated / g["measured_s"] - 1)
    assert formats == {"bf16", "fp8_e4m3"} and len(errors) >= 50
    assert max(map(abs, errors)) <= 0.10 and statistics.median(map(abs, errors)) <= 0.03


def test_the_speed_accuracy_page_is_what_the_benchmark_prints():
    # docs/speed-accuracy.md is benchmarks/serving_accuracy.py's report of every point, to the byte
    from helpers import load_script

    bench = load_script("serving_accuracy")
    table = bench.rows()
    assert (ROOT / "docs" / "speed-accuracy.md").read_text() == bench.report(table)
    assert (ROOT / "measure" / "serving" / "simulated.json").read_text() == bench.table_json(table)


def test_a_load_of_varied_lengths_is_replayed_request_by_request():
    model, engine = _replica()
    varied = Load(1000, 4, 2, concurrency=1, lengths=((1000, 4), (20000, 4)))
    served = simulate(model, engine, varied)
    short = model.seconds(0, 0, [(0, 1000)])
    long = sum(model.seconds(0, 0, [c]) for c in ((0, 8192), (8192, 16384), (16384, 20000)))
    # two requests one after the other: the TTFTs are one short and one long prefill (p50 interpolates them)
    # each first token reaches the client after the next step (async scheduling), a decode of that request
    # and the front end's handling of each, which grows with its prompt
    short += model.seconds(1, 1001, []) + model.handling_seconds(1000)
    long += model.seconds(1, 20001, []) + model.handling_seconds(20000)
    assert served.ttft_ms[50] == pytest.approx((short + long) / 2 * 1e3)
    with pytest.raises(KvsizeError, match="per-request lengths must be 2 pairs"):
        Load(1000, 4, 2, concurrency=1, lengths=((1000, 4),))


def test_a_step_is_never_shorter_than_the_floor_and_the_all_reduce_counts_only_past_one_rank():
    from dataclasses import replace

    model, _ = _replica()
    floored = replace(model, floor_s=0.05)
    # the host's side of the step: the floor and the engine core's work on its one stream
    assert floored.seconds(1, 1000, []) == pytest.approx(0.05 + model.core_s_per_token)
    assert floored.seconds(0, 0, [(0, 8192)]) >= 0.05
    # the floor is under the GPU's part of an 8B's step: it changes nothing there
    assert replace(model, floor_s=1e-4).seconds(1, 1000, []) == pytest.approx(model.seconds(1, 1000, []))
    layers = model.shape.num_layers
    plus = replace(model, tp_layer_overhead_s=1e-5, floor_s=0.0).seconds(1, 1000, [])
    assert plus == pytest.approx(replace(model, tp_layer_overhead_s=0.0, floor_s=0.0).seconds(1, 1000, []))  # TP 1
    tp2 = replace(model, tp=2, floor_s=0.0, tp_layer_overhead_s=0.0)
    assert (replace(tp2, tp_layer_overhead_s=1e-5).seconds(1, 1000, []) - tp2.seconds(1, 1000, [])
            == pytest.approx(layers * 1e-5))


def test_the_step_terms_are_fitted_on_every_dense_size_one_request_at_a_time_and_no_moe():
    from sizing.evidence.serving import point_scenario
    from sizing.planners.step_model import step_overhead

    points = {p["id"]: p for p in json.loads((ROOT / "measure" / "serving" / "points.json").read_text())["points"]}
    fit = step_overhead()
    # the MoE layer's cost, its launch past the graph and its experts' rate are fitted on Qwen3-30B-A3B's one-request
    # points alone, the MLA layer's launch on the MLA models' (scripts/fit_serving_mla.py), the dense terms on the rest
    moe = ("qwen3moe-bf16", "b7-qwen3moe", "b7-qwen3moe-cg2048", "b35-qwen3moe", "b39-qwen3moe")
    mla = ("deepseek-v2-lite", "glm-4.7-flash")
    one = [points[i] for i in fit.fitted_on if points[i]["settings"]["concurrency"] == 1
           and points[i]["server"] not in moe and points[i]["settings"]["model"] not in mla]
    assert one
    models = {p["settings"]["model"] for p in one}
    assert {"llama-3.2-1b-instruct", "llama-3.1-8b", "qwen3-8b", "llama-3.1-70b"} <= models or len(models) >= 5
    assert all(point_scenario(p["settings"], ROOT).shape.num_experts == 0 for p in one)
    assert any(p["settings"]["tensor_parallel_size"] == 2 for p in one)
    # the weights read at a share of the bandwidth a GEMM can reach, a floor under a step, an all-reduce at TP 2
    assert 0.5 < fit.engine_weights_efficiency <= 1 and fit.step_floor_s > 0 and fit.tp_per_layer_step_overhead_s > 0


def test_every_batch_predicted_before_it_ran_is_held_apart_with_its_committed_figures():
    from helpers import load_script

    bench = load_script("serving_accuracy")
    page = (ROOT / "docs" / "speed-accuracy.md").read_text()
    ahead = page.split("## Predicted before seen", 1)[1].split("## Every point", 1)[0]
    for f in sorted((ROOT / "measure" / "serving").glob("*-sim-predictions-h200.json")):
        batch = f.name.split("-sim-predictions")[0]
        assert f"### {batch}" in ahead
        committed = {x["id"]: x for x in json.loads(f.read_text())["points"]}
        for r in bench.ahead_rows():
            if r["file"] == f.name:
                assert r["itl_p50_ms"][1] == committed[r["id"]]["itl_ms"]["50"]
    assert "b5-dense-sizes" in (ROOT / "measure" / "serving" / "comparison.md").read_text()


def _points() -> dict:
    return {p["id"]: p for p in json.loads((ROOT / "measure" / "serving" / "points.json").read_text())["points"]}


def test_the_moe_layer_cost_is_added_once_a_step_for_each_layer_with_routed_experts_only():
    from dataclasses import replace

    from sizing.evidence.serving import point_replica

    points = _points()
    dense, _ = _replica()
    assert (replace(dense, moe_layer_overhead_s=1e-4).seconds(1, 1000, []) == dense.seconds(1, 1000, []))
    # DeepSeek-V2-Lite: 27 layers, the first dense (first_k_dense_replace 1): 26 pay the MoE layer's cost
    mla, _ = point_replica(points["dsv2lite-bf16-p01-i1000-o256-c1"]["settings"], ROOT)
    moe_layers = sum(1 for p in mla.shape.layer_params if p.experts > 0)
    assert (mla.shape.num_layers, moe_layers) == (27, 26)
    bare = replace(mla, moe_layer_overhead_s=0.0, floor_s=0.0)
    for batch in (1, 64):
        assert (replace(bare, moe_layer_overhead_s=1e-5).seconds(batch, batch * 1000, []) - bare.seconds(
            batch, batch * 1000, [])) == pytest.approx(26 * 1e-5)


def test_a_moe_step_reads_the_expected_distinct_experts_of_its_tokens():
    from sizing.evidence.serving import point_replica

    model, _ = point_replica(_points()["qwen3moe-bf16-p01-i1000-o256-c1"]["settings"], ROOT)
    e, k = model.shape.num_experts, model.shape.num_experts_per_tok
    assert (e, k) == (128, 8)
    one, many = model.read_seconds(1, 0)[0], model.read_seconds(1024, 0)[0]
    for n in (1, 8, 32):
        share = (model.read_seconds(n, 0)[0] - one) / (many - one)  # of the experts past the top-k of one token
        expected = (1 - (1 - k / e) ** n - k / e) / (1 - (1 - k / e) ** 1024 - k / e)
        assert share == pytest.approx(expected, abs=1e-3)


def test_the_moe_layer_cost_fitted_on_qwen3_moe_holds_its_points_and_mixtral_out_of_the_fit():
    # the fit's reproduction: Qwen3-30B-A3B's three one-request points within 3% each (each 12-13% short without
    # the term), a cost of the size of a few small kernels, and Mixtral-8x7B's one-request point, never fitted on,
    # within 3%
    from sizing.evidence.serving import predict_point, served_settings
    from sizing.planners.step_model import step_overhead

    points = _points()
    fit = step_overhead()
    assert 5e-6 < fit.moe_layer_step_overhead_s < 3e-5
    moe = list(dict.fromkeys(i for i in fit.fitted_on if points[i]["server"] == "qwen3moe-bf16"))
    assert sorted(moe) == ["qwen3moe-bf16-p01-i1000-o256-c1", "qwen3moe-bf16-p05-i8000-o256-c1",
                           "qwen3moe-bf16-p07-i32000-o128-c1"]
    assert "b4-mixtral-p01-i1000-o256-c1" not in fit.fitted_on
    for name in (*moe, "b4-mixtral-p01-i1000-o256-c1"):
        p = points[name]
        error = predict_point(served_settings(p), ROOT).itl_ms[50] / p["measured"]["itl_p50_ms"] - 1
        assert abs(error) <= 0.03, (name, error)


def test_the_front_ends_handling_delays_each_first_token_and_no_gap():
    # the request reaches the engine its handling and its prompt's way in after the client sent it, and its first
    # token takes its way back (read off the traces of requests alone: tests/test_serving_handling.py); without them
    # the simulation is what it was
    model, engine = _replica()
    bare = replace(model, request_handling_s=0.0, prompt_in_s_per_token=0.0, first_token_s_per_prompt_token=0.0)
    assert 0.002 < model.handling_seconds(1000) < 0.05
    for load in (Load(1000, 64, 4, concurrency=1), Load(1000, 32, 20, request_rate=0.5, seed=3)):
        handled, alone = simulate(model, engine, load), simulate(bare, engine, load)
        assert handled.ttft_ms[50] == pytest.approx(alone.ttft_ms[50] + 1e3 * model.handling_seconds(1000))
        assert handled.itl_ms[50] == pytest.approx(alone.itl_ms[50], rel=0.01)
    # a closed loop's next request waits for it too: fewer requests a second
    assert (simulate(model, engine, Load(1000, 64, 4, concurrency=1)).requests_per_s
            < simulate(bare, engine, Load(1000, 64, 4, concurrency=1)).requests_per_s)

"""The serving simulation (sizing/planners/serving.py): its scheduler against cases worked by hand, its fitted
constants against the fit script, and its figures against the real server on the points it was fitted on."""

import json
import statistics
import math
import re
import subprocess
import sys

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
    return serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, measured_efficiency())


def test_one_request_alone_waits_one_prefill_and_then_one_decode_step_a_token():
    model, engine = _replica()
    served = simulate(model, engine, Load(1000, 64, 2, concurrency=1))
    prefill = model.seconds(0, 0, [(0, 1000)])
    assert served.ttft_ms[50] == pytest.approx(prefill * 1e3)
    # every later token is one decode step of one request, its cache 1,001 to 1,063 tokens long
    steps = [model.seconds(1, 1000 + k, []) for k in range(1, 64)]
    assert min(steps) * 1e3 <= served.itl_ms[50] <= max(steps) * 1e3
    assert served.preemptions == 0


def test_a_prompt_past_the_token_budget_is_prefilled_in_chunks():
    model, engine = _replica()
    served = simulate(model, engine, Load(20000, 8, 1, concurrency=1))
    # 20,000 tokens in chunks of 8,192: three steps before the first token
    chunks = [(0, 8192), (8192, 16384), (16384, 20000)]
    assert served.ttft_ms[50] == pytest.approx(sum(model.seconds(0, 0, [c]) for c in chunks) * 1e3)


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
    assert served.ttft_ms[99] < 1.5 * model.seconds(1, 1000, [(0, 1000)]) * 1e3


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
    # one request in flight (the step terms): each point within 10%; 8 or more in flight (one KV read efficiency
    # per format over every batch size): within 10% in the median and 15% at worst
    from sizing.evidence.serving import predict_point
    from sizing.planners.serving import step_overhead

    points = {p["id"]: p for p in json.loads((ROOT / "measure" / "serving" / "points.json").read_text())["points"]}
    many = []
    for name in step_overhead().fitted_on:
        p = points[name]
        error = predict_point(p["settings"], ROOT).itl_ms[50] / p["measured"]["itl_p50_ms"] - 1
        if p["settings"]["concurrency"] == 1:
            assert abs(error) <= 0.10, name
        else:
            many.append(error)
    assert many and abs(statistics.median(many)) <= 0.10 and max(map(abs, many)) <= 0.15


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
    assert served.ttft_ms[50] == pytest.approx((short + long) / 2 * 1e3)
    with pytest.raises(KvsizeError, match="per-request lengths must be 2 pairs"):
        Load(1000, 4, 2, concurrency=1, lengths=((1000, 4),))

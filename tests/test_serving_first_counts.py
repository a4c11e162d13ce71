"""A step with prompt chunks of more requests than the server has run before holds back the last step's output
(sizing/planners/serving.py FIRST_USE_PAD): the engine core's own step traces show it, the simulation holds a fresh
server's burst to it, and a server that has run every count (the planner's steady state) never pays it."""

import json
import re

import pytest

from conftest import ROOT
from measure.steps import first_count_holds, traced_servers
from sizing.errors import KvsizeError
from sizing.evidence.serving import predict_point, served_settings
from sizing.planners.serving import FIRST_USE_LIMIT, FIRST_USE_PAD, Load, serving_replica, simulate
from sizing.profiles import gpu_profile, measured_efficiency
from helpers import scenario

SERVING = ROOT / "measure" / "serving"
BURST = "b21-qwen25-3b-int8-p02-i8000-o256-c96"  # 96 prompts of 8,000 tokens sent at once, after a point of 64


def _points() -> list[dict]:
    return json.loads((SERVING / "points.json").read_text())["points"]


def _point(pid: str) -> dict:
    return next(p for p in _points() if p["id"] == pid)


def _replica(tp: int = 1):
    g = gpu_profile("h200")
    s = scenario("qwen2.5-7b-instruct", "h200", max_model_len=32768, memory_fraction=0.9,
                 max_num_batched_tokens=8192, max_num_seqs=1024, tensor_parallel_size=tp)
    return serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors, measured_efficiency())


def test_the_traces_hold_the_output_back_at_first_counts_below_the_limit_and_not_past_it():
    below, above, tp2 = [0, 0], [0, 0], [0, 0]
    for server in traced_servers():
        holds = first_count_holds(server)
        if server["tensor_parallel_size"] > 1:
            tp2 = [a + b for a, b in zip(tp2, holds["below"])]
            continue
        below = [a + b for a, b in zip(below, holds["below"])]
        above = [a + b for a, b in zip(above, holds["above"])]
    # the counts sizing/planners/serving.py's comment gives: 505 of 915 below 256 requests, 16 of 199 from it on
    assert below == [505, 915] and above == [16, 199]
    assert below[0] / below[1] > 0.5 and above[0] / above[1] < 0.1
    assert tp2[1] >= 20 and tp2[0] == 0  # b16's Llama-3.1-70B at TP 2: its workers run the steps
    assert FIRST_USE_PAD == 8 and FIRST_USE_LIMIT == 256


def test_a_fresh_servers_burst_of_long_prompts_gaps_two_steps_at_its_slowest_percent():
    model, engine = _replica()
    assert engine.first_use_holds
    burst = dict(concurrency=96)
    warm = simulate(model, engine, Load(8000, 128, 96, **burst))
    fresh = simulate(model, engine, Load(8000, 128, 96, **burst, server_seen_requests=1))
    seen = simulate(model, engine, Load(8000, 128, 96, **burst, server_seen_requests=96))
    # the slowest 1% are steps with a prompt chunk: two of them back to back where the output was held
    assert 1.8 < fresh.itl_ms[99] / warm.itl_ms[99] < 2.2
    assert fresh.itl_ms[50] == pytest.approx(warm.itl_ms[50], rel=0.02)
    assert fresh.output_tokens_per_s == pytest.approx(warm.output_tokens_per_s, rel=0.02)  # the GPU lost no time
    # a server that had run 96 at once had run each of these counts
    assert seen.itl_ms[99] == pytest.approx(warm.itl_ms[99], rel=1e-9)


def test_a_server_whose_workers_run_the_steps_never_holds_the_output():
    model, engine = _replica(tp=2)
    assert not engine.first_use_holds
    warm = simulate(model, engine, Load(8000, 128, 48, concurrency=48))
    fresh = simulate(model, engine, Load(8000, 128, 48, concurrency=48, server_seen_requests=1))
    assert fresh.itl_ms[99] == pytest.approx(warm.itl_ms[99], rel=1e-9)


def test_the_measured_burst_is_held_to_its_servers_history():
    point = _point(BURST)
    assert point["server_running_before"] == 64  # b21's first point ran 64 at once
    measured = point["measured"]["itl_p99_ms"]
    held = predict_point(served_settings(point), ROOT).itl_ms[99]
    warm = predict_point({**served_settings(point), "server_seen_requests": None}, ROOT).itl_ms[99]
    assert abs(held / measured - 1) <= 0.25  # the p99 bar
    assert warm / measured - 1 < -0.4  # without the holds the slowest gaps are one step: half the measured


def test_each_point_records_the_most_its_server_had_running_before_it():
    by_server: dict[tuple[str, str], list[dict]] = {}
    for p in _points():
        by_server.setdefault((p["batch"], p["server"]), []).append(p)
    for points in by_server.values():
        before = 1  # the load generator's one-prompt test before each load
        for p in points:
            assert p["server_running_before"] == before, p["id"]
            peak = p["metrics"]["running_max"]
            before = max(before, int(peak if peak is not None else p["settings"]["concurrency"] or 0))


@pytest.mark.parametrize("value", [-1, 2.5, True])
def test_an_earlier_count_that_is_not_a_whole_number_is_refused_in_one_line(value):
    with pytest.raises(KvsizeError, match=re.escape("earlier requests in flight must be a whole number")):
        Load(1000, 16, 4, concurrency=4, server_seen_requests=value)


def test_check_serve_takes_the_servers_history(capsys):
    from app.cli import main

    point = _point(BURST)
    server = ["--model", str(SERVING / "models" / "qwen2.5-3b" / "config.json"), "--gpu", "h200",
              "--engine", "vllm@0.33.0", "--max-model-len", "32768", "--gpu-memory-utilization", "0.9",
              "--max-num-batched-tokens", "8192", "--max-num-seqs", "1024", "--kv-cache-dtype", "int8_per_token_head"]
    main(["check-serve", str(SERVING / point["raw"]), *server, "--requests-before", "64", "--format", "json"])
    held = json.loads(capsys.readouterr().out)
    main(["check-serve", str(SERVING / point["raw"]), *server, "--format", "json"])
    warm = json.loads(capsys.readouterr().out)
    p99 = {d["requests_before"]: next(r for r in d["rows"] if r["figure"] == "itl_p99_ms") for d in (held, warm)}
    # the accuracy page's figure for this point, from its server's history; a warm server's slowest gaps are one step
    assert p99[64]["kvsize"] == pytest.approx(predict_point(served_settings(point), ROOT).itl_ms[99])
    assert p99[64]["within"] and not p99[None]["within"]
    code = main(["check-serve", str(SERVING / point["raw"]), *server, "--requests-before", "0"])
    out = capsys.readouterr()
    assert code == 2 and "--requests-before" in out.err

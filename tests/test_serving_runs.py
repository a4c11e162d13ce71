"""The committed serving runs of a real vLLM OpenAI server (measure/serving/, issue 48): every measured point parses
and carries its settings, its summary percentiles are reproduced from the raw per-request data the load generator
saved, points.json is what the raw files give, and kvsize's predictions were committed for every batch."""

from __future__ import annotations

import json
import random

import pytest

import gzip

from measure.serving import (JSON_LIMIT, RAW_LIMIT, SERVING, ServingError, build_points, load_points, percentile,
                             points_record, predictions_file, raw_percentiles, read_bench, read_json, successful)

POINTS = load_points()
PLAN = read_json(SERVING / "plan.json")
PLANNED = {p["id"]: (s, p) for s in PLAN["servers"] for p in s["points"]}


def test_points_are_committed_once_each():
    assert len(POINTS) >= 1
    ids = [p.id for p in POINTS]
    assert len(set(ids)) == len(ids)


def test_points_json_is_what_the_raw_files_give():
    assert points_record(build_points()) == read_json(SERVING / "points.json")


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.id)
def test_point_has_its_settings(point):
    s = point.settings
    server, planned = PLANNED[point.id]
    assert point.server == server["tag"] and point.batch == server["batch"]
    assert s.vllm_version == PLAN["vllm_version"]
    assert s.gpu_name.startswith("NVIDIA ")
    assert (s.model, s.kv_cache_dtype, s.tensor_parallel_size, s.max_model_len) == (
        server["model"], server["kv_cache_dtype"], server["tensor_parallel_size"], server["max_model_len"])
    assert (s.max_num_batched_tokens, s.max_num_seqs, s.gpu_memory_utilization) == (
        server["max_num_batched_tokens"], server["max_num_seqs"], server["gpu_memory_utilization"])
    assert (s.input_len, s.output_len, s.concurrency, s.request_rate, s.num_prompts) == (
        planned["input_len"], planned["output_len"], planned["concurrency"], planned["request_rate"],
        planned["num_prompts"])
    assert (s.loop == "closed") == (s.concurrency is not None) and (s.loop == "open") == (s.request_rate is not None)
    assert s.input_len + s.output_len <= s.max_model_len
    assert (SERVING.parents[1] / s.config).is_file()
    assert point.server_start.gpu_kv_cache_tokens, "the server's startup KV line is kept"


@pytest.mark.parametrize("point", POINTS, ids=lambda p: p.id)
def test_summary_percentiles_come_from_the_raw_requests(point):
    bench = read_bench(SERVING / point.raw)
    ok = successful(bench)
    assert bench.completed == point.measured.completed == len(ok) > 0
    assert bench.num_prompts == point.settings.num_prompts == len(bench.ttfts) == len(bench.itls)
    recomputed = raw_percentiles(bench)
    for key, value in recomputed.items():
        assert value == pytest.approx(getattr(point.measured, key), abs=2e-3), key
    assert bench.p50_itl_ms == pytest.approx(bench.median_itl_ms) and bench.p50_ttft_ms == pytest.approx(
        bench.median_ttft_ms)
    # every request ran to its length (ignore_eos), and the rates are the totals over the run's duration
    assert all(bench.output_lens[i] == point.settings.output_len for i in ok)
    assert sum(bench.output_lens) == point.measured.total_output_tokens
    assert point.measured.output_tokens_per_s == pytest.approx(point.measured.total_output_tokens
                                                               / point.measured.duration_s, rel=1e-9)
    assert point.measured.requests_per_s == pytest.approx(point.measured.completed / point.measured.duration_s,
                                                          rel=1e-9)


# batches planned with the serving simulation's figures alone (measure/serving/<batch>-sim-predictions-h200.json,
# committed before they ran): each times one mechanism of the engine, not a design a planner would buy
# from b7 on, a batch's figures committed before it ran are the simulation's alone (the plan's decode step was retired)
SIMULATION_ONLY = tuple(b for b in PLAN["batches"] if int(b.split("-")[0][1:]) >= 7)


def test_every_batch_has_its_predictions():
    """For the plan's GPU and for the GPU the batch ran on (the machine lent may be another kind)."""
    batches = {p.batch for p in POINTS}
    assert batches <= set(PLAN["batches"])
    for batch in batches:
        ran_on = {p.settings.gpu_name for p in POINTS if p.batch == batch}
        assert len(ran_on) == 1
        if batch in SIMULATION_ONLY:
            sim = read_json(SERVING / f"{batch}-sim-predictions-h200.json")
            assert sim["batch"] == batch and sim["schema"] == "kvsize.serving-sim-predictions/1"
            assert {x["id"] for x in sim["points"]} >= {p.id for p in POINTS if p.batch == batch}
            continue
        files = {SERVING / f"{batch}-predictions.json", predictions_file(batch, ran_on.pop())}
        for f in files:
            pred = read_json(f)
            assert pred["batch"] == batch and pred["schema"] == "kvsize.serving-predictions/1"
            predicted = {x["id"]: x for x in pred["points"]}
            for p in (p for p in POINTS if p.batch == batch):
                assert p.id in predicted, f"{f.name}: no prediction committed for {p.id}"
                x = predicted[p.id]
                assert (x["input_len"], x["output_len"], x["concurrency"], x["request_rate"]) == (
                    p.settings.input_len, p.settings.output_len, p.settings.concurrency, p.settings.request_rate)
                for source in ("plan", "design"):
                    for key, value in x["predicted"][source].items():
                        assert value is not None or x["null_reasons"][source].get(key), (
                            f"{p.id}: {source}.{key} is null with no reason")


def test_the_percentile_is_numpys_linear_one():
    np = pytest.importorskip("numpy")
    rng = random.Random(48)
    for n in (1, 2, 3, 10, 257):
        xs = [rng.random() for _ in range(n)]
        for q in (50, 90, 99):
            assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)), rel=1e-12, abs=1e-15)
    assert percentile([], 50) == 0.0


def test_a_changed_request_changes_the_recomputed_percentiles(tmp_path):
    point = POINTS[0]
    data = read_json(SERVING / point.raw, RAW_LIMIT)
    ok = [i for i, err in enumerate(data["errors"]) if not err]
    for i in ok:  # every TTFT 1 s later
        data["ttfts"][i] += 1.0
    f = tmp_path / "raw.json.gz"
    f.write_bytes(gzip.compress(json.dumps(data).encode()))
    got = raw_percentiles(read_bench(f))
    assert got["ttft_p50_ms"] == pytest.approx(point.measured.ttft_p50_ms + 1000, abs=2e-3)


def _points_with(tmp_path, change):
    data = read_json(SERVING / "points.json", JSON_LIMIT)
    change(data["points"][0])
    f = tmp_path / "points.json"
    f.write_text(json.dumps(data))
    with pytest.raises(ServingError) as e:
        load_points(f)
    return str(e.value)


def test_a_bad_figure_is_named_in_one_line(tmp_path):
    msg = _points_with(tmp_path, lambda p: p["measured"].update(itl_p50_ms="fast"))
    assert "\n" not in msg and "points.0.measured.itl_p50_ms" in msg and "points.json" in msg


def test_a_missing_setting_is_named(tmp_path):
    msg = _points_with(tmp_path, lambda p: p["settings"].pop("kv_cache_dtype"))
    assert "points.0.settings.kv_cache_dtype" in msg and "Field required" in msg


def test_a_negative_or_infinite_latency_is_refused(tmp_path):
    assert "points.0.measured.ttft_p99_ms" in _points_with(tmp_path, lambda p: p["measured"].update(ttft_p99_ms=-1.0))


def test_an_oversized_or_malformed_raw_file_is_refused(tmp_path):
    big = tmp_path / "big.json.gz"
    big.write_bytes(b" " * (RAW_LIMIT + 1))
    with pytest.raises(ServingError, match="more than"):
        read_bench(big)
    bomb = tmp_path / "bomb.json.gz"
    bomb.write_bytes(gzip.compress(b" " * (20 * 1024 * 1024)))
    with pytest.raises(ServingError, match="unpacks to more than"):
        read_bench(bomb)
    with pytest.raises(ServingError, match="not a gzip file"):
        (tmp_path / "plain.json.gz").write_text("{}")
        read_bench(tmp_path / "plain.json.gz")
    bad = tmp_path / "bad.json.gz"
    data = read_json(SERVING / POINTS[0].raw, RAW_LIMIT)
    data["itls"][0] = "none"
    bad.write_bytes(gzip.compress(json.dumps(data).encode()))
    with pytest.raises(ServingError, match=r"itls\.0"):
        read_bench(bad)
    with pytest.raises(ServingError, match="not a regular file"):
        read_bench(tmp_path)


def test_the_kit_starts_each_planned_server_as_the_plan_says():
    # measure/serving/kit/lane.py builds each server's command line from plan.json: several API servers in front of
    # one engine through the CLI (batch b8), the largest CUDA graph through --compilation-config (batch b7)
    import importlib.util

    spec = importlib.util.spec_from_file_location("serving_kit_lane", SERVING / "kit" / "lane.py")
    lane = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(lane)
    counts = set()
    for s in PLAN["servers"]:
        args = lane.server_args(s)
        if s.get("api_server_count"):
            counts.add(s["api_server_count"])
            assert args[1:4] == ["-m", "vllm.entrypoints.cli.main", "serve"] and "--model" not in args
            assert args[args.index("--api-server-count") + 1] == str(s["api_server_count"])
        else:
            assert args[1:3] == ["-m", "vllm.entrypoints.openai.api_server"] and "--api-server-count" not in args
        graphs = json.loads(args[args.index("--compilation-config") + 1]) if "--compilation-config" in args else {}
        assert graphs.get("max_cudagraph_capture_size") == s.get("max_cudagraph_capture_size")
        assert args[args.index("--max-num-batched-tokens") + 1] == str(s["max_num_batched_tokens"])
    assert counts == {4}

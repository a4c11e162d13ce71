"""Fleet planning: workloads, pools, decode speed, cost, guidance, serve commands, `kvsize plan`."""

import copy
import json
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.cli import main
from helpers import scenario
from sizing.errors import KvsizeError
from sizing.planners.fleet import Candidate, Draft, GpuOffer, build_candidates, plan_candidate, plan_fleet
from sizing.planners.guidance import evaluate_rules, quality_notes
from sizing.cache.layers import build_layout
from sizing.engines.memory import WEIGHT_FORMATS
from sizing.profiles import gpu_profile, load_model
from sizing.engines.serve import ServeSettings, serve_command
from sizing.efficiency import DecodeEfficiency
from sizing.planners.speed import decode_step, itl_slope_seconds_per_token, weights_read_bytes
from sizing.planners.workload import parse_workload, parse_workload_text

MIX = {
    "peak_concurrency": 300,
    "buckets": [
        {"max_context_tokens": 8192, "share_percent": 60, "output_tokens": 512},
        {"max_context_tokens": 32768, "share_percent": 30, "output_tokens": 1024},
        {"max_context_tokens": 131072, "share_percent": 10, "output_tokens": 1024},
    ],
}


def _offer(gpu="h100-sxm", price=None):
    return GpuOffer.from_profile(gpu, gpu_profile(gpu), price)


def _plan(workload, fmt="auto", gpu="h100-sxm", tp=1, model="llama-3.1-8b", efficiency=None, draft=None):
    return plan_candidate(scenario(model), Candidate(_offer(gpu), fmt, tp), workload,
                          efficiency or DecodeEfficiency(), draft)


def _workload(**changes):
    return parse_workload({**MIX, **changes})


# -- the worked example ------------------------------------------------------------------


def test_llama3_8b_int8_kv_for_24000_tokens_uses_its_real_8_kv_heads():
    """A widely shared walk-through sizes Llama-3 8B with 24,000 live tokens of INT8 KV at about
    6.1 GB by assuming 32 KV heads (256 KiB per token). Its config.json has num_key_value_heads 8
    (grouped-query attention), so one token is 2 x 32 layers x 8 heads x 128 x 1 B = 65,536 B and
    24,000 tokens are 1,572,864,000 B (1.57 GB) of payload, plus the per-token-head fp32 scales:
    2 x 32 x 8 x 4 B = 2,048 B per token."""
    _, shape = load_model("llama-3.1-8b")
    assert shape.num_kv_heads == 8 and shape.num_layers == 32 and shape.head_dim == 128
    payload, metadata = build_layout(shape, "int8_per_token_head", "int8_per_token_head").sequence_bytes(24_000)
    assert payload == 24_000 * 65_536 == 1_572_864_000
    assert metadata == 24_000 * 2_048
    # The 32-head assumption, kept for comparison: four times the bytes (6.29 GB = 5.86 GiB).
    wrong = replace(shape, num_kv_heads=32)
    wrong_payload, _ = build_layout(wrong, "int8_per_token_head", "int8_per_token_head").sequence_bytes(24_000)
    assert wrong_payload == 24_000 * 262_144 == 4 * payload


# -- workload files ------------------------------------------------------------------------


@pytest.mark.parametrize("data, needle", [
    ({**MIX, "peak": 3}, "peak: unknown field; allowed: name, peak_concurrency"),
    ({**MIX, "buckets": [{**MIX["buckets"][0], "share_percent": 50}]}, "share_percent must sum to 100, got 50"),
    ({**MIX, "buckets": [{**MIX["buckets"][0], "share_percent": 100, "max_context_tokens": -8}]},
     "buckets[0].max_context_tokens: Input should be greater than 0"),
    ({**MIX, "buckets": [{**MIX["buckets"][0], "share_percent": 100, "output_tokens": 9000}]},
     "output_tokens 9000 must be below max_context_tokens 8192"),
    ({**MIX, "buckets": [{**MIX["buckets"][0], "share_percent": 100, "colour": "red"}]},
     "buckets[0].colour: unknown field; allowed: name, max_context_tokens, share_percent"),
    ({"peak_concurrency": 4, "percentiles": [{"percentile": 50, "context_tokens": 4096, "output_tokens": 256}]},
     "the last entry must be percentile 100"),
    ({"peak_concurrency": 0, "buckets": MIX["buckets"]}, "peak_concurrency: Input should be greater than 0"),
    ({"peak_concurrency": 4}, "give exactly one of buckets or percentiles"),
    ({**MIX, "prefix_cache_share": 1.5}, "prefix_cache_share: Input should be less than 1"),
])
def test_bad_workloads_name_the_field(data, needle):
    with pytest.raises(KvsizeError) as e:
        parse_workload(data, "w.yaml")
    assert needle in str(e.value) and str(e.value).startswith("w.yaml: ")
    assert "\n" not in str(e.value)


def test_yaml_and_json_read_the_same_workload():
    import yaml

    from_yaml = parse_workload_text(yaml.safe_dump(MIX).encode(), "w.yaml")
    from_json = parse_workload_text(json.dumps(MIX).encode(), "w.json")
    assert from_yaml == from_json
    with pytest.raises(KvsizeError, match="not valid YAML"):
        parse_workload_text(b"buckets: [unclosed", "w.yaml")
    with pytest.raises(KvsizeError, match="expected a mapping"):
        parse_workload_text(b"- 1\n- 2\n", "w.yaml")


def test_percentiles_become_buckets_with_the_steps_as_shares():
    w = parse_workload({"peak_concurrency": 10, "percentiles": [
        {"percentile": 50, "context_tokens": 2000, "output_tokens": 200},
        {"percentile": 90, "context_tokens": 12000, "output_tokens": 400},
        {"percentile": 100, "context_tokens": 60000, "output_tokens": 800}]})
    assert [(b.max_context_tokens, b.share_percent) for b in w.mix()] == [(2000, 50), (12000, 40), (60000, 10)]
    assert w.share_above(8192) == 50


# -- pools -----------------------------------------------------------------------------------


def test_shared_pool_counts_each_bucket_at_its_own_length():
    w = _workload()
    p = _plan(w)
    base = scenario("llama-3.1-8b", max_model_len=131072, memory_fraction=0.92)  # vLLM >= 0.21 default (vllm/config/cache.py)
    from sizing.capacity.estimate import estimate

    e = estimate(base)
    # vLLM pages of 16 tokens x 131,072 B (bf16, 32 layers x 8 heads x 128 x 2 x 2 B per token)
    page = 16 * 131_072
    per_request = 0.6 * (8192 // 16) * page + 0.3 * (32768 // 16) * page + 0.1 * (131072 // 16) * page
    assert p.shared.bytes_per_request == pytest.approx(per_request)
    assert p.shared.requests_per_replica == min(int((e.kv_budget_bytes - e.pool.fixed_bytes) // per_request), e.scenario.max_num_seqs)
    assert p.shared.replicas == -(-300 // p.shared.requests_per_replica)
    assert p.gpus == p.shared.replicas


def test_one_bucket_shared_and_split_pools_agree():
    w = parse_workload({"peak_concurrency": 100,
                        "buckets": [{"max_context_tokens": 32768, "share_percent": 100, "output_tokens": 1000}]})
    p = _plan(w)
    assert p.gpus == p.gpus_per_bucket_pools
    assert p.per_bucket[0].requests_per_replica == p.shared.requests_per_replica


def test_a_candidate_that_cannot_hold_one_request_says_why():
    w = parse_workload({"peak_concurrency": 1,
                        "buckets": [{"max_context_tokens": 131072, "share_percent": 100, "output_tokens": 10}]})
    p = _plan(w, model="llama-3.1-70b", gpu="h100-sxm", tp=2)
    assert not p.fits
    assert "does not fit" in p.reason and "try a larger TP" in p.reason


def test_unsupported_format_is_kept_with_its_reason():
    plan = plan_fleet(scenario("llama-3.1-8b"), build_candidates(["h100-sxm"], ["q4_0", "fp8"], [1]), _workload())
    by_fmt = {p.candidate.kv_format: p for p in plan.plans}
    assert not by_fmt["q4_0"].fits and "engines that store q4_0: llamacpp" in by_fmt["q4_0"].reason
    assert plan.cheapest.candidate.kv_format == "fp8"


@settings(max_examples=25, deadline=None)
@given(a=st.integers(1, 5000), b=st.integers(1, 5000), fmt=st.sampled_from(["auto", "fp8", "nvfp4"]),
       prefix=st.floats(0, 0.9))
def test_more_traffic_never_needs_fewer_gpus(a, b, fmt, prefix):
    low, high = sorted((a, b))
    w = _workload(prefix_cache_share=prefix)
    assert _plan(w.model_copy(update={'peak_concurrency': low}), fmt).gpus <= _plan(
        w.model_copy(update={'peak_concurrency': high}), fmt).gpus


@settings(max_examples=25, deadline=None)
@given(peak=st.integers(1, 5000), long_share=st.integers(1, 98), gpu=st.sampled_from(["h100-sxm", "l40s", "h200"]),
       tp=st.sampled_from([1, 2, 4]))
def test_a_format_with_fewer_bytes_never_needs_more_gpus(peak, long_share, gpu, tp):
    w = parse_workload({"peak_concurrency": peak, "buckets": [
        {"max_context_tokens": 4096, "share_percent": 99 - long_share, "output_tokens": 256},
        {"max_context_tokens": 65536, "share_percent": long_share, "output_tokens": 1024},
        {"max_context_tokens": 131072, "share_percent": 1, "output_tokens": 1024}]})
    eff = DecodeEfficiency()  # one efficiency for every format
    gpus = [_plan(w, fmt, gpu, tp, efficiency=eff).gpus for fmt in ("bf16", "fp8", "nvfp4")]  # 131072, 65544, 36872 B
    assert gpus[0] >= gpus[1] >= gpus[2]


def test_prefix_cache_and_draft_move_the_count_the_right_way():
    w = _workload()
    plain = _plan(w).gpus
    assert _plan(w.model_copy(update={'prefix_cache_share': 0.5})).gpus <= plain
    name, shape = load_model("qwen2.5-0.5b")
    assert _plan(w, draft=Draft(name, shape)).gpus >= plain


# -- speed and cost ------------------------------------------------------------------------


def test_decode_step_is_bytes_over_bandwidth():
    _, shape = load_model("llama-3.1-8b")
    layout = build_layout(shape, "bf16", "bf16")
    eff = DecodeEfficiency(weights=0.8, kv_default=0.7)
    step = decode_step(shape, layout, WEIGHT_FORMATS["bf16"], 1, [(4, 32768)], 3350, eff, "bf16")
    # Weights read: 8,030,257,152 params less the 525,336,576 embedding rows, 2 B each (config.json);
    # KV: 4 requests x 32,768 tokens x 131,072 B.
    weights = (8_030_257_152 - 525_336_576) * 2
    kv = 4 * 32_768 * 131_072
    assert step.weights_read_bytes == weights and step.kv_read_bytes == kv
    assert step.seconds == pytest.approx(weights / (3350e9 * 0.8) + kv / (3350e9 * 0.7))
    assert step.tokens_per_second == pytest.approx(4 / step.seconds)


def test_moe_decode_reads_only_the_touched_experts():
    _, shape = load_model("qwen3-30b-a3b")  # 128 experts, 8 per token (config.json)
    one = weights_read_bytes(shape, WEIGHT_FORMATS["bf16"], 1, 1)
    many = weights_read_bytes(shape, WEIGHT_FORMATS["bf16"], 1, 256)
    assert one < many < shape.total_params * 2
    assert one == pytest.approx(2 * 3.04e9, rel=0.01)  # ~3.0B active parameters per token in bf16


def test_halving_kv_bytes_halves_the_itl_slope():
    bf16 = itl_slope_seconds_per_token(131_072, 32, 3350, 0.75)
    fp8 = itl_slope_seconds_per_token(65_536, 32, 3350, 0.75)
    assert fp8 / bf16 == 0.5
    # and the plan reports it per format at equal batch: slope tracks bytes per token over the read share (the
    # engine's own: vLLM reads fp8 at a smaller share than bf16, so it buys 0.73 of bf16's slope, not 0.5)
    w = _workload()
    a, b = _plan(w, "auto"), _plan(w, "fp8")
    ratio = (b.itl_slope_seconds_per_1k_tokens / b.decode_batch) / (a.itl_slope_seconds_per_1k_tokens / a.decode_batch)
    assert ratio == pytest.approx(b.kv_bytes_per_token / a.kv_bytes_per_token * a.kv_efficiency / b.kv_efficiency,
                                  rel=0.02)
    assert a.kv_efficiency > b.kv_efficiency


def test_cost_per_million_tokens_from_fleet_rate_and_price():
    w = _workload()
    p = plan_candidate(scenario("llama-3.1-8b"), Candidate(_offer("h100-sxm", 2.0), "fp8", 1), w, DecodeEfficiency())
    assert p.usd_per_hour == pytest.approx(2.0 * p.gpus)
    assert p.fleet_tokens_per_second == pytest.approx(300 / p.itl_seconds)
    assert p.usd_per_million_output_tokens == pytest.approx(p.usd_per_hour / (p.fleet_tokens_per_second * 3600 / 1e6))


def test_savings_against_bf16_on_the_same_gpu():
    plan = plan_fleet(scenario("llama-3.1-8b"), build_candidates(["h100-sxm"], ["auto", "fp8"], [1]), _workload())
    bf16, fp8 = plan.plans
    assert bf16.savings_vs_bf16_percent == 0
    assert fp8.savings_vs_bf16_percent == pytest.approx(100 * (1 - fp8.usd_per_hour / bf16.usd_per_hour))
    assert fp8.savings_vs_bf16_percent > 0


# -- guidance, quality, serve -------------------------------------------------------------


def test_guidance_rules_fire_at_their_thresholds():
    def mix(long_share):
        return parse_workload({"peak_concurrency": 1, "buckets": [
            {"max_context_tokens": 8192, "share_percent": 100 - long_share, "output_tokens": 100},
            {"max_context_tokens": 12000, "share_percent": long_share, "output_tokens": 100}]})

    fired = {r.rule.name: r for r in evaluate_rules(mix(30))}
    assert fired["8-bit KV for long traffic"].fires and "30.0% of requests" in fired["8-bit KV for long traffic"].explanation
    assert not fired["4-bit KV for very long traffic"].fires  # 12,000 tokens is not above 16,384
    assert not evaluate_rules(mix(29))[0].fires


def test_quality_notes_carry_the_measured_error():
    report = {"device": {"name": "NVIDIA H200"},
              "decode": [{"format": "fp8_e4m3", "attention_rel_error": 0.09},
                         {"format": "fp8_e4m3", "attention_rel_error": 0.24}]}
    notes = {n.format: n for n in quality_notes(["fp8", "bf16"], "bf16", report, "r.json")}
    assert notes["fp8_e4m3"].measured_attention_error == 0.24 and "H200" in notes["fp8_e4m3"].measured_where
    assert "vLLM" in notes["fp8_e4m3"].published and notes["bf16"].measured_attention_error is None


def _settings(fmt, **kw):
    base = dict(model="meta-llama/Llama-3.1-8B", kv_format=fmt, serving_dtype="bf16", tensor_parallel_size=2,
                max_model_len=32768, memory_fraction=0.9, block_size=16, max_num_seqs=64, cache_tokens=500_000)
    return ServeSettings(**{**base, **kw})


@pytest.mark.parametrize("engine, fmt, expected", [
    ("vllm", "fp8_e4m3", "vllm serve meta-llama/Llama-3.1-8B --kv-cache-dtype fp8_e4m3 --max-model-len 32768 "
                         "--gpu-memory-utilization 0.9 --tensor-parallel-size 2 --block-size 16 --max-num-seqs 64"),
    ("vllm", "bf16", "--kv-cache-dtype auto"),
    ("sglang", "fp8_e5m2", "--kv-cache-dtype fp8_e5m2 --context-length 32768 --mem-fraction-static 0.9 --tp 2"),
    ("trtllm", "nvfp4", "dtype: nvfp4"),
    ("lmdeploy", "lmdeploy_int4", "--quant-policy 4 --cache-max-entry-count 0.9 --tp 2 --session-len 32768"),
    ("llamacpp", "q4_0", "-ctk q4_0 -ctv q4_0 -fa on -c 500000 -np 64 -kvu"),
])
def test_serve_commands_speak_each_engine(engine, fmt, expected):
    cmd = serve_command(engine, _settings(fmt))
    assert cmd.command is not None and expected in cmd.command


def test_serve_command_for_an_unsupported_format_names_the_engines_that_can():
    cmd = serve_command("sglang", _settings("q8_0"))
    assert cmd.command is None and "engines that can: llamacpp" in cmd.note


# -- the CLI -------------------------------------------------------------------------------


def _workload_file(tmp_path, data=MIX, name="w.yaml"):
    import yaml

    path = tmp_path / name
    path.write_text(yaml.safe_dump(data) if name.endswith(".yaml") else json.dumps(data))
    return str(path)


def test_plan_cli_writes_every_view(tmp_path, capsys):
    import openpyxl

    wl = _workload_file(tmp_path)
    xlsx, js, csv = tmp_path / "p.xlsx", tmp_path / "p.json", tmp_path / "p.csv"
    assert main(["plan", "--workload", wl, "--model", "llama-3.1-8b", "--gpus", "h100-sxm,h200",
                 "--formats", "auto,fp8", "--tp", "1,2", "--price", "h200=3.5",
                 "--out", str(xlsx), "--out", str(js), "--out", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "Fleet that serves the workload:" in out and "vllm serve meta-llama/Llama-3.1-8B" in out
    assert "Guidance:" in out and "capacity only: holds the peak's KV, prefill not counted" in out
    # One answer: the headline comes before the capacity-only table, which is labelled as never the answer.
    assert out.index("Fleet that serves the workload:") < out.index("Candidates, capacity only")
    book = openpyxl.load_workbook(xlsx)
    assert book.sheetnames == ["summary", "designs", "frontier", "capacity_only", "pools", "cost", "guidance",
                               "quality", "provenance"]
    record = json.loads(js.read_text())
    # The summary sheet answers on its own: what to buy (the design that serves prefill and decode under the
    # targets), its cost (dollars, per hour and per 730-hour month), how to start it, and what it rests on.
    summary = {row[0].value: row[1] for row in book["summary"].iter_rows(min_row=2)}
    best = record["cheapest"]
    assert best["design"] == record["designs"][0]["design"] and best["meets"]
    assert summary["recommendation"].value == best["design"]
    assert summary["GPUs"].value == best["gpus"] and summary["KV cache format"].value == best["kv_format"]
    assert summary["fleet usd per hour"].number_format == "$#,##0.00"
    assert summary["fleet usd per month"].value == round(summary["fleet usd per hour"].value * 730)
    roles = {s["role"]: s["command"] for s in record["design_serve_commands"]}
    assert all(summary[f"serve command ({role})"].value == command for role, command in roles.items())
    assert record["serve_command"] in roles.values()
    assert summary["price h200"].value == 3.5 and summary["workload"].value
    # No target in the mix: kvsize's stated defaults apply, and the summary says which.
    assert summary["TTFT target (ms)"].value == 2000 and summary["ITL target (ms)"].value == 200
    assert best["targets"]["ttft_given"] is False and "MLPerf" in best["targets"]["source"]
    candidates = book["capacity_only"]
    header = [c.value for c in candidates[1]]
    assert candidates.cell(2, header.index("fleet_usd_per_hour") + 1).number_format == "$#,##0.00"
    assert candidates.cell(2, header.index("usd_per_million_output_tokens") + 1).number_format == "$#,##0.0000"
    assert record["schema"] == "kvsize.plan/1" and len(record["candidates"]) == 8
    h200 = [r for r in record["candidates"] if r["gpu"] == "h200"]
    assert all(r["usd_per_gpu_hour"] == 3.5 for r in h200)
    cheapest = min((r for r in record["candidates"] if r["fits"]), key=lambda r: (r["fleet_usd_per_hour"], r["gpus"]))
    capacity = record["capacity_only"]
    assert capacity["gpu"] == cheapest["gpu"] and capacity["gpus"] == cheapest["gpus"]
    # Serving prefill too never takes fewer GPUs than holding the peak's KV alone.
    assert best["gpus"] >= capacity["gpus"]
    # Candidates are ranked as the capacity-only plan ranks them.
    first = record["candidates"][0]
    assert first["rank"] == 1 and (first["gpu"], first["kv_format"], first["tensor_parallel_size"]) == (
        capacity["gpu"], capacity["kv_format"], capacity["tensor_parallel_size"])
    assert csv.read_text().splitlines()[0].startswith("rank,gpu,kv_format,tensor_parallel_size")


@pytest.mark.parametrize("args, needle", [
    (["--price", "h100-sxm"], "--price: 'h100-sxm' must look like GPU=USD_PER_HOUR"),
    (["--price", "b200=3"], "--price names GPUs not in --gpus: b200"),
    (["--kv-efficiency", "fp8=fast"], "--kv-efficiency: 'fp8=fast' must look like FORMAT=FRACTION"),
    (["--kv-efficiency", "fp8=1.5"], "--kv-efficiency: fp8=1.5 must be a fraction from 0.001 to 1"),
    (["--kv-efficiency", "fp9=0.5"], "unknown KV cache format 'fp9' (--kv-efficiency)"),
    (["--price", "h100-sxm=inf"], "--price: 'h100-sxm=inf' needs a finite number"),
    (["--itl-target-ms", "inf"], "expected a positive finite number, got 'inf'"),
    (["--tp", "3"], "--tensor-parallel-size 3 does not divide num_attention_heads 32"),
    (["--concurrency", "5"], "drop --concurrency"),
    (["--out", "plan.pdf"], "--out must end in .csv, .xlsx or .json"),
    (["--formats", "fp9"], "unknown KV cache format 'fp9'"),
])
def test_plan_cli_bad_options(tmp_path, capsys, args, needle):
    wl = _workload_file(tmp_path)
    assert main(["plan", "--workload", wl, "--model", "llama-3.1-8b", "--gpus", "h100-sxm", *args]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_plan_cli_bad_workload_file(tmp_path, capsys):
    bad = {**MIX, "buckets": [{**MIX["buckets"][0], "share_percent": 60}, MIX["buckets"][1]]}  # 60 + 30
    wl = _workload_file(tmp_path, bad, "w.json")
    out = tmp_path / "p.json"
    assert main(["plan", "--workload", wl, "--model", "llama-3.1-8b", "--out", str(out)]) == 2
    assert "w.json: buckets: share_percent must sum to 100, got 90" in capsys.readouterr().err
    assert not out.exists()  # nothing half-written


def test_sweep_has_speed_and_cost_columns(tmp_path):
    out = tmp_path / "s.json"
    assert main(["sweep", "--models", "llama-3.1-8b", "--gpus", "h100-sxm", "--formats", "auto,fp8",
                 "--contexts", "32k", "--out", str(out), "--no-progress"]) == 0
    rows = {r["kv_cache_dtype"]: r for r in json.loads(out.read_text())}
    for r in rows.values():
        assert r["decode_batch"] == min(r["max_concurrency"], 256)
        assert r["usd_per_million_output_tokens"] == pytest.approx(
            r["usd_per_gpu_hour"] / (r["tokens_per_s_per_gpu"] * 3600 / 1e6), rel=1e-3)
    assert rows["fp8_e4m3"]["tokens_per_s_per_gpu"] > rows["bf16"]["tokens_per_s_per_gpu"]


def test_the_readme_example_workload_plans(capsys):
    from conftest import ROOT

    assert main(["plan", "--workload", str(ROOT / "examples" / "workload.yaml"), "--model", "llama-3.1-8b",
                 "--gpus", "h100-sxm,h200", "--formats", "auto,fp8,nvfp4", "--tp", "1,2,4"]) == 0
    assert "chat + RAG mix" in capsys.readouterr().out


def test_speed_defaults_to_the_measured_kernel_efficiencies(tmp_path, capsys):
    """profiles/efficiency/h200-triton-fused.json holds each format's fitted decode_efficiency
    from the committed kernel report that measured it last (`measured_in`): today every format
    from the main run's grid; plans use it unless told otherwise."""
    from conftest import ROOT
    from sizing.profiles import efficiency_profile, measured_efficiency
    from sizing.efficiency import efficiency_from_report

    report = json.loads((ROOT / "measure" / "reports" / "h200-decode-kernels.json").read_text())
    profile = efficiency_profile()
    assert set(profile.kv) == set(report["decode_efficiency"]["kv"]) == set(profile.measured_in)
    assert all(path.endswith("h200-decode-kernels.json") for path in profile.measured_in.values())
    for fmt, path in profile.measured_in.items():
        section = json.loads((ROOT / path).read_text())["decode_efficiency"]
        assert profile.kv[fmt] == pytest.approx(section["kv"][fmt], abs=1e-4)
        for term in ("overhead_s", "per_sequence_s", "per_context_token_s"):
            assert getattr(profile, term)[fmt] == pytest.approx(section[term][fmt], rel=1e-3)
    eff = measured_efficiency()
    assert eff.for_format("fp8_e4m3") == profile.kv["fp8_e4m3"]
    assert eff.for_format("q4_0") == profile.kv_default  # no kernel measured: the stated assumption
    assert efficiency_from_report(report).for_format("nvfp4") == pytest.approx(profile.kv["nvfp4"], abs=1e-4)
    # a format no engine server ran reads at the kernels' share (those the engine's servers ran: its own share)
    plan = plan_fleet(scenario("llama-3.1-8b"), build_candidates(["h200"], ["fp8_e5m2"], [1]), _workload())
    assert plan.efficiency.source.startswith("measure/reports/h200-decode-kernels.json")
    assert plan.plans[0].kv_efficiency == profile.kv["fp8_e5m2"]
    wl = _workload_file(tmp_path)
    assert main(["plan", "--workload", wl, "--model", "llama-3.1-8b", "--gpus", "h200", "--formats", "fp8",
                 "--tp", "1", "--kv-efficiency", "fp8_e4m3=0.9"]) == 0
    assert "overridden: fp8_e4m3=0.9" in capsys.readouterr().out


def test_a_users_kv_efficiency_stands_over_the_engines_measured_share():
    # --kv-efficiency sets a figure the engine's own share (profiles/serving.json) must not replace, in the
    # capacity table and in the serving simulation alike
    from sizing.planners.fleet import build_candidates, candidate_rows
    from sizing.planners.serving import serving_replica
    from sizing.planners.speed import parse_efficiency_overrides
    from sizing.planners.step_model import engine_efficiency
    from sizing.profiles import gpu_profile, measured_efficiency

    given = parse_efficiency_overrides("fp8_e4m3=0.9,weights=0.7", measured_efficiency())
    assert given.given == {"fp8_e4m3", "weights"}
    engine = engine_efficiency(given)
    assert engine.kv["fp8_e4m3"] == 0.9 and engine.weights == 0.7 and engine.kv["bf16"] != given.kv["bf16"]
    plan = plan_fleet(scenario("llama-3.1-8b"), build_candidates(["h200"], ["fp8"], [1]), _workload(),
                      efficiency=given)
    row = candidate_rows(plan)[0]
    assert row["kv_efficiency"] == 0.9 and row["kv_efficiency_basis"] == "modelled from decode kernels measured on h200"
    g = gpu_profile("h200")
    s = scenario("llama-3.1-8b", "h200", k_cache_dtype="fp8", v_cache_dtype="fp8", max_model_len=32768)
    model, _ = serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors, given)
    assert model.efficiency.kv["fp8_e4m3"] == 0.9 and model.efficiency.weights == 0.7


def test_efficiency_profiles_are_validated(tmp_path, monkeypatch):
    import sizing.profiles as profiles

    bad = json.loads((profiles.PROFILES_DIR / "efficiency" / "h200-triton-fused.json").read_text())
    negative = copy.deepcopy(bad)
    bad["kv"]["bf16"] = 1.7
    negative["per_sequence_s"]["bf16"] = -1e-6  # a fitted time term is a cost
    (tmp_path / "efficiency").mkdir()
    (tmp_path / "efficiency" / "broken.json").write_text(json.dumps(bad))
    (tmp_path / "efficiency" / "negative.json").write_text(json.dumps(negative))
    monkeypatch.setattr(profiles, "PROFILES_DIR", tmp_path)
    profiles.efficiency_ids.cache_clear()
    profiles.efficiency_profile.cache_clear()
    try:
        with pytest.raises(KvsizeError, match="broken.json is invalid"):
            profiles.efficiency_profile("broken")
        with pytest.raises(KvsizeError, match="negative.json is invalid.*must be >= 0"):
            profiles.efficiency_profile("negative")
    finally:
        profiles.efficiency_ids.cache_clear()
        profiles.efficiency_profile.cache_clear()


def test_an_itl_target_adds_replicas_until_the_step_meets_it():
    w = _workload()
    free = _plan(w, "fp8", "h200")
    tight = _plan(w.model_copy(update={"itl_target_ms": free.itl_seconds * 1000 / 2}), "fp8", "h200")
    assert tight.fits and tight.itl_seconds <= free.itl_seconds / 2
    assert tight.gpus > free.gpus and tight.shared.limited_by == "itl target"
    # the fewest replicas: one fewer would miss the target
    fewer = plan_candidate(scenario("llama-3.1-8b"), Candidate(_offer("h200"), "fp8", 1),
                           w.model_copy(update={"itl_target_ms": tight.itl_seconds * 1000 * 0.999}),
                           DecodeEfficiency())
    assert fewer.gpus >= tight.gpus
    impossible = _plan(w.model_copy(update={"itl_target_ms": 0.5}), "fp8", "h200")  # weights alone take ~3 ms
    assert not impossible.fits and "does not meet the inter-token target" in impossible.reason


@settings(max_examples=20, deadline=None)
@given(a=st.floats(2, 200), b=st.floats(2, 200))
def test_a_tighter_itl_target_never_needs_fewer_gpus(a, b):
    tight, loose = sorted((a, b))
    w = _workload()
    g_tight = _plan(w.model_copy(update={"itl_target_ms": tight}), "fp8", "h100-sxm")
    g_loose = _plan(w.model_copy(update={"itl_target_ms": loose}), "fp8", "h100-sxm")
    if not g_loose.fits:
        assert not g_tight.fits
    elif g_tight.fits:
        assert g_tight.gpus >= g_loose.gpus


def test_plan_never_offers_nvfp4_kv_on_gpus_without_fp4():
    # NVFP4 KV kernels need Blackwell's FP4 tensor cores (profiles/gpus/*.json nvfp4_native): H100,
    # H200, A100 and MI300X get no nvfp4 candidate; B200 does.
    from sizing.planners.fleet import build_candidates, unsupported_pairs

    gpus = ["h100-sxm", "h200", "a100-80gb", "mi300x", "b200"]
    candidates = build_candidates(gpus, ["bf16", "nvfp4"], [1])
    pairs = {(c.gpu.id, c.kv_format) for c in candidates}
    assert ("b200", "nvfp4") in pairs
    assert not {g for g, f in pairs if f == "nvfp4"} - {"b200"}
    assert {(g, f) for g, f, _ in unsupported_pairs(gpus, ["bf16", "nvfp4"])} == {
        (g, "nvfp4") for g in gpus if g != "b200"}


def test_plan_with_only_formats_no_gpu_runs_says_so():
    import pytest

    from sizing.errors import KvsizeError
    from sizing.planners.fleet import build_candidates

    with pytest.raises(KvsizeError, match="nvfp4_native"):
        build_candidates(["h100-sxm"], ["nvfp4"], [1])


def test_sweep_gives_no_figures_for_a_pair_the_engine_cannot_run():
    # profiles/support.json: vLLM finds no attention backend for nvfp4 on sm90 (H100); B200 has no cell (unconfirmed)
    from sizing.planners.sweep import SweepGrid, run_sweep

    grid = SweepGrid(models=["llama-3.1-8b"], gpus=["h100-sxm", "b200"], engines=["vllm"], formats=["nvfp4"],
                     tensor_parallel_sizes=[1], contexts=[8192])
    rows = {r["gpu"]: r for r in run_sweep(grid, scenario("llama-3.1-8b"))}
    assert rows["h100-sxm"]["status"] == "not sized" and rows["h100-sxm"]["reason"].startswith("needs nvfp4_native")
    assert rows["h100-sxm"]["max_tokens"] is None
    assert rows["b200"]["status"] == "fits"


@pytest.mark.parametrize("text, needle", [
    ("peak_concurrency: true\nbuckets:\n  - {max_context_tokens: 4096, share_percent: 100, output_tokens: 512}\n",
     "peak_concurrency: Input should be a valid integer"),
    ("peak_concurrency: '400'\nbuckets:\n  - {max_context_tokens: 4096, share_percent: 100, output_tokens: 512}\n",
     "peak_concurrency: Input should be a valid integer"),
    ("peak_concurrency: 400\nbuckets:\n  - {max_context_tokens: 4096, share_percent: '100', output_tokens: 512}\n",
     "buckets[0].share_percent: Input should be a valid number"),
    ("peak_concurrency: 400\npeak_concurrency: 500\nbuckets:\n  - {max_context_tokens: 4096, share_percent: 100, "
     "output_tokens: 512}\n", "duplicate key 'peak_concurrency'"),
    ('{"peak_concurrency": 4, "peak_concurrency": 5}', "duplicate key 'peak_concurrency'"),
    ("peak_concurrency: 400\nitl_target_ms: .inf\nbuckets:\n  - {max_context_tokens: 4096, share_percent: 100, "
     "output_tokens: 512}\n", "itl_target_ms: Input should be a finite number"),
    ("[" * 5000 + "]" * 5000, "nested more than 32 levels"),
    ('{"a":' * 100000 + "1" + "}" * 100000, "nested more than 32 levels"),
    ("peak_concurrency: 4\ndraft: {model: llama-3.1-8b, kv_cache_dtype: fp9}\nbuckets:\n  - {max_context_tokens: 4096, "
     "share_percent: 100, output_tokens: 512}\n", "draft.kv_cache_dtype"),
])
def test_workload_files_are_read_strictly(text, needle):
    from sizing.errors import KvsizeError
    from sizing.planners.workload import parse_workload_text

    with pytest.raises(KvsizeError, match="^w.yaml: ") as caught:
        parse_workload_text(text, "w.yaml")
    assert needle in str(caught.value)


@pytest.mark.parametrize("source, target, report", [
    ("h200-triton-fused", "h100-sxm", "h100-decode-kernels.json"),
    ("h100-triton-fused", "h200", "h200-decode-kernels.json"),
])
def test_decode_time_fitted_on_one_gpu_predicts_the_other_within_10_percent(source, target, report):
    # Fused decode at >= 16K tokens x batch >= 16, every format: the efficiencies fitted on one GPU, carried
    # to the other by its measured copy bandwidth and issue rate (sizing/planners/speed.py on_gpu), against the
    # kernel times measured there (measure/reports/*-decode-kernels.json).
    import json

    from conftest import ROOT
    from sizing.profiles import gpu_profile, issue_rate, measured_efficiency
    from sizing.planners.speed import attention_seconds

    g = gpu_profile(target)
    # every kernel measured, nvfp4's software kernel included: this holds the kernels, not an engine's
    eff = measured_efficiency(source, engine_kernels=False).on_gpu(target, g.hbm_bandwidth_gb_s,
                                                                   g.copy_bandwidth_gb_s, issue_rate(g))
    points = [p for p in json.loads((ROOT / "measure" / "reports" / report).read_text())["kernels"]
              if p["head_dim"] == 128 and not p.get("window") and not p.get("mla")
              and p["context"] >= 16384 and p["batch"] >= 16]
    assert len({p["format"] for p in points}) == 11
    for p in points:
        predicted = attention_seconds(p["bytes_read"], g.hbm_bandwidth_gb_s, eff, p["format"], p["batch"], p["context"])
        assert abs(predicted / (p["median_ms"] / 1e3) - 1) <= 0.10, (p["format"], p["batch"], p["context"])


def test_plan_says_which_gpu_its_decode_times_rest_on():
    from sizing.planners.fleet import build_candidates, candidate_rows

    # fp8_e5m2: a format kvsize's kernels measured and no engine server ran
    plan = plan_fleet(scenario("llama-3.1-8b"), build_candidates(["h200", "h100-sxm"], ["fp8_e5m2"], [1]),
                      _workload())
    basis = {r["gpu"]: r["kv_efficiency_basis"] for r in candidate_rows(plan)}
    assert basis["h200"] == "modelled from decode kernels measured on h200"
    assert basis["h100-sxm"].startswith("carried from h200 to h100-sxm (measured copy bandwidth 3,020 GB/s")


def test_the_capacity_tables_decode_step_reads_at_the_engines_own_shares():
    # the formats and weights vLLM's own servers were measured reading (profiles/serving.json) are read at those
    # shares here too, as in the serving simulation whose fleet is the answer: fp8 KV reads at 0.63 of the HBM rate
    # in vLLM where kvsize's own kernel reads it at about 0.88, so its ITL here is the engine's, not the kernel's
    from sizing.planners.fleet import build_candidates, candidate_rows
    from sizing.planners.step_model import step_overhead
    from sizing.profiles import gpu_profile, measured_efficiency

    fit = step_overhead()
    kernels = measured_efficiency()
    assert kernels.kv["fp8_e4m3"] > fit.engine_kv_efficiency["fp8_e4m3"] + 0.1
    plan = plan_fleet(scenario("llama-3.1-8b"), build_candidates(["h200", "h100-sxm"], ["fp8", "auto"], [1]),
                      _workload())
    rows = {(r["gpu"], r["kv_format"]): r for r in candidate_rows(plan)}
    for gpu in ("h200", "h100-sxm"):
        for asked, fmt in (("fp8", "fp8_e4m3"), ("auto", "bf16")):
            assert rows[gpu, asked]["kv_efficiency"] == fit.engine_kv_efficiency[fmt]
    assert rows["h200", "fp8"]["kv_efficiency_basis"] == (
        f"the engine's own read share, {fit.engine_kv_efficiency['fp8_e4m3']:g}, measured on vllm 0.33.0 servers "
        "on h200")
    assert rows["h100-sxm", "fp8"]["kv_efficiency_basis"].endswith("carried to h100-sxm as a share of its bandwidth")
    # the step itself: its KV part is the bytes it reads at the engine's share
    p = next(c for c in plan.plans if c.candidate.gpu.id == "h200" and c.candidate.kv_format == "fp8")
    kv_bytes = p.decode_batch * p.kv_bytes_per_token * 1000  # 1,000 more tokens of context for every request
    assert p.itl_slope_seconds_per_1k_tokens == pytest.approx(
        kv_bytes / (gpu_profile("h200").hbm_bandwidth_gb_s * 1e9 * fit.engine_kv_efficiency["fp8_e4m3"]), rel=1e-9)


@pytest.mark.parametrize("engine, pp", [("vllm", 1), ("vllm@0.7", 1), ("sglang", 1), ("trtllm", 1), ("llamacpp", 1),
                                        ("ideal", 1), ("vllm", 2)])
def test_a_sweeps_grid_rows_equal_estimating_each_row_alone(engine, pp):
    # The sweep estimates once per (model, GPU, engine, format, TP) and derives each context's figures;
    # every row must equal a full estimate of that scenario. vLLM 0.7's profiled batch depends on the
    # length (V0 unchunked prefill), PP sizes the tightest stage, gemma-2 has windows, Qwen3-Next Mamba state.
    from sizing.capacity.estimate import estimate
    from sizing.planners.sweep import SweepGrid, run_sweep

    models = ["llama-3.1-8b", "gemma-2-9b", "qwen3-next-80b-a3b-thinking", "deepseek-v2"]
    grid = SweepGrid(models=models, gpus=["h100-sxm", "h200"], engines=[engine], formats=["auto", "fp8_e4m3"],
                     tensor_parallel_sizes=[1, 2], contexts=[1000, 4096, 32768, 40000, 131072, 300000])
    base = replace(scenario("llama-3.1-8b"), pipeline_parallel_size=pp, concurrency=3)
    rows = run_sweep(grid, base)
    assert len(rows) == grid.size
    checked = 0
    for row in rows:
        name, shape = load_model(row["model"])
        g = gpu_profile(row["gpu"])
        s = replace(base, model_name=name, shape=shape, gpu_name=g.name, gpu_memory_bytes=g.memory_bytes,
                    gpu_multiprocessors=g.multiprocessors, gpu_nvml_mib=g.nvml_memory_mib,
                    gpu_architecture=g.architecture, engine=engine, k_cache_dtype=row["kv_cache_dtype"],
                    v_cache_dtype=row["kv_cache_dtype"], tensor_parallel_size=row["tensor_parallel_size"],
                    max_model_len=row["max_model_len_tokens"])
        try:
            e = estimate(s)
        except KvsizeError as err:
            assert row["status"] == "not sized" and row["reason"] == str(err)
            continue
        if row["status"] == "not sized":
            continue  # refused by the support table, which estimate() only warns about
        checked += 1
        assert row["status"] == ("fits" if e.fits else "does not fit")
        assert (row["kv_bytes_per_sequence"], row["num_blocks"], row["max_tokens"], row["max_concurrency"],
                row["max_context_at_concurrency_tokens"]) == (
            e.kv_bytes_per_sequence, e.num_blocks, e.max_tokens, e.max_concurrency,
            min(e.max_context_at_concurrency, row["max_model_len_tokens"]))  # the engine serves no longer request
    assert checked >= grid.size // 3


def test_at_an_equal_price_plan_prefers_a_near_lossless_format(tmp_path, capsys):
    # 4 short requests fit one H100 either way: fp8 (near-lossless, published) before int4_per_token_head
    # (accuracy not published by vLLM), though int4 holds more requests and a shade lower ITL
    from app.cli import main

    workload = tmp_path / "w.yaml"
    workload.write_text("name: small\npeak_concurrency: 4\nbuckets:\n"
                        "  - {name: chat, max_context_tokens: 4096, share_percent: 100, output_tokens: 256}\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--workload", str(workload), "--model", "llama-3.1-8b", "--gpus", "h100-sxm",
                 "--formats", "int4_per_token_head,fp8", "--out", str(out)]) == 0
    capsys.readouterr()
    cheapest = json.loads(out.read_text())["cheapest"]
    assert cheapest["kv_format"] == "fp8_e4m3" and cheapest["gpus"] == 1


def test_a_format_measured_only_in_software_is_not_carried_to_an_engine():
    # nvfp4 was measured in kvsize's own software kernel on an H200, which has no FP4 tensor cores and on which no
    # engine runs it: a B200's native nvfp4 is planned on the stated assumption and says "not measured"
    from sizing.planners.fleet import build_candidates, candidate_rows
    from sizing.profiles import measured_efficiency

    assert "nvfp4" in measured_efficiency(engine_kernels=False).kv
    engine = measured_efficiency()
    assert "nvfp4" not in engine.kv and "fp8_e4m3" in engine.kv
    assert "nvfp4 (measured in software on h200, which lacks nvfp4_native)" in engine.source
    plan = plan_fleet(scenario("llama-3.1-8b", "b200"), build_candidates(["b200"], ["nvfp4", "fp8_e4m3"], [1]), _workload())
    basis = {r["kv_format"]: r["kv_efficiency_basis"] for r in candidate_rows(plan)}
    assert basis["nvfp4"] == "not measured: nvfp4 assumed 75%"
    assert basis["fp8_e4m3"].startswith("the engine's own read share")
    assert basis["fp8_e4m3"].endswith("carried to b200 as a share of its bandwidth")

"""Designs held to the serving simulation (sizing/planners/held.py): the mix it sends, the steady state it measures,
the replicas it finds, and the answer `kvsize plan` gives from it."""

import json
from dataclasses import replace
import math
from collections import Counter
from pathlib import Path

import pytest

from helpers import scenario
from sizing.errors import KvsizeError
from sizing.planners.fleet import build_candidates
from sizing.planners.held import MIN_MEASURED_REQUESTS, mix_lengths, most_in_flight, replica_for, steady_load
from sizing.planners.serving import Load, Scheduler, serving_replica, simulate
from sizing.planners.slo import Targets
from sizing.planners.workload import parse_workload, read_workload
from sizing.profiles import gpu_profile, measured_efficiency

EXAMPLE = Path(__file__).parent.parent / "examples" / "workload.yaml"


def test_the_mix_sent_keeps_every_share_and_leaves_the_shared_prefix_to_the_cache():
    w = read_workload(EXAMPLE)
    n = 1000
    sent = Counter(mix_lengths(w, n))
    for b in w.mix():
        prompt = round(b.mean_prompt_tokens * (1 - w.prefix_cache_share))
        assert abs(sent[(prompt, b.output_tokens)] / n - b.share_percent / 100) <= 2 / n


def test_a_steady_state_is_measured_between_the_opening_burst_and_the_drain():
    w = read_workload(EXAMPLE)
    load = steady_load(w, 300)  # more in flight than the least measured: as many measured as in flight
    assert MIN_MEASURED_REQUESTS < 300
    assert load.concurrency == 300 and load.measured == (300, 600) and load.num_prompts == 900
    small = steady_load(w, 4)
    assert small.measured == (4, 4 + MIN_MEASURED_REQUESTS) and small.num_prompts == 8 + MIN_MEASURED_REQUESTS


def _replica(**kw):
    g = gpu_profile("h200")
    s = scenario("llama-3.1-8b", "h200", max_model_len=65536, memory_fraction=0.9, max_num_batched_tokens=8192,
                 max_num_seqs=1024, **kw)
    return serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors, measured_efficiency())


@pytest.mark.parametrize("load, blocks", [
    (Load(1000, 300, 40, concurrency=8), None),
    (Load(3000, 200, 30, concurrency=12, measured=(12, 24)), None),
    (Load(1000, 300, 30, request_rate=4.0, seed=5), None),
    (Load(2000, 400, 24, concurrency=10), 700),  # a pool of 700 blocks of 16: preemptions
    (Load(2000, 150, 24, concurrency=6, prefilled=True), None),
])
def test_runs_of_decode_steps_in_one_pass_give_the_step_by_step_figures(load, blocks):
    model, engine = _replica()
    if blocks is not None:
        engine = Scheduler(engine.max_num_batched_tokens, engine.max_num_seqs, engine.block_size, blocks)
    fast, slow = simulate(model, engine, load), simulate(model, engine, load, decode_runs=False)
    assert fast == slow
    assert fast.steps == slow.steps and (blocks is None or fast.preemptions > 0)


def test_one_request_alone_has_a_tpot_of_its_decode_steps():
    """A closed loop of one: 63 decode steps after the prefill. With async scheduling the first token reaches the
    client at the end of the first decode step and the last at the end of the last (the next request, sent once
    the client has it, holds nothing back), so the 63 gaps span decode steps 2 to 63; without, all 63."""
    model, engine = _replica()
    steps = [model.seconds(1, 1000 + k, []) for k in range(1, 64)]
    assert engine.output_delay_steps == 1
    # the first token's way back (shorter than a step here) takes its share of the first gap
    late = 1000 * model.first_token_s_per_prompt_token
    assert late < min(steps)
    served = simulate(model, engine, Load(1000, 64, 3, concurrency=1))
    assert served.tpot_ms[50] == pytest.approx((sum(steps[1:]) - late) / len(steps) * 1e3, rel=1e-9)
    undelayed = simulate(model, replace(engine, output_delay_steps=0), Load(1000, 64, 3, concurrency=1))
    assert undelayed.tpot_ms[50] == pytest.approx((sum(steps) - late) / len(steps) * 1e3, rel=1e-9)


def test_prompts_that_arrive_in_the_pool_are_not_prefilled():
    model, engine = _replica()
    shipped = simulate(model, engine, Load(20000, 32, 4, concurrency=1, prefilled=True))
    computed = simulate(model, engine, Load(20000, 32, 4, concurrency=1))
    assert shipped.ttft_ms[50] == 0.0 and computed.ttft_ms[50] > 500  # three 8,192-token chunks of an 8B model


def test_the_most_requests_a_replica_keeps_is_where_one_more_misses_the_targets():
    w = read_workload(EXAMPLE)
    base = scenario("llama-3.1-8b", "h200", max_model_len=131072)
    candidate = build_candidates(["h200"], ["fp8_e4m3"], [2], {}, "vllm")[0]
    replica = replica_for(base, candidate, w, measured_efficiency())
    targets = Targets(2.0, 0.030)
    most, served = most_in_flight(replica, w, targets, guess=40)
    assert 1 <= most < replica.most_requests
    assert served.ttft_ms[50] <= 2000 and served.tpot_ms[50] <= 30
    more = replica.served(w, most + 1)
    assert more.ttft_ms[50] > 2000 or more.tpot_ms[50] > 30
    # a looser ITL target never holds fewer
    assert most_in_flight(replica, w, Targets(2.0, 0.060), guess=40)[0] >= most


def test_a_target_percentile_outside_what_the_simulation_reports_is_refused():
    with pytest.raises(KvsizeError, match="percentile must be one of 50, 90, 99"):
        Targets(2.0, 0.05, 75)
    with pytest.raises(KvsizeError, match="target_percentile"):
        parse_workload({"peak_concurrency": 4, "target_percentile": 75,
                        "buckets": [{"max_context_tokens": 4096, "share_percent": 100, "output_tokens": 256}]})


def test_plan_answers_with_the_design_the_simulation_holds(tmp_path, capsys):
    from app.cli import main

    out = tmp_path / "plan.json"
    assert main(["plan", "--workload", str(EXAMPLE), "--model", "llama-3.1-8b", "--gpus", "h100-sxm,h200",
                 "--formats", "auto,fp8", "--tp", "1,2,4", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    cheapest = json.loads(out.read_text())["cheapest"]
    assert cheapest["basis"] == "serving simulation" and cheapest["targets"]["percentile"] == 50
    headline = next(line for line in text.splitlines() if line.startswith("Fleet that serves the workload:"))
    assert f"{cheapest['gpus']} GPUs" in headline and f"(serving simulation; {cheapest['speed_source']})" in headline
    # the chosen design's replicas, simulated again at the share of the peak each one takes, keep the targets
    w = read_workload(EXAMPLE)
    gpu = "h100-sxm" if cheapest["decode_gpu"] == "h100-sxm" else "h200"
    candidate = build_candidates([gpu], [cheapest["kv_format"]], [cheapest["decode_tp"]], {}, "vllm")[0]
    replica = replica_for(scenario("llama-3.1-8b", "h100-sxm", max_model_len=131072), candidate, w,
                          measured_efficiency())
    each = math.ceil(w.peak_concurrency / cheapest["decode_replicas"])
    served = replica.served(w, each, prefilled=cheapest["kind"] == "disaggregated")
    assert served.tpot_ms[50] <= w.itl_target_ms


@pytest.mark.parametrize("engine, gpus, named, left_out", [
    ("vllm", ("h100-sxm", "h200"), ["int4_per_token_head"], ["nvfp4", "lmdeploy_int4", "q4_0", "kivi4"]),
    ("vllm@0.33.0", ("b200",), ["int4_per_token_head", "nvfp4"], ["lmdeploy_int4", "q4_0", "kivi4"]),
    ("llamacpp", ("l40s",), ["q4_0"], ["nvfp4", "int4_per_token_head", "kivi4"]),
])
def test_the_4bit_guidance_names_the_formats_the_engine_runs_on_those_gpus(engine, gpus, named, left_out):
    from sizing.planners.guidance import RULES, evaluate_rules

    four = next(r for r in evaluate_rules(read_workload(EXAMPLE), engine=engine, gpu_ids=gpus)
                if r.rule is RULES[1])
    assert four.fires
    listed = four.explanation.split("evaluation first (", 1)[1]
    for f in named:
        assert f in listed
    for f in left_out:
        assert f not in listed


def test_a_design_the_host_paces_says_its_speed_is_the_hosts(tmp_path):
    # Llama-3.2-1B's steps are the host's at hundreds of short streams (b8, b9: its gaps follow the engine core's
    # and the API server's work per stream, and the same server ran 5.4 and 12.6 ms gaps on two H200 hosts): the
    # design that holds them says so; an 8B's steps at the README's workload are the GPU's, and its designs do not
    from app.cli import main

    root = Path(__file__).parent.parent
    workload = tmp_path / "short.yaml"
    workload.write_text("name: short\npeak_concurrency: 512\nttft_target_ms: 2000\nitl_target_ms: 50\nbuckets:\n"
                        "  - max_context_tokens: 512\n    share_percent: 100\n    output_tokens: 256\n")
    small, large = tmp_path / "small.json", tmp_path / "large.json"
    assert main(["plan", "--workload", str(workload), "--model",
                 str(root / "measure/serving/models/llama-3.2-1b-instruct/config.json"), "--gpus", "h200",
                 "--formats", "auto", "--tp", "1", "--out", str(small)]) == 0
    reason = json.loads(small.read_text())["cheapest"]["reason"]
    share = int(reason.split("the host sets ")[1].split("%")[0])
    assert 50 <= share <= 100 and "2.3x apart on two H200 hosts" in reason
    assert main(["plan", "--workload", str(EXAMPLE), "--model", "llama-3.1-8b", "--gpus", "h200", "--formats", "auto",
                 "--tp", "1", "--out", str(large)]) == 0
    assert "the host sets" not in json.loads(large.read_text())["cheapest"]["reason"]


def test_a_host_paced_vllm_replica_is_planned_with_more_api_servers_where_they_hold_more(tmp_path):
    # Llama-3.2-1B, 512 short streams under a 20 ms ITL target: one API server streams a token every ~30 ms at 512
    # (b8 measured 29.4 ms), four every ~10 ms (9.3 ms), so one replica under four API servers holds what two would
    # under one; the serve command says how to start it. An engine without API server processes is never given it.
    from app.cli import main

    root = Path(__file__).parent.parent
    model = str(root / "measure/serving/models/llama-3.2-1b-instruct/config.json")
    workload = tmp_path / "short.yaml"
    workload.write_text("name: short\npeak_concurrency: 512\nttft_target_ms: 2000\nitl_target_ms: 20\nbuckets:\n"
                        "  - max_context_tokens: 512\n    share_percent: 100\n    output_tokens: 256\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--workload", str(workload), "--model", model, "--gpus", "h200", "--formats", "auto",
                 "--tp", "1", "--out", str(out)]) == 0
    plan = json.loads(out.read_text())
    cheapest = plan["cheapest"]
    assert cheapest["decode_replicas"] == 1 and "--api-server-count 4" in cheapest["reason"]
    assert cheapest["itl_ms"] <= 20
    assert plan["serve_command"].endswith("--api-server-count 4")
    assert all(s["command"].endswith("--api-server-count 4") for s in plan["design_serve_commands"])
    # the same replica under one API server holds fewer under the target
    w = read_workload(workload)
    candidate = build_candidates(["h200"], ["auto"], [1], {}, "vllm")[0]
    one = replica_for(scenario(model, "h200", max_model_len=512), candidate, w, measured_efficiency())
    assert one.api_servers == 1 and one.more_api_servers
    held_one = most_in_flight(one, w, Targets(2.0, 0.020), guess=256)
    held_four = most_in_flight(one.with_api_servers(4), w, Targets(2.0, 0.020), guess=256)
    assert held_one[0] < 512 <= held_four[0]
    # SGLang's server is one process: its plan keeps two replicas and names no API servers
    sglang = tmp_path / "sglang.json"
    assert main(["plan", "--workload", str(workload), "--model", model, "--gpus", "h200", "--formats", "auto",
                 "--tp", "1", "--engine", "sglang", "--out", str(sglang)]) == 0
    other = json.loads(sglang.read_text())
    assert other["cheapest"]["decode_replicas"] == 2 and "api-server-count" not in other["cheapest"]["reason"]
    assert "api-server-count" not in other["serve_command"]


def _short_streams(engine: str):
    """Llama-3.2-1B at 512 short streams under a 20 ms ITL target, its designs disaggregated over NVLink in one
    host: (base, workload, targets, disaggregated designs by the queueing model)."""
    from sizing.planners.slo import search_designs
    from sizing.planners.tiers import link_fit

    model = str(Path(__file__).parent.parent / "measure/serving/models/llama-3.2-1b-instruct/config.json")
    w = parse_workload(dict(name="short", peak_concurrency=512, ttft_target_ms=2000, itl_target_ms=20, buckets=[
        dict(max_context_tokens=512, share_percent=100, output_tokens=256)]))
    base = scenario(model, "h200", max_model_len=512, engine=engine)
    targets = Targets(2.0, 0.020)
    candidates = build_candidates(["h200"], ["auto"], [1], {}, engine)
    designs = search_designs(base, candidates, w, measured_efficiency(), targets, link_fit("nvlink4-peer"),
                             same_host=True)
    return base, w, targets, [d for d in designs if d.kind == "disaggregated"]


def test_a_host_paced_vllm_decode_pool_is_held_with_more_api_servers_where_they_hold_more():
    # The same 512 short streams as above, disaggregated: the decode replicas stream every token through the API
    # server as an aggregated replica does, so one API server paces them and needs two decode replicas, where four
    # hold all 512 in one; the design's reason and its decode command say so, its prefill command does not (a
    # prefill replica streams no tokens).
    from sizing.planners.held import decode_pool, hold_designs
    from sizing.planners.slo import cheapest, design_serve_commands

    base, w, targets, designs = _short_streams("vllm")
    replica = replica_for(base, designs[0].decode, w, measured_efficiency())
    one = decode_pool(replace(replica, more_api_servers=False), w, targets, 256)
    four = decode_pool(replica, w, targets, 256)
    assert one.api_servers == 1 and one.served.host_paced and one.replicas == 2
    assert four.api_servers == 4 and four.replicas == 1 and four.each == 512
    # under four API servers the engine core's side of a step and the GPU's (its 512 requests' own cost a step among
    # it) come close: the one API server, not the GPU, is what a second replica was bought for
    assert four.served.tpot_ms[50] <= 20
    held = hold_designs(designs, base, w, measured_efficiency(), targets)
    best = cheapest(held.designs)
    assert best.kind == "disaggregated" and best.decode_replicas == 1 and best.api_servers == 4
    assert "512 requests in flight each; 4 API servers (--api-server-count 4)" in best.reason
    commands = dict(design_serve_commands(best, base, w, "meta-llama/Llama-3.2-1B-Instruct"))
    decode = next(c.command for role, c in commands.items() if role.startswith("decode"))
    prefill = next(c.command for role, c in commands.items() if role.startswith("prefill"))
    assert "--api-server-count 4" in decode and "--kv-transfer-config" in decode
    assert "--api-server-count" not in prefill


def test_an_sglang_decode_pool_is_never_held_with_more_api_servers():
    # SGLang's server is one process: its decode replicas, host-paced as vLLM's are, keep one API server however
    # many replicas that takes, and neither its reasons nor its commands name any
    from sizing.planners.held import decode_pool, hold_designs
    from sizing.planners.slo import cheapest, design_serve_commands

    base, w, targets, designs = _short_streams("sglang")
    replica = replica_for(base, designs[0].decode, w, measured_efficiency())
    assert not replica.more_api_servers
    pool = decode_pool(replica, w, targets, 256)
    assert pool.api_servers == 1 and pool.served.host_paced and pool.replicas > 1
    held = hold_designs(designs, base, w, measured_efficiency(), targets)
    assert all(d.api_servers == 1 and "api-server-count" not in d.reason for d in held.designs)
    best = cheapest(held.designs)
    assert best.decode_replicas == pool.replicas
    commands = design_serve_commands(best, base, w, "meta-llama/Llama-3.2-1B-Instruct")
    assert all("api-server-count" not in c.command for _, c in commands)


def test_prompts_launched_past_the_graph_say_their_ttft_is_the_hosts():
    # Qwen3-30B-A3B's 1,000-token prompt alone past its 512-token graph: the launch of its layers (83 ms from the
    # terms) sets the step, not its GPU part (about 18 ms); the same prompt spanned 58-63 ms on two H200 hosts and
    # 86-109 on a third (b39, b40, b35). An 8,000-token prompt's GPU part outlasts the launch
    from sizing.evidence.serving import predict_point, served_settings
    from sizing.planners.held import host_note

    root = Path(__file__).parent.parent
    points = {p["id"]: p for p in json.loads((root / "measure/serving/points.json").read_text())["points"]}
    short = predict_point(served_settings(points["b39-qwen3moe-p02-i1000-o32-c1"]), root)
    long = predict_point(served_settings(points["qwen3moe-bf16-p05-i8000-o256-c1"]), root)
    assert short.launch_paced_prompt_share > 0.9 and long.launch_paced_prompt_share == 0.0
    note = host_note(short)
    assert "sets 100% of its prompt steps' time" in note and "86-109 ms on a third" in note
    assert "prompt steps" not in host_note(long)

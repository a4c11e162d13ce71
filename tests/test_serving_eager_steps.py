"""A step past the largest CUDA graph the engine captured runs without one (sizing/planners/graph_steps.py): the host's
launch of its layers, a MoE layer's fused-expert path beyond a dense layer's, where it applies, and its fit on b35's
trace; and the routed experts' share of the prefill FLOP rate, fitted on long prompts alone."""

import json
import sys
from dataclasses import replace

import pytest

from conftest import ROOT
from helpers import scenario
from sizing.planners.graph_steps import GraphedSteps
from sizing.planners.serving import serving_replica
from sizing.planners.step_model import step_overhead
from sizing.profiles import gpu_profile, measured_efficiency

EAGER_MOE = 5e-4


def _replica(name="llama-3.1-8b", **kw):
    g = gpu_profile("h200")
    s = scenario(name, "h200", max_model_len=32768, memory_fraction=0.9, max_num_batched_tokens=8192,
                 max_num_seqs=1024, **kw)
    model, engine = serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors, measured_efficiency())
    # the launches' bounds are held apart (test_a_dense_models_step_past_the_graph_lasts_at_least_its_launch and
    # test_a_prompt_step_under_the_graph_lasts_at_least_its_pieces_launch)
    return replace(model, eager_moe_layer_launch_s=EAGER_MOE, floor_s=0.0, eager_layer_launch_s=0.0,
                   piecewise_layer_launch_s=0.0), engine


def _points() -> dict:
    return {p["id"]: p for p in json.loads((ROOT / "measure" / "serving" / "points.json").read_text())["points"]}


def _moe(point="b7-qwen3moe-p03-i520-o32-c1"):
    from sizing.evidence.serving import point_replica

    moe, _ = point_replica(_points()[point]["settings"], ROOT)
    return replace(moe, eager_moe_layer_launch_s=EAGER_MOE, floor_s=0.0, eager_layer_launch_s=0.0,
                   piecewise_layer_launch_s=0.0, core_s_per_token=0.0, api_s_per_token=0.0)


def test_a_prompt_one_token_past_the_largest_graph_pays_every_moe_layers_launch_on_the_host():
    moe = _moe()
    largest = moe.graphs.prefill_tokens
    assert largest == 512  # vLLM 0.33's default: min(512, 2 x max_num_seqs)
    # 48 layers, each with 128 routed experts: past the graph the host launches each one's fused-expert path, a bound
    # beside the GPU's part, which it leaves as it is; under the graph no such launch
    assert moe.host_side_seconds(0, [(0, largest + 1)]) == pytest.approx(48 * EAGER_MOE)
    assert moe.host_side_seconds(0, [(0, largest)]) == 0.0
    bare = replace(moe, eager_moe_layer_launch_s=0.0)
    assert moe.gpu_seconds(0, 0, [(0, largest + 1)]) == bare.gpu_seconds(0, 0, [(0, largest + 1)])
    past = moe.seconds(0, 0, [(0, largest + 1)])
    assert past == pytest.approx(max(moe.gpu_seconds(0, 0, [(0, largest + 1)]), 48 * EAGER_MOE))
    assert moe.seconds(0, 0, [(0, 500)]) == pytest.approx(bare.seconds(0, 0, [(0, 500)]))


def test_the_routed_experts_pay_each_tile_of_their_k_loops_a_fixed_cost():
    # Qwen3-30B-A3B: of its ~3.3B parameters a token passes through, ~2.2B are routed experts' (8 of 128 a layer), whose
    # gate and up reduce over the hidden size (2,048) and down over the expert's 768: a tile's fixed cost of k0 elements
    # lengthens two thirds of their FLOPs by k0 / 2,048 and a third by k0 / 768; a dense model has none to lengthen
    from sizing.planners.speed import active_params, routed_expert_params

    moe = _moe()
    routed, active = routed_expert_params(moe.shape), active_params(moe.shape)
    assert 0.6 < routed / active < 0.8
    assert (moe.shape.hidden_size, moe.shape.moe_intermediate_size) == (2048, 768)
    bare, tiled = replace(moe, moe_tile_fixed_k=0.0), replace(moe, moe_tile_fixed_k=1000.0)
    tokens = 8000
    gemms = [m.prefill_compute_seconds(tokens) - m._attention(tokens) / m._attention_flops() for m in (bare, tiled)]
    lengthened = 2 * routed * tokens * 1000 * (2 / 2048 + 1 / 768) / 3
    assert gemms[1] - gemms[0] == pytest.approx(lengthened / bare._flops(), rel=1e-9)
    # at TP 2 each rank holds half of every expert's intermediate size: down's K loop is 384 long
    assert replace(tiled, tp=2)._tile_k - 1 == pytest.approx(1000 * (2 / 2048 + 2 / 768) / 3)
    # Mixtral-8x7B's experts reduce over 4,096 and 14,336: the same cost lengthens them about a quarter as much
    mixtral = _moe("b39-mixtral-p04-i4000-o32-c1")
    per_flop = {m: (2 / m.shape.hidden_size + 1 / m.shape.moe_intermediate_size) / 3 for m in (moe, mixtral)}
    assert 3.5 < per_flop[moe] / per_flop[mixtral] < 4.5
    dense, _ = _replica()
    assert routed_expert_params(dense.shape) == 0
    assert replace(dense, moe_tile_fixed_k=1000.0).gpu_seconds(0, 0, [(0, tokens)]) == dense.gpu_seconds(0, 0, [(0, tokens)])


def test_a_dense_models_step_past_the_graph_lasts_at_least_its_launch():
    # no MoE cost is added; the host's launch of its layers bounds the step beside the GPU's part instead
    dense, _ = _replica()
    dense = replace(dense, eager_layer_launch_s=1e-3)  # its MoE launch (EAGER_MOE) has no MoE layer to apply to
    assert dense.graphs.prefill_tokens == 512
    assert dense.eager_launch_s == pytest.approx(32 * 1e-3)  # Llama-3.1-8B's 32 layers
    # a small chunk past the graph: the GPU's part is shorter than the launch, which sets the step
    assert dense.gpu_seconds(0, 0, [(0, 600)]) < dense.eager_launch_s
    assert dense.seconds(0, 0, [(0, 600)]) == pytest.approx(dense.eager_launch_s)
    # the same chunk under the graph launches only its pieces (none here), and a long chunk's GPU part hides the launch
    assert dense.seconds(0, 0, [(0, 500)]) == pytest.approx(max(dense.gpu_seconds(0, 0, [(0, 500)]),
                                                                dense.host_seconds(0)))
    assert dense.seconds(0, 0, [(0, 8000)]) == pytest.approx(dense.gpu_seconds(0, 0, [(0, 8000)]))
    # a decode-only step past the decode graph is launched the same way
    assert dense.host_side_seconds(513, []) >= dense.eager_launch_s > dense.host_side_seconds(8, [])


def test_a_prompt_step_under_the_graph_lasts_at_least_its_pieces_launch():
    # under FULL_AND_PIECEWISE a step with a prompt chunk replays the graph's pieces, each layer's attention launched
    # between them: a bound beside the GPU's part; a decode-only step replays one FULL graph and launches no layer
    dense, _ = _replica()
    dense = replace(dense, piecewise_layer_launch_s=0.4e-3)
    assert dense.graphs.piecewise_prompts
    launch = 32 * 0.4e-3
    assert dense.gpu_seconds(2, 2000, [(0, 300)]) < launch
    assert dense.seconds(2, 2000, [(0, 300)]) == pytest.approx(launch)
    assert dense.host_side_seconds(8, []) == pytest.approx(dense.host_seconds(8))
    # past the graph the eager launch stands instead (none here), and a long chunk's GPU part hides the pieces'
    assert dense.host_side_seconds(0, [(0, 600)]) == pytest.approx(dense.host_seconds(0))
    assert dense.seconds(0, 0, [(0, 500)]) == pytest.approx(max(dense.gpu_seconds(0, 0, [(0, 500)]), launch))
    # under FULL_DECODE_ONLY a prompt step has no graph at all: it is launched eagerly, never in pieces
    only = replace(dense, graphs=GraphedSteps(0, 512, dense.graphs.decode_batches))
    assert not only.graphs.piecewise(300, True) and only.graphs.eager(300, True)


def test_the_profiles_launches_are_what_the_fitted_traces_give():
    sys.path.insert(0, str(ROOT / "scripts"))
    from fit_serving_handling import fit_launch, launch_votes

    fitted, points = fit_launch()
    fit = step_overhead()
    assert fitted == {"eager_layer_launch_s": fit.eager_layer_launch_s,
                      "piecewise_layer_launch_s": fit.piecewise_layer_launch_s}
    assert set(points) <= set(fit.fitted_on) and len(points) >= 10
    # past the graph six dense models vote, one each, however many of their servers ran (docs/formulas.md,
    # 'c_launch'); under it the seven of b32
    votes = launch_votes()
    assert len(votes) == 6 and "llama-3.1-8b" in votes and "qwen2.5-7b-instruct" in votes
    per_model = sorted(sorted(r["launch_s"] / r["layers"] for r in rows)[len(rows) // 2] for rows in votes.values())
    assert per_model[0] == pytest.approx(0.74e-3, abs=0.03e-3) and per_model[-1] == pytest.approx(1.12e-3, abs=0.03e-3)
    assert per_model[2] <= fit.eager_layer_launch_s <= per_model[3]
    pieces = launch_votes(past_graph=False)
    assert len(pieces) == 7 and "llama-3.2-1b-instruct" in pieces and "qwen3-14b" in pieces
    per_model = sorted(sorted(r["launch_s"] / r["layers"] for r in rows)[len(rows) // 2] for rows in pieces.values())
    assert 0.3e-3 < per_model[0] and per_model[-1] < 0.6e-3 and per_model[3] == pytest.approx(fit.piecewise_layer_launch_s, abs=1e-7)
    # the pieces' launch is about half the eager one, on every model that ran both
    assert 0.3 < fit.piecewise_layer_launch_s / fit.eager_layer_launch_s < 0.6


def test_a_launch_shows_as_the_period_before_the_chunk_on_every_dense_server_that_ran_one():
    from measure.steps import launch_rows, traced_servers

    by_server = {s["tag"]: [r["launch_s"] / r["layers"] for r in launch_rows(s) if r["eager"]] for s in traced_servers()
                 if s["batch"] == "b30-front-door"}
    # Mistral-Nemo-12B's layers launch as Llama-3.1-8B's (b29: 0.75), Qwen3-8B's about 40% slower
    for tag, values in by_server.items():
        assert len(values) >= 50, tag
        median = sorted(values)[len(values) // 2]
        assert (0.9e-3 < median < 1.2e-3) if "qwen3" in tag else (0.65e-3 < median < 0.85e-3), (tag, median)


def test_a_lone_prompt_step_under_the_graph_is_shorter_than_past_it():
    # b31's one-request points: the same model's prompt step alone lasts about 0.6 ms a layer under the 512-token
    # graph (only the attention launched between its pieces) and about 1 ms past it, whatever the prompt's GEMMs take
    # on the small model (Qwen2.5-1.5B: 3-8 ms)
    from measure.steps import lone_prompt_rows, traced_servers

    server = next(s for s in traced_servers() if s["tag"] == "b31-qwen25-15b")
    rows = lone_prompt_rows(server)
    under = sorted(r["span_s"] / r["layers"] for r in rows if not r["eager"])
    past = sorted(r["span_s"] / r["layers"] for r in rows if r["eager"])
    assert len(under) >= 3 and len(past) >= 12
    assert 0.4e-3 < under[len(under) // 2] < 0.7e-3 < 0.9e-3 < past[len(past) // 2] < 1.4e-3
    assert all(r["span_s"] > 2 * r["gpu_s"] for r in rows)


def test_a_larger_capture_size_takes_the_eager_launch_away():
    small = _moe("b7-qwen3moe-p04-i1000-o32-c1")
    large = _moe("b7-qwen3moe-cg2048-p04-i1000-o32-c1")
    assert (large.graphs.prefill_tokens, large.graphs.decode_tokens) == (2048, 2048)
    # a decode-only step pads to a FULL graph of at most max_num_seqs requests (1,024 on these servers)
    assert max(large.graphs.decode_batches) == 1024 and large.graphs.padded_batch(1000) == 1008
    assert small.host_side_seconds(0, [(0, 1000)]) == pytest.approx(48 * EAGER_MOE)
    assert large.host_side_seconds(0, [(0, 1000)]) == 0.0
    assert large.gpu_seconds(0, 0, [(0, 1000)]) == pytest.approx(small.gpu_seconds(0, 0, [(0, 1000)]))
    # past both graphs the two engines' steps cost the same
    assert large.seconds(0, 0, [(0, 4000)]) == pytest.approx(small.seconds(0, 0, [(0, 4000)]))


def test_a_decode_only_step_of_more_requests_than_the_largest_graph_is_eager_too():
    moe = _moe()  # the front end's pace (513 streams' tokens, ~30 ms) is held apart
    # the cache by batch size (decode_seconds) gives what a step built from scratch gives, on both sides of 512
    for batch in (512, 513):
        assert moe.decode_seconds(batch, batch * 1000) == pytest.approx(moe.seconds(batch, batch * 1000, []))
    assert moe.host_side_seconds(513, []) == pytest.approx(48 * EAGER_MOE)
    assert moe.host_side_seconds(512, []) == 0.0
    assert moe.decode_seconds(513, 513_000) == pytest.approx(max(moe.gpu_seconds(513, 513_000, []), 48 * EAGER_MOE))


def test_enforce_eager_makes_every_step_eager_even_a_decode_of_one_request():
    model, _ = _replica("qwen3-30b-a3b", cudagraph_mode="NONE", torch_compile=False)
    assert model.graphs == GraphedSteps(0, 0)
    model = replace(model, core_s_per_token=0.0, api_s_per_token=0.0)
    # one request's decode on the GPU (a few ms) is shorter than the launch of its 48 MoE layers
    assert model.gpu_seconds(1, 1000, []) < 48 * EAGER_MOE
    assert model.seconds(1, 1000, []) == pytest.approx(48 * EAGER_MOE)
    assert model.decode_seconds(1, 1000) == pytest.approx(48 * EAGER_MOE)
    # decode graphs alone: a prompt chunk is never graphed, a decode batch up to the graph is
    decode_only, _ = _replica(cudagraph_mode="FULL_DECODE_ONLY")
    assert decode_only.graphs.eager(10, prefills=True) and not decode_only.graphs.eager(10, prefills=False)


def test_the_moe_launch_is_read_off_two_hosts_lone_prompts_and_holds_the_launches_under_load():
    # the fit (its reproduction in full is test_serving_sim's --check): Qwen3-30B-A3B's prompts alone past the 512-token
    # graph, their GPU part under half their span, on two hosts: b35's 1,000-token prompts spanned 86-109 ms, b39's
    # 1,000- and 2,000-token ones 58-80; the dense launch (48 layers) taken off, one vote a host
    sys.path.insert(0, str(ROOT / "scripts"))
    from fit_serving_moe import fit_moe_launch, moe_launch_rows

    fit = step_overhead()
    terms = fit.model_dump()
    rows = moe_launch_rows(terms)
    by_server = {r["server"]: [x["span_s"] for x in rows if x["server"] == r["server"]] for r in rows}
    assert set(by_server) == {"b35-qwen3moe", "b39-qwen3moe"}
    assert all(0.085 < v < 0.11 for v in by_server["b35-qwen3moe"])
    assert all(0.055 < v < 0.085 for v in by_server["b39-qwen3moe"])
    launch, ids = fit_moe_launch(terms)
    assert launch == fit.eager_moe_layer_launch_s and set(ids) <= set(fit.fitted_on)
    assert 0.5e-3 < launch < 1.0e-3
    # under load, the period before a 1,000-token chunk past the graph (the launch, under async scheduling) on four
    # hosts' Qwen3-30B-A3B servers: b39's 70 ms, b34's 94, b35's 98, b12's 120; the terms' 48 layers lie among them,
    # below the middle two's
    from measure.steps import launch_rows, traced_servers

    expected = 48 * (fit.eager_layer_launch_s + fit.eager_moe_layer_launch_s)
    medians = {}
    for tag in ("b12-qwen3moe", "b34-qwen3moe", "b35-qwen3moe", "b39-qwen3moe"):
        server = next(s for s in traced_servers() if s["tag"] == tag)
        eager = sorted(r["launch_s"] for r in launch_rows(server) if r["eager"])
        medians[tag] = eager[len(eager) // 2]
    ordered = sorted(medians.values())
    assert ordered[0] < expected < ordered[1] and ordered[-1] / ordered[0] > 1.5, (medians, expected)


def test_the_moe_prompt_terms_bring_the_out_of_fit_moe_prompts_nearer():
    # what the fit never read: b7's Qwen3-30B-A3B prompts of 520-2,000 tokens past the 512-token graph, DeepSeek-V2-Lite's
    # (MLA, 26 MoE layers of 64 experts) open loops on b39 (its prompts alone fit the MLA launch), and Mixtral-8x7B's prompts of
    # 1,000-4,000 tokens alone on b39, each nearer the measured TTFT than the figure committed before its batch ran; b7's within
    # 35%, Mixtral's within 10% (committed with the experts at one share of the prefill rate: 23-39% long)
    from sizing.evidence.serving import predict_point, served_settings

    fit = step_overhead()
    points = _points()
    committed = {}
    for batch in ("b7-prefill-graphs", "b15-format-check", "b39-moe-launch"):
        committed.update({p["id"]: p["ttft_ms"]["50"] for p in json.loads(
            (ROOT / "measure" / "serving" / f"{batch}-sim-predictions-h200.json").read_text())["points"]})
    # DeepSeek-V2-Lite's against the figures committed beside them from a cost per MoE layer added to the GPU's part
    gpu_eager = {p["id"]: p["ttft_ms"]["50"] for p in json.loads((ROOT / "measure" / "serving" / (
        "b39-moe-launch-sim-predictions-h200-gpu-eager.json")).read_text())["points"]}
    committed.update({i: gpu_eager[i] for i in gpu_eager if i.startswith("b39-dsv2lite")})
    for i in ("b7-qwen3moe-p03-i520-o32-c1", "b7-qwen3moe-p04-i1000-o32-c1", "b7-qwen3moe-p05-i2000-o32-c1",
              "b39-dsv2lite-p07-i1000-o128-r4", "b39-dsv2lite-p08-i1000-o128-r12",
              "b39-mixtral-p02-i1000-o32-c1", "b39-mixtral-p03-i2000-o32-c1", "b39-mixtral-p04-i4000-o32-c1"):
        assert i not in fit.fitted_on
        measured = points[i]["measured"]["ttft_p50_ms"]
        now = predict_point(served_settings(points[i]), ROOT).ttft_ms[50]
        assert abs(now / measured - 1) < abs(committed[i] / measured - 1), i
        if i.startswith("b7"):  # the 2,000-token prompt 34% short: b7's host was busy with a build
            assert abs(now / measured - 1) < 0.35, (i, now, measured)
        if i.startswith("b39-mixtral"):
            assert abs(now / measured - 1) < 0.1, (i, now, measured)
    # the tiles' cost: fitted on Qwen3-30B-A3B's one-request prompts of 8,000 tokens and more, over a thousand elements
    sys.path.insert(0, str(ROOT / "scripts"))
    from fit_serving_moe import tile_k_points

    chosen = tile_k_points(list(points.values()))
    assert {p["settings"]["model"] for p in chosen} == {"qwen3-30b-a3b"} and len(chosen) == 6
    assert all(p["id"] in fit.fitted_on and p["settings"]["input_len"] >= 8000 for p in chosen)
    assert 800 < fit.moe_tile_fixed_k < 1600


def test_the_front_end_paces_many_streams_and_more_api_servers_share_its_work():
    # b8-frontend: Llama-3.2-1B at 512 in flight streams a token every 29.4 ms under one API server and every 9.3 ms
    # under four: the step lasts at least its streams' tokens through the API servers, and the engine core's work on
    # each stream lengthens the host's side of the step beyond its floor
    from sizing.evidence.serving import point_replica
    from sizing.planners.step_model import step_overhead

    fitted = step_overhead()
    one = point_replica(_points()["b8-llama1b-p04-i128-o256-c512"]["settings"], ROOT)[0]
    four = point_replica(_points()["b8-llama1b-api4-p04-i128-o256-c512"]["settings"], ROOT)[0]
    assert one.core_s_per_token == four.core_s_per_token == pytest.approx(fitted.frontend_core_s_per_token)
    assert one.api_s_per_token == pytest.approx(fitted.frontend_api_s_per_token)
    assert four.api_s_per_token == pytest.approx(fitted.frontend_api_s_per_token / 4)
    gpu = replace(one, core_s_per_token=0.0, api_s_per_token=0.0).decode_seconds(512, 512 * 256)
    host = one.floor_s + 512 * one.core_s_per_token
    # one API server is the bound; four share its work and leave the engine core's side of the step and the GPU's
    # (its 512 requests' own cost a step among it) within 2% of each other, the longer of them the step
    assert 512 * four.api_s_per_token < min(gpu, host) and max(gpu, host) < 512 * one.api_s_per_token
    assert gpu == pytest.approx(host, rel=0.02)
    assert one.decode_seconds(512, 512 * 256) == pytest.approx(512 * one.api_s_per_token)
    assert four.decode_seconds(512, 512 * 256) == pytest.approx(max(gpu, host))
    # held to the server: within 10% of b8's measured gaps at 512 in flight
    assert one.decode_seconds(512, 512 * 256) == pytest.approx(0.02936, rel=0.1)
    assert four.decode_seconds(512, 512 * 256) == pytest.approx(0.00925, rel=0.1)
    # at a few streams the host's side is the floor and the engine core's share of them, added, not overlapped
    assert one.decode_seconds(32, 32 * 256) == pytest.approx(max(replace(one, core_s_per_token=0.0).decode_seconds(
        32, 32 * 256), one.floor_s + 32 * one.core_s_per_token))
    # one stream: the 1B's GPU step is shorter than the host's floor, which one stream's work lengthens by tens of us
    bare_one = replace(one, core_s_per_token=0.0, api_s_per_token=0.0).decode_seconds(1, 256)
    assert bare_one == pytest.approx(one.floor_s)
    assert one.decode_seconds(1, 256) == pytest.approx(one.floor_s + one.core_s_per_token)
    assert 0 < one.core_s_per_token < 1e-4


def test_the_share_of_step_time_the_host_sets_is_counted_over_the_run():
    # Llama-3.2-1B at 128 streams (b8): nearly every step is the host's; Llama-3.1-8B at 256 (b6): every one the GPU's
    # but the burst's first, its first prompt alone under the graph, which the host's launch of its layers sets
    from sizing.evidence.serving import predict_point

    points = _points()
    small = predict_point(points["b8-llama1b-p02-i128-o256-c128"]["settings"], ROOT)
    large = predict_point(points["b6-llama8b-bf16-p08-i1000-o256-c256"]["settings"], ROOT)
    assert 0.9 <= small.host_paced_share <= 1.0
    assert 0.0 < large.host_paced_share < 0.01

"""An MLA layer's work beyond a dense layer's (sizing/planners/step_model.py): its prompt path's launch
(eager_mla_layer_launch_s, piecewise_mla_layer_launch_s), where it applies, its fit on the prompts alone of the traced
MLA servers (scripts/fit_serving_mla.py) and the MLA points the fit never read; and its kernels' cost a step
(mla_layer_step_overhead_s), fitted on one MLA model's decode and held to the other's."""

import json
import statistics
import sys
from dataclasses import replace

import pytest

from conftest import ROOT
from sizing.evidence.serving import point_replica, predict_point, served_settings
from sizing.planners.step_model import step_overhead

MLA_MODELS = ("deepseek-v2-lite", "glm-4.7-flash")


def _points() -> dict:
    return {p["id"]: p for p in json.loads((ROOT / "measure" / "serving" / "points.json").read_text())["points"]}


def test_only_an_mla_models_layers_launch_the_mla_prompt_path():
    points = _points()
    dsv2, _ = point_replica(points["b39-dsv2lite-p02-i1000-o32-c1"]["settings"], ROOT)
    qwen_moe, _ = point_replica(points["b39-qwen3moe-p02-i1000-o32-c1"]["settings"], ROOT)
    assert dsv2.mla_layers == dsv2.shape.num_layers == 27 and dsv2.moe_layers == 26
    assert qwen_moe.mla_layers == 0
    fit = step_overhead()
    # past the 512-token graph: every layer's kernels, a MoE layer's fused-expert path and an MLA layer's prompt path
    assert dsv2.eager_launch_s == pytest.approx(27 * fit.eager_layer_launch_s + 26 * fit.eager_moe_layer_launch_s
                                                + 27 * fit.eager_mla_layer_launch_s)
    assert qwen_moe.eager_launch_s == pytest.approx(48 * (fit.eager_layer_launch_s + fit.eager_moe_layer_launch_s))
    # under it, a prompt chunk's step launches each layer's attention between the graph's pieces, MLA's at more
    bare = replace(dsv2, floor_s=0.0, core_s_per_token=0.0, api_s_per_token=0.0)
    assert bare.host_side_seconds(0, [(0, 300)]) == pytest.approx(
        27 * (fit.piecewise_layer_launch_s + fit.piecewise_mla_layer_launch_s))
    # a decode-only step replays one FULL graph: no launch
    assert bare.host_side_seconds(8, []) == pytest.approx(bare.host_seconds(8))
    # a launch is a bound beside the GPU's part, which it leaves as it is
    off = replace(dsv2, eager_mla_layer_launch_s=0.0, piecewise_mla_layer_launch_s=0.0)
    assert dsv2.gpu_seconds(0, 0, [(0, 1000)]) == off.gpu_seconds(0, 0, [(0, 1000)])
    assert dsv2.seconds(0, 0, [(0, 1000)]) > off.seconds(0, 0, [(0, 1000)])


def test_the_mla_launch_is_the_median_of_the_traced_mla_servers_votes():
    # the fit (its reproduction in full is test_serving_sim's --check): DeepSeek-V2-Lite's prompts alone on three hosts
    # (b15's in fp8, b34's and b39's in bf16) and GLM-4.7-Flash's on b40's, each server one vote
    sys.path.insert(0, str(ROOT / "scripts"))
    from fit_serving_mla import EAGER_MLA_TERM, PIECEWISE_MLA_TERM, fit_mla_launch

    fit = step_overhead()
    fitted, votes, ids = fit_mla_launch(fit.model_dump())
    assert fitted == {EAGER_MLA_TERM: fit.eager_mla_layer_launch_s, PIECEWISE_MLA_TERM: fit.piecewise_mla_layer_launch_s}
    assert set(ids) <= set(fit.fitted_on)
    points = _points()
    assert {points[i]["settings"]["model"] for i in ids} == set(MLA_MODELS)
    assert set(votes[EAGER_MLA_TERM]) == {"b15-dsv2lite-fp8", "b39-dsv2lite", "b40-glm47flash"}
    assert set(votes[PIECEWISE_MLA_TERM]) == {"b34-dsv2lite", "b39-dsv2lite", "b40-glm47flash"}
    # past the graph, a few tenths of a millisecond a layer beyond a dense layer's ~1 ms; both models' own votes agree
    # within a factor of 1.5 on the bf16 servers
    eager = votes[EAGER_MLA_TERM]
    assert 0.3e-3 < fit.eager_mla_layer_launch_s < 1.0e-3
    assert max(eager["b39-dsv2lite"], eager["b40-glm47flash"]) / min(eager["b39-dsv2lite"], eager["b40-glm47flash"]) < 1.5
    # under it, a small share of a dense layer's attention launch between the pieces
    assert 0 < fit.piecewise_mla_layer_launch_s < 0.5 * fit.piecewise_layer_launch_s


def test_the_mla_launch_brings_the_mla_points_the_fit_never_read_nearer():
    # every MLA point not in the fit (loaded and open loops, long prompts alone): p50 TTFT with the MLA launch against
    # without it: 13 of 24 within 10% where 8 were, the open loops of 1,000-token prompts -7% to -23% where they were
    # -30% to -54%
    fit = step_overhead()
    off = {**fit.model_dump(), "eager_mla_layer_launch_s": 0.0, "piecewise_mla_layer_launch_s": 0.0}
    errors = {}
    for i, p in _points().items():
        if p["settings"]["model"] in MLA_MODELS and i not in fit.fitted_on and p["measured"].get("ttft_p50_ms"):
            measured = p["measured"]["ttft_p50_ms"]
            errors[i] = tuple(predict_point(served_settings(p), ROOT, terms=terms).ttft_ms[50] / measured - 1
                              for terms in (off, None))
    assert len(errors) >= 24
    within = [sum(abs(e[k]) < 0.1 for e in errors.values()) for k in (0, 1)]
    assert within[1] >= within[0] + 3, within
    assert (statistics.median(abs(e[1]) for e in errors.values())
            < statistics.median(abs(e[0]) for e in errors.values()))
    for i in ("dsv2lite-bf16-p11-i1000-o256-r4", "dsv2lite-bf16-p12-i1000-o256-r16",
              "b39-dsv2lite-p07-i1000-o128-r4", "b39-dsv2lite-p08-i1000-o128-r12", "b40-glm47flash-p05-i1000-o128-r4"):
        before, now = errors[i]
        assert before < -0.25 and abs(now) < abs(before), (i, before, now)


def test_an_mla_layers_decode_kernels_fitted_on_one_model_hold_the_other():
    # the cost a step of an MLA layer's kernels beyond a dense layer's attention, fitted on DeepSeek-V2-Lite's
    # one-request gaps (prompts up to 4,000 tokens): GLM-4.7-Flash (47 layers to 27), which the fit never read for
    # it, decoding alone came 11-19% short without it
    sys.path.insert(0, str(ROOT / "scripts"))
    from fit_serving_mla import MLA_LAYER_TERM, fit_mla_layer, mla_layer_points

    fit = step_overhead()
    points = _points()
    chosen = mla_layer_points(list(points.values()))
    assert {p["settings"]["model"] for p in chosen} == {"deepseek-v2-lite"} and len(chosen) >= 6
    terms = fit.model_dump()
    assert fit_mla_layer(list(points.values()), terms) == pytest.approx(fit.mla_layer_step_overhead_s, abs=1e-9)
    assert 5e-6 < fit.mla_layer_step_overhead_s < 30e-6
    off = {**terms, MLA_LAYER_TERM: 0.0}
    glm = [p for p in points.values() if p["settings"]["model"] == "glm-4.7-flash"
           and p["settings"]["loop"] == "closed" and p["settings"]["concurrency"] == 1]
    assert len(glm) >= 4
    for p in glm:
        measured = p["measured"]["itl_p50_ms"]
        before = predict_point(served_settings(p), ROOT, terms=off).itl_ms[50] / measured - 1
        now = predict_point(served_settings(p), ROOT).itl_ms[50] / measured - 1
        assert before < -0.1 and abs(now) < 0.1, (p["id"], before, now)


def test_an_mla_prompt_attends_over_the_up_projected_keys_and_values():
    # QK over qk_nope + qk_rope, PV over v_head_dim (config.json: DeepSeek-V2-Lite 128 + 64 and 128, GLM-4.7-Flash
    # 192 + 64 and 256), where 2 x head_dim gave 128; a dense model's 2 x head_dim as before
    from sizing.planners.speed import attention_head_widths, prefill_attention_flops

    points = _points()
    widths = {}
    for i in ("b39-dsv2lite-p05-i16000-o32-c1", "b40-glm47flash-p04-i16000-o32-c1", "b39-qwen3moe-p05-i16000-o32-c1"):
        model, _ = point_replica(points[i]["settings"], ROOT)
        widths[points[i]["settings"]["model"]] = attention_head_widths(model.shape)
        assert prefill_attention_flops(model.shape, 1000) == (model.shape.num_layers * model.shape.num_attention_heads
                                                              * widths[points[i]["settings"]["model"]] * 1000 ** 2)
    assert widths == {"deepseek-v2-lite": 320, "glm-4.7-flash": 512, "qwen3-30b-a3b": 256}
    # the long prompts alone, where the GPU sets the step: 16-34% short with the rotary width alone
    for i, before in (("dsv2lite-bf16-p09-i32000-o128-c1", -0.16), ("b39-dsv2lite-p05-i16000-o32-c1", -0.12),
                      ("b40-glm47flash-p04-i16000-o32-c1", -0.34)):
        now = predict_point(served_settings(points[i]), ROOT).ttft_ms[50] / points[i]["measured"]["ttft_p50_ms"] - 1
        assert abs(now) < 0.1 and abs(now) < abs(before), (i, now)

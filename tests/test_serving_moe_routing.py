"""A MoE model whose routing vLLM runs as torch ops one by one (sizing/planners/moe_routing.py,
profiles/moe-routing.json): its kernels counted from the engine's model source, each priced as one of the fused-MoE
path's kernels, and held to the one model measured, Phi-3.5-MoE, which no term was fitted on."""

import json
from dataclasses import replace

import pytest

from conftest import ROOT
from sizing.evidence.serving import point_replica, predict_point, served_settings
from sizing.planners.moe_routing import moe_routing, routing_overhead_s
from sizing.planners.step_model import step_overhead


def _points() -> dict:
    return {p["id"]: p for p in json.loads((ROOT / "measure" / "serving" / "points.json").read_text())["points"]}


def test_only_an_architecture_the_engine_routes_op_by_op_pays_for_its_routing():
    c_moe = step_overhead().moe_layer_step_overhead_s
    table = moe_routing()
    # sparsemixer: 22 kernels in place of the fused top-k's one; the fused path's five kernels share c_moe
    assert table.routing["PhiMoEForCausalLM"].extra_kernels == 21 and table.fused_moe_kernels == 5
    assert routing_overhead_s(("PhiMoEForCausalLM",), c_moe) == pytest.approx(21 * c_moe / 5)
    assert routing_overhead_s(("MixtralForCausalLM",), c_moe) == 0.0
    assert routing_overhead_s((), c_moe) == 0.0
    points = _points()
    phi, _ = point_replica(points["b40-phimoe-p02-i1000-o32-c1"]["settings"], ROOT)
    mixtral, _ = point_replica(points["b39-mixtral-p02-i1000-o32-c1"]["settings"], ROOT)
    assert phi.moe_routing_overhead_s > 0 and mixtral.moe_routing_overhead_s == 0.0
    # every step pays it on every MoE layer, beside the GPU's other work
    bare = replace(phi, moe_routing_overhead_s=0.0)
    assert phi.decode_seconds(1, 1000) - bare.decode_seconds(1, 1000) == pytest.approx(
        32 * phi.moe_routing_overhead_s, rel=1e-6)


def test_phi_moe_decoding_alone_is_held_by_its_routing_kernels():
    # b40's Phi-3.5-MoE, one request at 300-16,000 tokens: 6.44-6.97 ms a gap measured, 22-23% short without its
    # routing kernels (1.49 ms a step over 32 layers); no term is fitted on it
    fit = step_overhead()
    for i, p in _points().items():
        if p["settings"]["model"] != "phi-3.5-moe-instruct" or p["settings"]["concurrency"] != 1:
            continue
        assert i not in fit.fitted_on
        measured = p["measured"]["itl_p50_ms"]
        model, _ = point_replica(p["settings"], ROOT)
        now = predict_point(served_settings(p), ROOT).itl_ms[50]
        # one request's gap is its decode step, the GPU's: without the routing, that step less its 32 layers' share
        before = now - 1e3 * 32 * model.moe_routing_overhead_s
        assert abs(now / measured - 1) < 0.03, (i, now, measured)
        assert before / measured - 1 < -0.2, (i, before, measured)


def test_a_broken_routing_profile_is_one_line_naming_it(tmp_path, monkeypatch):
    from sizing.errors import KvsizeError
    from sizing.planners import moe_routing as routing

    bad = tmp_path / "moe-routing.json"
    bad.write_text(json.dumps({"schema": "kvsize.moe-routing/1", "fused_moe_kernels": 0, "fused_moe_kernels_source": "x",
                               "routing": {}}))
    monkeypatch.setattr(routing, "ROUTING_PROFILE", bad)
    routing.moe_routing.cache_clear()
    try:
        with pytest.raises(KvsizeError, match=r"moe-routing\.json is invalid: .*fused_moe_kernels"):
            routing.moe_routing()
        bad.write_text("{")
        routing.moe_routing.cache_clear()
        with pytest.raises(KvsizeError, match=r"moe-routing\.json is invalid"):
            routing.moe_routing()
    finally:
        routing.moe_routing.cache_clear()

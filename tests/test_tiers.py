"""Tiers and links: the link fit, and the transfer reports measured on H100 and H200 (measure/reports)."""

import copy
import json
from pathlib import Path

import pytest

from sizing.errors import KvsizeError
from sizing.planners.tiers import LinkFit, fit_link, host_transfer_from_report, peer_link_from_report

REPORTS = Path(__file__).parent.parent / "measure" / "reports"
EXAMPLES = Path(__file__).parent.parent / "examples"
TRANSFER_REPORTS = sorted(REPORTS.glob("*transfer*.json"))


def test_fit_link_recovers_a_known_link():
    # 10 us to start, 1 us per further transfer, 50 GB/s: t = 1e-5 + (k - 1) * 1e-6 + bytes / 5e10
    link = LinkFit(1e-5, 1e-6, 5e10, "made up")
    points = [(b, k, link.seconds(b, k)) for b in (1 << 20, 1 << 24, 1 << 28) for k in (1, 4, 16)]
    fitted = fit_link(points, "made up")
    assert fitted.latency_s == pytest.approx(1e-5, rel=1e-9)
    assert fitted.per_transfer_s == pytest.approx(1e-6, rel=1e-9)
    assert fitted.bandwidth_bytes_per_s == pytest.approx(5e10, rel=1e-9)
    # one transfer per point: no per-transfer term to fit
    single = fit_link([(b, link.seconds(b)) for b in (1 << 20, 1 << 30)], "made up")
    assert single.per_transfer_s == 0 and single.bandwidth_bytes_per_s == pytest.approx(5e10, rel=1e-9)


@pytest.mark.parametrize("points", [[(1 << 20, 1e-4)], [(1 << 20, 0.0), (1 << 21, 1e-4)],
                                    [(1 << 20, 1e-4), (1 << 20, 1e-4)]])
def test_fit_link_refuses_points_it_cannot_fit(points):
    with pytest.raises(KvsizeError):
        fit_link(points, "bad")


def test_measured_host_links_are_pcie_gen5():
    # measure/reports/h100-host-transfer.json, h200-host-transfer.json: both GPUs report a PCIe 5.0 x16
    # link; pinned copies sustain 54.5-54.6 GB/s each way (the link's 63 GB/s raw, less protocol overhead).
    for name in ("h100-host-transfer.json", "h200-host-transfer.json"):
        report = json.loads((REPORTS / name).read_text())
        assert (report["device"]["pcie_generation"], report["device"]["pcie_width"]) == (5, 16)
        model = host_transfer_from_report(report, name)
        for link in (model.d2h, model.h2d):
            assert 50e9 < link.bandwidth_bytes_per_s < 63e9
            assert link.latency_s < 50e-6


def test_measured_nvlink_peer_link():
    # measure/reports/h200x2-peer-transfer.json: two H200s over NVLink (NV18), NCCL 2.28.9 send/recv.
    report = json.loads((REPORTS / "h200x2-peer-transfer.json").read_text())
    link = peer_link_from_report(report, "peer")
    assert 300e9 < link.bandwidth_bytes_per_s < 450e9  # H200 NVLink 4: 450 GB/s per direction, raw


@pytest.mark.parametrize("path", TRANSFER_REPORTS, ids=lambda p: p.name)
def test_transfer_times_raised_20_percent_are_rejected(path):
    from measure.validate import checked

    report = json.loads(path.read_text())
    assert checked(report, None) == []
    slower = copy.deepcopy(report)
    section = "host_paged" if "host_paged" in slower else "peer_layered"
    for p in slower[section]:
        p["seconds"] *= 1.2
    problems = checked(slower, None)
    assert len(problems) == len(slower[section])


def test_a_transfer_point_with_the_wrong_bytes_is_rejected():
    from measure.validate import checked

    report = json.loads((REPORTS / "h200-host-transfer.json").read_text())
    report["host_paged"][0]["bytes"] += 1
    assert any("the layout holds" in p for p in checked(report, None))


# -- the tier model ---------------------------------------------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from helpers import scenario  # noqa: E402
from sizing.planners.tiers import Tier, lru_hit_rates, reload_seconds, tier_answers, tiers_for  # noqa: E402
from sizing.planners.workload import parse_workload  # noqa: E402

PCIE = LinkFit(10e-6, 0.0, 50e9, "a 50 GB/s link")
HBM = LinkFit(0.0, 0.0, 2e12, "a 2 TB/s copy")


def test_lru_hit_rate_by_hand():
    # 10 sessions of 50 tokens reused alike, a cache of 250 tokens: T solves 500 (1 - e^(-T/tau)) = 250,
    # so every session's hit rate is 1/2; a cache that holds all 500 tokens hits every time.
    assert lru_hit_rates(250, [(10, 50, 10.0)]) == [pytest.approx(0.5, rel=1e-9)]
    assert lru_hit_rates(500, [(10, 50, 10.0)]) == [1.0]
    assert lru_hit_rates(0, [(10, 50, 10.0)]) == [0.0]
    # a group reused 10x as often is held longer: 1 - e^(-T/1) vs 1 - e^(-T/10)
    hot, cold = lru_hit_rates(500, [(10, 50, 1.0), (10, 50, 10.0)])
    assert hot > cold and 10 * 50 * hot + 10 * 50 * cold == pytest.approx(500, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 10_000), st.integers(1, 100_000), st.floats(0.01, 1e5)), min_size=1,
                max_size=4),
       st.floats(0, 1e9), st.floats(0, 1e9))
def test_a_larger_cache_never_lowers_the_hit_rate(groups, a, b):
    small, large = sorted((a, b))
    for lo, hi in zip(lru_hit_rates(small, groups), lru_hit_rates(large, groups)):
        assert hi >= lo - 1e-9
        assert 0 <= lo <= 1 and 0 <= hi <= 1


def test_reload_by_hand():
    # 1 GiB over a 50 GB/s per-GPU link with 10 us latency, then scattered at 2 TB/s:
    # 10e-6 + 2^30 / 50e9 + 2^30 / 2e12 = 0.02148... + 0.000537 s; a link the GPUs share moves both halves.
    host = Tier("host", 10**12, (PCIE,), (False,))
    assert reload_seconds(host, 2**30, 2, HBM) == pytest.approx(10e-6 + 2**30 / 50e9 + 2**30 / 2e12)
    shared = Tier("disk", 10**12, (PCIE,), (True,))
    assert reload_seconds(shared, 2**30, 2, HBM) == pytest.approx(10e-6 + 2 * 2**30 / 50e9 + 2**30 / 2e12)


def test_tier_answer_by_hand():
    # Llama-3.1-8B fp8 (32 layers x 8 KV heads x 128 x 2 sides x 1 B = 65,536 B per token), TP 1:
    # 256 GiB of host memory holds 2^38 / 2^16 = 4,194,304 tokens, 128 sessions of 32K.
    (answer,) = tier_answers([Tier("host", 256 * 2**30, (PCIE,), (False,))], 65_536, 1, 32_768, 1.0, HBM)
    assert (answer.tokens, answer.sessions_warm) == (4_194_304, 128)
    assert answer.reload_seconds == pytest.approx(10e-6 + 2**31 / 50e9 + 2**31 / 2e12)
    assert answer.reload_beats_recompute


WORKLOAD = {"peak_concurrency": 300, "buckets": [
    {"max_context_tokens": 16384, "share_percent": 100, "output_tokens": 400, "prompt_tokens": 6000}],
    "sessions": [{"share_percent": 85, "sessions": 3000, "reused_tokens": 5000, "reuse_interval_s": 90}]}


def test_a_bigger_host_tier_saves_more_prefill_and_never_slows_ttft():
    w = parse_workload(WORKLOAD)
    s = scenario("llama-3.1-8b", k_cache_dtype="fp8", v_cache_dtype="fp8", max_model_len=16384)
    plans = [tiers_for(s, w, {"host": gib * 2**30} if gib else {}, {}, 32768, 0.5)[1] for gib in (0, 64, 256, 1024)]
    saved = [p.prefill_tokens_saved_per_request for p in plans]
    ttft = [p.ttft_seconds for p in plans]
    assert saved == sorted(saved) and saved[-1] > saved[0]
    assert ttft == sorted(ttft, reverse=True) and ttft[-1] < plans[0].ttft_seconds_no_reuse
    # 3,000 sessions x 5,000 tokens = 15M tokens; 1 TiB of host memory holds 16.8M fp8 tokens: all hit
    assert plans[-1].reuse[0].hit_rate == pytest.approx(1.0)


def test_sessions_sharing_more_than_all_requests_are_refused():
    bad = dict(WORKLOAD, sessions=[dict(WORKLOAD["sessions"][0], share_percent=70)] * 2)
    with pytest.raises(KvsizeError, match="sessions: share_percent must sum to at most 100"):
        parse_workload(bad)


def test_tiers_cli(capsys):
    from app.cli import main

    assert main(["tiers", "--workload", str(EXAMPLES / "multi-turn-chat.yaml"), "--model", "llama-3.1-8b",
                 "--kv-cache-dtype", "fp8", "--host-memory", "256GiB", "--format", "json"]) == 0
    record = json.loads(capsys.readouterr().out)
    (host,) = record["tiers"]
    assert host["tokens"] == 4_194_304 and host["route"] == "pcie5-x16"
    assert record["engine_options"] == "--kv-offloading-size 256 --kv-offloading-backend native"
    assert main(["tiers", "--workload", str(EXAMPLES / "multi-turn-chat.yaml"), "--model", "llama-3.1-8b",
                 "--host-memory", "1GiB", "--host-link", "pcie9"]) == 2
    assert "unknown link 'pcie9' (--host-link)" in capsys.readouterr().err


def test_host_tier_options_per_engine():
    # vLLM: --kv-offloading-size in GiB summed over TP ranks; SGLang: --hicache-size in GB per rank;
    # TensorRT-LLM: kv_cache_config.host_cache_size in bytes per rank (64 GiB over TP 2 = 34,359,738,368 B).
    from sizing.engines.serve import ServeSettings, serve_command
    from sizing.planners.tiers import engine_offload_options

    host = 64 * 2**30
    assert engine_offload_options("vllm", host, 2) == "--kv-offloading-size 64 --kv-offloading-backend native"
    assert engine_offload_options("sglang", host, 2) == "--enable-hierarchical-cache --hicache-size 34.3597"
    assert engine_offload_options("trtllm", host, 2) == "kv_cache_config: {host_cache_size: 34359738368}"
    settings = ServeSettings("m", "fp8_e4m3", "bf16", 2, 8192, 0.9, 32, 64, 0)
    assert "host_cache_size: 34359738368" in serve_command("trtllm", settings, None, host).command
    assert serve_command("lmdeploy", settings, None, host).command is None

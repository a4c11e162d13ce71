"""The most requests/s a replica holds under a latency target (sizing/evidence/slo_rate.py), on hand-made ladders of
loads and on batch b1's measured points."""

import copy
import json
from pathlib import Path

import pytest

from sizing.errors import KvsizeError
from sizing.evidence.slo_rate import compared, most_held, target

ROOT = Path(__file__).resolve().parent.parent


def _ladder(ttft, tpot, rates, loads=(1, 8, 32, 128)):
    return [dict(load=n, ttft_p50_ms=a, tpot_p50_ms=b, requests_per_s=r)
            for n, a, b, r in zip(loads, ttft, tpot, rates)]


LADDER = _ladder(ttft=(30, 150, 600, 1800), tpot=(5, 6, 8, 16), rates=(1, 5, 13, 22))


def test_every_load_meeting_answers_at_least_the_heaviest_rate():
    held = most_held(LADDER, target(tpot_p50_ms=50, ttft_p50_ms=5000))
    assert held.kind == "at least" and held.at_least
    assert held.requests_per_s == 22 and held.low == 22 and held.met == 128 and held.missed is None
    assert held.text() == "≥ 22.00"


def test_the_lightest_load_missing_answers_none():
    held = most_held(LADDER, target(tpot_p50_ms=4))
    assert held.requests_per_s is None and held.kind == "none"
    assert held.missed == 1 and held.high == 1 and held.binding == "tpot_p50_ms"


def test_interpolation_is_exact_on_a_linear_ladder():
    # TPOT grows as 2 ms a request/s: 10 ms is met at 5 req/s exactly, between the loads of 4 and 8 req/s
    ladder = [dict(load=n, tpot_p50_ms=2.0 * r, ttft_p50_ms=10.0, requests_per_s=r)
              for n, r in ((1, 1), (4, 4), (8, 8))]
    held = most_held(ladder, target(tpot_p50_ms=10))
    assert held.requests_per_s == pytest.approx(5.0)
    assert (held.met, held.missed, held.low, held.high) == (4, 8, 4, 8)
    assert not held.readable()  # 4 to 8 req/s: the straight line is a guess
    # the points in any order: read in load order
    assert most_held(ladder[::-1], target(tpot_p50_ms=10)).requests_per_s == pytest.approx(5.0)


def test_the_figure_that_crosses_first_binds():
    # between 32 and 128 in flight both bounds are passed: TTFT (600 -> 1800) reaches 1000 a third of the way,
    # TPOT (8 -> 16) reaches 12 half the way; TTFT binds
    held = most_held(LADDER, target(ttft_p50_ms=1000, tpot_p50_ms=12))
    assert held.binding == "ttft_p50_ms"
    assert held.requests_per_s == pytest.approx(13 + (22 - 13) / 3)
    # a looser TTFT bound: TPOT now binds, half way
    held = most_held(LADDER, target(ttft_p50_ms=1700, tpot_p50_ms=12))
    assert held.binding == "tpot_p50_ms" and held.requests_per_s == pytest.approx(17.5)
    # TPOT binds alone between 8 and 32 when its bound is 7
    held = most_held(LADDER, target(tpot_p50_ms=7, ttft_p50_ms=5000))
    assert held.binding == "tpot_p50_ms" and held.requests_per_s == pytest.approx(9.0)


def test_a_load_missing_stops_the_ladder_and_a_lighter_higher_rate_is_kept():
    # a closed loop past its peak: 128 in flight serves fewer requests/s than 32; the answer keeps 32's rate
    ladder = _ladder(ttft=(30, 150, 600, 1800), tpot=(5, 6, 8, 16), rates=(1, 5, 13, 12))
    held = most_held(ladder, target(tpot_p50_ms=12))
    assert held.requests_per_s == 13 and (held.low, held.high) == (12, 13)
    # a miss at 32 stops the reading even if 128 met again
    bumpy = _ladder(ttft=(30, 150, 600, 300), tpot=(5, 6, 8, 6), rates=(1, 5, 13, 22))
    assert most_held(bumpy, target(ttft_p50_ms=500)).missed == 32


def test_bad_targets_and_points_are_refused():
    with pytest.raises(KvsizeError, match="latency percentile"):
        target(tpot_p42_ms=10)
    with pytest.raises(KvsizeError, match="positive"):
        target(ttft_p50_ms=0)
    with pytest.raises(KvsizeError, match="no tpot_p50_ms"):
        most_held([dict(load=1, ttft_p50_ms=1, requests_per_s=1)], target(tpot_p50_ms=10))
    with pytest.raises(KvsizeError, match="same load"):
        most_held(LADDER + LADDER[:1], target(tpot_p50_ms=10))
    with pytest.raises(KvsizeError, match="no points"):
        most_held([], target(tpot_p50_ms=10))


def test_the_comparison_says_within_out_or_unread():
    ladder = [dict(load=n, tpot_p50_ms=2.0 * r, requests_per_s=r) for n, r in ((1, 1), (4, 4), (8, 8))]
    measured = most_held(ladder, target(tpot_p50_ms=10))  # 5 req/s
    close = most_held(ladder, target(tpot_p50_ms=10.8))  # 5.4 req/s
    error, verdict = compared(measured, close)
    assert error == pytest.approx(0.08) and verdict == "yes"
    assert compared(measured, most_held(ladder, target(tpot_p50_ms=12)))[1] == "no"  # 6 req/s: +20%
    everything = most_held(ladder, target(tpot_p50_ms=100))  # at least 8: more than 10% over 5
    assert compared(measured, everything) == (None, "no")
    nothing = most_held(ladder, target(tpot_p50_ms=1))
    assert compared(nothing, nothing) == (None, "both none")
    assert compared(everything, everything) == (None, "both ≥")
    # measured at least 8, kvsize 7.5: within 10% of the range, nothing more can be said
    assert compared(everything, most_held(ladder, target(tpot_p50_ms=15)))[1] == "unread"


def _b1_ladder(points, server="llama8b-bf16"):
    from helpers import load_script

    bench = load_script("serving_accuracy")
    out = []
    for p in points:
        st = p["settings"]
        if p["server"] == server and (st["input_len"], st["output_len"], st["loop"]) == (1000, 256, "closed"):
            out.append({**p["measured"], "load": st["concurrency"]})
    return bench, sorted(out, key=lambda x: x["load"])


def test_the_measured_answer_is_read_from_the_measured_figures():
    points = json.loads((ROOT / "measure" / "serving" / "points.json").read_text())["points"]
    bench, ladder = _b1_ladder(points)
    assert [x["load"] for x in ladder] == [1, 8, 32, 128, 384]
    goal = target(tpot_p50_ms=15)
    held = most_held(ladder, goal)
    # TPOT p50 crosses 15 ms between 32 and 128 in flight: the answer lies between their measured rates
    assert (held.met, held.missed) == (32, 128)
    lo, hi = ladder[2], ladder[3]
    fraction = (15 - lo["tpot_p50_ms"]) / (hi["tpot_p50_ms"] - lo["tpot_p50_ms"])
    rate = lo["requests_per_s"] + fraction * (hi["requests_per_s"] - lo["requests_per_s"])
    assert held.requests_per_s == pytest.approx(rate)
    # a change to one measured figure changes the answer
    changed = copy.deepcopy(ladder)
    changed[3]["tpot_p50_ms"] += 5  # a slower 128 in flight: the line reaches 15 ms sooner
    assert most_held(changed, goal).requests_per_s < held.requests_per_s
    changed = copy.deepcopy(ladder)
    changed[3]["requests_per_s"] *= 1.5
    assert most_held(changed, goal).requests_per_s > held.requests_per_s

    # and the benchmark's measured column is that same reading of points.json, not the simulation's
    table = bench.rows()
    row = next(r for r in bench.slo_rows(table)
               if r["ladder"]["server"] == "llama8b-bf16" and r["ladder"]["lengths"] == (1000, 256)
               and r["ladder"]["loop"] == "closed" and r["target"] == goal)
    assert row["measured"] == held
    assert row["today"] == most_held(row["ladder"]["kvsize"], goal)
    edited = [dict(r, slo=({**r["slo"][0], "tpot_p50_ms": r["slo"][0]["tpot_p50_ms"] + 5}, r["slo"][1]))
              if r["id"] == "llama8b-bf16-p04-i1000-o256-c128" else r for r in table]
    row2 = next(r for r in bench.slo_rows(edited)
                if r["ladder"]["server"] == "llama8b-bf16" and r["ladder"]["lengths"] == (1000, 256)
                and r["ladder"]["loop"] == "closed" and r["target"] == goal)
    assert row2["measured"].requests_per_s != held.requests_per_s and row2["today"] == row["today"]


def test_the_page_holds_every_ladder_and_the_planned_batch():
    page = (ROOT / "docs" / "speed-accuracy.md").read_text()
    section = page.split("## The most a replica holds under a target", 1)[1].split("## Every point", 1)[0]
    for server in ("llama8b-bf16", "llama8b-fp8", "dsv2lite-bf16", "b5-qwen3-8b", "b6-llama8b-bf16",
                   "b6-qwen3moe-bf16"):
        assert f"| {server} |" in section
    assert "most req/s under a target:" in section and "too coarse" in section

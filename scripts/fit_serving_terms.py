"""Fit the serving simulation's constants, the fixed cost of an engine step per layer, the MFU chunked prefill
reaches and the share of HBM bandwidth the engine's own attention reads each KV format at (sizing/planners/
serving.py), and write them to profiles/serving.json.

The step cost and the MFU are fitted on the points where nothing but a decode step separates two tokens and nothing
but one prompt's prefill comes before the first: one request in flight on a dense model (batch b1: Llama-3.1-8B
with bf16 and fp8 KV on an H200, 1K to 64K prompts). The step overhead: the measured median inter-token gap less the
simulated one without it, over the model's layers. The prefill MFU: the reference MFU scaled by the simulated over
the measured median TTFT. Each is the median over those points. The engine's KV read efficiency, per format: on the
same servers' closed-loop points of 8 or more in flight, the efficiency at which the simulated median gap is the
measured one in the median (kvsize's own decode kernels read fp8 faster than the engine's attention does). The two
depend on each other through the long one-request points' KV reads, so they are fitted in turn, twice.
Every other measured point (the MoE, MLA and TP 2 servers, the later batches, the open loops) is left out of the
fit, so the accuracy page reports those apart as out of the fit.

usage: python scripts/fit_serving_terms.py           (rewrites profiles/serving.json)
       python scripts/fit_serving_terms.py --check   (exit 1 if the file differs from the fit)
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sizing.evidence.serving import point_scenario, predict_point, served_settings  # noqa: E402
from sizing.planners.serving import SERVING_PROFILE  # noqa: E402

POINTS = ROOT / "measure" / "serving" / "points.json"


def fitted_on(points: list[dict]) -> list[dict]:
    """Closed-loop points of one request in flight on the dense servers of batch b1."""
    return [p for p in points if p["batch"] == "b1-llama8b" and p["settings"]["concurrency"] == 1]


KV_FIT_FORMATS = {"llama8b-bf16": "bf16", "llama8b-fp8": "fp8_e4m3"}  # b1's servers and the format each reads


def kv_fitted_on(points: list[dict]) -> dict[str, list[dict]]:
    """Per KV format, b1's closed-loop points of 8 or more in flight, where each decode step reads the KV of many
    requests: what the engine's own attention reads it at."""
    return {fmt: [p for p in points if p["batch"] == "b1-llama8b" and p["server"] == server
                  and (p["settings"]["concurrency"] or 0) >= 8] for server, fmt in KV_FIT_FORMATS.items()}


def fit_engine_kv(points: list[dict], per_layer: float, mfu: float) -> dict[str, float]:
    """Per format, the read efficiency (to 0.001) at which the simulated median inter-token gap over its points is,
    in the median, the measured one: bisection (a lower efficiency lengthens every decode step)."""
    out = {}
    for fmt, chosen in kv_fitted_on(points).items():
        def median_error(share: float) -> float:
            return statistics.median(
                predict_point(served_settings(p), ROOT, per_layer, mfu, {fmt: share}).itl_ms[50]
                / p["measured"]["itl_p50_ms"] - 1 for p in chosen)

        lo, hi = 0.05, 1.0  # median_error(lo) > 0 > median_error(hi) where the kernels read faster than measured
        if median_error(hi) >= 0:
            out[fmt] = hi
            continue
        while hi - lo > 0.0005:
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if median_error(mid) > 0 else (lo, mid)
        out[fmt] = round((lo + hi) / 2, 3)
    return out


REFERENCE_MFU = 0.5  # any MFU: one prompt prefilled alone takes time inversely proportional to it


FIT_ROUNDS = 2  # the step terms read the KV at the engine's efficiency and that is fitted with the step terms


def fit_step(points: list[dict], engine_kv: dict[str, float]) -> tuple[float, float]:
    """(per-layer overhead, prefill MFU) from the one-request points, the KV read at `engine_kv`."""
    per_layer, mfus = [], []
    for p in fitted_on(points):
        layers = point_scenario(p["settings"], ROOT).shape.num_layers
        simulated = predict_point(served_settings(p), ROOT, 0.0, REFERENCE_MFU, engine_kv)
        per_layer.append((p["measured"]["itl_p50_ms"] - simulated.itl_ms[50]) / 1e3 / layers)
        mfus.append(REFERENCE_MFU * simulated.ttft_ms[50] / p["measured"]["ttft_p50_ms"])
    return round(statistics.median(per_layer), 9), round(statistics.median(mfus), 4)


def fit(points: list[dict]) -> dict:
    engine_kv: dict[str, float] = {}
    for _ in range(FIT_ROUNDS):
        overhead, mfu = fit_step(points, engine_kv)
        engine_kv = fit_engine_kv(points, overhead, mfu)
    overhead, mfu = fit_step(points, engine_kv)
    kv_points = [p for group in kv_fitted_on(points).values() for p in group]
    return {"per_layer_step_overhead_s": overhead,
            "prefill_mfu": mfu,
            "engine_kv_efficiency": engine_kv,
            "fitted_on": [p["id"] for p in fitted_on(points) + kv_points],
            "source": "scripts/fit_serving_terms.py: medians over the points it names (measure/serving/points.json): "
                      "the measured median inter-token gap less the simulated one without the overhead, per layer; "
                      "the reference MFU scaled by the simulated over the measured median TTFT (one request in "
                      "flight); per KV format, the engine's read efficiency at which the simulated median gap of its "
                      "server's points of 8 or more in flight is the measured one, in the median"}


def main(argv: list[str]) -> int:
    points = json.loads(POINTS.read_text())["points"]
    text = json.dumps(fit(points), indent=1) + "\n"
    if "--check" in argv:
        same = SERVING_PROFILE.exists() and SERVING_PROFILE.read_text() == text
        print("profiles/serving.json " + ("is the fit" if same else "differs from the fit"))
        return 0 if same else 1
    tmp = SERVING_PROFILE.with_suffix(".json.tmp")
    tmp.write_text(text)
    tmp.replace(SERVING_PROFILE)
    print(text, end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Fit the serving simulation's two constants, the fixed cost of an engine step per layer and the MFU chunked
prefill reaches (sizing/planners/serving.py), and write them to profiles/serving.json.

It is fitted on the points where nothing but a decode step separates two tokens and nothing but one prompt's
prefill comes before the first: one request in flight on a dense model (batch b1: Llama-3.1-8B with bf16 and fp8
KV on an H200, 1K to 64K prompts). The step overhead: the measured median inter-token gap less the simulated one
without it, over the model's layers. The prefill MFU: the reference MFU scaled by the simulated over the measured
median TTFT. Each is the median over those points.
Every other measured point (the MoE, MLA and TP 2 servers, every batch above one) is left out of the fit, so the
accuracy page reports those apart as out of the fit.

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


REFERENCE_MFU = 0.5  # any MFU: one prompt prefilled alone takes time inversely proportional to it


def fit(points: list[dict]) -> dict:
    chosen = fitted_on(points)
    per_layer, mfus = [], []
    for p in chosen:
        layers = point_scenario(p["settings"], ROOT).shape.num_layers
        simulated = predict_point(served_settings(p), ROOT, 0.0, REFERENCE_MFU)
        per_layer.append((p["measured"]["itl_p50_ms"] - simulated.itl_ms[50]) / 1e3 / layers)
        mfus.append(REFERENCE_MFU * simulated.ttft_ms[50] / p["measured"]["ttft_p50_ms"])
    return {"per_layer_step_overhead_s": round(statistics.median(per_layer), 9),
            "prefill_mfu": round(statistics.median(mfus), 4),
            "fitted_on": [p["id"] for p in chosen],
            "source": "scripts/fit_serving_terms.py: medians over the points it names (measure/serving/points.json): "
                      "the measured median inter-token gap less the simulated one without the overhead, per layer; "
                      "the reference MFU scaled by the simulated over the measured median TTFT"}


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

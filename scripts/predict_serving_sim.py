"""The serving simulation's predictions for every planned serving point (measure/serving/plan.json) on a GPU where
the points have not run yet, written before they run: measure/serving/<batch>-sim-predictions-<gpu>.json.

When the batch runs there, these are the simulation's prospective figures, reported apart from the fitted and
out-of-fit ones (docs/speed-accuracy.md). A server whose steps are traced also gets its decode-only step for every
count of requests up to each closed loop's (at the point's cached tokens, measure/steps.py cached_tokens): a closed
loop's last requests finish one by one, so its trace holds the steps of every count. An existing file is never
rewritten: predictions are made once, before.

usage: python scripts/predict_serving_sim.py h100-sxm          (every batch of plan.json, on that bundled GPU)
       python scripts/predict_serving_sim.py h200 BATCH ...    (only the batches named)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.serving import (ServingError, new_predictions_files, planned_server_settings,  # noqa: E402
                             prediction_inputs)
from measure.steps import cached_tokens  # noqa: E402
from sizing.evidence.serving import point_replica, predict_point  # noqa: E402
from sizing.planners.step_model import step_overhead  # noqa: E402

SCHEMA = "kvsize.serving-sim-predictions/1"


def settings(plan: dict, server: dict, point: dict, device_name: str) -> dict:
    return {**planned_server_settings(plan, server, device_name),
            "input_len": point["input_len"], "output_len": point["output_len"], "concurrency": point["concurrency"],
            "request_rate": point["request_rate"], "num_prompts": point["num_prompts"], "seed": point["seed"]}


def decode_steps(point_settings: dict, point: dict) -> dict:
    """The simulated decode-only step, in ms, of 1 to the point's concurrency requests at its cached tokens."""
    model, _ = point_replica(point_settings, ROOT)
    tokens = cached_tokens(point)
    return dict(id=point["id"], cached_tokens=tokens,
                step_ms={str(n): round(1e3 * model.decode_seconds(n, n * tokens), 3)
                         for n in range(1, point["concurrency"] + 1)})


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.split("usage:")[1].strip(), file=sys.stderr)
        return 2
    gpu, named = argv[0], argv[1:]
    device_name, plan, commit = prediction_inputs(gpu)
    fit = step_overhead()
    try:
        todo = new_predictions_files(plan, named or plan["batches"], "sim", gpu)
    except ServingError as e:
        print(e, file=sys.stderr)
        return 2
    for batch, out in todo:
        points, steps = [], []
        for server in (s for s in plan["servers"] if s["batch"] == batch):
            for point in server["points"]:
                point_settings = settings(plan, server, point, device_name)
                served = predict_point(point_settings, ROOT)
                if server.get("step_trace") and point["concurrency"]:
                    steps.append(decode_steps(point_settings, point))
                points.append(dict(id=point["id"], server=server["tag"],
                                   ttft_ms={str(q): round(v, 3) for q, v in served.ttft_ms.items()},
                                   itl_ms={str(q): round(v, 4) for q, v in served.itl_ms.items()},
                                   tpot_ms={str(q): round(v, 4) for q, v in served.tpot_ms.items()},
                                   output_tokens_per_s=round(served.output_tokens_per_s, 3),
                                   requests_per_s=round(served.requests_per_s, 5),
                                   preemptions=served.preemptions))
        record = dict(schema=SCHEMA, batch=batch, gpu=gpu, device_name=device_name, kvsize_commit=commit,
                      constants=fit.model_dump(mode="json"), points=points, **({"decode_steps": steps} if steps else {}))
        tmp = out.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(record, indent=1) + "\n")
        tmp.replace(out)
        print(f"wrote {out.relative_to(ROOT)} ({len(points)} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

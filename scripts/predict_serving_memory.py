"""kvsize's memory figures for every server of a planned serving batch (measure/serving/plan.json) on a GPU, written
before the batch runs: measure/serving/<batch>-memory-predictions-<gpu>.json.

Each server's `vllm serve` prints its KV budget and tokens at startup; tests/test_serving_server_logs.py holds these
committed figures to what it printed once the batch has run (predicted before seen), beside check-log's figures of
today. An existing file is never rewritten: predictions are made once, before.

usage: python scripts/predict_serving_memory.py h200 BATCH ...   (the servers of each batch that have not run)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.serving import (SERVING, ServingError, new_predictions_files, planned_server_settings,  # noqa: E402
                             prediction_inputs)
from sizing.capacity.estimate import estimate  # noqa: E402
from sizing.evidence.serving import point_scenario  # noqa: E402

SCHEMA = "kvsize.serving-memory-predictions/1"


def predicted(plan: dict, server: dict, device_name: str) -> dict:
    e = estimate(point_scenario(planned_server_settings(plan, server, device_name), ROOT))
    b = e.breakdown
    return {"server": server["tag"], "weights_bytes": b.weights_bytes, "activation_bytes": b.activation_bytes,
            "non_torch_bytes": b.non_torch_bytes, "cuda_graph_bytes": b.cuda_graph_bytes,
            "kv_budget_bytes": e.kv_budget_bytes, "kv_tokens": e.max_tokens}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("usage:")[1].strip(), file=sys.stderr)
        return 2
    gpu, named = argv[0], argv[1:]
    device_name, plan, commit = prediction_inputs(gpu)
    try:
        todo = new_predictions_files(plan, named, "memory", gpu)
    except ServingError as e:
        print(e, file=sys.stderr)
        return 2
    for batch, out in todo:
        # a server that has already run is not predicted: its log was seen
        servers = [predicted(plan, s, device_name) for s in plan["servers"] if s["batch"] == batch
                   and not (SERVING / batch / s["tag"] / "server.log").exists()]
        if not servers:
            print(f"{batch}: every server has run; nothing to predict", file=sys.stderr)
            continue
        part = out.with_suffix(".json.part")
        part.write_text(json.dumps({"schema": SCHEMA, "batch": batch, "gpu": gpu, "code": commit,
                                    "servers": servers}, indent=1) + "\n")
        part.replace(out)
        print(f"wrote {out.relative_to(ROOT)} ({len(servers)} servers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

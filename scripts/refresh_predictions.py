"""Recompute the predictions stored in kvsize's reports: verify reports from their own log and config,
capacity points of measurement reports from their measured settings.

usage: python scripts/refresh_predictions.py measure/reports/*.json
A verify report keeps vLLM's whole log, the config and kvsize's checks; a capacity point keeps what was read
from the GPU and what follows from it. Their predictions are kvsize's, so when kvsize's rules change they are
recomputed (what vLLM printed and what the GPU read never change) and the report is rewritten in place,
atomically. kvsize validate holds verify checks exactly and stored capacity predictions to 1%.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measure.report_io import write_report  # noqa: E402
from measure.validate import read_report  # noqa: E402
from measure.run import REPORT_SCHEMA, model_shape, predict_capacity, predicted_weight_tensors_bytes  # noqa: E402
from measure.verify import VERIFY_SCHEMA, verify_checks  # noqa: E402


def capacity_prediction(point: dict) -> dict:
    """The `predicted` block measure/run.py stores for a capacity point, with today's rules."""
    _, shape = model_shape(point["model"], point.get("layers"))
    p = predict_capacity(point["model"], shape, point["total_bytes"], point["gpu_memory_utilization"],
                         point["max_num_batched_tokens"], point["block_size"], point["kv_cache_dtype"],
                         point["measured"]["non_torch_bytes"])
    out = dict(weights_bytes=p.breakdown.weights_bytes, activation_bytes=p.breakdown.activation_bytes,
               kv_budget_bytes=p.kv_budget_bytes, num_blocks=p.num_blocks)
    if "weights_tensor_bytes" in point["measured"]:  # version 3: the tensors apart from the allocator
        out = {"weights_bytes": out.pop("weights_bytes"), "weights_tensor_bytes": predicted_weight_tensors_bytes(shape),
               **out}
    return out


def main(paths: list[str]) -> int:
    for name in paths:
        path = Path(name)
        report = read_report(name)
        if report.get("schema") == VERIFY_SCHEMA:
            report["checks"] = verify_checks(report)
            write_report(path, report)
            print(f"{path}: {len(report['checks'])} checks recomputed")
        elif report.get("schema") == REPORT_SCHEMA and report.get("capacity"):
            for point in report["capacity"]:
                if "derived" in point:  # version 2 and later: the prediction sits beside the readings
                    point["predicted"] = capacity_prediction(point)
            write_report(path, report)
            print(f"{path}: {len(report['capacity'])} capacity predictions recomputed")
        else:
            print(f"{path}: no stored prediction to recompute; left as it is", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

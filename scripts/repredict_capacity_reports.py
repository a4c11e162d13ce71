"""Refresh kvsize's stored predictions in the committed capacity reports after the rules they follow changed.

usage: python scripts/repredict_capacity_reports.py measure/reports/h100-capacity.json ...
A capacity point keeps what the GPU measured (`measured`, `derived`, `boundary`) and what kvsize predicted for
it (`predicted`) under measure/run.py's HARNESS_ENGINE; `kvsize validate` holds the stored prediction to
today's. When that release's rules are redrawn from new real-engine starts, this rewrites `predicted` (and
nothing measured) with today's figures, each file through a temporary file renamed on success.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measure.report_io import write_report  # noqa: E402
from measure.run import model_shape, predict_capacity, predicted_record  # noqa: E402


def repredict(point: dict) -> bool:
    if "predicted" not in point or "measured" not in point:
        return False
    _, shape = model_shape(point["model"], point.get("layers"))
    m = point["measured"]
    e = predict_capacity(point["model"], shape, point["total_bytes"], point["gpu_memory_utilization"],
                         point["max_num_batched_tokens"], point["block_size"], point["kv_cache_dtype"],
                         m["non_torch_bytes"])
    new = {k: v for k, v in predicted_record(e, shape).items() if k in point["predicted"]}
    changed = new != point["predicted"]
    point["predicted"] = new
    return changed


def main(paths: list[str]) -> int:
    for name in paths:
        path = Path(name)
        report = json.loads(path.read_text())
        changed = sum(repredict(p) for p in report.get("capacity", []))
        write_report(path, report)
        print(f"{path}: {changed} predictions refreshed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

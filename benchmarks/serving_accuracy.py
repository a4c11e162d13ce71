"""kvsize's serving simulation (sizing/planners/serving.py) against every measured point of a real vLLM server
(measure/serving/points.json): TTFT and ITL p50 and p99, output tokens per second, point by point and in summary.

    python benchmarks/serving_accuracy.py            # the table and the summary
    python benchmarks/serving_accuracy.py --summary  # the summary alone

Points are split as the accuracy page reports them: the ones the simulation's two constants were fitted on
(profiles/serving.json names them), and the rest, which the fit never saw but which were measured before the
simulation was written (so out of the fit, not predicted before seen). The predictions committed before each batch
ran came from kvsize's earlier speed model (measure/serving/comparison.md); their errors are printed beside.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sizing.evidence.serving import predict_point  # noqa: E402
from sizing.planners.serving import step_overhead  # noqa: E402

POINTS = ROOT / "measure" / "serving" / "points.json"
FIGURES = (("ttft_p50_ms", "ttft_ms", 50, 0.10), ("itl_p50_ms", "itl_ms", 50, 0.10),
           ("ttft_p99_ms", "ttft_ms", 99, 0.25), ("itl_p99_ms", "itl_ms", 99, 0.25))


def rows() -> list[dict]:
    fitted = set(step_overhead().fitted_on)
    out = []
    for p in json.loads(POINTS.read_text())["points"]:
        served = predict_point(p["settings"], ROOT)
        row = dict(id=p["id"], group="fitted on" if p["id"] in fitted else "out of the fit",
                   loop=p["settings"]["loop"], errors={})
        for measured_key, attr, q, _ in FIGURES:
            measured, predicted = p["measured"][measured_key], getattr(served, attr)[q]
            row[measured_key] = (measured, predicted)
            row["errors"][measured_key] = predicted / measured - 1
        m, pr = p["measured"]["output_tokens_per_s"], served.output_tokens_per_s
        row["output_tokens_per_s"] = (m, pr)
        row["errors"]["output_tokens_per_s"] = pr / m - 1
        out.append(row)
    return out


def summary(table: list[dict]) -> list[str]:
    lines = [f"{'group':<16}{'figure':<22}{'points':>7}{'within bar':>12}{'median |error|':>16}{'worst':>9}"]
    for group in ("fitted on", "out of the fit"):
        part = [r for r in table if r["group"] == group]
        for key, _, _, bar in FIGURES + (("output_tokens_per_s", None, None, 0.10),):
            errors = [r["errors"][key] for r in part]
            ok = sum(1 for e in errors if abs(e) <= bar)
            worst = max(errors, key=abs)
            lines.append(f"{group:<16}{key + f' (±{bar:.0%})':<22}{len(errors):>7}{ok:>12}"
                         f"{statistics.median(abs(e) for e in errors):>15.1%}{worst:>+9.0%}")
    return lines


def main(argv: list[str]) -> int:
    table = rows()
    if "--summary" not in argv:
        print(f"{'point':<44}{'TTFT p50 ms':>20}{'ITL p50 ms':>18}{'ITL p99 ms':>18}{'tok/s':>16}")
        for r in table:
            cells = "".join(f"{r[k][0]:>9.1f}{r[k][1]:>9.1f}" for k in ("ttft_p50_ms", "itl_p50_ms", "itl_p99_ms"))
            print(f"{r['id'][:43]:<44}{cells}{r['output_tokens_per_s'][0]:>8.0f}{r['output_tokens_per_s'][1]:>8.0f}")
        print()
    print("\n".join(summary(table)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

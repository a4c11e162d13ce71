"""The fleet answers the README quotes, as `kvsize plan` gives them today: the summary of its plan example, and the
cheapest design of each kind for the two example workloads of 'Latency targets'.

    python benchmarks/fleet_answers.py

Each answer is the CLI's own JSON (`kvsize plan --out plan.json`), so the figures are the ones a user gets; the time
each command took is printed beside it (the designs are held to the serving simulation, which costs seconds).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from app.cli import main  # noqa: E402

SUMMARY_PLAN = ["plan", "--workload", "examples/workload.yaml", "--model", "llama-3.1-8b", "--gpus",
                "h100-sxm,h200,l40s", "--formats", "auto,fp8,nvfp4", "--tp", "1,2,4", "--price", "h200=3.2"]
TARGETS_PLAN = ["--model", "llama-3.1-8b", "--gpus", "h100-sxm,h200", "--formats", "auto,fp8", "--tp", "1,2,4",
                "--ttft-ms", "1500", "--host-memory", "512GiB"]
KINDS = ("aggregated", "disaggregated", "aggregated + tiers", "disaggregated + tiers")


def plan_json(argv: list[str]) -> tuple[dict, float, str]:
    """The plan's JSON, the seconds the command took and the text it printed."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        start = time.perf_counter()
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
            code = main([*argv, "--out", str(out)])
        took = time.perf_counter() - start
        if code not in (0, 1):
            raise SystemExit(f"kvsize {' '.join(argv)} exited {code}")
        return json.loads(out.read_text()), took, text.getvalue()


def cheapest_of(record: dict, kind: str) -> dict | None:
    meeting = [d for d in record["designs"] if d["kind"] == kind and d["meets"]]
    return min(meeting, key=lambda d: (d["usd_per_hour"], d["gpus"])) if meeting else None


def main_() -> int:
    import os

    os.chdir(ROOT)
    record, took, _ = plan_json(SUMMARY_PLAN)
    best = record["cheapest"]
    q, t = best["targets"]["percentile"], best["targets"]
    capacity = record["capacity_only"]
    price = {c["gpu"]: c["usd_per_gpu_hour"] for c in record["candidates"]}[capacity["gpu"]]
    print(f"kvsize {' '.join(SUMMARY_PLAN)}  ({took:.1f} s)")
    print()
    print("| item | value | note |\n| --- | --- | --- |")
    print(f"| recommendation | {best['design']} | {best['reason']} |")
    print(f"| GPUs | {best['gpus']} | prefill and decode, at the peak's arrival rate |")
    print(f"| fleet usd per hour | ${best['usd_per_hour']:,.2f} | |")
    print(f"| fleet usd per month | ${best['usd_per_month']:,.2f} | 730 h a month (8,760 h a year / 12) |")
    print(f"| TTFT p{q} (ms) | {best['ttft_ms']} | {best['basis']} |")
    print(f"| ITL p{q} (ms) | {best['itl_ms']} | {best['basis']}: each request's mean gap between tokens (TPOT) |")
    print(f"| TTFT target (ms) | {t['ttft_ms']:g} | {'given' if t['ttft_given'] else 'kvsize' + chr(39) + 's default'} |")
    print(f"| ITL target (ms) | {t['itl_ms']:g} | {'given' if t['itl_given'] else 'kvsize' + chr(39) + 's default'} |")
    print(f"| capacity only (not the answer) | {capacity['gpus']} × {capacity['gpu']} | holds the peak's KV, prefill "
          f"not counted: {capacity['kv_format']} KV, TP {capacity['tensor_parallel_size']}, "
          f"${capacity['gpus'] * price:,.2f}/h |")
    print()
    print("| workload | " + " | ".join(KINDS) + " |")
    for workload in ("examples/shared-prefix.yaml", "examples/multi-turn-chat.yaml"):
        record, took, text = plan_json(["plan", "--workload", workload, *TARGETS_PLAN])
        queueing = re.search(r"HBM-only aggregated serving \((\d+)\)", text)
        cells = []
        for kind in KINDS:
            d = cheapest_of(record, kind)
            of_kind = [x for x in record["designs"] if x["kind"] == kind]
            pruned = of_kind and all(x["reason"].startswith("not simulated") for x in of_kind)
            cells.append(("none simulated: none could cost less" if pruned else "none meets the targets")
                         if d is None else f"{d['gpus']} GPUs, ${d['usd_per_hour']:,.0f}/h ({d['basis']})")
        print(f"| `{workload}` | " + " | ".join(cells) + f" |  ({took:.1f} s; the queueing model's HBM-only "
              f"aggregated: {queueing.group(1) if queueing else '?'} GPUs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main_())

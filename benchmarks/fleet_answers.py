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


def plan_json(argv: list[str], xlsx: bool = False) -> tuple[dict, float, str, list[tuple]]:
    """The plan's JSON, the seconds the command took, the text it printed and (with `xlsx`) its summary sheet's
    (item, value, note) rows."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "plan.json"
        sheet = Path(tmp) / "plan.xlsx"
        start = time.perf_counter()
        text = io.StringIO()
        with contextlib.redirect_stdout(text), contextlib.redirect_stderr(io.StringIO()):
            code = main([*argv, "--out", str(out), *(["--out", str(sheet)] if xlsx else [])])
        took = time.perf_counter() - start
        if code not in (0, 1):
            raise SystemExit(f"kvsize {' '.join(argv)} exited {code}")
        rows = []
        if xlsx:
            import openpyxl

            rows = list(openpyxl.load_workbook(sheet, read_only=True)["summary"].iter_rows(values_only=True))
        return json.loads(out.read_text()), took, text.getvalue(), rows


# the summary sheet's rows the README quotes, in its order
SUMMARY_ITEMS = ("recommendation", "GPUs", "fleet usd per hour", "fleet usd per month", "TTFT p50 (ms)",
                 "ITL p50 (ms)", "TTFT target (ms)", "ITL target (ms)", "capacity only (not the answer)")


def cheapest_of(record: dict, kind: str) -> dict | None:
    meeting = [d for d in record["designs"] if d["kind"] == kind and d["meets"]]
    return min(meeting, key=lambda d: (d["usd_per_hour"], d["gpus"])) if meeting else None


def main_() -> int:
    import os

    os.chdir(ROOT)
    record, took, _, summary = plan_json(SUMMARY_PLAN, xlsx=True)
    print(f"kvsize {' '.join(SUMMARY_PLAN)}  ({took:.1f} s)")
    print()
    print("| item | value | note |\n| --- | --- | --- |")
    rows = {item: (value, note) for item, value, note in summary[1:]}
    for item in SUMMARY_ITEMS:
        value, note = rows[item]
        shown = f"${value:,.2f}" if "usd" in item else f"{value:g}" if isinstance(value, float) else value
        print(f"| {item} | {shown} | {note or ''} |")
    print()
    print("| workload | " + " | ".join(KINDS) + " |")
    for workload in ("examples/shared-prefix.yaml", "examples/multi-turn-chat.yaml"):
        record, took, text, _ = plan_json(["plan", "--workload", workload, *TARGETS_PLAN])
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

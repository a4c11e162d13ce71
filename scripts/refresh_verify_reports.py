"""Recompute the predictions stored in kvsize verify reports from their own log and config.

usage: python scripts/refresh_verify_reports.py measure/reports/*verify*.json
A verify report keeps vLLM's whole log, the config and kvsize's checks; the checks' predictions are
derived, so when kvsize's rules change they are recomputed (what vLLM printed never changes) and the
report is rewritten in place, atomically. kvsize validate holds them exactly.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measure.report_io import write_report  # noqa: E402
from measure.validate import read_report  # noqa: E402
from measure.verify import VERIFY_SCHEMA, verify_checks  # noqa: E402


def main(paths: list[str]) -> int:
    for name in paths:
        path = Path(name)
        report = read_report(name)
        if report.get("schema") != VERIFY_SCHEMA:
            print(f"{path}: not a verify report; left as it is", file=sys.stderr)
            continue
        report["checks"] = verify_checks(report)
        write_report(path, report)
        print(f"{path}: {len(report['checks'])} checks recomputed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

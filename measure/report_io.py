"""Measurement and verify reports written whole: a temporary file beside the target, renamed when done."""

from __future__ import annotations

import json
from pathlib import Path


def write_report(path: Path, report: dict) -> None:
    tmp = path.with_name(f".{path.name[:100]}.part")
    try:
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)

"""Predicted against logged for every real engine startup log kept in tests/fixtures/engine-logs.

    python benchmarks/engine_logs.py [ROWS.jsonl ...]

Prints per run the KV budget (GiB) and "GPU KV cache size" tokens, predicted and logged, and the
median and worst errors. The goal: every vLLM 0.19 H100 run within 1% on both.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sizing.evidence.logcheck import check_rows  # noqa: E402
from sizing.units import GiB  # noqa: E402


def main(argv: list[str]) -> int:
    fixtures = ROOT / "tests" / "fixtures"
    files = [Path(a) for a in argv] or sorted((fixtures / "engine-logs").glob("*.jsonl"))
    errors = []
    print(f"{'run':<48}{'KV GiB pred':>12}{'logged':>9}{'err':>8}{'tokens pred':>14}{'logged':>12}{'err':>8}")
    for path in files:
        for c in check_rows(path, fixtures / "configs"):
            errors.append((abs(c.kv_error), abs(c.tokens_error)))
            print(f"{c.id[:47]:<48}{c.predicted_kv_bytes / GiB:>12.2f}{c.logged_kv_gib:>9.2f}{100 * c.kv_error:>+7.2f}%"
                  f"{c.predicted_tokens:>14,}{c.logged_tokens:>12,}{100 * c.tokens_error:>+7.2f}%")
    kv = [e[0] for e in errors]
    tok = [e[1] for e in errors]
    print(f"\n{len(errors)} runs; KV: median {100 * statistics.median(kv):.2f}%, worst {100 * max(kv):.2f}%, "
          f"{sum(e < 0.01 for e in kv)} within 1%; tokens: median {100 * statistics.median(tok):.2f}%, "
          f"worst {100 * max(tok):.2f}%, {sum(e < 0.01 for e in tok)} within 1%")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

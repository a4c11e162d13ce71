"""Reproduce SGLang's measured constants in profiles/engines/sglang-*.json from the committed starts.

    python scripts/fit_sglang_terms.py          # print each fitted constant and the starts it comes from

The memory taken before the weights load (CUDA context, NCCL and custom all-reduce buffers at TP >= 2) is the
GPU's CUDA total less the free memory SGLang logs at "Load weight begin", the median over the starts of each
parallel size of each release range (the log prints GiB to two decimals). tests/test_sglang_starts.py fails
when the shipped constants and this fit drift apart.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sizing.profiles import gpu_profile  # noqa: E402
from sizing.engines.releases import find_release  # noqa: E402
from sizing.evidence.sglang_starts import load_corpus  # noqa: E402
from sizing.units import GiB  # noqa: E402


def fit_non_torch() -> dict[str, dict[int, tuple[int, list[str]]]]:
    """release name -> {TP: (bytes taken before the weights, the starts it is the median of)}."""
    out: dict[str, dict[int, list]] = {}
    for s in load_corpus():
        if s.status != "sized" or not s.printed.avail_begin_gib:
            continue
        tp = int(s.args.get("tp_size", 1))
        taken = gpu_profile(s.gpu).memory_bytes - round(min(map(float, s.printed.avail_begin_gib)) * GiB)
        out.setdefault(find_release("sglang", s.version).name, {}).setdefault(tp, []).append((taken, s.id))
    return {name: {tp: (int(statistics.median(t for t, _ in rows)), sorted(i for _, i in rows))
                   for tp, rows in by_tp.items()} for name, by_tp in out.items()}


def main() -> int:
    for name, by_tp in fit_non_torch().items():
        for tp, (taken, ids) in sorted(by_tp.items()):
            print(f"{name} TP {tp}: {taken:,} B ({taken / GiB:.3f} GiB) taken before the weights, median of "
                  f"{len(ids)} starts: {', '.join(ids)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Web app re-render time: every tab is rebuilt on each interaction, so time one full rerun.

Run: python benchmarks/bench_app.py   (prints median and worst of repeated reruns per scenario)
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from streamlit.testing.v1 import AppTest  # noqa: E402

CHANGES = [("model", "llama-3.1-8b"), ("model", "deepseek-v3"), ("model", "gpt-oss-120b"),
           ("model", "nemotron-h-8b-base-8k"), ("k_format", "fp8_e4m3"), ("gpu", "h200")]


def main(repeats: int = 5) -> None:
    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=120)
    at.run()  # first run loads profiles into the cache
    print(f"{'change':<36}{'median s':>10}{'max s':>10}")
    for key, value in CHANGES:
        times = []
        for _ in range(repeats):
            at.selectbox(key=key).set_value(value)
            start = time.perf_counter()
            at.run()
            times.append(time.perf_counter() - start)
            assert not at.exception, at.exception
        print(f"{key + '=' + value:<36}{statistics.median(times):>10.3f}{max(times):>10.3f}")


if __name__ == "__main__":
    main()

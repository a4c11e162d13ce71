"""The README's screenshot of the Validation page, taken from the app as it runs today.

usage: python scripts/validation_screenshot.py [OUT.png]    (default docs/screenshots/validation-real-vllm.png)

Starts `streamlit run` on a free localhost port, opens the Validation tab in headless Chromium (KVSIZE_CHROMIUM,
default /usr/bin/chromium; the playwright package), waits until the page shows the accuracy benchmark's figure
("N of M" predictions within 1%, from the same starts `benchmarks/vllm_starts.py` reads), and writes the first
1,400 x 1,000 pixels to a temporary file renamed over OUT once written.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sizing.evidence.starts import accuracy_rows, summarize  # noqa: E402

CHROMIUM = os.environ.get("KVSIZE_CHROMIUM", "/usr/bin/chromium")
START_BOUND_S = 120
DRAW_BOUND_S = 180
LABEL = "Predictions within 1% of vLLM"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(done, bound_s: float, what: str) -> None:
    deadline = time.monotonic() + bound_s
    while not done():
        if time.monotonic() > deadline:
            raise SystemExit(f"validation_screenshot: {what} within {bound_s:.0f} s")
        time.sleep(0.5)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "screenshots" / "validation-real-vllm.png"
    if not Path(CHROMIUM).exists():
        print(f"validation_screenshot: needs Chromium at {CHROMIUM} (set KVSIZE_CHROMIUM)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    overall = summarize(accuracy_rows(), lambda r: "all")[0]
    expected = f"{overall.within_1pct} of {overall.starts}"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "streamlit_app.py"),
                             "--server.address", "127.0.0.1", "--server.port", str(port), "--server.headless", "true",
                             "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait(lambda: _healthy(url) or proc.poll() is not None, START_BOUND_S, "streamlit did not start")
        if proc.poll() is not None:
            print(f"validation_screenshot: streamlit exited with {proc.returncode}", file=sys.stderr)
            return 1
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True,
                                         args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(DRAW_BOUND_S * 1000)
            page.goto(f"{url}/?page=Validation")
            metric = page.locator('[data-testid="stMetric"]', has_text=LABEL).first
            value = metric.locator('[data-testid="stMetricValue"]')
            _wait(lambda: value.count() > 0 and value.inner_text().strip() == expected, DRAW_BOUND_S,
                  f"the Validation tab did not show {expected!r}")
            page.locator(".js-plotly-plot").first.wait_for(state="visible")
            tmp = out.with_name(out.name + ".tmp.png")
            page.screenshot(path=str(tmp))
            browser.close()
        tmp.replace(out)
        print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: {LABEL} {expected}")
        return 0
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

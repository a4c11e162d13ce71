"""The README's screenshot of the Validation page, taken from the app as it runs today.

usage: python scripts/validation_screenshot.py [OUT.png]    (default docs/screenshots/validation-real-vllm.png)

Starts the app on localhost (app/local_app.py), opens the Validation tab in headless Chromium (KVSIZE_CHROMIUM,
default /usr/bin/chromium; the playwright package), waits until the page shows the accuracy benchmark's figure
("N of M" predictions within 1%, from the same starts `benchmarks/vllm_starts.py` reads), and writes the first
1,400 x 1,000 pixels to a temporary file renamed over OUT once written.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.local_app import CHROMIUM, CHROMIUM_ARGS, AppDidNotStart, local_app, wait_for_metric  # noqa: E402
from sizing.evidence.starts import accuracy_rows, summarize  # noqa: E402

DRAW_BOUND_MS = 180_000
LABEL = "Predictions within 1% of vLLM"


def main(argv: list[str]) -> int:
    out = Path(argv[0]) if argv else ROOT / "docs" / "screenshots" / "validation-real-vllm.png"
    if not Path(CHROMIUM).exists():
        print(f"validation_screenshot: needs Chromium at {CHROMIUM} (set KVSIZE_CHROMIUM)", file=sys.stderr)
        return 2
    from playwright.sync_api import sync_playwright

    overall = summarize(accuracy_rows(), lambda r: "all")[0]
    expected = f"{overall.within_1pct} of {overall.starts}"
    tmp = out.with_name(out.name + ".tmp.png")
    try:
        with local_app() as url, sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{url}/?page=Validation")
            wait_for_metric(page, LABEL, expected, DRAW_BOUND_MS)
            page.locator(".js-plotly-plot").first.wait_for(state="visible", timeout=DRAW_BOUND_MS)
            page.screenshot(path=str(tmp))
            browser.close()
    except AppDidNotStart as e:
        print(f"validation_screenshot: {e}", file=sys.stderr)
        return 1
    tmp.replace(out)
    print(f"wrote {out}: {LABEL} {expected}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

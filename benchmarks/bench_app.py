"""Web app timing as a planner sees it: `streamlit run` driven by headless Chromium, timed.

Goals (README): first figures within 2 s of opening the page on a warm server, and the Validation tab within 2 s;
a widget change answered within 0.5 s (from the click to the new figure on screen).

Run: python benchmarks/bench_app.py [--repeats N]   (needs Chromium and the playwright package;
KVSIZE_CHROMIUM names the browser, default /usr/bin/chromium)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from app.local_app import CHROMIUM, CHROMIUM_ARGS, AppDidNotStart, local_app, wait_for_metric  # noqa: E402

FIRST_FIGURES_GOAL_S = 2.0
CHANGE_GOAL_S = 0.5


def _wait_idle(page, bound_ms: int = 60_000) -> None:
    """Until the page's script has finished (Streamlit shows its status widget only while a run goes on), so the
    next timing starts on a warm, idle server rather than one still drawing the last page."""
    page.wait_for_function("() => !document.querySelector('[data-testid=\"stStatusWidget\"]')", polling=100,
                           timeout=bound_ms)


def expected_concurrency(model: str) -> str:
    """The Plan tab's headline for the start URL's scenario, as sizing computes it."""
    from sizing.capacity.scenario import Scenario
    from sizing.capacity.estimate import estimate
    from sizing.profiles import gpu_profile, load_model

    name, shape = load_model(model)
    g = gpu_profile("h100-sxm")
    s = Scenario(name, shape, g.name, g.memory_bytes, gpu_multiprocessors=g.multiprocessors,
                 gpu_nvml_mib=g.nvml_memory_mib, gpu_architecture=g.architecture, max_model_len=32768,
                 concurrency=8, memory_fraction=0.92)  # the app's default utilization (newest vLLM release)
    return f"{estimate(s).max_concurrency:,}"


def _report(name: str, times: list[float], goal: float) -> bool:
    ok = max(times) <= goal
    print(f"{name:<44}{statistics.median(times):>9.3f}{max(times):>9.3f}{goal:>7.1f}  {'met' if ok else 'MISSED'}"
          f"  ({', '.join(f'{t:.2f}' for t in times)})")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with local_app() as url:
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
            page = browser.new_page(viewport={"width": 1500, "height": 1100})
            start_url = f"{url}/?model=llama-3.1-8b&gpu=h100-sxm&engine=vllm&ctx=32768&conc=8"
            page.goto(start_url)
            wait_for_metric(page, "Max concurrency")  # warms the server: profiles loaded, caches filled
            _wait_idle(page)
            opening = []
            for _ in range(args.repeats):
                t = time.perf_counter()
                page.goto(start_url)
                wait_for_metric(page, "Max concurrency", expected_concurrency("llama-3.1-8b"))
                opening.append(time.perf_counter() - t)
                _wait_idle(page)
            changes: dict[str, list[float]] = {}
            models = ["qwen3-8b", "deepseek-v3", "gpt-oss-120b", "nemotron-h-8b-base-8k", "llama-3.1-8b"]
            headlines = [expected_concurrency(m) for m in ["llama-3.1-8b", *models]]
            # A change is timed until its new figure shows, so each must differ from the one before.
            assert all(a != b for a, b in zip(headlines, headlines[1:])), headlines
            for _ in range(args.repeats):
                for model in models:
                    expected = expected_concurrency(model)
                    box = page.locator('[data-testid="stSelectbox"]', has_text="Model").first
                    box.click()
                    page.keyboard.type(model)
                    option = page.get_by_role("option", name=model, exact=True)
                    option.wait_for()
                    t = time.perf_counter()
                    option.click()
                    wait_for_metric(page, "Max concurrency", expected)
                    changes.setdefault(f"change model to {model}", []).append(time.perf_counter() - t)
            validation = []
            for k in range(args.repeats + 1):  # the first opening fills the tab's caches: warm is what is timed
                page.goto(start_url)
                wait_for_metric(page, "Max concurrency")
                _wait_idle(page)
                t = time.perf_counter()
                page.get_by_role("tab", name="Validation").click()
                wait_for_metric(page, "ITL p50 within")  # its third section: the real starts and llama.cpp above it
                if k:
                    validation.append(time.perf_counter() - t)
            fleet = []
            for _ in range(args.repeats):
                page.goto(start_url)
                wait_for_metric(page, "Max concurrency")
                _wait_idle(page)
                t = time.perf_counter()
                page.get_by_role("tab", name="Fleet").click()
                wait_for_metric(page, "Fleet that serves the workload")
                fleet.append(time.perf_counter() - t)
            browser.close()
    print(f"{'browser journey (warm server, ' + str(args.repeats) + ' repeats)':<44}{'median s':>9}{'max s':>9}"
          f"{'goal':>7}")
    ok = _report("open the page: first figures", opening, FIRST_FIGURES_GOAL_S)
    for name, times in changes.items():
        ok &= _report(name, times, CHANGE_GOAL_S)
    ok &= _report("open the Validation tab: to its speed section", validation, FIRST_FIGURES_GOAL_S)
    _report("open the Fleet tab: its plan (informational)", fleet, FIRST_FIGURES_GOAL_S)
    return 0 if ok else 1


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except AppDidNotStart as e:
        raise SystemExit(f"bench_app: {e}") from None

"""End to end: `streamlit run` on localhost, driven by Playwright in headless Chromium.

Locally the test is skipped when Chromium is absent; under CI (CI=true) that is a failure, since
`.ci/run` installs Debian's chromium package.
"""

import os
import time
from pathlib import Path

import pytest

from app.local_app import CHROMIUM, CHROMIUM_ARGS, AppDidNotStart, local_app
from conftest import ROOT
from helpers import scenario
from sizing.capacity.estimate import estimate

pytestmark = pytest.mark.browser

SCREENSHOTS = Path(os.environ.get("KVSIZE_SCREENSHOT_DIR", ROOT / "tests" / "screenshots"))


def _need_browser():
    have = Path(CHROMIUM).exists()
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        have = False
    if not have:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the browser test: need {CHROMIUM} and the playwright package")
        pytest.skip(f"needs {CHROMIUM} and the playwright package")


@pytest.fixture(scope="module")
def app_url():
    _need_browser()
    try:
        with local_app() as url:
            yield url
    except AppDidNotStart as e:
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def page(app_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        pg = browser.new_page(viewport={"width": 1500, "height": 1100})
        pg.set_default_timeout(60_000)
        yield pg
        browser.close()


def _metric(page, label: str) -> str:
    box = page.locator('[data-testid="stMetric"]', has_text=label).first
    return box.locator('[data-testid="stMetricValue"]').inner_text().strip()


def _choose(page, label: str, option: str) -> None:
    box = page.locator('[data-testid="stSelectbox"]', has_text=label).first
    box.click()
    page.keyboard.type(option)
    page.get_by_role("option", name=option, exact=True).click()


def _wait_for_metric(page, label: str, expected: str) -> str:
    deadline = time.monotonic() + 60
    value = _metric(page, label)
    while value != expected and time.monotonic() < deadline:
        page.wait_for_timeout(250)
        value = _metric(page, label)
    return value


def _wait_until(done, bound_s: float = 90.0) -> bool:
    """Poll `done` until it holds or `bound_s` passes; the answer is whether it held."""
    deadline = time.monotonic() + bound_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.25)
    return True


def _script_running(page) -> bool:
    # Streamlit shows its status widget ("Running...") only while the script runs.
    return page.locator('[data-testid="stStatusWidget"]').count() > 0


def _tab_drawn(page, tab: str, charts: int) -> bool:
    in_url = f"page={tab.replace(' ', '+')}" in page.url or f"page={tab.replace(' ', '%20')}" in page.url
    drawn = page.locator('[data-testid="stTabPanel"]:visible .js-plotly-plot .main-svg').count() >= charts
    return in_url and drawn and not _script_running(page)


def test_changing_model_and_format_changes_the_headline(page, app_url):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.goto(f"{app_url}/?model=llama-3.1-8b&gpu=h100-sxm&engine=vllm&ctx=32768&conc=8")
    # the app starts from the newest vLLM release's default utilization, 0.92 (vllm/config/cache.py, 0.21+)
    default = estimate(scenario("llama-3.1-8b", max_model_len=32768, concurrency=8, memory_fraction=0.92))
    assert _wait_for_metric(page, "Max concurrency", f"{default.max_concurrency:,}") == f"{default.max_concurrency:,}"
    page.screenshot(path=str(SCREENSHOTS / "plan-llama-3.1-8b-bf16.png"), full_page=True)

    _choose(page, "Model", "qwen3-8b")
    qwen = estimate(scenario("qwen3-8b", max_model_len=32768, concurrency=8, memory_fraction=0.92))
    assert _wait_for_metric(page, "Max concurrency", f"{qwen.max_concurrency:,}") == f"{qwen.max_concurrency:,}"

    _choose(page, "K cache format", "fp8_e4m3")
    _choose(page, "V cache format", "fp8_e4m3")
    fp8 = estimate(scenario("qwen3-8b", k_cache_dtype="fp8_e4m3", v_cache_dtype="fp8_e4m3", max_model_len=32768,
                            concurrency=8, memory_fraction=0.92))
    # Qwen3-8B: 36 layers x 8 KV heads x 128 (its config.json); fp8 halves the 147,456 B of bf16 per token.
    assert fp8.kv_bytes_per_token == 73_728
    assert _wait_for_metric(page, "KV bytes per token", "73,728") == "73,728"
    assert _wait_for_metric(page, "Max concurrency", f"{fp8.max_concurrency:,}") == f"{fp8.max_concurrency:,}"
    assert fp8.max_concurrency > qwen.max_concurrency
    # the picture waits for plotly to have drawn its chart, not for a fixed time
    assert _wait_until(lambda: page.locator('.js-plotly-plot .main-svg').count() > 0 and not _script_running(page))
    page.screenshot(path=str(SCREENSHOTS / "plan-qwen3-8b-fp8.png"), full_page=True)
    assert "model=qwen3-8b" in page.url and "k=fp8_e4m3" in page.url  # the link reproduces the scenario


def test_each_tab_draws_its_chart(page, app_url):
    page.goto(f"{app_url}/?model=gpt-oss-20b&gpu=h100-sxm&ctx=65536&conc=16")
    page.wait_for_selector('[data-testid="stMetricValue"]')
    for tab, shot, charts in (("Compare formats", "compare", 1), ("Capacity curves", "curves", 1), ("Fleet", "fleet", 2),
                              ("Tiers", "tiers", 1),
                              ("Validation", "validation", 1), ("Formulas", "formulas", 0)):
        page.get_by_role("tab", name=tab).click()
        # Only the open tab is drawn: wait (bounded) until its own charts are there and the run is over;
        # a slow machine takes seconds for the Validation tab.
        drawn = _wait_until(lambda: _tab_drawn(page, tab, charts))
        page.screenshot(path=str(SCREENSHOTS / f"{shot}-gpt-oss-20b.png"), full_page=True)
        assert page.locator('[data-testid="stException"]').count() == 0
        assert drawn, (tab, page.locator('[data-testid="stTabPanel"]:visible .js-plotly-plot').count(), page.url)


def test_chart_png_export_renders_through_chromium():
    _need_browser()
    import plotly.graph_objects as go

    from app.chart_export import png_bytes

    fig = go.Figure()
    fig.add_bar(x=["bf16", "fp8_e4m3"], y=[147_456, 73_728])
    png = png_bytes(fig, width=600, height=300, scale=1)
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # PNG IHDR: width and height as big-endian 32-bit integers at bytes 16..24
    assert int.from_bytes(png[16:20], "big") == 600 and int.from_bytes(png[20:24], "big") == 300


def test_upload_a_config_then_share_the_link(page, app_url, tmp_path):
    # Qwen3-8B's config.json uploaded in the sidebar is sized as the bundled profile is; the page link
    # keeps the widgets but not the file, and says so.
    import json

    from sizing.profiles import model_profile

    config = tmp_path / "config.json"
    config.write_text(json.dumps(model_profile("qwen3-8b").config))
    page.goto(f"{app_url}/?model=llama-3.1-8b&gpu=h100-sxm&engine=vllm&ctx=32768&conc=8")
    page.wait_for_selector('[data-testid="stMetricValue"]')
    page.locator('[data-testid="stSidebar"] input[type="file"]').first.set_input_files(str(config))
    qwen = estimate(scenario("qwen3-8b", max_model_len=32768, concurrency=8, memory_fraction=0.92))
    assert _wait_for_metric(page, "KV bytes per token", "147,456") == "147,456"  # 2 x 36 x 8 x 128 x 2 B
    assert _wait_for_metric(page, "Max concurrency", f"{qwen.max_concurrency:,}") == f"{qwen.max_concurrency:,}"
    assert page.get_by_text("An uploaded config is not part of the page link").count() == 1
    page.get_by_role("tab", name="Fleet").click()
    page.wait_for_selector('[data-testid="stMetric"]:has-text("Fleet that serves the workload")')
    # the tab's serve command replaces the previous tab's code once its run ends: waited for, up to a bound
    assert _wait_until(lambda: page.locator('[data-testid="stCode"]', has_text="vllm serve MODEL_DIR").count() > 0
                       and not _script_running(page))


def test_release_picker_and_recommendation_in_chromium(page, app_url):
    # the release picker from the page link, and Compare formats naming its recommendation, as a browser shows them
    page.goto(f"{app_url}/?model=llama-3.1-8b&gpu=h100-sxm&engine=vllm&release=0.23.0&ctx=32768&conc=8")
    assert _wait_until(lambda: page.get_by_text("vllm 0.23.0 was started").count() > 0 and not _script_running(page))
    page.goto(f"{app_url}/?model=llama-3.1-8b&gpu=h100-sxm&engine=vllm&ctx=32768&conc=8&page=Compare+formats")
    assert _wait_until(lambda: page.get_by_text("Recommended: fp8_e4m3").count() > 0 and not _script_running(page))
    assert page.locator('[data-testid="stException"]').count() == 0


def test_a_bad_link_is_reported_and_a_shared_gpus_fraction_can_be_set(app_url, page):
    # in the browser: an unknown model, GPU and page from the URL are said, the widgets keep their own
    # defaults (not the first entry of each list), and utilization 0.16 (kvsize watch's example) is settable
    page.goto(f"{app_url}/?model=nope&gpu=nope-gpu&page=Nope&util=0.16")
    assert _wait_until(lambda: page.get_by_text("page 'Nope' from the page URL is not one of the pages").count() > 0
                       and not _script_running(page))
    assert page.get_by_text("'nope' from the page URL is not one of the choices").count() > 0
    # the app writes the values it used back into the link: the widgets' defaults
    assert _wait_until(lambda: "model=llama-3.1-8b" in page.url and "gpu=h100-sxm" in page.url), page.url
    assert "util=0.16" in page.url
    shared = estimate(scenario("llama-3.1-8b", max_model_len=32768, concurrency=8, memory_fraction=0.16))
    want = f"{shared.max_concurrency:,}"
    assert _wait_for_metric(page, "Max concurrency", want) == want  # the pool of 0.16 of the GPU

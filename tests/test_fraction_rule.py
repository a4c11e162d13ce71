"""One memory-fraction rule in the CLI and the app (issue 50, item 3), and one release spelling."""

import json
import subprocess
import sys

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import ROOT  # noqa: E402

APP = str(ROOT / "app" / "streamlit_app.py")


def _cli_concurrency(*args: str) -> int:
    out = subprocess.run([sys.executable, "-m", "app.cli", "estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm",
                          "--max-model-len", "32768", "--format", "json", *args],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return json.loads(out)["max_concurrency"]


def _metric(at, label):
    return next(m.value for m in at.metric if m.label == label or m.label.startswith(label + " ("))


def _app(**query):
    at = AppTest.from_file(APP, default_timeout=60)
    for k, v in query.items():
        at.query_params[k] = v
    at.run()
    assert not at.exception
    return at


def test_sglang_in_the_app_follows_the_clis_default_fraction():
    cli = _cli_concurrency("--engine", "sglang")
    opened = _app(engine="sglang")
    assert _metric(opened, "Max concurrency") == f"{cli:,}"
    switched = _app()  # vLLM first, then SGLang: an untouched slider follows the new engine
    switched.selectbox(key="engine").set_value("sglang")
    switched.run()
    assert not switched.exception
    assert _metric(switched, "Max concurrency") == f"{cli:,}"
    assert switched.slider(key="fraction").value != 0.92
    assert not any("not one of the choices" in str(w.value) for w in switched.warning)


def test_a_fraction_the_user_set_is_kept_and_used():
    at = _app(engine="sglang", util="0.8")
    assert at.slider(key="fraction").value == 0.8
    assert _metric(at, "Max concurrency") == f"{_cli_concurrency('--engine', 'sglang', '--mem-fraction-static', '0.8'):,}"
    at2 = _app(engine="sglang")
    at2.slider(key="fraction").set_value(0.8)
    at2.run()
    assert at2.query_params["util"] in ("0.8", ["0.8"])


def test_a_release_in_the_page_url_takes_the_clis_spelling():
    at = _app(release="0.31")
    assert at.selectbox(key="engine_release").value == "0.31.0"
    assert not any("not one of the choices" in str(w.value) for w in at.warning)
    assert _app(release="0.31.0").selectbox(key="engine_release").value == "0.31.0"


def test_switching_engine_after_a_release_leaves_no_stale_banner():
    at = _app(release="0.31.0")
    at.selectbox(key="engine").set_value("sglang")
    at.run()
    assert not at.exception
    assert not any("not one of the choices" in str(w.value) for w in at.warning)

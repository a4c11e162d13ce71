"""The web app served on localhost for headless Chromium to drive: the browser test, the app benchmark and the
README's screenshot start it, and wait on its figures, the same way. Standard library only; playwright's page is
passed in."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = os.environ.get("KVSIZE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]
START_BOUND_S = 90  # a cold start on a 2-core machine imports pandas, plotly and the profiles
STOP_BOUND_S = 20
LOG_TAIL_BYTES = 2000
_METRIC = ('const m = [...document.querySelectorAll(\'[data-testid="stMetric"]\')]'
           '.find(e => e.innerText.includes(LABEL));')


class AppDidNotStart(RuntimeError):
    """streamlit exited, or did not answer its health check within the bound; the message ends with its output."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


@contextmanager
def local_app(bound_s: float = START_BOUND_S) -> Iterator[str]:
    """`streamlit run app/streamlit_app.py` on a free localhost port, its URL once it answers; stopped on exit."""
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "streamlit", "run", str(ROOT / "app" / "streamlit_app.py"),
           "--server.address", "127.0.0.1", "--server.port", str(port), "--server.headless", "true",
           "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + bound_s
            while not _healthy(url):
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-LOG_TAIL_BYTES:]
                    raise AppDidNotStart(f"streamlit did not start on {url}: {tail}")
                time.sleep(0.5)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=STOP_BOUND_S)
            except subprocess.TimeoutExpired:
                proc.kill()


def wait_for_metric(page, label: str, expected: str | None = None, bound_ms: int = 60_000) -> None:
    """Until the page's metric named `label` shows `expected` (or any value): polled on every animation frame."""
    check = ("m && m.querySelector('[data-testid=\"stMetricValue\"]') && "
             + ("m.querySelector('[data-testid=\"stMetricValue\"]').innerText.trim() === EXPECTED"
                if expected is not None else "true"))
    page.wait_for_function(f"([LABEL, EXPECTED]) => {{ {_METRIC} return {check}; }}", arg=[label, expected],
                           polling="raf", timeout=bound_ms)

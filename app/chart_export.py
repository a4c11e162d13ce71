"""Charts to files: HTML always; PNG through kaleido where a Chrome or Chromium is installed."""

from __future__ import annotations

import os
import shutil

BROWSER_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")

# The modebar's camera button renders PNG in the planner's own browser, so a PNG is always one
# click away even where the server has no browser for kaleido.
PLOTLY_CONFIG = {"displaylogo": False,
                 "toImageButtonOptions": {"format": "png", "scale": 2, "width": 1200, "height": 600}}


def browser_path() -> str | None:
    """The browser kaleido will drive: $BROWSER_PATH, else the first Chrome/Chromium on PATH."""
    explicit = os.environ.get("BROWSER_PATH")
    if explicit and os.path.exists(explicit):
        return explicit
    for name in BROWSER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


def html_bytes(fig) -> bytes:
    # Inline plotly.js so the file opens offline, on a laptop in a meeting room.
    return fig.to_html(include_plotlyjs=True, full_html=True).encode()


def png_bytes(fig, width: int = 1200, height: int = 600, scale: int = 2) -> bytes:
    """The chart as PNG; needs a Chrome/Chromium (browser_path) for kaleido to render with."""
    path = browser_path()
    if path is None:
        raise RuntimeError("PNG export needs Chrome or Chromium installed (or BROWSER_PATH set); "
                           "use the HTML download or the chart's camera button instead")
    os.environ.setdefault("BROWSER_PATH", path)
    import kaleido  # noqa: F401  (import error means the optional extra is missing)

    return fig.to_image(format="png", width=width, height=height, scale=scale)

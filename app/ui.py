"""What the kvsize web app's pages share: the repository root, widget helpers (URL start values,
choices, error wording), number formatting, the memory breakdown chart and the download row."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.chart_export import PLOTLY_CONFIG, browser_path, html_bytes, png_bytes
from sizing.errors import KvsizeError
from sizing.capacity.estimate import Estimate, estimate
from sizing.capacity.scenario import Scenario
from sizing.profiles import gpu_ids, gpu_profile, model_ids
from sizing.config import parse_config_text, resolve_shape
from sizing.units import GiB

ROOT = Path(__file__).resolve().parent.parent

BREAKDOWN_COLORS = {
    "weights": "#4C78A8", "kv_payload": "#F58518", "kv_metadata": "#E45756", "activation": "#72B7B2",
    "non_torch": "#54A24B", "cuda_graph": "#B279A2", "recurrent_state": "#9D755D", "headroom": "#BAB0AC",
    "free": "#EEEEEE",
}


@st.cache_data(show_spinner=False)
def _model_choices() -> list[str]:
    return list(model_ids())


@st.cache_data(show_spinner=False)
def _gpu_choices() -> list[str]:
    return list(gpu_ids())


@st.cache_resource(show_spinner=False)
def _uploaded_shape(data: bytes):
    return resolve_shape(parse_config_text(data, "uploaded config.json"))


def _query(key: str, default, cast=str, low=None, high=None):
    """A widget's start value from the page URL; one that is not a number in the widget's range is
    reported and replaced by the default (a widget given it would raise)."""
    value = st.query_params.get(key)
    if value is None:
        return default
    try:
        parsed = cast(value)
    except (TypeError, ValueError, OverflowError):
        parsed = None
    if parsed is None or (low is not None and not low <= parsed <= high):
        allowed = f" (allowed: {low} to {high})" if low is not None else ""
        st.warning(f"URL parameter {key}='{markdown_text(str(value)[:60])}' is not usable{allowed}; using {default}")
        return default
    return parsed


SAME_AS_K = "same as K"
LIMITS = {"tp": (1, 64), "pp": (1, 64), "context": (1, 10_485_760), "concurrency": (1, 100_000), "mtp_layers": (0, 8)}
UPLOADED_MODEL = "MODEL_DIR"
# The CLI's flags as the sidebar names them: sizing's errors speak of flags.
WIDGET_NAMES = {
    "--k-cache-dtype": "K cache format", "--v-cache-dtype": "V cache format", "--kv-cache-dtype": "K cache format and V cache format",
    "--tensor-parallel-size": "Tensor parallel size", "--pipeline-parallel-size": "Pipeline parallel size",
    "--max-model-len": "Context", "--concurrency": "Concurrent requests", "--weights-dtype": "Weights dtype",
    "--mtp-layers": "MTP layers for speculative decoding",
    "--gpu-memory-utilization": "Engine memory fraction", "--mem-fraction-static": "Engine memory fraction",
    "--headroom": "Headroom", "--model": "Model", "--gpu": "GPU", "--engine": "Engine",
}
_FLAG = re.compile("|".join(re.escape(f) + r"\b" for f in sorted(WIDGET_NAMES, key=len, reverse=True)))


def in_widget_terms(message: str) -> str:
    """An error from sizing with its flags named as the widgets that set them."""
    return _FLAG.sub(lambda m: f"'{WIDGET_NAMES[m.group(0)]}'", message)


def _gpu_label(gpu: str) -> str:
    g = gpu_profile(gpu)
    return f"{gpu} · {g.memory_bytes / GiB:.0f} GiB · ${g.price_usd_per_hour:g}/h"


def show_error(message: str) -> None:
    """An error on the page as plain text: what it quotes from outside (a file's name, a config's value, a URL)
    never renders as a link, an image or emphasis."""
    st.error(markdown_text(message))


def markdown_text(text: str) -> str:
    """Text from outside (a URL, a config, a scrape) shown as itself: Markdown's special characters escaped and
    control characters dropped, so a link or an image in it is never rendered live."""
    cleaned = "".join(c for c in text if c.isprintable())
    return re.sub(r"([\\`*_{}\[\]()#+\-.!|<>~$])", r"\\\1", cleaned)


def matching_release(value: str, releases: list[str]) -> str:
    """`value` as one of `releases`, trailing zero parts ignored (0.31 is 0.31.0); else `value` unchanged."""
    def parts(v: str) -> tuple[int, ...] | None:
        pieces = str(v).strip().removeprefix("v").split(".")
        if len(pieces) > 8 or any(len(p) > 9 for p in pieces):  # no release is written longer (a URL can be)
            return None
        try:
            numbers = [int(p) for p in pieces]
        except ValueError:
            return None
        while len(numbers) > 1 and numbers[-1] == 0:
            numbers.pop()
        return tuple(numbers)

    if value in releases:
        return value
    wanted = parts(value)
    found = [r for r in releases if wanted is not None and parts(r) == wanted]
    return found[0] if found else value


def _index(options: list[str], value: str, fallback: str | None = None) -> int:
    """The option the page URL names; else the widget's default (`fallback`), said in a banner."""
    if value in options:
        return options.index(value)
    shown = fallback if fallback in options else options[0]
    st.warning(f"'{markdown_text(str(value)[:60])}' from the page URL is not one of the choices; showing {shown} "
               "instead")
    return options.index(shown)


def breakdown_figure(record: dict) -> go.Figure:
    b = record["breakdown"]
    fig = go.Figure()
    for key, color in BREAKDOWN_COLORS.items():
        value = b.get(f"{key}_bytes", 0)
        if value <= 0:
            continue  # a zero term only crowds the legend
        label = key.replace("_", " ")
        fig.add_bar(name=f"{label} {value / GiB:.2f} GiB", x=[value / GiB], y=["per GPU"], orientation="h",
                    marker_color=color, hovertemplate=f"{label}: %{{x:.2f}} GiB ({value:,} bytes)<extra></extra>")
    total = b["total_bytes"] / GiB
    # A line, not a bar: terms that do not fit run past it.
    fig.add_scatter(x=[total, total], y=[-0.5, 0.5], mode="lines", name=f"GPU memory {total:.2f} GiB",
                    line=dict(color="black", dash="dash", width=2),
                    hovertemplate=f"GPU memory (CUDA total): {total:.2f} GiB<extra></extra>")
    fig.update_layout(barmode="stack", height=300, xaxis_title="GiB (2^30 bytes)",
                      title=f"Memory per GPU: {record['gpu']} ({b['total_bytes'] / GiB:.2f} GiB)",
                      legend=dict(orientation="h", y=1.0, yanchor="bottom", x=0, traceorder="normal"),
                      margin=dict(t=90))
    return fig


def _downloads(df: pd.DataFrame, fig: go.Figure | None, stem: str) -> None:
    from app.spreadsheet import xlsx_bytes

    cols = st.columns(4)
    cols[0].download_button("CSV", df.to_csv(index=False).encode(), f"{stem}.csv", "text/csv", key=f"{stem}_csv")
    cols[1].download_button("XLSX", xlsx_bytes({stem: df.to_dict("records")}), f"{stem}.xlsx", key=f"{stem}_xlsx")
    if fig is None:
        return
    # Rendering is deferred to the click: HTML with plotly.js inlined is ~4 MB, PNG needs a browser.
    cols[2].download_button("Chart (HTML)", lambda: html_bytes(fig), f"{stem}.html", "text/html",
                            key=f"{stem}_html")
    has_browser = browser_path() is not None
    cols[3].download_button("Chart (PNG)", (lambda: png_bytes(fig)) if has_browser else b"", f"{stem}.png",
                            "image/png", key=f"{stem}_png", disabled=not has_browser,
                            help=None if has_browser else "needs Chrome or Chromium on the server; "
                                                          "the chart's camera button saves a PNG too")


def _chart(fig: go.Figure, key: str) -> None:
    st.plotly_chart(fig, key=key, config=PLOTLY_CONFIG)


def _estimate(s: Scenario) -> tuple[Estimate | None, str | None]:
    """The scenario's estimate, or its error message: Plan and Formulas show the same one."""
    try:
        return estimate(s), None
    except KvsizeError as err:
        return None, in_widget_terms(str(err))


def _tokens_label(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


def _fmt_bytes(x) -> str:
    """An exact per-token byte count: integer where it is one, else the fraction (e.g. 17/32 of q8_0)."""
    return f"{x.numerator:,}" if x.denominator == 1 else f"{float(x):,.4f} ({x.numerator}/{x.denominator})"


def tensor_parallel_section(e) -> None:
    """What each GPU holds at the chosen TP size, term by term, and which terms grow with TP (sizing's notes)."""
    from sizing.capacity.record import tensor_parallel_notes

    notes = tensor_parallel_notes(e)
    if notes:
        st.caption(f"Per GPU at TP {e.scenario.tensor_parallel_size}: every figure above is one GPU's.")
        st.markdown("\n".join(f"- {n}" for n in notes))


def points_frame(points: list[dict], floor: float) -> pd.DataFrame:
    """Predicted against measured points, with the signed error in percent (measured figures below `floor` count
    as `floor`, so that a zero does not divide)."""
    df = pd.DataFrame(points, columns=["kind", "point", "predicted", "measured"])
    df["error_%"] = 100 * (df["predicted"] - df["measured"]) / df["measured"].clip(lower=floor)
    return df

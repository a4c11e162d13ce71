"""Validation, speed: kvsize's serving simulation against a real vLLM server under load (docs/speed-accuracy.md),
drawn from the rows the benchmark wrote (measure/serving/simulated.json); nothing is simulated while the page draws."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.ui import _chart, _downloads, show_error
from sizing.errors import KvsizeError
from sizing.evidence.serving import SPEED_BARS
from sizing.inputs import read_limited
from sizing.units import MiB

TABLE = Path(__file__).resolve().parents[2] / "measure" / "serving" / "simulated.json"


@st.cache_data(show_spinner=False)
def _rows() -> pd.DataFrame:
    data = json.loads(read_limited(TABLE, 4 * MiB, "measure/serving/simulated.json", "the serving rows"))
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise KvsizeError("measure/serving/simulated.json holds no rows; run benchmarks/serving_accuracy.py --write")
    return pd.DataFrame(data["rows"])


def speed_section() -> None:
    st.subheader("Speed against a real vLLM server")
    try:
        df = _rows()
    except (KvsizeError, OSError, json.JSONDecodeError) as e:
        show_error(str(e))
        return
    unseen = df[df["group"] == "out of the fit"]
    shown = ("ttft_p50_ms", "itl_p50_ms")
    cols = st.columns(len(shown))
    for col, (key, bar) in zip(cols, ((k, SPEED_BARS[k]) for k in shown)):
        error = unseen[f"{key}_kvsize"] / unseen[f"{key}_measured"] - 1
        col.metric(f"{key.split('_')[0].upper()} p50 within {bar:.0%} (out of the fit)",
                   f"{int((error.abs() <= bar).sum())} of {len(unseen)}",
                   help=f"median |error| {error.abs().median():.1%}")
    st.caption("66 load points of vLLM 0.33.0's OpenAI server on an H200 (`vllm bench serve`, closed and open loop; "
               "measure/serving/). 'fitted on': the points the simulation's two constants were fitted on; 'out of "
               "the fit': the rest, measured before the simulation was written (docs/speed-accuracy.md).")
    figure = st.selectbox("Figure", ["itl_p50_ms", "ttft_p50_ms", "itl_p99_ms", "ttft_p99_ms", "output_tokens_per_s"],
                          key="speed_figure")
    fig = go.Figure()
    for group, part in df.groupby("group"):
        fig.add_scatter(x=part[f"{figure}_measured"], y=part[f"{figure}_kvsize"], mode="markers", name=group,
                        text=part["id"], hovertemplate="%{text}<br>measured %{x:,.1f}, kvsize %{y:,.1f}<extra></extra>")
    low = float(min(df[f"{figure}_measured"].min(), df[f"{figure}_kvsize"].min()))
    high = float(max(df[f"{figure}_measured"].max(), df[f"{figure}_kvsize"].max()))
    fig.add_scatter(x=[low, high], y=[low, high], mode="lines", name="equal", line=dict(dash="dash", color="gray"))
    fig.update_layout(xaxis=dict(type="log", title=f"{figure}, measured"), yaxis=dict(type="log", title="kvsize"),
                      title=f"{figure}: kvsize's serving simulation against the real server")
    _chart(fig, "speed_chart")
    st.dataframe(df, key="speed_table", hide_index=True)
    _downloads(df, fig, "speed")

"""Compare formats: every KV cache format for the sidebar's scenario."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.ui import _chart, _downloads
from sizing.cache.formats import FORMAT_NAMES
from sizing.capacity.scenario import Scenario
from sizing.engines import get_engine
from sizing.planners.compare import NOT_THIS_ENGINE, compare


def page_compare(s: Scenario) -> None:
    # The sidebar's concurrency and context, as on Plan: "fits" means the same on both pages.
    rows = compare(s, s.engine, FORMAT_NAMES)
    df = pd.DataFrame(rows)
    engine = get_engine(s.engine).name
    st.caption(f"Each format at {s.concurrency:,} requests of {s.max_model_len:,} tokens on {s.gpu_name}; formats "
               f"{engine} lacks are not run by it: their bars are the ideal engine's figures, for scale only.")
    best = df[df["recommended"]] if "recommended" in df else df.iloc[0:0]
    if len(best):
        r = best.iloc[0]
        st.success(f"Recommended: {r['format']}, {r['max_concurrency']:,} requests at this length ({r['quality']}): "
                   f"the most among the near-lossless formats {r['engine']} runs on this GPU that fit.")
    else:
        st.info("No near-lossless format that the engine runs on this GPU fits this scenario.")
    # green only where the bytes fit and the chosen engine itself runs the format on this GPU
    own = df["runs"] != NOT_THIS_ENGINE
    runnable = df["fits"] & df["runs"].isin(["supported", "unconfirmed"]) & own
    fig = go.Figure()
    for part, name, color, pattern in (
            (df[runnable], "fits and runs here", "#54A24B", ""),
            (df[~runnable & own], "does not fit, does not run here, or n/a", "#BAB0AC", ""),
            (df[~own], f"not run by {engine} (the ideal engine's figure)", "#E4E1DE", "/")):
        if pattern and part.empty:
            continue
        fig.add_bar(name=name, x=part["format"], y=part["max_concurrency"], marker_color=color,
                    marker_pattern_shape=pattern,
                    customdata=part[["kv_bytes_per_token", "capacity_vs_bf16"]],
                    hovertemplate="%{x}: %{y:,} requests, %{customdata[0]:,} B/token, "
                                  "%{customdata[1]:.2f}× bf16's capacity<extra></extra>")
    fig.add_scatter(x=list(df["format"]), y=[s.concurrency] * len(df), mode="lines", name="your concurrency",
                    line=dict(dash="dot", color="black", width=1))
    fig.update_layout(yaxis_title=f"max concurrent requests of {s.max_model_len:,} tokens", xaxis_tickangle=-35,
                      title=f"Capacity by KV format: {s.model_name} on {s.gpu_name}, {s.engine}")
    _chart(fig, "compare_chart")
    st.dataframe(df[["format", "engine", "status", "runs", "recommended", "max_concurrency", "capacity_vs_bf16", "kv_bytes_per_token",
                     "ratio_to_bf16", "max_tokens", "quality", "quality_source"]], key="compare_table", hide_index=True,
                 column_config={"ratio_to_bf16": st.column_config.NumberColumn("bytes vs bf16", format="%.3f×"),
                                "capacity_vs_bf16": st.column_config.NumberColumn("capacity vs bf16",
                                                                                  format="%.2f×")})
    _downloads(df, fig, "formats")

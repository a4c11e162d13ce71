"""Capacity curves: max concurrency against context, one line per format."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.ui import _chart, _downloads, _tokens_label
from sizing.errors import KvsizeError
from sizing.cache.formats import FORMAT_NAMES, get_format
from sizing.capacity.scenario import Scenario
from sizing.capacity.estimate import estimate_lengths
from sizing.engines import get_engine
from sizing.planners.compare import NOT_THIS_ENGINE, gpu_id, runs_here


def page_curves(s: Scenario) -> None:
    contexts = [2**i for i in range(10, 18)] + [s.max_model_len]
    contexts = sorted(set(c for c in contexts if c <= max(s.shape.max_position_embeddings, s.max_model_len)))
    chosen = st.multiselect("Formats", FORMAT_NAMES, default=["bf16", "fp8_e4m3", "nvfp4", "kivi2"], key="curve_formats")
    fig = go.Figure()
    rows = []
    engine = get_engine(s.engine).name
    where = gpu_id(s) or s.gpu_name
    marked = []
    for fmt in chosen:
        row = get_format(fmt, s.shape.serving_dtype, s.format_options)
        own = engine in row.engines
        runs = runs_here(engine, row, s).status if own else NOT_THIS_ENGINE
        # a format the engine does not run here is drawn dashed and says why: its line is bytes, not a plan
        name = (fmt if runs != "unsupported" else f"{fmt} (does not run on {where})") if own else \
            f"{fmt} (sized as ideal: {engine} has no {fmt})"
        if runs in ("unsupported", NOT_THIS_ENGINE):
            marked.append(name)
        try:
            figures = [f for _, f in estimate_lengths(
                s.evolve(engine=s.engine if own else "ideal", k_cache_dtype=fmt, v_cache_dtype=fmt, concurrency=1),
                contexts)]
            ys = [f.max_concurrency for f in figures]
        except KvsizeError:
            ys = [None] * len(contexts)
        rows += [dict(format=fmt, engine=s.engine if own else "ideal", runs=runs, context_tokens=ctx, max_concurrency=y)
                 for ctx, y in zip(contexts, ys)]
        fig.add_scatter(x=contexts, y=ys, name=name, mode="lines+markers",
                        line=dict(dash="dash") if name in marked else None,
                        hovertemplate="%{x:,} tokens: %{y:,} requests<extra>" + name + "</extra>")
    # Marks as traces, not shapes: shape annotations are placed in linear units on log axes.
    values = [r["max_concurrency"] for r in rows if r["max_concurrency"]] + [s.concurrency]
    low, high = max(min(values) / 2, 0.5), max(values) * 2
    fig.add_scatter(x=[s.max_model_len, s.max_model_len], y=[low, high], mode="lines", name="your context",
                    line=dict(dash="dash", color="black", width=1),
                    hovertemplate=f"your context: {s.max_model_len:,} tokens<extra></extra>")
    fig.add_scatter(x=[contexts[0], contexts[-1]], y=[s.concurrency, s.concurrency], mode="lines",
                    name="your concurrency", line=dict(dash="dot", color="black", width=1),
                    hovertemplate=f"your concurrency: {s.concurrency:,} requests<extra></extra>")
    fig.update_layout(xaxis=dict(type="log", tickvals=contexts, ticktext=[_tokens_label(c) for c in contexts]),
                      yaxis=dict(type="log", dtick=1, tickformat=",d"),  # decades only: no minor labels
                      xaxis_title="context length (tokens, log scale)",
                      yaxis_title="max concurrent requests (log scale)",
                      title=f"Max concurrency vs context: {s.model_name} on {s.gpu_name}, {s.engine} "
                            "(dashed: not run here, bytes only)")
    _chart(fig, "curves_chart")
    if marked:
        st.caption(f"Dashed lines are formats {engine} does not run on {where}, or does not have (sized by the ideal "
                   f"engine): what the memory would hold, not a plan it serves.")
    df = pd.DataFrame(rows)
    st.dataframe(df, hide_index=True, key="curves_table")
    _downloads(df, fig, "curves")


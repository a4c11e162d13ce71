"""Validation, llama.cpp: kvsize's llama.cpp rules against real llama.cpp loads on a CPU
(measure/reports/llamacpp-cpu-loads.json, as docs/accuracy.md's "llama.cpp, on a CPU"): each load against the
prediction committed before it ran and against today's kvsize."""

from __future__ import annotations

import json

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.ui import _chart, _downloads, points_frame


@st.cache_data(show_spinner=False)
def _table() -> tuple[pd.DataFrame, dict] | None:
    from measure.llamacpp.accuracy import PREDICTIONS, load_report, rows, summary

    report = load_report()
    if report is None:
        return None
    predictions = json.loads(PREDICTIONS.read_text(encoding="utf-8")) if PREDICTIONS.exists() else None
    return pd.DataFrame(rows(report, predictions)), summary(report, predictions)


def report_points(data: dict) -> pd.DataFrame:
    """Predicted vs printed MiB of each cache of each load (the bundled-report view)."""
    from measure.llamacpp.report import predicted
    from sizing.engines.llamacpp import MIB

    points = []
    for row in data.get("loads", []):
        p = predicted(row["load"])
        for got, want in zip(row["figures"]["caches"], p.caches):
            points.append(dict(kind=f"{got['role']} K + V (MiB)", point=row["load"]["id"],
                               predicted=round(want.size_bytes / MIB, 2), measured=float(got["size_mib"])))
    return points_frame(points, floor=0.01)


def buffer_points(data: dict) -> pd.DataFrame:
    """Predicted vs printed MiB of each full-size load's model, output and compute buffers (the bundled-report view
    of measure/reports/llamacpp-cpu-buffers.json), and its KV buffer on a CUDA GPU (llamacpp-cuda-buffers.json)."""
    from measure.llamacpp.buffers import predicted_mib, printed

    points = []
    for row in data.get("loads", []):
        for kind, by_device in predicted_mib(data, row).items():
            got = printed(row["figures"], kind)
            for device, mib in by_device.items():
                if device in got:
                    points.append(dict(kind=f"{kind} buffer (MiB)", point=f"{row['load']['id']} {device}",
                                       predicted=float(mib), measured=float(got[device])))
    return points_frame(points, floor=0.01)


def llamacpp_section() -> None:
    st.subheader("Against the real llama.cpp (loads on a CPU)")
    got = _table()
    if got is None:
        st.info("no llama.cpp load report is kept in this checkout (measure/reports/llamacpp-cpu-loads.json)")
        return
    df, s = got
    cols = st.columns(3)
    cols[0].metric("Loads exactly as printed (today)", f"{s['today_exact']} of {s['loads']}")
    cols[1].metric("Exact before the loads ran", f"{s['prospective_exact']} of {s['prospective_total']}")
    cols[2].metric("Refusals predicted", f"{s['refused']}")
    st.caption(f"{s['loads']} loads of llama.cpp (llama-cpp-python {s['engine'].get('llama_cpp_python', '?')}) on a "
               f"{s['device']}: {s['models']} models ({', '.join(s['arches'])}) as KV-faithful miniature GGUFs, cache "
               f"types {', '.join(s['types'])} for K and V. Exact: every cell count, layer count and MiB figure "
               "llama.cpp printed (0.01 MiB), or its refusal. 'Before': kvsize's rules when the predictions were "
               "committed, ahead of the loads.")
    arch = st.selectbox("Architecture", ["all", *s["arches"]], key="llamacpp_arch")
    part = df if arch == "all" else df[df["arch"] == arch]
    fig = go.Figure()
    for verdict, column in (("before the loads", "prospective"), ("today", "today")):
        exact = part.groupby("arch")[column].apply(lambda c: int((c == "exact").sum()))
        fig.add_bar(x=list(exact.index), y=list(exact.values), name=f"exact {verdict}")
    totals = part.groupby("arch").size()
    fig.add_scatter(x=list(totals.index), y=list(totals.values), mode="markers", name="loads",
                    marker=dict(symbol="line-ew-open", size=24))
    fig.update_layout(barmode="group", yaxis_title="loads", title="Loads predicted exactly, by llama.cpp architecture")
    _chart(fig, "llamacpp_chart")
    st.dataframe(part, key="llamacpp_table")
    _downloads(part, fig, "llamacpp")

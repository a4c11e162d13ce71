"""Tiers: KV tiers below HBM for the sidebar's replica."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.ui import ROOT, _chart, _downloads, in_widget_terms, show_error
from sizing.errors import KvsizeError
from sizing.capacity.scenario import Scenario
from sizing.units import GiB


def page_tiers(s: Scenario) -> None:
    """KV tiers below HBM for the sidebar's replica: what each holds, reload against recompute, and
    the prefix hits a workload's sessions find (sizing/planners/tiers.py)."""
    from sizing.profiles import link_ids
    from sizing.planners.tiers import engine_offload_options, tiers_for
    from sizing.planners.workload import parse_workload_text, read_workload

    st.caption(f"{s.model_name} on {s.gpu_name}, {s.engine}, TP {s.tensor_parallel_size}: tiers are per replica; "
               "reuse comes from the workload's sessions (docs/formulas.md, 'Tiers below HBM').")
    upload = st.file_uploader("Workload with sessions (.yaml/.json); default: examples/multi-turn-chat.yaml",
                              type=["yaml", "yml", "json"], key="tiers_workload", max_upload_size=1)
    try:
        workload = (parse_workload_text(upload.getvalue(), upload.name) if upload is not None
                    else read_workload(str(ROOT / "examples" / "multi-turn-chat.yaml")))
    except KvsizeError as e:
        show_error(str(e))
        return
    links = list(link_ids())
    c = st.columns(4)
    host = c[0].number_input("Host memory (GiB per replica)", 0, 1 << 20, 512, 64, key="tier_host_gib")
    host_link = c[1].selectbox("Host link", links, index=links.index("pcie5-x16"), key="tier_host_link")
    disk = c[2].number_input("Local NVMe (GiB per replica)", 0, 1 << 24, 0, 256, key="tier_disk_gib")
    disk_link = c[3].selectbox("Disk link", links, index=links.index("nvme-gen4"), key="tier_disk_link")
    session = st.number_input("Session length for the reload figures (tokens)", 1, 10_485_760, 32768, 1024,
                              key="tier_session_tokens")
    sizes = {k: v * GiB for k, v in (("host", host), ("disk", disk)) if v}
    try:
        e, plan = tiers_for(s, workload, sizes, {"host": host_link, "disk": disk_link}, int(session), 0.5)
    except KvsizeError as err:
        show_error(in_widget_terms(str(err)))
        return
    m = st.columns(3)
    m[0].metric("Prefill work saved", f"{plan.prefill_work_saved:.1%}")
    m[1].metric("Mean TTFT (prefill)", f"{plan.ttft_seconds * 1e3:,.0f} ms",
                help=f"{plan.ttft_seconds_no_reuse * 1e3:,.0f} ms with nothing reused")
    m[2].metric("HBM left for prefixes at the peak", f"{plan.hbm_reuse_tokens:,} tokens")
    rows = [dict(tier=t.name, capacity_gib=round(t.capacity_bytes / GiB, 1), tokens=t.tokens,
                 sessions_warm=t.sessions_warm, reload_ms=round(t.reload_seconds * 1e3, 2),
                 recompute_ms=round(t.recompute_seconds * 1e3, 1),
                 faster="reload" if t.reload_beats_recompute else "recompute", route=t.route) for t in plan.tiers]
    if rows:
        st.dataframe(pd.DataFrame(rows), hide_index=True, key="tiers_table")
    reuse = [dict(sessions=r.label, share_of_requests_percent=r.share_percent, reused_tokens=r.reused_tokens,
                  hit_rate=round(r.hit_rate, 4),
                  **{f"found_in_{n}": round(h, 4) for n, h in zip(["hbm", *(t.name for t in plan.tiers)], r.hit_by_tier)})
             for r in plan.reuse]
    st.dataframe(pd.DataFrame(reuse), hide_index=True, key="reuse_table")
    options = engine_offload_options(e.engine.name, sizes.get("host", 0), s.tensor_parallel_size)
    if options:
        st.code(options, language="bash")
    # Hit rate and TTFT as the host tier grows (the other tiers as set).
    grid = sorted({0, 16, 64, 128, 256, 512, 1024, 2048, 4096, int(host)})
    points = []
    for gib in grid:
        _, p = tiers_for(s, workload, {**sizes, "host": gib * GiB} if gib else
                         {k: v for k, v in sizes.items() if k != "host"}, {"host": host_link, "disk": disk_link},
                         int(session), 0.5)
        points.append((gib, p.prefill_work_saved, p.ttft_seconds * 1e3))
    fig = go.Figure()
    fig.add_scatter(x=[g for g, _, _ in points], y=[100 * w for _, w, _ in points], name="prefill work saved (%)",
                    mode="lines+markers")
    fig.add_scatter(x=[g for g, _, _ in points], y=[t for _, _, t in points], name="mean TTFT (ms)",
                    mode="lines+markers", yaxis="y2")
    fig.update_layout(xaxis_title="host memory per replica (GiB)", yaxis_title="prefill work saved (%)",
                      yaxis2=dict(title="mean TTFT (ms)", overlaying="y", side="right"),
                      title=f"Host tier size against reuse: {workload.name}")
    _chart(fig, "tiers_chart")
    _downloads(pd.DataFrame(rows or [{}]), fig, "tiers")

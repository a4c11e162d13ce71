"""Fleet: the cheapest fleet for a workload over GPUs, KV formats and TP sizes; its latency
designs and ITL chart are in app/views/fleet_designs.py."""

from __future__ import annotations

from dataclasses import replace

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.ui import UPLOADED_MODEL, _chart, _downloads, _gpu_choices, show_error, tensor_parallel_section
from app.views.fleet_designs import _itl_chart, fleet_answer, page_designs, show_answer
from sizing.errors import KvsizeError
from sizing.planners.fleet import replica_estimate
from sizing.cache.formats import FORMAT_NAMES
from sizing.capacity.scenario import Scenario
from sizing.capacity.estimate import beyond_positions_warning
from sizing.profiles import gpu_profile, model_profile
from sizing.units import GiB

COST_CHART_BARS = 15  # more bars than this cannot be read; the table holds every candidate

DEFAULT_BUCKETS = [
    {"max_context_tokens": 8192, "share_percent": 55.0, "output_tokens": 512},
    {"max_context_tokens": 16384, "share_percent": 25.0, "output_tokens": 512},
    {"max_context_tokens": 32768, "share_percent": 15.0, "output_tokens": 1024},
    {"max_context_tokens": 131072, "share_percent": 5.0, "output_tokens": 1024},
]


def read_workload_widgets():
    """The workload from an uploaded file, else from the table editor; errors via st.error."""
    from sizing.planners.workload import parse_workload, parse_workload_text

    upload = st.file_uploader("Workload file (.yaml/.json, as for `kvsize plan --workload`)",
                              type=["yaml", "yml", "json"], key="workload_upload", max_upload_size=1)
    if upload is not None:
        workload = parse_workload_text(upload.getvalue(), upload.name)
        target = f"ITL target {workload.itl_target_ms:g} ms" if workload.itl_target_ms else "no ITL target"
        st.caption(f"Workload {workload.name!r} from {upload.name}: peak {workload.peak_concurrency:,} concurrent "
                   f"requests, {target}, prefix cache share {workload.prefix_cache_share:.0%}")
        st.dataframe(pd.DataFrame([dict(bucket=b.label, max_context_tokens=b.max_context_tokens,
                                        share_of_requests_percent=b.share_percent, output_tokens=b.output_tokens)
                                   for b in workload.mix()]), hide_index=True, key="workload_shown")
        return workload
    c = st.columns(3)
    peak = c[0].number_input("Peak concurrent requests", 1, 10_000_000, 400, key="peak_concurrency")
    prefix = c[1].slider("Share of prompt tokens from a shared prefix", 0.0, 0.95, 0.0, 0.05, key="prefix_share")
    itl = c[2].number_input("Inter-token latency target (ms, 0 = none)", 0.0, 10_000.0, 50.0, 5.0, key="itl_target",
                            help="each replica keeps its decode step under this at the peak; more replicas if needed")
    table = st.data_editor(pd.DataFrame(DEFAULT_BUCKETS), num_rows="dynamic", key="buckets",
                           column_config={
                               "max_context_tokens": st.column_config.NumberColumn("≤ context (tokens)", step=1),
                               "share_percent": st.column_config.NumberColumn("share of requests (%)"),
                               "output_tokens": st.column_config.NumberColumn("mean output (tokens)", step=1)})
    buckets = [{k: (float(v) if k == "share_percent" else int(v)) for k, v in row.items() if pd.notna(v)}
               for row in table.to_dict("records")]
    return parse_workload({"peak_concurrency": int(peak), "prefix_cache_share": float(prefix), "buckets": buckets,
                           "itl_target_ms": float(itl) or None}, "workload table")


def page_fleet(s: Scenario) -> None:
    from app.spreadsheet import xlsx_bytes
    from sizing.planners.answer import CAPACITY_ONLY, answer_record
    from sizing.planners.fleet import (HOURS_PER_MONTH, bucket_rows, build_candidates, candidate_rows, cost_rows,
                                       plan_fleet, plan_summary, unconfirmed_pairs, unsupported_pairs)
    from sizing.planners.slo import design_row, design_serve_commands, ranked
    from sizing.planners.guidance import evaluate_rules, quality_notes

    st.caption(f"{s.model_name} on {s.engine}; the sidebar's engine settings apply. KV is charged at each bucket's "
               "longest request; speed at the peak batch per replica (docs/formulas.md, 'Fleet' and 'Speed').")
    try:
        workload = read_workload_widgets()
    except KvsizeError as e:
        show_error(str(e))
        return
    beyond = beyond_positions_warning(s.model_name, s.shape, [b.max_context_tokens for b in workload.mix()])
    if beyond:
        st.warning(beyond)
    c = st.columns(3)
    gpus = c[0].multiselect("GPUs", _gpu_choices(), default=["h100-sxm", "h200"], key="fleet_gpus")
    formats = c[1].multiselect("KV formats", ["auto", *FORMAT_NAMES], default=["auto", "fp8_e4m3", "nvfp4"],
                               key="fleet_formats")
    tps = c[2].multiselect("TP sizes", [1, 2, 4, 8], default=[1, 2, 4], key="fleet_tp")
    if not (gpus and formats and tps):
        show_error("choose at least one GPU, one KV format and one TP size")
        return
    prices = {}
    with st.expander("Prices (USD per GPU-hour)"):
        cols = st.columns(min(4, len(gpus)))
        for i, gpu in enumerate(gpus):
            profile = gpu_profile(gpu)
            prices[gpu] = cols[i % len(cols)].number_input(
                gpu, 0.01, 1000.0, float(profile.price_usd_per_hour), 0.01, key=f"price_{gpu}",
                help=f"indicative: {profile.price_source} ({profile.price_date}); your own rate gives your costs")
    try:
        plan = plan_fleet(replace(s, pipeline_parallel_size=1),
                          build_candidates(gpus, formats, tps, prices, engine=s.engine), workload)
    except KvsizeError as e:
        show_error(str(e))
        return
    for gpu, fmt, why in unsupported_pairs(gpus, formats, s.engine):
        st.info(f"{fmt} left out on {gpu}: {why}")
    unconfirmed = unconfirmed_pairs(gpus, formats, s.engine)
    if unconfirmed:
        st.caption("No engine source confirms " + ", ".join(f"{f} on {g}" for g, f in unconfirmed) + ".")
    rows = candidate_rows(plan)
    answer = fleet_answer(s, workload, gpus, formats, tps, prices, plan)
    show_answer(answer)
    best = plan.cheapest
    st.subheader(f"Candidates, {CAPACITY_ONLY}")
    if best is None:
        show_error("no candidate fits: try a larger TP, a GPU with more memory, or a smaller KV format")
    else:
        b = best.candidate
        st.caption(f"Never the answer (the designs below serve prefill too): the fewest dollars that hold the peak's "
                   f"KV are {best.gpus} × {b.gpu.id} TP {b.tensor_parallel_size} {b.kv_format}, "
                   f"${best.usd_per_hour:,.2f}/h (${best.usd_per_hour * HOURS_PER_MONTH:,.0f} a month of "
                   f"{HOURS_PER_MONTH} h) · {best.reason}")
    df = pd.DataFrame(rows)  # ranked: the recommendation first
    fitting = df[df["fits"]].head(COST_CHART_BARS)
    fig = go.Figure()
    if not fitting.empty:
        labels = fitting["gpu"] + " TP" + fitting["tensor_parallel_size"].astype(str) + " " + fitting["kv_format"]
        for fmt in fitting["kv_format"].unique():
            part = fitting["kv_format"] == fmt
            fig.add_bar(name=fmt, y=labels[part], x=fitting["fleet_usd_per_hour"][part], orientation="h",
                        text=fitting["gpus"][part].astype(str) + " GPUs", textposition="auto",
                        hovertemplate="%{y}: $%{x:,.2f}/h, %{text}<extra></extra>")
        more = len(df[df["fits"]]) - len(fitting)
        fig.update_layout(barmode="overlay", xaxis_title="fleet cost (USD per hour)",
                          yaxis=dict(categoryorder="array", categoryarray=list(labels)[::-1], title=""),
                          height=max(300, 28 * len(fitting) + 120),
                          title=f"Fleet cost for a peak of {workload.peak_concurrency:,} requests, cheapest at the top"
                                + (f" ({more} dearer candidates in the table)" if more > 0 else ""))
        _chart(fig, "fleet_cost_chart")
    st.dataframe(df, hide_index=True, key="fleet_table")
    pools, costs = bucket_rows(plan), cost_rows(plan)
    _downloads(df, fig if not fitting.empty else None, "fleet")
    uploaded = st.session_state.get("upload") is not None
    # An upload names no checkpoint: the command says where the user's own goes.
    model_id = UPLOADED_MODEL if uploaded else model_profile(st.session_state["model"]).hf_id
    serve = [] if answer.best is None else [
        dict(role=role, command=c.command, note=c.note)
        for role, c in design_serve_commands(answer.best, replace(s, pipeline_parallel_size=1), workload, model_id,
                                             int(st.session_state.get("host_tier_gib", 0) or 0) * GiB)]
    fired = [r.explanation for r in evaluate_rules(workload, engine=s.engine, gpu_ids=tuple(gpus)) if r.fires]
    st.download_button("Whole plan (XLSX: summary, designs, capacity-only candidates, pools, cost)",
                       lambda: xlsx_bytes({"summary": plan_summary(plan, answer_record(answer.best, answer.chosen),
                                                                   serve, fired),
                                           "designs": [design_row(d) for d in ranked(answer.designs)],
                                           "capacity_only": rows, "pools": pools, "cost": costs}),
                       "fleet-plan.xlsx", key="fleet_plan_xlsx")
    if serve:
        st.subheader("Serve the fleet that serves the workload")
        for row in serve:
            st.caption(f"{row['role']}: {row['note'] or ''}")
            if row["command"]:
                st.code(row["command"], language="bash", wrap_lines=True)
        if uploaded:
            st.caption(f"{UPLOADED_MODEL}: the folder holding the uploaded config.json and its weights, or its "
                       "Hugging Face id.")
    if best is not None:
        _itl_chart(plan, s, best, formats)
        st.subheader("Pools of the capacity-only candidate")
        st.dataframe(pd.DataFrame([r for r in pools if r["gpu"] == b.gpu.id and r["kv_format"] == b.kv_format
                                   and r["tensor_parallel_size"] == b.tensor_parallel_size]), key="fleet_pools")
        if b.tensor_parallel_size > 1:
            try:
                tensor_parallel_section(replica_estimate(s, best))
            except KvsizeError as e:
                show_error(str(e))
        watch_panel(s, best)
    page_designs(s, workload, answer)
    st.subheader("Guidance")
    for r in evaluate_rules(workload, engine=s.engine, gpu_ids=tuple(gpus)):
        (st.success if r.fires else st.info)(r.explanation)
    st.subheader("Quality notes")
    st.dataframe(pd.DataFrame([n.__dict__ for n in quality_notes(formats, s.shape.serving_dtype)]),
                 key="fleet_quality")
    st.caption(f"Efficiency: {plan.efficiency.source}")


def watch_panel(s: Scenario, best) -> None:
    """The running engine held against the cheapest plan: a saved /metrics scrape of one replica, figure by
    figure (sizing/evidence/metrics.py, as `kvsize watch`)."""
    from sizing.evidence.metrics import MAX_METRICS_BYTES, PlannedPool, read_metrics, watch

    st.subheader("Hold a running replica against this plan")
    upload = st.file_uploader("A saved /metrics scrape of one replica (curl http://host:8000/metrics > metrics.txt)",
                              type=["txt", "prom"], key="fleet_metrics_upload",
                              max_upload_size=MAX_METRICS_BYTES // 2**20)
    if upload is None:
        st.caption("kvsize watch does the same from the command line, against the server's URL, scrape by scrape.")
        return
    pool = best.shared
    try:
        text = upload.getvalue().decode("utf-8")
        replica = replica_estimate(s, best)
        planned = PlannedPool.of(replica)
        if pool:  # the plan counts its pool's hold of the workload's mix, not of max_model_len
            planned = replace(planned, holds_requests=pool.requests_per_replica)
        lines = watch(read_metrics(text), planned, pool.requests_per_replica if pool else s.concurrency)
    except UnicodeDecodeError:
        show_error("the scrape is not UTF-8 text")
        return
    except KvsizeError as e:
        show_error(str(e))
        return
    table = pd.DataFrame([line.__dict__ for line in lines])
    outside = table[table["inside"] == False]  # noqa: E712 - None means nothing to hold it against
    (st.error if len(outside) else st.success)(
        f"{len(outside)} of {len(table)} figures outside the plan" if len(outside) else "every figure inside the plan")
    for _, row in outside.iterrows():
        st.warning(f"{row['figure']}: {row['advice']}")
    st.dataframe(table, hide_index=True, key="fleet_watch_table")

"""Fleet, continued: aggregated against disaggregated designs for latency targets, and the
inter-token latency chart of the cheapest plan."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.ui import _chart, in_widget_terms, show_error
from sizing.errors import KvsizeError
from sizing.capacity.scenario import Scenario
from sizing.capacity.estimate import estimate
from sizing.units import GiB


@dataclass(frozen=True)
class FleetAnswer:
    """The designs the Fleet page's answer comes from, searched once a render."""

    designs: list
    best: object  # the chosen Design, or None
    chosen: object  # ChosenTargets
    error: str | None = None
    held: object = None  # HeldDesigns: how many replicas the serving simulation ran


def fleet_answer(s: Scenario, workload, gpus: list[str], formats: list[str], tps: list[int], prices: dict,
                 plan) -> FleetAnswer:
    """The fleet that serves the workload, as `kvsize plan` answers: the cheapest design under the TTFT and ITL
    targets, or kvsize's stated default targets where none is given. The widgets below the headline set the TTFT
    target, P/D link and host tier; their values are read from the session so the headline comes first."""
    from sizing.planners.answer import targets_for
    from sizing.planners.fleet import build_candidates
    from sizing.planners.held import hold_designs
    from sizing.planners.slo import TierOption, cheapest, pd_link, search_designs

    ttft = float(st.session_state.get("ttft_target", workload.ttft_target_ms or 0.0) or 0.0)
    link_choice = st.session_state.get("pd_link", "nvlink4-peer")
    host_gib = int(st.session_state.get("host_tier_gib", 0) or 0)
    chosen = targets_for(workload.model_copy(update={"ttft_target_ms": ttft or None}), "the targets set on this page")
    tiers = TierOption({"host": host_gib * GiB}, {"host": "pcie5-x16"}) if host_gib else None
    key = (repr(s), workload.model_dump_json(), tuple(gpus), tuple(formats), tuple(tps), tuple(sorted(prices.items())),
           link_choice, ttft, host_gib, repr(plan.efficiency))
    if key in _ANSWERS:
        return _ANSWERS[key]
    try:
        link, shared, same_host = pd_link(link_choice, "P/D link")
        base = replace(s, pipeline_parallel_size=1)
        designs = search_designs(base, build_candidates(gpus, formats, tps, prices, engine=s.engine), workload,
                                 plan.efficiency, chosen.targets, link, shared, same_host=same_host, tiers=tiers)
        held = None
        if tiers is None:  # KV tiers' reloads are the queueing model's; the simulation holds designs without them
            held = hold_designs(designs, base, workload, plan.efficiency, chosen.targets)
            designs = held.designs
    except KvsizeError as e:
        return FleetAnswer([], None, chosen, in_widget_terms(str(e)))
    answer = FleetAnswer(designs, cheapest(designs), chosen, held=held)
    if len(_ANSWERS) >= MAX_KEPT_ANSWERS:
        _ANSWERS.pop(next(iter(_ANSWERS)))
    _ANSWERS[key] = answer
    return answer


# Answers kept per server process: a design search holds some ten replicas to the serving simulation (seconds), and
# a rerun of the page with the same inputs (any other widget moved) must not pay for it again.
MAX_KEPT_ANSWERS = 32
_ANSWERS: dict[tuple, FleetAnswer] = {}


def show_answer(answer: FleetAnswer) -> None:
    """The headline: the fleet that serves the workload (GPUs, cost, TTFT and ITL), never the capacity-only row."""
    from sizing.planners.fleet import HOURS_PER_MONTH
    from sizing.planners.serving import SIMULATED

    if answer.error:
        show_error(answer.error)
        return
    d = answer.best
    if d is None:
        show_error(f"No design serves the workload under {answer.chosen.sentence()}: loosen the targets, or add "
                 "faster GPUs or larger TP sizes (the designs table below gives each one's reason)")
        return
    m = st.columns([3, 3, 2, 2])
    m[0].metric("Fleet that serves the workload", f"{d.gpus} GPUs", help=d.label)
    m[1].metric("Fleet cost", f"${d.usd_per_hour:,.2f}/h",
                help=f"${d.usd_per_hour * HOURS_PER_MONTH:,.0f} a month of {HOURS_PER_MONTH} h")
    q = answer.chosen.targets.percentile
    how = ("simulated: the engine's steps at the design's share of the peak" if d.basis == SIMULATED
           else "queueing model at the peak's arrival rate")
    m[2].metric(f"TTFT p{q} ({d.basis})", f"{d.ttft_seconds * 1e3:,.0f} ms", help=how)
    m[3].metric(f"ITL p{q} ({d.basis})", f"{d.itl_seconds * 1e3:.1f} ms",
                help=f"each request's mean gap between tokens (TPOT), prefill interleaved with decode; {how}")
    held = answer.held
    extra = "" if held is None else (
        f" Held to the serving simulation: {held.simulated} replica(s) run step by step; {held.skipped} design(s) "
        "could not cost less than the cheapest that meets the targets"
        + (f"; {held.unsimulated} left unsimulated, so never chosen." if held.unsimulated else "."))
    source = f"; speed: {d.speed_source}" if d.speed_source else ""
    st.caption(f"{d.label}{source}; targets: {answer.chosen.sentence()}.{extra}")


def page_designs(s: Scenario, workload, answer: FleetAnswer) -> None:
    """Aggregated and disaggregated designs against TTFT and ITL targets, and their frontier: where the answer
    above comes from."""
    from app.spreadsheet import xlsx_bytes
    from sizing.profiles import link_ids
    from sizing.planners.held import none_of_kind
    from sizing.planners.slo import cheapest, design_row, frontier, ranked

    st.subheader("Latency targets: aggregated or disaggregated")
    c = st.columns(3)
    c[0].number_input("TTFT target (ms, 0 = none)", 0.0, 600_000.0, float(workload.ttft_target_ms or 0.0), 100.0,
                      key="ttft_target", help="mean time to first token at the peak; with neither target, kvsize's "
                                              "stated default targets apply")
    links = ["none", *link_ids()]
    c[1].selectbox("P/D link", links, index=links.index("nvlink4-peer"), key="pd_link",
                   help="what a disaggregated design ships each request's KV over (kvsize links)")
    c[2].number_input("Host memory tier per replica (GiB, 0 = none)", 0, 1 << 20, 0, 64, key="host_tier_gib",
                      help="prefixes the workload's sessions find there are reloaded, not prefilled")
    if answer.error:
        show_error(answer.error)
        return
    designs, targets = answer.designs, answer.chosen.targets
    best = cheapest(designs)
    agg = cheapest([d for d in designs if d.kind == "aggregated"])
    dis = cheapest([d for d in designs if d.kind == "disaggregated"])
    m = st.columns(3)
    for col, kind, d in ((m[0], "aggregated", agg), (m[1], "disaggregated", dis)):
        why = "" if d else none_of_kind(designs, kind)
        col.metric(f"Cheapest {kind}", f"{d.gpus} GPUs, ${d.usd_per_hour:,.2f}/h" if d else why.split(":")[0],
                   help=(f"{d.layout}; TTFT {d.ttft_seconds * 1e3:,.0f} ms, ITL {d.itl_seconds * 1e3:.1f} ms; "
                         f"{d.reason}") if d else why)
    if agg and dis:
        m[2].metric("Disaggregated against aggregated",
                    f"{dis.gpus - agg.gpus:+d} GPUs, {dis.usd_per_hour - agg.usd_per_hour:+,.2f} $/h",
                    help="the cheapest disaggregated design less the cheapest aggregated one")
    if best is not None:
        st.caption(f"Chosen (cheapest per hour at the peak): {best.label}. The frontier is cost per token: faster "
                   "designs serve more requests at the same concurrency, so they can cost less per token while "
                   "costing more per hour.")
    front = frontier(designs)
    fig = go.Figure()
    for kind, color in (("aggregated", "#4C78A8"), ("disaggregated", "#F58518")):
        part = [d for d in front if d.kind == kind]
        fig.add_scatter(x=[d.itl_seconds * 1e3 for d in part], y=[d.usd_per_million_output_tokens for d in part],
                        mode="markers", name=f"{kind} (frontier)", marker=dict(color=color, size=11),
                        text=[f"{d.layout}<br>TTFT {d.ttft_seconds * 1e3:,.0f} ms, {d.gpus} GPUs" for d in part],
                        hovertemplate="%{text}<br>ITL %{x:.1f} ms, $%{y:.3f}/M tok<extra></extra>")
    if best is not None:
        fig.add_scatter(x=[best.itl_seconds * 1e3], y=[best.usd_per_million_output_tokens], mode="markers",
                        name="chosen", marker=dict(symbol="star", size=18, color="crimson"),
                        hovertemplate=f"chosen: {best.label}<extra></extra>")
    if targets.itl_seconds:
        ys = [d.usd_per_million_output_tokens for d in front] or [0, 1]
        fig.add_scatter(x=[targets.itl_seconds * 1e3] * 2, y=[min(ys) * 0.95, max(ys) * 1.05], mode="lines",
                        name="ITL target", line=dict(dash="dash", color="crimson", width=1))
    fig.update_layout(xaxis_title="inter-token latency at the peak (ms)",
                      yaxis_title="USD per million output tokens", height=420,
                      title="Designs that meet the targets: cost per token against ITL (hover: TTFT, GPUs)")
    _chart(fig, "frontier_chart")
    rows = [design_row(d) for d in ranked(designs)]
    st.dataframe(pd.DataFrame(rows), hide_index=True, key="designs_table")
    st.download_button("Designs (XLSX: designs, frontier)",
                       lambda: xlsx_bytes({"designs": rows, "frontier": [design_row(d) for d in front]}),
                       "designs.xlsx", key="designs_xlsx")


def _itl_chart(plan, s: Scenario, best, formats: list[str]) -> None:
    """Inter-token latency against context at the cheapest plan's batch, one line per format."""
    from sizing.engines.memory import resolve_weights_dtype
    from sizing.planners.speed import decode_step

    c = best.candidate
    batch = max(1, round(best.decode_batch))
    contexts = [2**i for i in range(10, 18)]
    fig, rows = go.Figure(), []
    for fmt in formats:
        try:
            e = estimate(replace(s, k_cache_dtype=fmt, v_cache_dtype=fmt, tensor_parallel_size=c.tensor_parallel_size,
                                 pipeline_parallel_size=1, gpu_name=c.gpu.name, gpu_memory_bytes=c.gpu.memory_bytes,
                                 max_model_len=contexts[-1]))
        except KvsizeError:
            continue
        ys = []
        for ctx in contexts:
            step = decode_step(s.shape, e.layout, resolve_weights_dtype(s.weights_dtype, s.shape),
                               c.tensor_parallel_size, [(batch, ctx)], c.gpu.hbm_bandwidth_gb_s, plan.efficiency,
                               e.k_format)
            ys.append(step.seconds * 1000)
            rows.append(dict(format=e.k_format, context_tokens=ctx, batch=batch, itl_ms=ys[-1]))
        fig.add_scatter(x=contexts, y=ys, mode="lines+markers", name=e.k_format,
                        hovertemplate="%{x:,} tokens: %{y:.2f} ms<extra>" + e.k_format + "</extra>")
    target = plan.workload.itl_target_ms
    if target:
        fig.add_scatter(x=[contexts[0], contexts[-1]], y=[target, target], mode="lines", name=f"ITL target {target:g} ms",
                        line=dict(dash="dash", color="crimson", width=1),
                        hovertemplate=f"ITL target: {target:g} ms<extra></extra>")
    fig.update_layout(xaxis_title="context per request (tokens)", yaxis_title="inter-token latency (ms)",
                      title=f"Decode step vs context: {batch} requests on {c.gpu.id} TP {c.tensor_parallel_size} "
                            "(slope ∝ KV bytes per token)")
    _chart(fig, "itl_chart")

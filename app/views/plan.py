"""Plan: the sidebar's scenario sized, its memory per GPU and the engine's startup log lines."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from app.ui import _chart, _downloads, breakdown_figure, in_widget_terms, show_error, tensor_parallel_section
from sizing.capacity.estimate import Estimate
from sizing.capacity.scenario import Scenario
from sizing.capacity.record import to_record
from sizing.engines import get_engine
from sizing.planners.compare import scenario_runs_here

HIDDEN = ("schema",)  # the record's format tag: for programs reading the JSON, not for the page


def page_plan(s: Scenario, e: Estimate | None, error: str | None) -> None:
    if e is None:
        show_error(error)
        return
    r = to_record(e)
    c = st.columns(4)
    capped = (f"; the engine's {r['recurrent_state_slots']:,} Mamba state slots cap it at "
              f"{r['recurrent_state_capped_requests']:,}" if r.get("recurrent_state_slots") is not None else "")
    c[0].metric("Max concurrency (requests)", f"{r['max_concurrency']:,}",
                help=f"requests of {r['max_model_len']:,} tokens{capped}")
    c[1].metric("Max context (tokens)", f"{r['max_context_at_concurrency']:,}", help=f"at {s.concurrency} requests")
    c[2].metric("KV bytes per token (bytes)", f"{r['kv_bytes_per_token']:,}", help="per GPU, metadata included")
    c[3].metric("Max tokens in cache (tokens)", f"{r['max_tokens']:,}", help="what the engine's startup log reports")
    # "fits" means the engine runs it: a format the engine does not run on this GPU is an error, never a green fit
    verdict = scenario_runs_here(s)
    stops = verdict.status == "unsupported"
    if stops:
        held = (f" Its memory would hold up to {e.max_concurrency:,} requests of {s.max_model_len:,} tokens, but "
                f"{get_engine(s.engine).name} cannot serve this plan on this GPU." if e.fits else "")
        show_error(in_widget_terms(f"does not run here: {verdict.source}.{held} Choose a format it runs here "
                                 "(Compare formats lists them) or another --gpu."))
    if not (stops and e.fits):
        (st.success if e.fits else st.error)(in_widget_terms(e.fit_message))
    for w in e.warnings:
        if not (stops and " does not run " in w):  # said in the error above
            st.warning(in_widget_terms(w))
    fig = breakdown_figure(r)
    _chart(fig, "breakdown_chart")
    df = pd.DataFrame([{k: v for k, v in r.items() if k != "breakdown"} | r["breakdown"]])  # downloaded whole
    # On screen the schema tag is left off, and the log lines are shown as the engine prints them, not as a list.
    shown = df.drop(columns=[*HIDDEN, "engine_log_lines", "tensor_parallel_notes"], errors="ignore")
    st.dataframe(shown.T.rename(columns={0: "value"}).astype(str), key="plan_table")
    tensor_parallel_section(e)
    if r["engine_log_lines"]:
        st.caption(f"What {r['engine']} prints at startup for this plan:")
        st.code("\n".join(r["engine_log_lines"]), language=None)
    _downloads(df, fig, "plan")

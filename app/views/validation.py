"""Validation: kvsize against real vLLM starts, measurement reports and decode timings."""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from app.ui import ROOT, _chart, _downloads, points_frame, show_error
from measure.llamacpp.buffers import SCHEMA as LLAMACPP_BUFFERS_SCHEMA  # full-size llama.cpp loads' buffers
from measure.llamacpp.report import SCHEMA as LLAMACPP_SCHEMA  # real llama.cpp loads on a CPU
from sizing.inputs import load_json
from sizing.errors import KvsizeError

REPORT_SCHEMA = "kvsize.measure/1"  # measure/run.py writes it; the app reads reports without importing torch


MAX_REPORT_UPLOAD_BYTES = 64 * 2**20  # the largest committed report is under 2 MiB
VERIFY_SCHEMA = "kvsize.verify/1"  # measure/verify.py: a real vLLM start, its log and kvsize's checks


def report_points(data) -> pd.DataFrame:
    """Predicted vs measured points of a measurement report (a verify report: predicted vs what vLLM
    printed); KvsizeError names what is missing."""
    if isinstance(data, dict) and data.get("schema") == LLAMACPP_SCHEMA:
        from app.views.validation_llamacpp import report_points as llamacpp_points

        return llamacpp_points(data)
    if isinstance(data, dict) and data.get("schema") == LLAMACPP_BUFFERS_SCHEMA:
        from app.views.validation_llamacpp import buffer_points

        try:
            return buffer_points(data)
        except (KeyError, TypeError, ValueError, OSError) as e:
            raise KvsizeError(f"llama.cpp buffers report is missing or has a malformed field ({e!r})") from None
    if isinstance(data, dict) and data.get("schema") == VERIFY_SCHEMA:
        try:
            points = [dict(kind=c["term"], point=data.get("model_name") or "model", predicted=c["predicted"],
                           measured=c["printed"]) for c in data["checks"]]
        except (KeyError, TypeError) as e:
            raise KvsizeError(f"verify report check is missing field {e}") from None
        return points_frame(points, floor=1)
    if not isinstance(data, dict) or data.get("schema") != REPORT_SCHEMA:
        found = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise KvsizeError(f"not a kvsize measurement report: schema {found!r}, expected {REPORT_SCHEMA!r}")
    points = []
    try:
        for a in data.get("allocation", []):
            points.append(dict(kind="storage bytes", point=f"{a['model']} {a['kv_cache_dtype']}",
                               predicted=a["predicted_bytes"], measured=a["storage_bytes"]))
        for c in data.get("capacity", []):
            where = f"{c['model']} {c.get('kv_cache_dtype', '')}".strip()
            if "derived" in c:  # capacity_version 2: blocks follow from the readings (derived), not read
                for key, source in (("weights_bytes", "measured"), ("activation_bytes", "measured"),
                                    ("num_blocks", "derived")):
                    # version 3 reads the weight tensors apart from the allocator's rounding: the
                    # prediction is of the tensors (measure/validate.py holds it to them)
                    read = "weights_tensor_bytes" if key == "weights_bytes" and "weights_tensor_bytes" in \
                        c[source] and "weights_tensor_bytes" in c["predicted"] else key
                    points.append(dict(kind=f"{read} ({source})", point=where, predicted=c["predicted"][read],
                                       measured=c[source][read]))
                continue
            for key in ("weights_bytes", "num_blocks", "activation_bytes", "non_torch_bytes"):
                points.append(dict(kind=key, point=c["model"], predicted=c["predicted"][key],
                                   measured=c["measured"][key]))
        for t in data.get("tensor_parallel", []):
            where = f"{t['model']} TP {t['tensor_parallel_size']} rank {t['rank']} {t['kv_cache_dtype']}"
            for key, label in (("weights_bytes", "weights_bytes"), ("kv_page_bytes_per_layer", "KV page per layer")):
                points.append(dict(kind=f"{label} per rank (measured)", point=where, predicted=t["predicted"][key],
                                   measured=t["measured"][key]))
    except (KeyError, TypeError) as e:
        raise KvsizeError(f"measurement report point is missing field {e}") from None
    return points_frame(points, floor=1)


@st.cache_data(show_spinner=False)
def _accuracy() -> tuple[pd.DataFrame, object]:
    """Every start's rows and their summary over all of them (sizing/evidence/starts.py summarize)."""
    from dataclasses import asdict

    from sizing.evidence.starts import accuracy_rows, summarize

    rows = accuracy_rows()
    overall = summarize(rows, lambda r: "all")[0] if rows else None
    return pd.DataFrame([asdict(r) for r in rows]), overall


def real_engine_section() -> None:
    """kvsize against the real vLLM starts kept in tests/fixtures/vllm-starts (as docs/accuracy.md)."""
    st.subheader("Against the real vLLM")
    df, overall = _accuracy()
    if overall is None:
        st.info("no real vLLM start is kept in this checkout")
        return
    cols = st.columns(3)
    cols[0].metric("Predictions within 1% of vLLM", f"{overall.within_1pct} of {overall.starts}")
    cols[1].metric("Median |token error|", f"{100 * overall.median_abs:.2f}%")
    cols[2].metric("Worst token error (signed)", f"{100 * overall.worst:+.2f}%")
    st.caption(f"{df['id'].nunique()} starts of vLLM with dummy weights ({', '.join(sorted(df['release'].unique()))}; "
               f"{', '.join(sorted(df['gpu'].unique()))}), each predicted by `kvsize estimate` from its settings and "
               "by `kvsize check-log` from its log. Above zero promises KV memory vLLM does not give.")
    group = st.selectbox("Group by", ["family", "release", "gpu", "tp", "by"], key="accuracy_group")
    fig = go.Figure()
    for name, part in df.groupby(group):
        fig.add_box(y=100 * part["kv_tokens_error"], name=str(name), boxpoints="all", text=part["id"],
                    hovertemplate="%{text}<br>%{y:+.2f}%<extra></extra>")
    fig.add_hline(y=1, line_dash="dash", line_color="gray")
    fig.add_hline(y=-1, line_dash="dash", line_color="gray")
    fig.update_layout(yaxis_title="GPU KV cache size: predicted / printed − 1 (%)", showlegend=False,
                      title="Token error per start (dashed: ±1%)")
    _chart(fig, "accuracy_chart")
    table = df.assign(kv_budget_error=100 * df["kv_budget_error"], kv_tokens_error=100 * df["kv_tokens_error"])
    table = table.rename(columns={"kv_budget_error": "KV budget error (%)", "kv_tokens_error": "token error (%)",
                                  "graphs_error_gib": "CUDA graphs: predicted − printed (GiB)",
                                  "weights_error_gib": "weights: predicted − printed (GiB)"})
    st.dataframe(table, key="accuracy_table")
    _downloads(table, fig, "accuracy")


def page_validation() -> None:
    from app.views.validation_llamacpp import llamacpp_section
    from app.views.validation_speed import speed_section

    real_engine_section()
    llamacpp_section()
    speed_section()
    st.subheader("Measurement reports")
    reports = sorted((ROOT / "measure" / "reports").glob("*.json"))
    names = [p.name for p in reports]
    choice = st.selectbox("Bundled report", names, key="report_choice") if names else None
    upload = st.file_uploader("…or upload a report", type=["json"], key="report_upload",
                              max_upload_size=MAX_REPORT_UPLOAD_BYTES // 2**20)
    if upload is None and choice is None:
        st.info("no measurement report bundled; upload one written by `kvsize measure`")
        return
    try:
        raw = upload.getvalue() if upload is not None else (ROOT / "measure" / "reports" / choice).read_bytes()
        data = load_json(raw, f"measurement report {upload.name if upload is not None else choice}",
                         "a kvsize measurement report (JSON)", MAX_REPORT_UPLOAD_BYTES)
        df = report_points(data)
    except KvsizeError as e:
        show_error(str(e))
        return
    from measure.validate import POINT_SECTIONS, report_problems

    try:
        problems = report_problems(data, None)
    except KvsizeError as e:
        problems = [str(e)]
    count = len(df) if data.get("schema") in (VERIFY_SCHEMA, LLAMACPP_SCHEMA, LLAMACPP_BUFFERS_SCHEMA) else \
        sum(len(data.get(k, [])) for k in POINT_SECTIONS)
    gpu = data.get("device", {}).get("name", "?")
    if problems:
        show_error(f"{len(problems)} of the checks fail on this report ({gpu}): " + "; ".join(problems[:3]))
    elif data.get("schema") == LLAMACPP_SCHEMA:
        st.success(f"{count} of {count} caches agree with today's kvsize (`kvsize validate`): predicted against what "
                   f"real llama.cpp loads printed on a {gpu}, re-read from the raw lines the report keeps.")
    elif data.get("schema") == LLAMACPP_BUFFERS_SCHEMA:
        st.success(f"{count} of {count} buffers agree with today's kvsize (`kvsize validate`): the model and output "
                   f"buffers exactly, the compute buffer within the band docs/formulas.md states, against real "
                   f"full-size llama.cpp loads on a {gpu}.")
    elif data.get("schema") == VERIFY_SCHEMA:
        st.success(f"{count} of {count} points agree with today's kvsize (`kvsize validate`): predicted against what "
                   f"a real vLLM start printed on {gpu}, re-read from the log the report keeps (`kvsize verify`).")
    else:
        st.success(f"{count} of {count} points agree with today's kvsize (`kvsize validate`), measured on {gpu}. "
                   "Measured: read from the GPU; derived: vLLM's rule and kvsize's pool applied to the readings. "
                   "Not covered by this report: engines that were not run (the harness replicates vLLM's rule), "
                   "GPUs it was not measured on.")
    if df.empty:
        if not data.get("kernels") and not data.get("decode"):
            st.info("this report has no allocation, capacity or decode points")
    else:
        fig = go.Figure()
        for kind, part in df.groupby("kind"):
            fig.add_scatter(x=part["measured"], y=part["predicted"], mode="markers", name=kind, text=part["point"],
                            hovertemplate="%{text}<br>measured %{x:,}<br>predicted %{y:,}<extra>" + kind + "</extra>")
        top = float(max(df["measured"].max(), df["predicted"].max()))
        bottom = float(max(min(df["measured"].min(), df["predicted"].min()), 1))
        fig.add_scatter(x=[bottom, top], y=[bottom, top], mode="lines", name="identity (predicted = measured)",
                        line=dict(dash="dash", color="gray"))
        fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis_title="measured (bytes, or blocks)",
                          yaxis_title="predicted (bytes, or blocks)",
                          title=f"Predicted vs measured on {data.get('device', {}).get('name', '?')}")
        _chart(fig, "validation_chart")
        st.dataframe(df, key="validation_table")
        _downloads(df, fig, "validation")
    decode_section(data)


def decode_section(data: dict) -> None:
    """Decode time against context, one line per format (and kernel), at the report's largest batch."""
    points = [p for p in (data.get("kernels") or []) + (data.get("decode") or []) if isinstance(p, dict)]
    if not points:
        return
    df = pd.DataFrame(points)
    needed = {"format", "batch", "context", "median_ms"}
    if not needed <= set(df.columns):
        show_error(f"measurement report decode points need fields {sorted(needed)}; found {sorted(df.columns)}")
        return
    if "kernel" not in df.columns:
        df["kernel"] = "torch reference"
    st.subheader("Decode attention time")
    batches = sorted(df["batch"].unique())
    batch = st.selectbox("Batch", batches, index=len(batches) - 1, key="decode_batch")
    part = df[df["batch"] == batch].sort_values("context")
    if "head_dim" in part.columns:  # the main grid: the most common head size
        part = part[part["head_dim"] == part["head_dim"].mode().iloc[0]]
    from plotly.colors import qualitative

    fig = go.Figure()
    palette = qualitative.Dark24  # one colour per line: the default palette has ten
    for i, ((kernel, fmt), line) in enumerate(part.groupby(["kernel", "format"], sort=False)):
        color = palette[i % len(palette)]
        fig.add_scatter(x=line["context"], y=line["median_ms"], mode="lines+markers", name=f"{fmt} ({kernel})",
                        line=dict(color=color),
                        hovertemplate="%{x:,} tokens: %{y:.3f} ms<extra>" + f"{fmt} ({kernel})" + "</extra>")
        if "predicted_ms" in line.columns and line["predicted_ms"].notna().any():
            fig.add_scatter(x=line["context"], y=line["predicted_ms"], mode="lines", name=f"{fmt} predicted",
                            line=dict(dash="dot", color=color), showlegend=False,
                            hovertemplate="%{x:,} tokens: predicted %{y:.3f} ms<extra>" + fmt + "</extra>")
    fig.update_layout(xaxis_type="log", yaxis_type="log", xaxis_title="context length (tokens, log scale)",
                      yaxis_title="one decode attention call (ms, log scale)",
                      title=f"Decode attention at batch {batch}, one layer (dotted: kvsize prediction)")
    if "copy_bandwidth_gb_s" in data:
        st.caption(f"Measured copy bandwidth {data['copy_bandwidth_gb_s']:,.0f} GB/s (read + write, decimal GB). "
                   "Predictions: overhead + bytes read / (bandwidth × the format's fitted efficiency) "
                   "+ batch × per-sequence time + context × per-token time (docs/formulas.md).")
    _chart(fig, "decode_chart")
    st.dataframe(part, key="decode_table")
    _downloads(part, fig, "decode")

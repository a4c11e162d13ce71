"""kvsize web app: read widgets, call sizing, draw. Run: streamlit run app/streamlit_app.py"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import pandas as pd  # noqa: E402
import plotly.graph_objects as go  # noqa: E402
import streamlit as st  # noqa: E402

from app.chart_export import PLOTLY_CONFIG, browser_path, html_bytes, png_bytes  # noqa: E402
from sizing.engines import ENGINES, get_engine  # noqa: E402
from sizing.errors import KvsizeError  # noqa: E402
from sizing.formats import FORMAT_NAMES  # noqa: E402
from sizing.layers import layer_groups  # noqa: E402
from sizing.memory import WEIGHT_FORMATS  # noqa: E402
from sizing.plan import (Estimate, Scenario, beyond_positions_warning, compare, estimate, estimate_lengths,  # noqa: E402
                         to_record)  # noqa: E402
from sizing.profiles import bundled_shape, gpu_ids, gpu_profile, model_ids, model_profile  # noqa: E402
from sizing.shape import MAX_CONFIG_BYTES, parse_config_text, resolve_shape  # noqa: E402
from sizing.units import GiB  # noqa: E402

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
        st.warning(f"URL parameter {key}={value!r} is not usable{allowed}; using {default}")
        return default
    return parsed


SAME_AS_K = "same as K"
LIMITS = {"tp": (1, 64), "pp": (1, 64), "context": (1, 10_485_760), "concurrency": (1, 100_000), "mtp_layers": (0, 8)}
UPLOADED_MODEL = "MODEL_DIR"
# The CLI's flags as the sidebar names them: sizing's errors speak of flags.
WIDGET_NAMES = {
    "--k-cache-dtype": "K cache format", "--v-cache-dtype": "V cache format", "--kv-cache-dtype": "the cache format",
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


def _index(options: list[str], value: str) -> int:
    if value in options:
        return options.index(value)
    st.warning(f"{value!r} from the page URL is not one of the choices; showing {options[0]} instead")
    return 0


def read_scenario() -> Scenario | None:
    """The sidebar widgets as a Scenario; errors are shown with st.error."""
    models, gpus = _model_choices(), _gpu_choices()
    sb = st.sidebar
    sb.header("Scenario")
    model = sb.selectbox("Model", models, index=_index(models, _query("model", "llama-3.1-8b")), key="model")
    upload = sb.file_uploader(f"…or upload a config.json (≤ {MAX_CONFIG_BYTES // 2**20} MiB)", type=["json"],
                              key="upload", max_upload_size=MAX_CONFIG_BYTES // 2**20)
    if upload is not None:
        sb.caption("An uploaded config is not part of the page link: send the file with the link.")
    gpu = sb.selectbox("GPU", gpus, index=_index(gpus, _query("gpu", "h100-sxm")), key="gpu", format_func=_gpu_label)
    engines = list(ENGINES)
    engine = sb.selectbox("Engine", engines, index=_index(engines, _query("engine", "vllm")), key="engine")
    formats = ["auto", *FORMAT_NAMES]
    k_fmt = sb.selectbox("K cache format", formats, index=_index(formats, _query("k", "auto")), key="k_format")
    v_choices = [SAME_AS_K, *formats]
    v_fmt = sb.selectbox("V cache format", v_choices, index=_index(v_choices, _query("v", SAME_AS_K)), key="v_format")
    if v_fmt == SAME_AS_K:
        v_fmt = k_fmt
    weights = ["auto", *WEIGHT_FORMATS]
    weights_dtype = sb.selectbox("Weights dtype", weights, index=_index(weights, _query("w", "auto")),
                                 key="weights_dtype", help="auto: the checkpoint's quantization, else its dtype")
    # No bounds on the widgets themselves: a browser refuses an out-of-range entry silently and keeps
    # the last answer on screen, so the range is checked here and a wrong entry is named in a banner.
    tp = sb.number_input("Tensor parallel size", value=_query("tp", 1, int, *LIMITS["tp"]), step=1, key="tp")
    pp = sb.number_input("Pipeline parallel size", value=_query("pp", 1, int, *LIMITS["pp"]), step=1, key="pp")
    context = sb.number_input("Context (max_model_len, tokens)", value=_query("ctx", 32768, int, *LIMITS["context"]),
                              step=1024, key="context")
    mtp = sb.number_input("MTP layers for speculative decoding", value=0, step=1, key="mtp_layers",
                           help="of the model's num_nextn_predict_layers: their KV and weights are added")
    concurrency = sb.number_input("Concurrent requests", value=_query("conc", 8, int, *LIMITS["concurrency"]),
                                  step=1, key="concurrency")
    fraction = sb.slider("Engine memory fraction (vLLM gpu_memory_utilization, …)", 0.5, 1.0,
                         _query("util", get_engine(engine).memory_fraction_default or 0.9, float, 0.5, 1.0), 0.01,
                         key="fraction")
    headroom = sb.slider("Headroom (engines without their own fraction)", 0.0, 0.5,
                         _query("headroom", 0.10, float, 0.0, 0.5), 0.01, key="headroom")
    st.query_params.update(model=model, gpu=gpu, engine=engine, k=k_fmt, v=st.session_state["v_format"], w=weights_dtype,
                           tp=str(tp), pp=str(pp),
                           ctx=str(context), conc=str(concurrency), util=str(fraction), headroom=str(headroom))
    try:
        for key, label in (("tp", "Tensor parallel size"), ("pp", "Pipeline parallel size"),
                           ("context", "Context"), ("concurrency", "Concurrent requests"),
                           ("mtp_layers", "MTP layers for speculative decoding")):
            low, high = LIMITS[key]
            if not low <= st.session_state[key] <= high:
                raise KvsizeError(f"'{label}' must be from {low:,} to {high:,}, got {st.session_state[key]:,}")
        if upload is not None:
            shape, name = _uploaded_shape(upload.getvalue()), upload.name
        else:
            shape, name = bundled_shape(model), model_profile(model).name
        g = gpu_profile(gpu)
        return Scenario(
            model_name=name, shape=shape, gpu_name=g.name, gpu_memory_bytes=g.memory_bytes, engine=engine,
            gpu_multiprocessors=g.multiprocessors, gpu_nvml_mib=g.nvml_memory_mib, gpu_architecture=g.architecture,
            k_cache_dtype=k_fmt, v_cache_dtype=v_fmt, tensor_parallel_size=int(tp), pipeline_parallel_size=int(pp),
            max_model_len=int(context), concurrency=int(concurrency),
            memory_fraction=fraction if ENGINES[engine].fraction_option else None, headroom=headroom,
            weights_dtype=weights_dtype, mtp_layers=int(mtp),
        )
    except KvsizeError as e:
        st.error(in_widget_terms(str(e)))
        return None


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


def page_plan(s: Scenario, e: Estimate | None, error: str | None) -> None:
    if e is None:
        st.error(error)
        return
    r = to_record(e)
    c = st.columns(4)
    c[0].metric("Max concurrency (requests)", f"{r['max_concurrency']:,}",
                help=f"requests of {r['max_model_len']:,} tokens")
    c[1].metric("Max context (tokens)", f"{r['max_context_at_concurrency']:,}", help=f"at {s.concurrency} requests")
    c[2].metric("KV bytes per token (bytes)", f"{r['kv_bytes_per_token']:,}", help="per GPU, metadata included")
    c[3].metric("Max tokens in cache (tokens)", f"{r['max_tokens']:,}", help="what the engine's startup log reports")
    (st.success if e.fits else st.error)(in_widget_terms(e.fit_message))
    for w in e.warnings:
        st.warning(in_widget_terms(w))
    fig = breakdown_figure(r)
    _chart(fig, "breakdown_chart")
    df = pd.DataFrame([{k: v for k, v in r.items() if k != "breakdown"} | r["breakdown"]])
    st.dataframe(df.T.rename(columns={0: "value"}).astype(str), key="plan_table")
    _downloads(df, fig, "plan")


def page_compare(s: Scenario) -> None:
    # The sidebar's concurrency and context, as on Plan: "fits" means the same on both pages.
    rows = compare(s, s.engine, FORMAT_NAMES)
    df = pd.DataFrame(rows)
    st.caption(f"Each format at {s.concurrency:,} requests of {s.max_model_len:,} tokens on {s.gpu_name}; formats "
               f"{s.engine} lacks are sized by the ideal engine and say so.")
    fig = go.Figure()
    for fits, name, color in ((True, "fits", "#54A24B"), (False, "does not fit or n/a", "#BAB0AC")):
        part = df[df["fits"] == fits]
        fig.add_bar(name=name, x=part["format"], y=part["max_concurrency"], marker_color=color,
                    customdata=part[["kv_bytes_per_token", "capacity_vs_bf16"]],
                    hovertemplate="%{x}: %{y:,} requests, %{customdata[0]:,} B/token, "
                                  "%{customdata[1]:.2f}× bf16's capacity<extra></extra>")
    fig.add_scatter(x=list(df["format"]), y=[s.concurrency] * len(df), mode="lines", name="your concurrency",
                    line=dict(dash="dot", color="black", width=1))
    fig.update_layout(yaxis_title=f"max concurrent requests of {s.max_model_len:,} tokens", xaxis_tickangle=-35,
                      title=f"Capacity by KV format: {s.model_name} on {s.gpu_name}, {s.engine}")
    _chart(fig, "compare_chart")
    st.dataframe(df[["format", "engine", "status", "max_concurrency", "capacity_vs_bf16", "kv_bytes_per_token",
                     "ratio_to_bf16", "max_tokens", "quality", "quality_source"]], key="compare_table", hide_index=True,
                 column_config={"ratio_to_bf16": st.column_config.NumberColumn("bytes vs bf16", format="%.3f×"),
                                "capacity_vs_bf16": st.column_config.NumberColumn("capacity vs bf16",
                                                                                  format="%.2f×")})
    _downloads(df, fig, "formats")


def page_curves(s: Scenario) -> None:
    contexts = [2**i for i in range(10, 18)] + [s.max_model_len]
    contexts = sorted(set(c for c in contexts if c <= max(s.shape.max_position_embeddings, s.max_model_len)))
    chosen = st.multiselect("Formats", FORMAT_NAMES, default=["bf16", "fp8_e4m3", "nvfp4", "kivi2"], key="curve_formats")
    fig = go.Figure()
    rows = []
    for fmt in chosen:
        own = s.engine in _engines_of(fmt)
        name = fmt if own else f"{fmt} (sized as ideal: {s.engine} has no {fmt})"
        try:
            figures = [f for _, f in estimate_lengths(
                s.evolve(engine=s.engine if own else "ideal", k_cache_dtype=fmt, v_cache_dtype=fmt, concurrency=1),
                contexts)]
            ys = [f.max_concurrency for f in figures]
        except KvsizeError:
            ys = [None] * len(contexts)
        rows += [dict(format=fmt, engine=s.engine if own else "ideal", context_tokens=ctx, max_concurrency=y)
                 for ctx, y in zip(contexts, ys)]
        fig.add_scatter(x=contexts, y=ys, name=name, mode="lines+markers",
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
                            "(formats it lacks sized by the ideal engine)")
    _chart(fig, "curves_chart")
    df = pd.DataFrame(rows)
    st.dataframe(df, hide_index=True, key="curves_table")
    _downloads(df, fig, "curves")


def _tokens_label(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else f"{n:,}"


def _engines_of(fmt: str) -> tuple[str, ...]:
    from sizing.formats import get_format

    return get_format(fmt).engines


REPORT_SCHEMA = "kvsize.measure/1"  # measure/run.py writes it; the app reads reports without importing torch


def report_points(data) -> pd.DataFrame:
    """Predicted vs measured points of a measurement report; KvsizeError names what is missing."""
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
                points.append(dict(kind="weights_bytes (measured)", point=where,
                                   predicted=c["predicted"]["weights_bytes"], measured=c["measured"]["weights_bytes"]))
                points.append(dict(kind="activation_bytes (measured)", point=where,
                                   predicted=c["predicted"]["activation_bytes"],
                                   measured=c["measured"]["activation_bytes"]))
                points.append(dict(kind="num_blocks (derived)", point=where, predicted=c["predicted"]["num_blocks"],
                                   measured=c["derived"]["num_blocks"]))
                continue
            for key in ("weights_bytes", "num_blocks", "activation_bytes", "non_torch_bytes"):
                points.append(dict(kind=key, point=c["model"], predicted=c["predicted"][key],
                                   measured=c["measured"][key]))
        for t in data.get("tensor_parallel", []):
            where = f"{t['model']} TP {t['tensor_parallel_size']} rank {t['rank']} {t['kv_cache_dtype']}"
            points.append(dict(kind="weights_bytes per rank (measured)", point=where,
                               predicted=t["predicted"]["weights_bytes"], measured=t["measured"]["weights_bytes"]))
            points.append(dict(kind="KV page per layer per rank (measured)", point=where,
                               predicted=t["predicted"]["kv_page_bytes_per_layer"],
                               measured=t["measured"]["kv_page_bytes_per_layer"]))
    except (KeyError, TypeError) as e:
        raise KvsizeError(f"measurement report point is missing field {e}") from None
    df = pd.DataFrame(points, columns=["kind", "point", "predicted", "measured"])
    df["error_%"] = 100 * (df["predicted"] - df["measured"]) / df["measured"].clip(lower=1)
    return df


@st.cache_data(show_spinner=False)
def _accuracy() -> pd.DataFrame:
    from dataclasses import asdict

    from sizing.starts import accuracy_rows

    return pd.DataFrame([asdict(r) for r in accuracy_rows()])


def real_engine_section() -> None:
    """kvsize against the real vLLM starts kept in tests/fixtures/vllm-starts (as docs/accuracy.md)."""
    st.subheader("Against the real vLLM")
    df = _accuracy()
    if df.empty:
        st.info("no real vLLM start is kept in this checkout")
        return
    within = ((df["kv_budget_error"].abs().fillna(0) < 0.01) & (df["kv_tokens_error"].abs().fillna(0) < 0.01)).sum()
    tokens = df["kv_tokens_error"].dropna()
    cols = st.columns(3)
    cols[0].metric("Predictions within 1% of vLLM", f"{within} of {len(df)}")
    cols[1].metric("Median |token error|", f"{100 * tokens.abs().median():.2f}%")
    cols[2].metric("Worst token error (signed)", f"{100 * tokens.loc[tokens.abs().idxmax()]:+.2f}%")
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
    real_engine_section()
    st.subheader("Measurement reports")
    reports = sorted((ROOT / "measure" / "reports").glob("*.json"))
    names = [p.name for p in reports]
    choice = st.selectbox("Bundled report", names, key="report_choice") if names else None
    upload = st.file_uploader("…or upload a report", type=["json"], key="report_upload", max_upload_size=64)
    if upload is None and choice is None:
        st.info("no measurement report bundled; upload one written by `kvsize measure`")
        return
    try:
        raw = upload.getvalue() if upload is not None else (ROOT / "measure" / "reports" / choice).read_bytes()
        data = json.loads(raw)
        df = report_points(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        st.error(f"measurement report: not valid JSON ({e})")
        return
    except KvsizeError as e:
        st.error(str(e))
        return
    from measure.validate import POINT_SECTIONS, checked

    try:
        problems = checked(data, None)
    except KvsizeError as e:
        problems = [str(e)]
    count = sum(len(data.get(k, [])) for k in POINT_SECTIONS)
    gpu = data.get("device", {}).get("name", "?")
    if problems:
        st.error(f"{len(problems)} of the checks fail on this report ({gpu}): " + "; ".join(problems[:3]))
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
        st.error(f"measurement report decode points need fields {sorted(needed)}; found {sorted(df.columns)}")
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


def _fmt_bytes(x) -> str:
    """An exact per-token byte count: integer where it is one, else the fraction (e.g. 17/32 of q8_0)."""
    return f"{x.numerator:,}" if x.denominator == 1 else f"{float(x):,.4f} ({x.numerator}/{x.denominator})"


def page_formulas(s: Scenario, e: Estimate | None, error: str | None) -> None:
    if e is None:
        st.error(error)
        return
    r, b = to_record(e), e.breakdown
    groups = layer_groups(e.layout, e.max_model_len) if e.layout is not None else []
    terms = " + ".join(f"{g.layers} × {_fmt_bytes(g.payload_bytes_per_token + g.metadata_bytes_per_token)}"
                       for g in groups) or "0"
    st.markdown(f"""
**KV bytes per token** = Σ over the {e.kv_layers} KV layers on this GPU of (K + V bytes per token of the layer),
each layer = heads × (K + V payload and metadata per head per token) = {terms}
= **{r['kv_bytes_per_token']:,} B** (payload {r['kv_payload_bytes_per_token']:,} B + metadata
{r['kv_metadata_bytes_per_token']:,} B; rounded up to whole bytes). Windowed layers count per token only up to
their window; the per-sequence column holds that.
""")
    if groups:
        st.dataframe(pd.DataFrame([dict(
            layers=g.layers, kind=g.kind, window=g.window, kv_heads=g.heads, head_dim=g.head_dim,
            k_format=g.k_format, v_format=g.v_format or "(MLA latent: no V)",
            payload_bytes_per_token=_fmt_bytes(g.payload_bytes_per_token),
            metadata_bytes_per_token=_fmt_bytes(g.metadata_bytes_per_token),
            bytes_per_sequence=g.sequence_bytes) for g in groups]), key="formula_layers")
        _downloads(pd.DataFrame([{k: v for k, v in r.items() if k != "breakdown"} | r["breakdown"]]), None,
                   "formulas")
    st.markdown(f"""
**KV budget** ({e.engine.name}) = {e.budget_formula}
= {b.total_bytes:,} total → **{e.kv_budget_bytes:,} B** ({e.kv_budget_bytes / GiB:.2f} GiB)
with weights {b.weights_bytes:,} B, activation {b.activation_bytes:,} B, non-torch {b.non_torch_bytes:,} B,
CUDA graphs {b.cuda_graph_bytes:,} B.

**Blocks** = ⌊(budget − per-layer tensors) / block bytes⌋ = ⌊({e.kv_budget_bytes:,} − {e.kv_layer_fixed_bytes:,}) / {e.block_bytes:,}⌋ = **{e.num_blocks:,}**
of {e.block_size} tokens → **{e.max_tokens:,} tokens** in cache.

**Per request** at {e.max_model_len:,} tokens: {e.kv_reserved_bytes_per_sequence:,} B reserved by the engine
({e.kv_bytes_per_sequence:,} B exact) → **max concurrency {e.max_concurrency:,}** ({e.max_concurrency_ratio:.2f}×).
""")


DEFAULT_BUCKETS = [
    {"max_context_tokens": 8192, "share_percent": 55.0, "output_tokens": 512},
    {"max_context_tokens": 16384, "share_percent": 25.0, "output_tokens": 512},
    {"max_context_tokens": 32768, "share_percent": 15.0, "output_tokens": 1024},
    {"max_context_tokens": 131072, "share_percent": 5.0, "output_tokens": 1024},
]


def read_workload_widgets():
    """The workload from an uploaded file, else from the table editor; errors via st.error."""
    from sizing.workload import parse_workload, parse_workload_text

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
    from sizing.fleet import (HOURS_PER_MONTH, bucket_rows, build_candidates, candidate_rows, cost_rows, plan_fleet,
                              plan_serve_command, plan_summary, unconfirmed_pairs, unsupported_pairs)
    from sizing.guidance import evaluate_rules, quality_notes

    st.caption(f"{s.model_name} on {s.engine}; the sidebar's engine settings apply. KV is charged at each bucket's "
               "longest request; speed at the peak batch per replica (docs/formulas.md, 'Fleet' and 'Speed').")
    try:
        workload = read_workload_widgets()
    except KvsizeError as e:
        st.error(str(e))
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
        st.error("choose at least one GPU, one KV format and one TP size")
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
        st.error(str(e))
        return
    for gpu, fmt, why in unsupported_pairs(gpus, formats, s.engine):
        st.info(f"{fmt} left out on {gpu}: {why}")
    unconfirmed = unconfirmed_pairs(gpus, formats, s.engine)
    if unconfirmed:
        st.caption("No engine source confirms " + ", ".join(f"{f} on {g}" for g, f in unconfirmed) + ".")
    rows = candidate_rows(plan)
    best = plan.cheapest
    if best is None:
        st.error("no candidate fits: try a larger TP, a GPU with more memory, or a smaller KV format")
    else:
        b = best.candidate
        m = st.columns([3, 3, 2, 3, 3])
        m[0].metric("Cheapest fleet", f"{best.gpus} × {b.gpu.id}", help=best.reason)
        m[1].metric("KV format", b.kv_format)
        m[2].metric("TP", f"{b.tensor_parallel_size}")
        m[3].metric("Fleet cost", f"${best.usd_per_hour:,.2f}/h",
                    help=f"${b.gpu.usd_per_hour:g} per GPU-hour ({b.gpu.price_source}); "
                         f"${best.usd_per_hour * HOURS_PER_MONTH:,.0f} a month of {HOURS_PER_MONTH} h")
        m[4].metric("Cost per million output tokens", f"${best.usd_per_million_output_tokens:,.3f}",
                    help=f"ITL {best.itl_seconds * 1000:.1f} ms at {best.decode_batch:.0f} requests per replica")
        st.caption(f"${best.usd_per_hour * HOURS_PER_MONTH:,.0f} a month ({HOURS_PER_MONTH} h) · {best.reason}")
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
    serve = None
    if best is not None:
        uploaded = st.session_state.get("upload") is not None
        # An upload names no checkpoint: the command says where the user's own goes.
        serve = plan_serve_command(plan, s, best,
                                   UPLOADED_MODEL if uploaded else model_profile(st.session_state["model"]).hf_id)
    fired = [r.explanation for r in evaluate_rules(workload) if r.fires]
    st.download_button("Whole plan (XLSX: summary, candidates, pools, cost)",
                       lambda: xlsx_bytes({"summary": plan_summary(plan, serve.command if serve else None, fired),
                                           "candidates": rows, "pools": pools, "cost": costs}),
                       "fleet-plan.xlsx", key="fleet_plan_xlsx")
    if best is not None:
        _itl_chart(plan, s, best, formats)
        st.subheader("Serve the cheapest plan")
        if serve.command:
            st.code(serve.command, language="bash", wrap_lines=True)
        st.caption(serve.note)
        if uploaded:
            st.caption(f"{UPLOADED_MODEL}: the folder holding the uploaded config.json and its weights, or its "
                       "Hugging Face id.")
        st.subheader("Pools of the cheapest candidate")
        st.dataframe(pd.DataFrame([r for r in pools if r["gpu"] == b.gpu.id and r["kv_format"] == b.kv_format
                                   and r["tensor_parallel_size"] == b.tensor_parallel_size]), key="fleet_pools")
    page_designs(s, workload, gpus, formats, tps, prices, plan)
    st.subheader("Guidance")
    for r in evaluate_rules(workload):
        (st.success if r.fires else st.info)(r.explanation)
    st.subheader("Quality notes")
    st.dataframe(pd.DataFrame([n.__dict__ for n in quality_notes(formats, s.shape.serving_dtype)]),
                 key="fleet_quality")
    st.caption(f"Efficiency: {plan.efficiency.source}")


def page_designs(s: Scenario, workload, gpus: list[str], formats: list[str], tps: list[int], prices: dict,
                 plan) -> None:
    """Aggregated and disaggregated designs against TTFT and ITL targets, and their frontier."""
    from app.spreadsheet import xlsx_bytes
    from sizing.fleet import build_candidates
    from sizing.profiles import link_ids
    from sizing.slo import Targets, TierOption, cheapest, design_row, frontier, pd_link, ranked, search_designs

    st.subheader("Latency targets: aggregated or disaggregated")
    c = st.columns(3)
    ttft = c[0].number_input("TTFT target (ms, 0 = none)", 0.0, 600_000.0,
                             float(workload.ttft_target_ms or 0.0), 100.0, key="ttft_target",
                             help="mean time to first token at the peak; with a target, designs are searched")
    links = ["none", *link_ids()]
    link_choice = c[1].selectbox("P/D link", links, index=links.index("nvlink4-peer"), key="pd_link",
                             help="what a disaggregated design ships each request's KV over (kvsize links)")
    host_gib = c[2].number_input("Host memory tier per replica (GiB, 0 = none)", 0, 1 << 20, 0, 64, key="host_tier_gib",
                                 help="prefixes the workload's sessions find there are reloaded, not prefilled")
    if not ttft and not workload.itl_target_ms:
        st.caption("Give a TTFT or ITL target to compare aggregated with disaggregated designs.")
        return
    targets = Targets(ttft / 1000 if ttft else None, workload.itl_target_ms / 1000 if workload.itl_target_ms else None)
    tiers = TierOption({"host": host_gib * GiB}, {"host": "pcie5-x16"}) if host_gib else None
    try:
        link, shared, same_host = pd_link(link_choice, "P/D link")
        designs = search_designs(replace(s, pipeline_parallel_size=1),
                                 build_candidates(gpus, formats, tps, prices, engine=s.engine), workload,
                                 plan.efficiency, targets, link, shared, same_host=same_host, tiers=tiers)
    except KvsizeError as e:
        st.error(in_widget_terms(str(e)))
        return
    best = cheapest(designs)
    agg = cheapest([d for d in designs if d.kind == "aggregated"])
    dis = cheapest([d for d in designs if d.kind == "disaggregated"])
    m = st.columns(3)
    for col, name, d in ((m[0], "Cheapest aggregated", agg), (m[1], "Cheapest disaggregated", dis)):
        col.metric(name, f"{d.gpus} GPUs, ${d.usd_per_hour:,.2f}/h" if d else "none meets the targets",
                   help=(f"{d.layout}; TTFT {d.ttft_seconds * 1e3:,.0f} ms, ITL {d.itl_seconds * 1e3:.1f} ms; "
                         f"{d.reason}") if d else None)
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
    from sizing.memory import resolve_weights_dtype
    from sizing.speed import decode_step

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


def page_tiers(s: Scenario) -> None:
    """KV tiers below HBM for the sidebar's replica: what each holds, reload against recompute, and
    the prefix hits a workload's sessions find (sizing/tiers.py)."""
    from sizing.profiles import link_ids
    from sizing.tiers import engine_offload_options, tiers_for
    from sizing.workload import parse_workload_text, read_workload

    st.caption(f"{s.model_name} on {s.gpu_name}, {s.engine}, TP {s.tensor_parallel_size}: tiers are per replica; "
               "reuse comes from the workload's sessions (docs/formulas.md, 'Tiers below HBM').")
    upload = st.file_uploader("Workload with sessions (.yaml/.json); default: examples/multi-turn-chat.yaml",
                              type=["yaml", "yml", "json"], key="tiers_workload", max_upload_size=1)
    try:
        workload = (parse_workload_text(upload.getvalue(), upload.name) if upload is not None
                    else read_workload(str(ROOT / "examples" / "multi-turn-chat.yaml")))
    except KvsizeError as e:
        st.error(str(e))
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
        st.error(in_widget_terms(str(err)))
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


COST_CHART_BARS = 15  # more bars than this cannot be read; the table holds every candidate
PAGES = ["Plan", "Compare formats", "Capacity curves", "Fleet", "Tiers", "Validation", "Formulas"]


def main() -> None:
    st.set_page_config(page_title="kvsize", layout="wide")
    st.title("kvsize — KV cache capacity planner")
    scenario = read_scenario()
    # Only the open tab runs (lazy tabs); its name is in the page URL (?page=Fleet), so a link opens it.
    tabs = dict(zip(PAGES, st.tabs(PAGES, key="page", on_change="rerun", bind="query-params")))
    if tabs["Validation"].open:
        with tabs["Validation"]:
            page_validation()
    if scenario is None:
        return
    if tabs["Plan"].open or tabs["Formulas"].open:
        result, error = _estimate(scenario)
        if tabs["Plan"].open:
            with tabs["Plan"]:
                page_plan(scenario, result, error)
        else:
            with tabs["Formulas"]:
                page_formulas(scenario, result, error)
    for name, page in (("Compare formats", page_compare), ("Capacity curves", page_curves), ("Fleet", page_fleet),
                       ("Tiers", page_tiers)):
        if tabs[name].open:
            with tabs[name]:
                page(scenario)


main()

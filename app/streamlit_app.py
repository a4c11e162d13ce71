"""kvsize web app: read widgets, call sizing, draw. Run: streamlit run app/streamlit_app.py

This file is the entry point: the sidebar's scenario and the tabs. Each tab's page is a module of
app/views/; what pages share is in app/ui.py."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import streamlit as st  # noqa: E402

from app.ui import (LIMITS, SAME_AS_K, _estimate, _gpu_choices, _gpu_label, _index, _model_choices, _query,  # noqa: E402
                    _uploaded_shape, in_widget_terms, markdown_text, matching_release, show_error)  # noqa: E402
from app.views.compare import page_compare  # noqa: E402
from app.views.curves import page_curves  # noqa: E402
from app.views.fleet import page_fleet  # noqa: E402
from app.views.formulas import page_formulas  # noqa: E402
from app.views.plan import page_plan  # noqa: E402
from app.views.tiers import page_tiers  # noqa: E402
from app.views.validation import page_validation  # noqa: E402
from sizing.engines import ENGINES, get_engine  # noqa: E402
from sizing.errors import KvsizeError  # noqa: E402
from sizing.cache.formats import FORMAT_NAMES  # noqa: E402
from sizing.engines.memory import WEIGHT_FORMATS  # noqa: E402
from sizing.capacity.scenario import Scenario  # noqa: E402
from sizing.profiles import bundled_shape, gpu_profile, model_profile  # noqa: E402
from sizing.config import MAX_CONFIG_BYTES  # noqa: E402


NEWEST_STARTED = "newest started"


def release_choices(engine: str) -> list[str]:
    """The releases a planner can pick for an engine kvsize keeps starts of: the default (its newest started
    release) and every published release; other engines follow their one release file."""
    from sizing.engines.started import published

    versions = list(published(engine))
    return [NEWEST_STARTED, *reversed(versions)] if versions else [NEWEST_STARTED]


def release_label(engine: str, version: str) -> str:
    from sizing.engines.started import newest_started, started

    if version == NEWEST_STARTED:
        return f"newest started ({newest_started(engine)})"
    return f"{version} (started)" if version in started(engine) else f"{version} (never started)"


def _release_query(engine: str, releases: list[str]) -> str:
    """The release the page URL names, as a choice: the CLI's spellings (0.31 for 0.31.0) are accepted; a release
    named for another engine (the engine changed since the link was written) gives way to the default."""
    ss = st.session_state
    written_for = ss.get("release_engine")
    ss["release_engine"] = engine
    if written_for is not None and written_for != engine:
        return NEWEST_STARTED
    value = _query("release", NEWEST_STARTED)
    return matching_release(value, releases)


def _is_number(text) -> bool:
    try:
        float(text)
    except (TypeError, ValueError, OverflowError):
        return False
    return True


def _mark_fraction_set() -> None:
    st.session_state["fraction_set"] = True


def _fraction_slider(sb, engine_spec: str) -> float | None:
    """The memory fraction the user set, or None: untouched, the engine's own rule applies (the CLI's rule
    without --gpu-memory-utilization or --mem-fraction-static). Switching engine moves an untouched slider to
    the new engine's default."""
    ss = st.session_state
    default = get_engine(engine_spec).memory_fraction_default or 0.9
    if "fraction" not in ss:  # the first run: a fraction in the page URL was set by whoever wrote the link
        written = st.query_params.get("util")
        value = _query("util", default, float, 0.05, 1.0)  # one out of range is named in a banner
        ss["fraction_set"] = written is not None and str(value) == str(float(written)) if _is_number(written) else False
        ss["fraction"] = value
    elif not ss.get("fraction_set") and ss.get("fraction_engine") != engine_spec:
        ss["fraction"] = default
    ss["fraction_engine"] = engine_spec
    # from 0.05: a shared GPU or a small test server (kvsize watch's example runs at 0.16)
    fraction = sb.slider("Engine memory fraction (vLLM gpu_memory_utilization, …)", 0.05, 1.0, step=0.01,
                         key="fraction", on_change=_mark_fraction_set,
                         help="untouched: the engine release's own default for this scenario, as the CLI uses")
    return fraction if ss.get("fraction_set") else None


def read_scenario() -> Scenario | None:
    """The sidebar widgets as a Scenario; errors are shown with st.error."""
    models, gpus = _model_choices(), _gpu_choices()
    sb = st.sidebar
    sb.header("Scenario")
    model = sb.selectbox("Model", models, index=_index(models, _query("model", "llama-3.1-8b"), "llama-3.1-8b"), key="model")
    upload = sb.file_uploader(f"…or upload a config.json (≤ {MAX_CONFIG_BYTES // 2**20} MiB)", type=["json"],
                              key="upload", max_upload_size=MAX_CONFIG_BYTES // 2**20)
    if upload is not None:
        sb.caption("An uploaded config is not part of the page link: send the file with the link.")
    gpu = sb.selectbox("GPU", gpus, index=_index(gpus, _query("gpu", "h100-sxm"), "h100-sxm"), key="gpu", format_func=_gpu_label)
    engines = list(ENGINES)
    engine = sb.selectbox("Engine", engines, index=_index(engines, _query("engine", "vllm"), "vllm"), key="engine")
    releases = release_choices(engine)
    release = NEWEST_STARTED
    if len(releases) > 1:
        release = sb.selectbox("Engine release", releases, index=_index(releases, _release_query(engine, releases), NEWEST_STARTED),
                               key="engine_release", format_func=lambda v: release_label(engine, v),
                               help="the release whose rules apply; started releases were held to real starts")
    engine_spec = engine if release == NEWEST_STARTED else f"{engine}@{release}"
    formats = ["auto", *FORMAT_NAMES]
    k_fmt = sb.selectbox("K cache format", formats, index=_index(formats, _query("k", "auto"), "auto"), key="k_format")
    v_choices = [SAME_AS_K, *formats]
    v_fmt = sb.selectbox("V cache format", v_choices, index=_index(v_choices, _query("v", SAME_AS_K), SAME_AS_K), key="v_format")
    if v_fmt == SAME_AS_K:
        v_fmt = k_fmt
    if engine == "llamacpp":  # llama.cpp sizes the GGUF's tensors: the types convert and llama-quantize write
        from sizing.engines.llamacpp_quant import CONVERT_TYPES, QUANTIZE_PRESETS

        weights = ["auto", *CONVERT_TYPES, *QUANTIZE_PRESETS]
        weights_help = "auto: the GGUF convert_hf_to_gguf.py writes (bf16, or f16 for a float16 checkpoint)"
    else:
        weights = ["auto", *WEIGHT_FORMATS]
        weights_help = "auto: the checkpoint's quantization, else its dtype"
    weights_dtype = sb.selectbox("Weights dtype", weights, index=_index(weights, _query("w", "auto"), "auto"),
                                 key="weights_dtype", help=weights_help)
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
    fraction = _fraction_slider(sb, engine_spec)
    fraction_caption = sb.empty()
    headroom = sb.slider("Headroom (engines without their own fraction)", 0.0, 0.5,
                         _query("headroom", 0.10, float, 0.0, 0.5), 0.01, key="headroom")
    text_only = sb.checkbox("Served text-only (vLLM --language-model-only)", value=_query("textonly", "0") == "1",
                            key="language_model_only",
                            help="a multimodal model without its vision tower: vLLM builds none when every "
                                 "modality's limit is 0")
    compile_cache = sb.radio("vLLM compile cache", ["cold", "warm"], horizontal=True, key="compile_cache",
                             index=1 if _query("cc", "cold") == "warm" else 0,
                             help="cold: a first start compiles during profiling and holds a copy of the embedding "
                                  "for autotuning; warm: a restart loads the compiled graph and gets that as KV")
    st.query_params.update(model=model, gpu=gpu, engine=engine, release=release, k=k_fmt, v=st.session_state["v_format"], w=weights_dtype,
                           tp=str(tp), pp=str(pp),
                           ctx=str(context), conc=str(concurrency), headroom=str(headroom),
                           textonly="1" if text_only else "0", cc=compile_cache)
    if fraction is not None:  # a fraction the user set travels with the link; an untouched one follows the engine
        st.query_params["util"] = str(fraction)
    elif "util" in st.query_params:
        del st.query_params["util"]
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
        scenario = Scenario(
            model_name=name, shape=shape, gpu_name=g.name, gpu_memory_bytes=g.memory_bytes, engine=engine_spec,
            gpu_multiprocessors=g.multiprocessors, gpu_nvml_mib=g.nvml_memory_mib, gpu_architecture=g.architecture,
            k_cache_dtype=k_fmt, v_cache_dtype=v_fmt, tensor_parallel_size=int(tp), pipeline_parallel_size=int(pp),
            max_model_len=int(context), concurrency=int(concurrency),
            memory_fraction=fraction if ENGINES[engine].fraction_option else None, headroom=headroom,
            weights_dtype=weights_dtype, mtp_layers=int(mtp), language_model_only=bool(text_only),
            compile_cache_hit=compile_cache == "warm",
        )
        if fraction is None and ENGINES[engine].fraction_option:
            from sizing.capacity.budget import chosen_fraction

            fraction_caption.caption(f"Not set: {engine} picks its own fraction, as the CLI does without "
                                     f"{ENGINES[engine].fraction_option}: {chosen_fraction(scenario, get_engine(engine_spec)):g} here")
        return scenario
    except KvsizeError as e:
        show_error(in_widget_terms(str(e)))
        return None


PAGES = ["Plan", "Compare formats", "Capacity curves", "Fleet", "Tiers", "Validation", "Formulas"]


def main() -> None:
    st.set_page_config(page_title="kvsize", layout="wide")
    st.title("kvsize — KV cache capacity planner")
    scenario = read_scenario()
    # Only the open tab runs (lazy tabs); its name is in the page URL (?page=Fleet), so a link opens it.
    asked = st.query_params.get("page")
    if asked is not None and asked not in PAGES:
        st.warning(f"page '{markdown_text(str(asked)[:40])}' from the page URL is not one of the pages "
                   f"({', '.join(PAGES)}); "
                   f"showing {PAGES[0]}")
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

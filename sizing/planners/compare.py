"""Compare formats: one scenario sized in every KV format, and the format to serve (the most requests among
the near-lossless formats the engine runs on the GPU), as `kvsize compare` and the app's Compare page show it."""

from __future__ import annotations

from dataclasses import replace

from ..capacity.scenario import Scenario

from ..capacity.estimate import estimate
from ..cache.formats import FORMAT_NAMES, get_format
from ..engines import get_engine
from ..engines.support import Support, runs_on
from ..errors import KvsizeError
from ..profiles import gpu_profile, matching_gpus
from .guidance import NEAR_LOSSLESS_FORMATS


# A row sized by the ideal engine because the chosen one has no such format: its figures are the bytes,
# not a plan the chosen engine can serve.
NOT_THIS_ENGINE = "not this engine"


def gpu_id(base: Scenario) -> str | None:
    """The bundled GPU profile the scenario's GPU is (h100-sxm), or None for a GPU of the user's own."""
    found = matching_gpus(name=base.gpu_name)
    return found[0] if found else None


def runs_here(engine_name: str, fmt, base: Scenario) -> Support:
    """Whether the engine runs the format (a KVFormat) on the scenario's GPU (profiles/support.json, the GPU's
    hardware)."""
    found = gpu_id(base)
    if found is None:
        return Support("unconfirmed", f"{base.gpu_name} is not a bundled GPU: no support table row applies")
    return runs_on(engine_name, fmt, gpu_profile(found))


def scenario_runs_here(s: Scenario) -> Support:
    """Whether the scenario's engine runs its K and V formats on its GPU: the first "unsupported" verdict of
    the two (its source a sentence naming engine, format and GPU), else the first "unconfirmed", else
    supported. What the Plan page checks before it says "fits"."""
    eng = get_engine(s.engine)
    verdicts = {}
    for name in dict.fromkeys((s.k_cache_dtype, s.v_cache_dtype)):
        fmt = get_format(name, s.shape.serving_dtype, s.format_options)
        verdicts[fmt.name] = runs_here(eng.name, fmt, s)
    for name, v in verdicts.items():
        if v.status == "unsupported":
            said = f"{eng.name} does not run {name} "
            return v if v.source.startswith(said) else \
                Support("unsupported", f"{said}KV on {gpu_id(s) or s.gpu_name}: {v.source}")
    return next((v for v in verdicts.values() if v.status == "unconfirmed"), next(iter(verdicts.values())))


def recommended_format(rows: list[dict], engine: str, model_dtype: str | None = None) -> dict | None:
    """The format to serve: among those the engine runs on this GPU (supported) that fit, with published
    accuracy near-lossless or better (guidance.NEAR_LOSSLESS_FORMATS), the one holding the most concurrent
    requests, then the most bytes a token: a smaller format that holds no more requests (a cap the KV cache does
    not set, such as SGLang's Mamba state slots) only costs accuracy; then the model's own dtype. Smaller formats
    stay in the table for the planner's own trial."""
    candidates = [r for r in rows if r["engine"] == engine and r.get("runs") == "supported" and r["fits"]
                  and r["format"] in NEAR_LOSSLESS_FORMATS]
    if not candidates:
        return None
    return max(candidates, key=lambda r: (r["max_concurrency"], r["kv_bytes_per_token"], r["format"] == model_dtype))


def recommend(base: Scenario, engine: str) -> dict | None:
    """recommended_format over the near-lossless formats the engine stores (what `kvsize compare` would name),
    sized for the scenario as given; None where none runs on this GPU and fits."""
    eng = get_engine(engine)
    names = [n for n in FORMAT_NAMES
             if n in NEAR_LOSSLESS_FORMATS and eng.name in get_format(n, base.shape.serving_dtype).engines]
    best = recommended_format(compare(base, engine, names), eng.name, base.shape.serving_dtype)
    return None if best is None else {"format": best["format"], "max_concurrency": best["max_concurrency"],
                                      "kv_bytes_per_token": best["kv_bytes_per_token"]}


def compare(base: Scenario, engine: str, format_names) -> list[dict]:
    """Every format for one scenario, one row each; formats the engine cannot store are sized
    with the `ideal` engine and say so: runs "not this engine", status "not run by <engine>: …"."""
    rows = []
    eng = get_engine(engine)
    for name in format_names:
        fmt = get_format(name, base.shape.serving_dtype, base.format_options)
        # the release asked for (vllm@0.33) sizes the row, not the engine's default release
        use = eng.name if eng.name in fmt.engines else "ideal"
        scenario = replace(base, engine=engine.strip() if use == eng.name else use, k_cache_dtype=fmt.name,
                           v_cache_dtype=fmt.name, block_size=base.block_size if use == eng.name else None)
        try:
            e = estimate(scenario)
        except KvsizeError as err:
            rows.append(dict(format=fmt.name, engine=use, status=f"n/a: {err}", runs="n/a", kv_bytes_per_token=0,
                             kv_payload_bytes_per_token=0, kv_metadata_bytes_per_token=0, ratio_to_bf16=0.0,
                             capacity_vs_bf16=0.0, max_tokens=0, max_concurrency=0, max_context_at_concurrency=0, fits=False,
                             summary=fmt.summary, quality=fmt.quality, quality_source=fmt.quality_source,
                             layout_source=fmt.source, layout_confirmed=not fmt.unconfirmed))
            continue
        status = "fits" if e.fits else "does not fit"
        if use != eng.name:
            # the ideal engine's bytes, kept for scale and labelled: never a green "fits", never the recommendation
            runs = NOT_THIS_ENGINE
            status = f"not run by {eng.name}: it has no {fmt.name} (sized as ideal: {status})"
        else:
            verdict = runs_here(use, fmt, base)
            runs = verdict.status
            if runs == "unsupported":
                # the bytes fit, but the engine does not run this format on this GPU: never a green "fits"
                status = f"does not run here: {verdict.source}"
            elif runs == "unconfirmed" and e.fits:
                status = "fits (unconfirmed on this GPU)"
            if e.state_pool is not None and e.max_concurrency == e.state_pool.max_requests and runs != "unsupported":
                status += f"; {e.max_concurrency:,} requests at most: the engine's state slots, not the KV cache"
        rows.append(dict(
            format=fmt.name, engine=use, status=status, runs=runs, kv_bytes_per_token=e.kv_bytes_per_token,
            kv_payload_bytes_per_token=e.kv_payload_bytes_per_token,
            kv_metadata_bytes_per_token=e.kv_metadata_bytes_per_token, ratio_to_bf16=0.0,
            capacity_vs_bf16=0.0, max_tokens=e.max_tokens, max_concurrency=e.max_concurrency,
            max_context_at_concurrency=e.max_context_at_concurrency, fits=e.fits,
            summary=fmt.summary, quality=fmt.quality, quality_source=fmt.quality_source, layout_source=fmt.source,
            layout_confirmed=not fmt.unconfirmed,
        ))
    bf16 = next((r for r in rows if r["format"] == "bf16" and r["kv_bytes_per_token"]), None)
    best = recommended_format(rows, eng.name, base.shape.serving_dtype)
    for r in rows:
        r["recommended"] = best is not None and r["format"] == best["format"]
        # Bytes ratio is per token; the capacity multiplier counts tokens the pool holds, so it
        # includes block rounding and any change of engine for formats the chosen one lacks.
        r["ratio_to_bf16"] = r["kv_bytes_per_token"] / bf16["kv_bytes_per_token"] if bf16 else 0.0
        r["capacity_vs_bf16"] = r["max_tokens"] / bf16["max_tokens"] if bf16 and bf16["max_tokens"] else 0.0
    return rows

"""Decode kernels on a GPU: check every format against fp32, time it, and derive the
bandwidth efficiency that sizing's inter-token model uses (benchmarks/bench_decode.py runs it).

Per point: bytes read (every stored byte of the pages the batch reads, payload and metadata),
kernel time (median of CUDA-graph replays, L2 flushed between runs, CUDA events through
triton.testing.do_bench; baselines are timed the same way),
achieved GB/s, its share of the measured copy bandwidth, the kernel's error against fp32
attention over the same dequantized cache (kernel_rel_error) and against fp32 attention over
the unquantized keys and values (attention_rel_error, the format's own loss).
"""

from __future__ import annotations

import math
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from types import MappingProxyType

import torch
import triton

from sizing.efficiency import DEFAULT_KV_EFFICIENCY, DEFAULT_WEIGHTS_EFFICIENCY, KERNEL_TIME_TERMS, DecodeEfficiency
from sizing.planners.speed import attention_seconds

from .kernels import compile_decode, paged_decode
from .paged_cache import (FORMATS, KIVI, KIVI_RESIDUAL, add_kivi_residual, kernel_tolerance, pack,
                          reference_decode, relative_error)
from .quant import ERROR_BOUNDS, realistic_kv


def _bench(fn, rep_ms: int = 60) -> float:
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=10, rep=rep_ms, return_mode="median"))


def _bench_graph(fn, rep_ms: int = 60) -> float:
    """GPU time of `fn` replayed from a CUDA graph, as engines replay decode: the Python launch
    path (tens of microseconds, and host-dependent) is left out."""
    fn()  # compile and warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return _bench(graph.replay, rep_ms)


def copy_bandwidth_gb_s(gib: int = 2) -> float:
    """Device-to-device copy: bytes read plus bytes written per second (decimal GB/s)."""
    n = gib * 2**30
    src = torch.empty(n, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = _bench(lambda: dst.copy_(src), rep_ms=200)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * n / (ms / 1e3) / 1e9


def build_case(fmt: str, batch: int, context: int, kv_heads: int, head_dim: int, block_size: int, seed: int,
               mla_v_dim: int | None = None):
    """A fresh cache holding exactly the pages a batch of `context`-token sequences reads."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    kivi = FORMATS[fmt].kind == KIVI
    paged_tokens = context
    if kivi:  # KIVI: whole groups quantized, the rest (at least KIVI_RESIDUAL) kept in fp16
        paged_tokens = max(0, (context - KIVI_RESIDUAL) // block_size * block_size)
    pages_per_seq = max(1, math.ceil(paged_tokens / block_size))
    nb = batch * pages_per_seq
    k, v = realistic_kv(nb * block_size, kv_heads, head_dim, g, "cuda")
    if mla_v_dim is not None:
        cache = pack(fmt, k, None, block_size, v_dim=mla_v_dim)
    else:
        cache = pack(fmt, k, v, block_size)
    raw_k, raw_v = k, (v if mla_v_dim is None else None)
    if kivi:
        rest = context - paged_tokens
        rk, rv = realistic_kv(batch * rest, kv_heads, head_dim, g, "cuda")
        add_kivi_residual(cache, rk.reshape(batch, rest, kv_heads, head_dim),
                          rv.reshape(batch, rest, kv_heads, head_dim),
                          torch.full((batch,), paged_tokens, dtype=torch.int32, device="cuda"))
    table = torch.randperm(nb, generator=g, device="cuda").reshape(batch, pages_per_seq).to(torch.int32)
    lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    return cache, table, lens, raw_k, raw_v


def bytes_read(cache, batch: int, context: int, window: int | None) -> int:
    """Stored bytes the kernel reads: every page of the cache (it holds exactly the batch's pages)
    less per-tensor scalars; with a window, only the pages the window touches."""
    total = cache.nbytes()
    if window and window < context:
        per_seq_pages = math.ceil(context / cache.block_size)
        touched = min(per_seq_pages, math.ceil(window / cache.block_size) + 1)
        total = total * touched // per_seq_pages
    return int(total)


def unquantized_reference(q, cache, table, lens, raw_k, raw_v, window):
    """fp32 attention over the original keys and values laid out like the cache."""
    from .paged_cache import PagedCache, PagedSide

    def side(raw):  # stored head-major, like every layout
        return PagedSide(raw.reshape(-1, cache.block_size, cache.heads, raw.shape[-1]).transpose(1, 2).float())

    plain = PagedCache(FORMATS["bf16"], cache.block_size, cache.heads, cache.head_dim, cache.v_dim, side(raw_k),
                       None if raw_v is None else side(raw_v))
    plain.residual_k, plain.residual_v, plain.quantized_lens = cache.residual_k, cache.residual_v, cache.quantized_lens
    return reference_decode(q, plain, table, lens, window)


def tune(fmt: str, kv_heads: int, head_dim: int, q_heads: int, block_size: int, configs, batch=16, context=16384):
    """The fastest launch configuration (tile, warps, stages, registers, options) for a format at
    a long-context point, among those whose output is within their tolerance of fp32."""
    cache, table, lens, _, _ = build_case(fmt, batch, context, kv_heads, head_dim, block_size, seed=1)
    q = torch.randn(batch, q_heads, head_dim, device="cuda")
    ref = reference_decode(q, cache, table, lens)
    best, timings = None, {}
    # Compiling dominates the search: every option compiles side by side first (one thread per
    # core); one that fails to compile fails again below, where its error is recorded.
    with triton.AsyncCompileMode(ThreadPoolExecutor(os.cpu_count() or 1), ignore_errors=True):
        for config in configs:
            try:
                compile_decode(q, cache, table, lens, **config)
            except Exception:
                pass
    for config in configs:
        key = "/".join(f"{k}={v}" for k, v in config.items())
        try:
            error = relative_error(paged_decode(q, cache, table, lens, max_context=context, **config), ref)
            ms = _bench_graph(lambda: paged_decode(q, cache, table, lens, max_context=context, **config), rep_ms=40)
        except Exception as e:  # a config that does not compile (registers, shared memory) is skipped
            timings[key] = f"failed: {type(e).__name__}: {str(e).strip().splitlines()[-1][:300] if str(e).strip() else ''}"
            continue
        if not error <= kernel_tolerance(config):  # never pick a fast wrong answer
            timings[key] = f"failed: kernel error {error:.2e} against fp32 over the same cache"
            continue
        timings[key] = ms
        if best is None or ms < best[0]:
            best = (ms, dict(config))
    del cache
    torch.cuda.empty_cache()
    return best[1], timings


def run_point(fmt: str, batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int, block_size: int,
              config: dict, copy_gb_s: float, seed: int, window: int | None = None,
              mla_v_dim: int | None = None, poison_tail: bool = False) -> dict:
    """One timed and checked point. poison_tail: the unused slots of each sequence's last page
    hold NaN (or the largest code, for integer layouts), as never-written memory may; the
    output must not change."""
    cache, table, lens, raw_k, raw_v = build_case(fmt, batch, context, kv_heads, head_dim, block_size, seed,
                                                  mla_v_dim)
    poisoned = bool(poison_tail and context % block_size and FORMATS[fmt].kind != KIVI)  # KIVI's tail is fp16
    if poisoned:
        page, used = table[:, context // block_size].long(), context % block_size
        for side in (cache.k, cache.v):
            tail = side.data[page, :, used:]
            side.data[page, :, used:] = torch.full_like(tail, float("nan") if tail.dtype.is_floating_point else 127)
    q = torch.randn(batch, q_heads, head_dim, device="cuda",
                    generator=torch.Generator(device="cuda").manual_seed(seed + 7))
    def run():
        return paged_decode(q, cache, table, lens, window=window, max_context=context, **config)

    out = run()
    ref = reference_decode(q, cache, table, lens, window)
    exact = unquantized_reference(q, cache, table, lens, raw_k, raw_v, window) if mla_v_dim is None else None
    ms = _bench_graph(run)
    nbytes = bytes_read(cache, batch, context, window)
    gbs = nbytes / (ms / 1e3) / 1e9
    point = dict(kernel="triton fused", format=fmt, batch=batch, context=context, q_heads=q_heads, kv_heads=kv_heads,
                 head_dim=head_dim, v_dim=cache.v_dim, block_size=block_size, window=window, mla=mla_v_dim is not None,
                 bytes_read=nbytes, median_ms=ms, achieved_gb_s=gbs, pct_of_copy=100 * gbs / copy_gb_s,
                 kernel_rel_error=relative_error(out, ref),
                 attention_rel_error=relative_error(out, exact) if exact is not None else None, config=config,
                 poisoned_tail=poisoned, finite=bool(torch.isfinite(out).all()))
    del cache, table, raw_k, raw_v, ref, out
    return point


def baseline_points(batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int, block_size: int,
                    seed: int) -> list[dict]:
    """bf16 through SDPA's flash backend on a contiguous cache, and the plain torch path
    (gather pages, dequantize, attend) on the bf16 paged cache."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    g = torch.Generator(device="cuda").manual_seed(seed)
    k = torch.randn(batch, kv_heads, context, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    q = torch.randn(batch, q_heads, 1, head_dim, device="cuda", generator=g, dtype=torch.bfloat16)
    nbytes = 2 * k.numel() * k.element_size()
    out = []

    def sdpa():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)

    try:
        ms = _bench_graph(sdpa)
        out.append(dict(kernel="sdpa flash (contiguous)", format="bf16", batch=batch, context=context,
                        bytes_read=nbytes, median_ms=ms, achieved_gb_s=nbytes / (ms / 1e3) / 1e9))
    except RuntimeError as e:
        out.append(dict(kernel="sdpa flash (contiguous)", format="bf16", batch=batch, context=context,
                        error=str(e).splitlines()[0]))
    del k, v
    cache, table, lens, _, _ = build_case("bf16", batch, context, kv_heads, head_dim, block_size, seed)
    qf = torch.randn(batch, q_heads, head_dim, device="cuda")
    group = q_heads // kv_heads

    def plain():
        kk = cache.k.data[table.long()].transpose(2, 3).reshape(batch, -1, kv_heads, head_dim)[:, :context].float()
        vv = cache.v.data[table.long()].transpose(2, 3).reshape(batch, -1, kv_heads, head_dim)[:, :context].float()
        kk = kk.repeat_interleave(group, dim=2)
        vv = vv.repeat_interleave(group, dim=2)
        s = torch.einsum("bhd,bthd->bht", qf, kk) * head_dim ** -0.5
        return torch.einsum("bht,bthd->bhd", s.softmax(-1), vv)

    ms = _bench_graph(plain, rep_ms=40)
    out.append(dict(kernel="torch gather+attend (paged)", format="bf16", batch=batch, context=context,
                    bytes_read=cache.nbytes(), median_ms=ms, achieved_gb_s=cache.nbytes() / (ms / 1e3) / 1e9))
    del cache
    torch.cuda.empty_cache()
    return out


def fit_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least squares y = a + b x; returns (a, b)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx else 0.0
    return my - b * mx, b


TIME_MODEL = ("time = overhead_s + bytes_read / (reference_bandwidth × kv efficiency) + batch × per_sequence_s "
              "+ context × per_context_token_s")


def fit_time_terms(points: list[dict]) -> tuple[float, dict[str, float]] | None:
    """Least squares of each point's time on (1, bytes, batch, context), every point weighted by
    1/time² so that relative errors count alike; returns (seconds per byte, time terms). A time
    term that comes out negative is dropped and the rest refitted (each is a cost: at least 0);
    None when the bytes term is not positive. With fewer than three points per parameter only
    the overhead joins the bytes (a four-parameter fit of a 2 x 2 grid would be exact, not a fit)."""
    columns = {"overhead_s": lambda p: 1.0, "per_sequence_s": lambda p: float(p["batch"]),
               "per_context_token_s": lambda p: float(p["context"])}
    kept = list(columns) if len(points) >= 3 * (len(columns) + 1) else ["overhead_s"]
    # scaled so the normal equations stay well conditioned (bytes ~1e9, contexts ~1e4)
    scale = {"bytes": 1e-9, "overhead_s": 1.0, "per_sequence_s": 1e-1, "per_context_token_s": 1e-4}
    ys = [p["median_ms"] / 1e3 for p in points]
    w = [1 / (y * y) for y in ys]
    while True:
        rows = [[p["bytes_read"] * scale["bytes"]] + [columns[t](p) * scale[t] for t in kept] for p in points]
        n = len(rows[0])
        ata = [[sum(wi * r[i] * r[j] for wi, r in zip(w, rows)) for j in range(n)] for i in range(n)]
        aty = [sum(wi * r[i] * y for wi, r, y in zip(w, rows, ys)) for i in range(n)]
        try:
            coef = torch.linalg.solve(torch.tensor(ata, dtype=torch.float64),
                                      torch.tensor(aty, dtype=torch.float64)).tolist()
        except torch.linalg.LinAlgError:  # singular: the points cannot separate the terms
            return None
        if coef[0] <= 0:
            return None
        terms = dict(zip(kept, coef[1:]))
        negative = [t for t, v in terms.items() if v < 0]
        if not negative:
            per_byte = coef[0] * scale["bytes"]
            return per_byte, {t: terms.get(t, 0.0) * scale[t] for t in columns}
        kept.remove(min(negative, key=lambda t: terms[t]))


def efficiency_section(points: list[dict], spec_gb_s: float, min_batch: int) -> dict:
    """Per format: TIME_MODEL fitted on the grid points with batch ≥ min_batch (fit_time_terms);
    every point gets its predicted time."""
    kv, terms = {}, {t: {} for t in KERNEL_TIME_TERMS}
    for fmt in dict.fromkeys(p["format"] for p in points):
        sel = [p for p in points if p["format"] == fmt and p["batch"] >= min_batch]
        fit = fit_time_terms(sel) if len(sel) >= 2 else None
        if fit is None:
            continue
        per_byte, fmt_terms = fit
        kv[fmt] = min(1.0, 1 / per_byte / (spec_gb_s * 1e9))
        for t in KERNEL_TIME_TERMS:
            terms[t][fmt] = fmt_terms[t]
    fitted = DecodeEfficiency(kv=MappingProxyType(kv), **{t: MappingProxyType(v) for t, v in terms.items()})
    for p in points:
        if p["format"] in kv:
            p["predicted_ms"] = 1e3 * attention_seconds(p["bytes_read"], spec_gb_s, fitted, p["format"],
                                                        sequences=p["batch"], context_tokens=p["context"])
            p["prediction_error_pct"] = 100 * (p["predicted_ms"] - p["median_ms"]) / p["median_ms"]
    return dict(reference_bandwidth_gb_s=spec_gb_s, kv=kv, **terms, fitted_on_batch_at_least=min_batch,
                model=TIME_MODEL)


def slopes(points: list[dict], batch: int) -> dict:
    """Decode time against context at one batch: slope per format and its ratio to bf16's,
    beside the ratio of bytes per token."""
    out = {}
    for fmt in dict.fromkeys(p["format"] for p in points):
        sel = sorted((p for p in points if p["format"] == fmt and p["batch"] == batch), key=lambda p: p["context"])
        if len(sel) < 2:
            continue
        _, b = fit_line([p["context"] for p in sel], [p["median_ms"] for p in sel])
        bytes_per_token = sel[-1]["bytes_read"] / (batch * sel[-1]["context"])
        out[fmt] = dict(ms_per_1k_tokens=1000 * b, bytes_per_token=bytes_per_token)
    if "bf16" in out:
        for fmt, row in out.items():
            row["slope_ratio"] = row["ms_per_1k_tokens"] / out["bf16"]["ms_per_1k_tokens"]
            row["bytes_ratio"] = row["bytes_per_token"] / out["bf16"]["bytes_per_token"]
            row["ratio_gap_pct"] = 100 * (row["slope_ratio"] - row["bytes_ratio"]) / row["bytes_ratio"]
    return out


def error_ok(point: dict) -> bool:
    bound = 5 * ERROR_BOUNDS[point["format"]]
    return point.get("finite", True) and point["kernel_rel_error"] <= kernel_tolerance(point.get("config")) and (
        point["attention_rel_error"] is None or point["attention_rel_error"] <= bound)


def efficiency_profile(reports: list[tuple[str, dict]], only: list[set[str] | None] | None = None) -> dict:
    """A bundled efficiency profile (profiles/efficiency/*.json) from kernel benchmark reports,
    given as (path, report) pairs: each format's terms come from the last report that measured
    it, so a later run of some formats updates just those (`measured_in` names the report);
    only[i], when given, limits what report i contributes (a later run's bf16 baseline stays out)."""
    if not reports:
        raise ValueError("an efficiency profile needs at least one kernel report")
    kv, terms, measured_in = {}, {t: {} for t in KERNEL_TIME_TERMS}, {}
    reference = reports[0][1]["decode_efficiency"]["reference_bandwidth_gb_s"]
    devices = []
    for i, (path, report) in enumerate(reports):
        eff = report["decode_efficiency"]
        wanted = only[i] if only else None
        missing = sorted((wanted or set()) - set(eff["kv"]))
        if missing:
            raise ValueError(f"{path} has no fitted {', '.join(missing)}; it has {', '.join(eff['kv'])}")
        if eff["reference_bandwidth_gb_s"] != reference:
            raise ValueError(f"{path}: reference bandwidth {eff['reference_bandwidth_gb_s']:g} GB/s, the first "
                             f"report's is {reference:g} GB/s; one profile holds one device's fits")
        dev = report["device"]
        devices.append(f"{dev['name']} (torch {dev['torch']}, triton {dev['triton']}, CUDA {dev['cuda']})")
        for fmt, value in eff["kv"].items():
            if wanted is not None and fmt not in wanted:
                continue
            kv[fmt] = round(value, 4)
            measured_in[fmt] = path
            for t in KERNEL_TIME_TERMS:
                terms[t][fmt] = float(f"{eff.get(t, {}).get(fmt, 0.0):.4g}")  # seconds: 4 significant digits
    first = reports[0][1]
    eff = first["decode_efficiency"]
    return dict(
        name=f"kvsize fused Triton paged decode on {first['device']['name']}",
        source=f"{', '.join(path for path in dict.fromkeys(measured_in.values()))}: benchmarks/bench_decode.py, fit "
               f"{eff.get('model', TIME_MODEL)} ({reference:g} GB/s) on batch >= {eff['fitted_on_batch_at_least']}"
               + ("; each format from the last of these reports that measured it" if len(reports) > 1 else ""),
        device="; ".join(dict.fromkeys(devices)),
        reference_bandwidth_gb_s=reference,
        kv=kv,
        **terms,
        measured_in=measured_in,
        weights=DEFAULT_WEIGHTS_EFFICIENCY,
        weights_source="assumption (weight GEMVs were not measured)",
        kv_default=DEFAULT_KV_EFFICIENCY,
        kv_default_source="assumption for formats without a measured kernel (llama.cpp types, fp32, kvquant3)",
    )


def refit(report: dict) -> dict:
    """The report with its decode_efficiency section and per-point predictions fitted again from
    its measured points with today's TIME_MODEL (the measurements are left as they are)."""
    section = report["decode_efficiency"]
    report["decode_efficiency"] = efficiency_section(report["kernels"], section["reference_bandwidth_gb_s"],
                                                     section["fitted_on_batch_at_least"])
    return report


def main(argv: list[str]) -> int:
    """python -m measure.kernel_bench REPORT[:FORMAT,...] ... > profiles/efficiency/NAME.json: the
    profile of reports (each format from the last that measured it; after a colon, the formats to
    take from that report); python -m measure.kernel_bench --refit REPORT: refit in place."""
    import json

    if len(argv) == 2 and argv[0] == "--refit":
        with open(argv[1]) as f:
            report = refit(json.load(f))
        with open(argv[1], "w") as f:
            f.write(json.dumps(report, indent=1) + "\n")
        return 0
    if not argv or argv[0].startswith("-"):
        print("usage: python -m measure.kernel_bench REPORT[:FORMAT,...] ... | --refit REPORT", file=sys.stderr)
        return 2
    reports, only = [], []
    try:
        for arg in argv:
            path, _, formats = arg.partition(":")
            with open(path) as f:
                reports.append((path, json.load(f)))
            only.append(set(formats.split(",")) if formats else None)
        profile = efficiency_profile(reports, only)
    except (OSError, ValueError, KeyError) as e:
        print(f"measure.kernel_bench: error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(profile, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

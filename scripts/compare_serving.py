"""Measured against predicted for the serving runs: measure/serving/comparison.md.

For every measured point (measure/serving/points.json) it sets the measured p50 ITL, p50 TTFT and output tokens/s
beside kvsize's predictions committed before the batch ran, for the GPU the batch ran on
(measure.serving.predictions_file): the `plan` figure (the candidate table: ITL = the decode step at the peak,
TTFT = one prompt's prefill alone) and the `design` figure (the aggregated design: ITL = step / (1 - rho),
TTFT = prefill + M/D/1 wait). These are prospective errors: nothing was fitted to these runs.

The batches the plan and design figures were committed for are b1-b6; later batches were predicted by the serving
simulation alone, and benchmarks/serving_accuracy.py holds them to it (docs/speed-accuracy.md).

usage: python scripts/compare_serving.py          (writes measure/serving/comparison.md)
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.serving import SERVING, load_points, predictions_file, read_json  # noqa: E402

GPU_IDS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100-sxm"}


def simulated_ahead(rs: list[dict]) -> list[str]:
    """Per batch whose step simulation's figures were committed before it ran (<batch>-sim-predictions-<gpu>.json):
    those figures against the server's, closed loop, apart from the plan and design figures above."""
    lines = []
    for batch in sorted({r["batch"] for r in rs}):
        part = [r for r in rs if r["batch"] == batch and r["loop"] == "closed"]
        f = SERVING / f"{batch}-sim-predictions-{GPU_IDS.get(part[0]['gpu'] if part else '', '')}.json"
        if not part or not f.exists():
            continue
        sim = {x["id"]: x for x in read_json(f)["points"]}
        for r in part:
            x = sim.get(r["id"])
            r["sim_itl"], r["sim_ttft"] = (x["itl_ms"]["50"], x["ttft_ms"]["50"]) if x else (None, None)
            r["sim_tps"] = x["output_tokens_per_s"] if x else None
        lines += [f"- `{batch}` (`{f.name}`): p50 ITL {summary(part, 'itl', 'sim_itl')}; p50 TTFT "
                  f"{summary(part, 'ttft', 'sim_ttft')}; output tokens/s {summary(part, 'tps', 'sim_tps')}"]
    return lines


def err(pred: float | None, meas: float) -> float | None:
    return None if pred is None or not meas else 100 * (pred - meas) / meas


def fmt(x: float | None, nd: int = 1) -> str:
    return "–" if x is None else f"{x:,.{nd}f}"


def pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.0f}%"


def rows() -> list[dict]:
    points = load_points()
    preds: dict[str, dict] = {}
    out = []
    for p in points:
        f = predictions_file(p.batch, p.settings.gpu_name)
        if not f.is_file():
            continue  # from b7 on, batches were predicted by the serving simulation alone: docs/speed-accuracy.md
        if f not in preds:
            preds[f] = {x["id"]: x for x in read_json(f)["points"]}
        x = preds[f][p.id]
        m = p.measured
        plan, design = x["predicted"]["plan"], x["predicted"]["design"]
        s = p.settings
        out.append(dict(
            id=p.id, batch=p.batch, model=s.model, kv=s.kv_cache_dtype, tp=s.tensor_parallel_size, gpu=s.gpu_name,
            lengths=f"{s.input_len}/{s.output_len}",
            load=f"c={s.concurrency}" if s.loop == "closed" else f"{s.request_rate:g}/s",
            loop=s.loop, itl=m.itl_p50_ms, itl_p99=m.itl_p99_ms, ttft=m.ttft_p50_ms, tps=m.output_tokens_per_s,
            plan_itl=plan["itl_p50_ms"], design_itl=design["itl_p50_ms"], plan_ttft=plan["ttft_p50_ms"],
            design_ttft=design["ttft_p50_ms"], plan_tps=plan["output_tokens_per_s"],
            design_tps=design["output_tokens_per_s"], running_max=p.metrics.running_max,
            kv_usage_max=p.metrics.kv_cache_usage_max, preemptions=p.metrics.preemptions,
            kv_tokens=p.server_start.gpu_kv_cache_tokens, pred_kv_tokens=x["components"]["cache_tokens"],
            file=f.name))
    return out


def summary(rs: list[dict], key: str, pred: str) -> str:
    errs = [abs(e) for r in rs if (e := err(r[pred], r[key])) is not None]
    if not errs:
        return "no points"
    within = sum(e <= 10 for e in errs)
    return (f"{len(errs)} points: median |error| {statistics.median(errs):.0f}%, worst {max(errs):.0f}%, "
            f"{within} within 10%")


def render(rs: list[dict]) -> str:
    closed = [r for r in rs if r["loop"] == "closed"]
    lines = [
        "# Serving runs: measured against kvsize's predictions",
        "",
        "Written by `scripts/compare_serving.py` from `points.json` and the predictions committed before each batch",
        "ran, for the GPU it ran on. Every error is prospective (nothing was fitted to these runs): (predicted −",
        "measured) / measured. `plan` is `kvsize plan`'s candidate table (ITL = the decode step at the peak batch,",
        "TTFT = one prompt's prefill alone, no queue); `design` is its aggregated design (ITL = step / (1 − ρ),",
        "TTFT = prefill + M/D/1 wait); – where kvsize has no figure (its reason is in the predictions file).",
        "Measured figures are p50 over the client's own per-request timestamps; ms unless noted.",
        "",
        "## Summary (closed loop)",
        "",
        f"- p50 ITL, plan: {summary(closed, 'itl', 'plan_itl')}",
        f"- p50 ITL, design: {summary(closed, 'itl', 'design_itl')}",
        f"- p50 TTFT, plan: {summary(closed, 'ttft', 'plan_ttft')}",
        f"- p50 TTFT, design: {summary(closed, 'ttft', 'design_ttft')}",
        f"- output tokens/s, plan: {summary(closed, 'tps', 'plan_tps')}",
        f"- output tokens/s, design: {summary(closed, 'tps', 'design_tps')}",
        "- open loop: kvsize has no model at a given arrival rate (every open-loop figure is null).",
        "",
        "## The step simulation's figures, committed before the batch ran (closed loop)",
        "",
        "Batches that ran after the serving simulation was written had its figures committed too, before they ran:",
        "predicted before seen, nothing fitted on them then, held here apart from the plan and design figures.",
        "",
        *simulated_ahead(rs),
        "",
        "## KV pool at start: the server's 'GPU KV cache size' against kvsize's cache tokens",
        "",
        "| server | GPU | measured tokens | kvsize | error |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    seen = set()
    for r in rs:
        server = r["id"].rsplit("-p", 1)[0]
        if server in seen:
            continue
        seen.add(server)
        lines.append(f"| {server} | {r['gpu']} | {r['kv_tokens']:,} | {r['pred_kv_tokens']:,} | "
                     f"{pct(err(r['pred_kv_tokens'], r['kv_tokens']))} |")
    pairs = {}
    for r in closed:
        if r["model"] == "llama-3.1-8b":
            pairs.setdefault(r["id"].split("-p", 1)[1], {})[r["kv"]] = r
    lines += ["", "## fp8 over bf16 KV (Llama-3.1-8B, closed loop): p50 ITL of bf16 / p50 ITL of fp8", "",
              "| in/out | load | measured | plan | error |", "| --- | --- | ---: | ---: | ---: |"]
    for key in sorted(pairs, key=lambda k: int(k.split("-")[0])):
        pair = pairs[key]
        if set(pair) != {"auto", "fp8"}:
            continue
        b, f = pair["auto"], pair["fp8"]
        meas = b["itl"] / f["itl"]
        plan = b["plan_itl"] / f["plan_itl"] if b["plan_itl"] and f["plan_itl"] else None
        lines.append(f"| {b['lengths']} | {b['load']} | {meas:.2f} | {fmt(plan, 2)} | "
                     f"{pct(None if plan is None else 100 * (plan - meas) / meas)} |")
    lines += ["", "## Every point", "",
              "| point | in/out | load | ITL p50 | plan | design | ITL p99 | TTFT p50 | plan | design | tok/s | plan "
              "| design | running max | KV use max | preempted |",
              "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: "
              "| ---: |"]
    for r in rs:
        lines.append(
            f"| {r['id'].rsplit('-i', 1)[0]} | {r['lengths']} | {r['load']} | {fmt(r['itl'], 2)} | "
            f"{fmt(r['plan_itl'], 2)} ({pct(err(r['plan_itl'], r['itl']))}) | "
            f"{fmt(r['design_itl'], 2)} ({pct(err(r['design_itl'], r['itl']))}) | {fmt(r['itl_p99'], 1)} | "
            f"{fmt(r['ttft'], 0)} | {fmt(r['plan_ttft'], 0)} ({pct(err(r['plan_ttft'], r['ttft']))}) | "
            f"{fmt(r['design_ttft'], 0)} ({pct(err(r['design_ttft'], r['ttft']))}) | {fmt(r['tps'], 0)} | "
            f"{fmt(r['plan_tps'], 0)} | {fmt(r['design_tps'], 0)} | {fmt(r['running_max'], 0)} | "
            f"{fmt(None if r['kv_usage_max'] is None else 100 * r['kv_usage_max'], 0)}% | "
            f"{fmt(r['preemptions'], 0)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    out = SERVING / "comparison.md"
    out.write_text(render(rows()))
    print(f"wrote {out.relative_to(ROOT)}")

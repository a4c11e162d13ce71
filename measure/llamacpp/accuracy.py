"""The llama.cpp loads as docs/accuracy.md and the app's Validation tab show them: each load against the
prediction committed before the loads ran (prospective) and against today's kvsize (after the fixes)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from . import report as report_mod

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "measure" / "reports" / "llamacpp-cpu-loads.json"
PREDICTIONS = ROOT / "measure" / "llamacpp" / "predictions.json"


def load_report(path: Path = REPORT) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.exists() else None


def rows(report: dict[str, Any], predictions: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One row per load: its settings, what llama.cpp printed, and both predictions' verdicts."""
    before = {r["id"]: r for r in report_mod.prospective(report, predictions)} if predictions else {}
    out = []
    for row in report["loads"]:
        s, f = row["load"], row["figures"]
        today = report_mod.disagreements(s, f)
        b = before.get(s["id"], {})
        out.append({
            "load": s["id"], "model": s["model"], "arch": s["arch"], "n_ctx": s["n_ctx"], "n_seq_max": s["n_seq_max"],
            "type_k": s["type_k"], "type_v": s["type_v"], "flash_attn": "on" if s["flash_attn"] else "off",
            "kv_unified": "yes" if s["kv_unified"] else "no",
            "printed": f["refusal"] or "; ".join(f"{c['role']} {c['cells']} cells, K {c['k_mib']} + V {c['v_mib']} "
                                                 f"MiB" for c in f["caches"]) or "no KV cache",
            "recurrent_mib": "; ".join(r["size_mib"] for r in f["recurrent"]),
            "prospective": ("exact" if b.get("exact") else "missed" if b.get("loaded") == b.get("predicted_loads")
                            else f"missed ({'made' if b.get('loaded') else 'refused'} by llama.cpp, predicted "
                                 f"{'to load' if b.get('predicted_loads') else 'refused'})") if b else "",
            "prospective_error": b.get("error"),
            "today": "exact" if not today else "; ".join(today)[:160],
        })
    return out


def summary(report: dict[str, Any], predictions: dict[str, Any] | None) -> dict[str, Any]:
    table = rows(report, predictions)
    loads = report["loads"]
    types = sorted({r["load"]["type_k"] for r in loads} | {r["load"]["type_v"] for r in loads})
    missed = [r for r in table if r["prospective"].startswith("missed")]
    return {
        "loads": len(loads), "models": len({r["model"] for r in table}), "arches": sorted({r["arch"] for r in table}),
        "types": types, "refused": sum(1 for r in loads if r["figures"]["refusal"]),
        "today_exact": sum(r["today"] == "exact" for r in table),
        "prospective_exact": sum(r["prospective"] == "exact" for r in table),
        "prospective_refusals_missed": sum(r["prospective"].startswith("missed (") for r in table),
        "prospective_total": sum(bool(r["prospective"]) for r in table),
        "missed_by_arch": dict(sorted(Counter(r["arch"] for r in missed).items())),
        "engine": report.get("engine", {}), "device": report.get("device", {}).get("name", "?"),
    }


def section(report_path: Path = REPORT, predictions_path: Path = PREDICTIONS) -> list[str]:
    """docs/accuracy.md's llama.cpp section (empty when no report is kept)."""
    report = load_report(report_path)
    if report is None:
        return []
    predictions = json.loads(predictions_path.read_text()) if predictions_path.exists() else None
    s, table = summary(report, predictions), rows(report, predictions)
    lines = [
        "## llama.cpp, on a CPU",
        "",
        f"Real loads of llama.cpp (llama-cpp-python {s['engine'].get('llama_cpp_python', '?')}, built from source) on "
        f"{s['device']} in `measure/reports/llamacpp-cpu-loads.json`, made by `python -m measure.llamacpp run`: "
        "each a KV-faithful miniature GGUF written from the model's config.json as published "
        "(`measure/llamacpp/gguf_writer.py`: the real layers, KV heads, key and value lengths, windows, MLA ranks "
        "and recurrent sizes; a small embedding, FFN and vocabulary), loaded with the load's n_ctx, n_seq_max, "
        "cache types, flash attention and kv_unified. Every memory line llama.cpp printed is kept; CI re-reads "
        "them and holds `kvsize`'s llama.cpp rules (`sizing/engines/llamacpp.py`) to every figure: cells, layers, "
        "sequences, streams, cache types and each MiB figure as llama.cpp rounds it (0.01 MiB), or the refusal.",
        "",
        f"- {s['loads']} loads of {s['models']} models ({', '.join(s['arches'])}), cache types "
        f"{', '.join(s['types'])} for K and for V, mixed K/V, flash attention on and off; {s['refused']} refused by "
        "llama.cpp, each refusal predicted.",
        f"- Today's kvsize: {s['today_exact']} of {s['loads']} loads exactly as printed.",
    ]
    if predictions is not None:
        lines.append(
            f"- Predicted before any load ran (`measure/llamacpp/predictions.json`, committed ahead of the loads with "
            f"the rules of that commit): {s['prospective_exact']} of {s['prospective_total']} exact (cells, the K + "
            f"V bytes and recurrent state within the printed rounding, and whether the context is made; "
            f"{s['prospective_refusals_missed']} of the misses a refusal kvsize did not foresee). Missed, by "
            "architecture: " + ", ".join(f"{a} {n}" for a, n in s["missed_by_arch"].items()) + ".")
    lines += buffers_section(report)
    lines += cuda_section()
    lines += ["", "| load | printed | prospective (error) | today |", "|---|---|---:|---|"]
    for r in table:
        err = r["prospective_error"]
        pro = r["prospective"] + (f" ({100 * err:+.1f}%)" if isinstance(err, float) and r["prospective"] == "missed"
                                  else "")
        lines.append(f"| {r['load']} | {r['printed']} | {pro} | {r['today']} |")
    return lines + [""]


BUFFERS = ROOT / "measure" / "reports" / "llamacpp-cpu-buffers.json"


def buffers_section(loads_report: dict[str, Any], path: Path = BUFFERS) -> list[str]:
    """The model, output and compute buffers: full-size loads (llamacpp-cpu-buffers.json) and the miniatures."""
    import statistics

    from . import buffers

    report = load_report(path)
    if report is None:
        return []
    mini = buffers.miniature_compute_errors(loads_report)
    errs = [r["error"] for r in mini]
    lines = ["", "### Beside the cache: model, output and compute buffers (CPU figures)", "",
             f"{len(report['loads'])} full-size loads with zero weights (`python -m measure.llamacpp.full run`; "
             "predictions in `measure/llamacpp/full-predictions.json`, written before they ran). Model buffers "
             "(sizing/engines/llamacpp_weights.py) are held exact, for these and for every miniature; the output "
             "buffer exact; the compute buffer is a model (the larger of the logits and attention stages), held "
             f"within {100 * buffers.FULL_COMPUTE_BAND[0]:+.0f}%..{100 * buffers.FULL_COMPUTE_BAND[1]:+.0f}% "
             "on the full-size loads.", "",
             "| load | model buffers printed (MiB) | output | compute printed | compute kvsize | error |",
             "|---|---|---:|---:|---:|---:|"]
    for row in report["loads"]:
        f = row["figures"]
        config = json.loads((buffers.CONFIGS / f"{row['load']['model']}.json").read_text())
        p = buffers.full_prediction(row["load"], config, buffers.mapped(row["lines"]))
        compute = buffers.printed(f, "compute")["CPU"]
        model = ", ".join(f"{k} {v}" for k, v in sorted(buffers.printed(f, "model").items()))
        lines.append(f"| {row['load']['id']} | {model} | {buffers.printed(f, 'output')['CPU']} | {compute} | "
                     f"{buffers.mib_printed(p['compute'])} | {100 * buffers.compute_error(p['compute'], compute):+.1f}% |")
    if errs:
        lines += ["", f"On the {len(errs)} miniature loads that made a context (small embedding and vocabulary, so "
                  f"the attention stage rules) the compute model's signed error runs {100 * min(errs):+.0f}% to "
                  f"{100 * max(errs):+.0f}% (median {100 * statistics.median(errs):+.1f}%): a model, not a bound."]
    return lines


def cuda_section() -> list[str]:
    """The full-size loads on a CUDA GPU (llamacpp-cuda-buffers.json): each buffer llama.cpp printed against kvsize's
    prediction written before the load ran, and the GPU memory the load took beyond its printed CUDA0 buffers."""
    from . import cuda

    report = load_report(cuda.REPORT)
    if report is None:
        return []
    predicted = {row["load"]["id"]: row["prediction"]["printed_mib"]
                 for row in json.loads(cuda.PREDICTIONS.read_text())["loads"]}
    lines = ["", f"### Full-size loads on a CUDA GPU ({report['device']['name']})", "",
             f"{len(report['loads'])} loads with every layer offloaded and zero weights, as kvsize's serve command "
             "starts llama-server (`python -m measure.llamacpp.cuda run`; predictions in "
             "`measure/llamacpp/full-cuda-predictions.json`, written before they ran). Printed MiB, and kvsize's "
             "prediction where it differs. Beyond: the GPU memory the load took (CUDA's free memory before the model "
             "and after the context) less its printed CUDA0 buffers.", "",
             "| load | CUDA0 model | CPU_Mapped model | CUDA0 KV | CUDA_Host output | CUDA0 compute | beyond (MiB) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    columns = (("model", "CUDA0"), ("model", "CPU_Mapped"), ("KV", "CUDA0"), ("output", "CUDA_Host"),
               ("compute", "CUDA0"))
    for row in report["loads"]:
        # the predictions file names each buffer by llama.cpp's line ("load_tensors: CUDA0 model buffer size")
        want = {k.split(": ", 1)[1]: v for k, v in predicted[row["load"]["id"]].items()}
        cells = []
        for kind, device in columns:
            got = cuda.printed(row["figures"], kind).get(device, "-")
            expected = want.get(f"{device} {kind} buffer size")
            cells.append(got if expected == got else f"{got} (kvsize {expected})")
        memory = row.get("cuda_memory") or {}
        beyond = "-"
        if "before_load" in memory and "after_context" in memory:
            taken = memory["before_load"]["free_bytes"] - memory["after_context"]["free_bytes"]
            shown = sum(float(cuda.printed(row["figures"], kind).get("CUDA0", 0)) for kind in ("model", "KV", "compute"))
            beyond = f"{taken / 2**20 - shown:.1f}"
        lines.append(f"| {row['load']['id']} | " + " | ".join(cells) + f" | {beyond} |")
    return lines

"""The llama.cpp load report held to its own raw lines and to kvsize.

A load's figures must be exactly what its raw lines say (re-read with logparse): a report whose figures llama.cpp
did not print fails. kvsize's prediction (sizing/engines/llamacpp.py predict_load) must then print as llama.cpp
printed: the same caches in the same roles, cells, layers, sequences and streams, the same cache types, every MiB
figure as llama.cpp rounds it, the same recurrent memories, and the same refusal where llama.cpp refused.
"""

from __future__ import annotations

from typing import Any

from sizing.engines.llamacpp import LlamaCppLoad, mib_text, predict_load
from sizing.errors import KvsizeError
from sizing.profiles import bundled_shape

from .logparse import parse

SCHEMA = "kvsize.llamacpp-loads/1"
MIB = 1 << 20


def predicted(settings: dict[str, Any]) -> LlamaCppLoad:
    return predict_load(bundled_shape(settings["model"]), settings["n_ctx"], settings["n_seq_max"],
                        settings["type_k"], settings["type_v"], settings["flash_attn"], settings["kv_unified"],
                        settings["n_batch"], settings["n_ubatch"], settings.get("swa_full", False))


def disagreements(settings: dict[str, Any], figures: dict[str, Any]) -> list[str]:
    """Where kvsize's prediction does not print as llama.cpp printed (empty: it agrees)."""
    try:
        p = predicted(settings)
    except KvsizeError as e:
        return [f"kvsize refuses it: {e}"]
    if figures["refusal"] or p.refusal:
        if p.refusal != figures["refusal"]:
            return [f"llama.cpp: {figures['refusal'] or 'made the context'}; kvsize: {p.refusal or 'makes it'}"]
        return []
    out = []
    ctx = figures["context"]
    for key, value in (("n_ctx", p.n_ctx), ("n_ctx_seq", p.n_ctx_seq)):
        if ctx.get(key) != value:
            out.append(f"{key}: llama.cpp {ctx.get(key)}, kvsize {value}")
    if [c["role"] for c in figures["caches"]] != [c.role for c in p.caches]:
        out.append(f"caches: llama.cpp {[c['role'] for c in figures['caches']]}, kvsize {[c.role for c in p.caches]}")
        return out
    for got, want in zip(figures["caches"], p.caches):
        pairs = (("cells", want.cells), ("layers", want.layers), ("seqs", want.seqs), ("streams", want.streams),
                 ("type_k", want.type_k), ("type_v", want.type_v), ("k_mib", mib_text(want.k_bytes)),
                 ("v_mib", mib_text(want.v_bytes)), ("size_mib", mib_text(want.size_bytes)))
        out += [f"{got['role']} {key}: llama.cpp {got[key]}, kvsize {value}" for key, value in pairs
                if got[key] != value]
    if len(figures["recurrent"]) != len(p.recurrent):
        out.append(f"recurrent memories: llama.cpp {len(figures['recurrent'])}, kvsize {len(p.recurrent)}")
        return out
    for got, want in zip(figures["recurrent"], p.recurrent):
        pairs = (("cells", want.cells), ("layers", want.layers), ("seqs", want.seqs),
                 ("r_mib", mib_text(want.r_bytes)), ("s_mib", mib_text(want.s_bytes)),
                 ("size_mib", mib_text(want.size_bytes)))
        out += [f"recurrent {key}: llama.cpp {got[key]}, kvsize {value}" for key, value in pairs if got[key] != value]
    return out


def problems(report: dict[str, Any]) -> list[str]:
    """Every failed check of the report, one line each, named by load."""
    if report.get("schema") != SCHEMA:
        return [f"not a llama.cpp load report (schema {report.get('schema')!r}, expected {SCHEMA})"]
    loads = report.get("loads")
    if not isinstance(loads, list) or not loads:
        return ["the report holds no loads"]
    out = []
    for row in loads:
        settings = row["load"]
        where = settings.get("id", "?")
        figures = parse(row["lines"])
        if figures != row["figures"]:
            out.append(f"{where}: its figures are not what llama.cpp printed (its raw lines say otherwise)")
            continue
        if row["context_made"] == bool(figures["refusal"]) or (row["context_made"] and not figures["caches"]
                                                                and not figures["recurrent"]):
            out.append(f"{where}: the context was {'made' if row['context_made'] else 'refused'}, its lines say "
                       "otherwise")
            continue
        out += [f"{where}: {line}" for line in disagreements(settings, figures)]
    from .buffers import miniature_problems  # the model buffers each miniature printed, exact

    return out + miniature_problems(report)


def measured_kv_mib(figures: dict[str, Any]) -> float:
    """The attention caches' K and V as printed, summed (each to 0.01 MiB)."""
    return sum(float(c["k_mib"]) + float(c["v_mib"]) for c in figures["caches"])


def prospective(report: dict[str, Any], predictions: dict[str, Any]) -> list[dict[str, Any]]:
    """Each load against the prediction committed before it ran: did it load as predicted, were its cells the
    predicted cells, and the signed error of the predicted KV (and recurrent state) bytes against the printed K + V
    (and R + S); exact: within the half-hundredth of a MiB each printed figure is rounded to."""
    by_id = {row["load"]["id"]: row["prediction"] for row in predictions["loads"]}
    rows = []
    for row in report["loads"]:
        settings, figures = row["load"], row["figures"]
        before = by_id.get(settings["id"])
        if before is None:
            continue
        made = not figures["refusal"]
        entry: dict[str, Any] = {"id": settings["id"], "loaded": made, "predicted_loads": before["loads"]}
        if made and before["loads"]:
            measured = measured_kv_mib(figures) * MIB
            slack = 0.005 * MIB * 2 * len(figures["caches"]) + 1  # each printed K and V rounded to 0.01 MiB
            cells = [c["cells"] for c in figures["caches"]]
            entry.update(measured_kv_bytes=round(measured), predicted_kv_bytes=before["kv_bytes"],
                         error=(before["kv_bytes"] - measured) / measured if measured else 0.0,
                         cells=cells, predicted_cells=before["cells"])
            entry["exact"] = abs(before["kv_bytes"] - measured) <= slack and cells == [before["cells"]] * len(cells)
            state = sum(float(r["r_mib"]) + float(r["s_mib"]) for r in figures["recurrent"]) * MIB
            if figures["recurrent"] or before.get("recurrent_state_bytes"):
                entry.update(measured_state_bytes=round(state), predicted_state_bytes=before["recurrent_state_bytes"])
                entry["exact"] = entry["exact"] and abs(before["recurrent_state_bytes"] - state) <= \
                    0.005 * MIB * 2 * len(figures["recurrent"]) + 1
                total = measured + state  # the error of the whole memory, cache and state
                entry["error"] = (before["kv_bytes"] + before["recurrent_state_bytes"] - total) / total
        else:
            entry["exact"] = made == before["loads"]
        rows.append(entry)
    return rows

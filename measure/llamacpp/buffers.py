"""The llama.cpp buffers beside the KV cache held to what llama.cpp printed: the model buffers (exact, for the full-size
loads of measure/reports/llamacpp-cpu-buffers.json and the miniatures of llamacpp-cpu-loads.json), the output buffer
(exact) and the compute buffer (a model: its error is measured and held within the band docs/formulas.md states).
A report of loads on a CUDA GPU (device kind "cuda", llamacpp-cuda-buffers.json) is checked by measure/llamacpp/cuda.py.

A report whose figures are not what its raw lines say fails, as does a load whose buffers kvsize does not print as
llama.cpp printed them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sizing.config.read import resolve_shape
from sizing.engines.llamacpp import predict_load
from sizing.engines.llamacpp_weights import (ComputeShape, GgufTensor, compute_buffer_model_bytes, compute_shape,
                                             mib_printed, model_buffers, output_buffer_bytes, weight_buffers)
from sizing.profiles import bundled_shape, model_profile

from .logparse import compute_error, parse, printed

SCHEMA = "kvsize.llamacpp-buffers/1"
CONFIGS = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "vllm-starts" / "configs"  # config.json each
# the compute-buffer model's band on the full-size loads (signed error against the printed figure)
FULL_COMPUTE_BAND = (-0.02, 0.02)


def miniature_model_buffers(settings: dict[str, Any]) -> dict[str, int]:
    """A miniature's model buffers from the tensors gguf_writer writes for it (measure/llamacpp/gguf_writer.py)."""
    from .gguf_writer import build

    _, tensors = build(model_profile(settings["model"]).config, settings["arch"])
    typed = [GgufTensor(name, t, ne, "other") for name, t, ne in tensors.typed()]  # none of its types repacks
    return model_buffers(typed, not any(name == "output.weight" for name, _, _ in tensors.typed()))


def miniature_problems(report: dict[str, Any]) -> list[str]:
    """Each miniature load's model buffers as kvsize prints them, against llama.cpp (llamacpp-cpu-loads.json)."""
    out, cache = [], {}
    for row in report["loads"]:
        s = row["load"]
        if s["model"] not in cache:
            cache[s["model"]] = {k: mib_printed(v) for k, v in miniature_model_buffers(s).items()}
        got = printed(row["figures"], "model")
        if got != cache[s["model"]]:
            out.append(f"{s['id']}: model buffers: llama.cpp {got}, kvsize {cache[s['model']]}")
    return out


def full_prediction(settings: dict[str, Any], config: dict[str, Any], mapped: bool) -> dict[str, Any]:
    """kvsize's buffers for a full-size load on the CPU; `mapped`: llama.cpp mapped the file (as its log says)."""
    shape = resolve_shape(config)
    kv = predict_load(shape, settings["n_ctx"], settings["n_seq_max"], settings["type_k"], settings["type_v"],
                      settings["flash_attn"], settings["kv_unified"], settings["n_batch"], settings["n_ubatch"])
    compute = compute_buffer_model_bytes(compute_shape(shape), kv.n_ctx, max(c.cells for c in kv.caches),
                                         settings["n_ubatch"], settings["flash_attn"], settings["type_k"],
                                         settings["type_v"])
    return {"model": weight_buffers(shape, settings["weight_type"], mapped),
            "output": output_buffer_bytes(shape.vocab_size, settings["n_seq_max"]),
            "compute": compute["compute_bytes"]}


def predicted_mib(report: dict[str, Any], row: dict[str, Any]) -> dict[str, dict[str, str]]:
    """kvsize's figure for each buffer of a full-size load, by kind and device, as llama.cpp prints MiB: on a CUDA
    GPU (a report of device kind "cuda") the model, KV, output and compute buffers of measure/llamacpp/cuda.py,
    on the CPU the model, output and compute buffers of full_prediction."""
    s = row["load"]
    if report.get("device", {}).get("kind") == "cuda":
        from .cuda import kvsize_figures

        f = kvsize_figures(s)
        return {kind: {device: mib_printed(n) for device, n in f[kind].items()}
                for kind in ("model", "KV", "output", "compute")}
    p = full_prediction(s, json.loads((CONFIGS / f"{s['model']}.json").read_text()), mapped(row["lines"]))
    return {"model": {k: mib_printed(v) for k, v in p["model"].items()},
            "output": {"CPU": mib_printed(p["output"])}, "compute": {"CPU": mib_printed(p["compute"])}}


def mapped(lines: list[str]) -> bool:
    """Whether llama.cpp mapped the GGUF: src/llama-model.cpp load_tensors prints its load mode ("load_mode =
    mmap"); the loader's own choice, whatever was asked."""
    return any("load_tensors:" in line and "load_mode = mmap" in line for line in lines)


def problems(report: dict[str, Any]) -> list[str]:
    """Every failed check of a full-size buffers report, one line each, named by load (a CUDA report's by
    measure/llamacpp/cuda.py)."""
    if report.get("schema") != SCHEMA:
        return [f"not a llama.cpp buffers report (schema {report.get('schema')!r}, expected {SCHEMA})"]
    if isinstance(report.get("device"), dict) and report["device"].get("kind") == "cuda":
        from .cuda import problems as cuda_problems

        return cuda_problems(report)
    if not report.get("loads"):
        return ["the report holds no loads"]
    out = []
    for row in report["loads"]:
        s = row["load"]
        figures = parse(row["lines"])
        if figures != row["figures"]:
            out.append(f"{s['id']}: its figures are not what llama.cpp printed (its raw lines say otherwise)")
            continue
        if not row["context_made"]:
            out.append(f"{s['id']}: no context was made")
            continue
        if s.get("use_mmap", True) != mapped(row["lines"]):
            out.append(f"{s['id']}: the load asked for use_mmap={s.get('use_mmap', True)} but llama.cpp's load mode "
                       f"was {'mmap' if mapped(row['lines']) else 'not mmap'}")
            continue
        p = full_prediction(s, json.loads((CONFIGS / f"{s['model']}.json").read_text()), mapped(row["lines"]))
        want = {k: mib_printed(v) for k, v in p["model"].items()}
        if printed(figures, "model") != want:
            out.append(f"{s['id']}: model buffers: llama.cpp {printed(figures, 'model')}, kvsize {want}")
        if printed(figures, "output") != {"CPU": mib_printed(p["output"])}:
            out.append(f"{s['id']}: output buffer: llama.cpp {printed(figures, 'output')}, kvsize "
                       f"{mib_printed(p['output'])}")
        compute = printed(figures, "compute")
        if set(compute) != {"CPU"}:
            out.append(f"{s['id']}: compute buffers: llama.cpp printed {compute}")
            continue
        err = compute_error(p["compute"], compute["CPU"])
        if not FULL_COMPUTE_BAND[0] <= err <= FULL_COMPUTE_BAND[1]:
            out.append(f"{s['id']}: compute buffer: llama.cpp {compute['CPU']} MiB, kvsize "
                       f"{mib_printed(p['compute'])} MiB ({100 * err:+.1f}%, outside the stated band)")
    return out


def miniature_compute_errors(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The compute-buffer model against every miniature load that made a context: its signed error by load."""
    from .gguf_writer import build

    rows = []
    for row in report["loads"]:
        s, f = row["load"], row["figures"]
        compute = printed(f, "compute")
        if "CPU" not in compute:
            continue
        hp, _ = build(model_profile(s["model"]).config, s["arch"])
        kv = predict_load(bundled_shape(s["model"]), s["n_ctx"], s["n_seq_max"], s["type_k"], s["type_v"],
                          s["flash_attn"], s["kv_unified"], s["n_batch"], s["n_ubatch"])
        cells = max((c.cells for c in kv.caches), default=0)
        heads, k_len = hp["add_head_count"], hp["add_key_length"]
        m = ComputeShape(hp["add_embedding_length"], hp["add_vocab_size"], heads, heads * k_len,
                         hp["add_head_count_kv"] * k_len)
        predicted = compute_buffer_model_bytes(m, kv.n_ctx, cells, s["n_ubatch"], s["flash_attn"], s["type_k"],
                                               s["type_v"])["compute_bytes"]
        rows.append({"id": s["id"], "arch": s["arch"], "flash_attn": s["flash_attn"], "printed_mib": compute["CPU"],
                     "kvsize_mib": mib_printed(predicted), "error": compute_error(predicted, compute["CPU"])})
    return rows

"""`kvsize validate`: recompute every prediction in a measurement report with today's sizing."""

from __future__ import annotations

import json
import sys

from sizing.errors import KvsizeError
from sizing.layers import build_layout
from sizing.plan import Scenario, estimate

from .quant import ERROR_BOUNDS
from .run import REPORT_SCHEMA, model_shape

# Relative tolerances per checked figure; storage must match to the byte.
TOLERANCES = {"storage_bytes": 0.0, "weights_bytes": 0.01, "num_blocks": 0.01}


def _rel(a: float, b: float) -> float:
    return abs(a - b) / max(abs(b), 1)


def check_report(report: dict, tolerance: float | None = None) -> list[str]:
    """Every disagreement beyond tolerance, one line each; empty when the report agrees."""
    if report.get("schema") != REPORT_SCHEMA:
        raise KvsizeError(f"not a kvsize measurement report (schema {report.get('schema')!r}, expected {REPORT_SCHEMA})")
    problems = []
    for p in report.get("allocation", []):
        from .tensors_math import layout_bytes

        _, shape = model_shape(p["model"], p.get("layers"))
        layout = build_layout(shape, p["kv_cache_dtype"], p["kv_cache_dtype"])
        predicted = layout_bytes(layout, p["num_blocks"], p["block_size"])
        tol = TOLERANCES["storage_bytes"] if tolerance is None else tolerance
        if _rel(p["storage_bytes"], predicted) > tol:
            problems.append(f"allocation {p['model']} {p['kv_cache_dtype']}: measured storage {p['storage_bytes']} B, "
                            f"predicted {predicted} B")
    for p in report.get("capacity", []):
        _, shape = model_shape(p["model"], p.get("layers"))
        e = estimate(Scenario(p["model"], shape, "measured", p["total_bytes"], engine="vllm",
                              memory_fraction=p["gpu_memory_utilization"],
                              max_num_batched_tokens=p["max_num_batched_tokens"], max_num_seqs=1, cuda_graph_bytes=0,
                              weights_dtype="bf16", block_size=p["block_size"],
                              max_model_len=p["max_num_batched_tokens"]))
        m = p["measured"]
        for name, predicted in (("weights_bytes", e.breakdown.weights_bytes), ("num_blocks", e.num_blocks)):
            tol = TOLERANCES[name] if tolerance is None else tolerance
            if _rel(predicted, m[name]) > tol:
                problems.append(f"capacity {p['model']} ({p.get('layers') or 'all'} layers): {name} predicted "
                                f"{predicted}, measured {m[name]} ({100 * _rel(predicted, m[name]):.2f}% > "
                                f"{100 * tol:.2f}%)")
        if p["boundary"]["measured_blocks_fit"] is not True:
            problems.append(f"capacity {p['model']}: the measured number of blocks did not fit under the limit")
    for p in report.get("decode", []):
        # Softmax over long contexts amplifies key error (keys carry outlier channels): the output
        # bound is 5x the per-element bound of the format.
        bound = 5 * ERROR_BOUNDS[p["format"]] if tolerance is None else tolerance
        if p["attention_rel_error"] > bound:
            problems.append(f"decode {p['format']} b{p['batch']} ctx{p['context']}: attention error "
                            f"{p['attention_rel_error']:.4f} > bound {bound}")
    return problems


def validate_files(paths: list[str], tolerance: float | None = None) -> int:
    failed = 0
    for path in paths:
        try:
            with open(path) as f:
                report = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise KvsizeError(f"cannot read report {path}: {e}") from None
        problems = check_report(report, tolerance)
        points = sum(len(report.get(k, [])) for k in ("allocation", "capacity", "decode"))
        if problems:
            failed += 1
            for line in problems:
                print(f"{path}: {line}", file=sys.stderr)
        else:
            print(f"{path}: {points} points agree ({report['device']['name']})")
    return 1 if failed else 0

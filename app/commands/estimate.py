"""`kvsize estimate`: one scenario, or one scenario release by release (--vs)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from sizing.errors import KvsizeError

from app.options import _add_scenario_options, launch_scenario
from app.output import _check_out, _csv_text, _emit, _flat, _gib, _label, render_table
from app.provenance import provenance_rows, say, with_provenance_columns


def add_parser(sub) -> None:
    p = sub.add_parser("estimate", help="one scenario",
                       epilog="A vLLM launch may follow '--' as it is: kvsize estimate --gpu h100-sxm -- vllm serve "
                              "MODEL --max-model-len 32768 --enforce-eager, or -- 'LLM(model=\"MODEL\", "
                              "max_model_len=32768)'; its settings are read under vLLM's names.")
    _add_scenario_options(p, model_required=False)
    p.add_argument("--vs", action="append", default=[], metavar="ENGINE",
                   help="the same scenario under another release, side by side (repeatable): --engine vllm@0.25.1 "
                        "--vs vllm@0.26.0 shows each term's change and the mechanism behind it")
    p.add_argument("launch", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="KV format, as the engine spells it: auto, fp8, nvfp4, q8_0, ... (kvsize formats)")
    p.add_argument("--k-cache-dtype", default=None, help="K's format where it differs from V's")
    p.add_argument("--v-cache-dtype", default=None, help="V's format where it differs from K's")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table", help="output form (default table)")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sizing.capacity.estimate import estimate
    from sizing.capacity.record import to_record

    if args.out is not None:
        _check_out(Path(args.out))  # refused before anything is computed or printed
    k = args.k_cache_dtype or args.kv_cache_dtype
    v = args.v_cache_dtype or args.kv_cache_dtype
    scenario = launch_scenario(args, k, v)
    if args.vs:
        return _print_release_comparison(scenario, [args.engine, *args.vs], args.format, args.out, args.gpu)
    result = estimate(scenario)
    record = to_record(result)
    if not result.fits and args.format != "json":
        raise KvsizeError(result.fit_message)
    from sizing.planners.compare import recommend

    record["recommended_format"] = recommend(scenario, args.engine)
    from app.commands.llamacpp_buffers import flat_columns, serve_buffers_of, table_lines

    buffers = serve_buffers_of(scenario, result.k_format, result.v_format)
    if buffers is not None:
        from sizing.engines.llamacpp_quant import buffers_record

        record["llamacpp_buffers"] = buffers_record(buffers)
    if args.format != "table" or args.out is not None:
        # the table on the terminal carries its warnings; a file or JSON/CSV on stdout does not show them there
        for w in result.warnings:
            say(_label(w), w)
    if args.format == "json":
        from sizing.planners.deployment import estimate_deployment

        record["deployment"] = estimate_deployment(result, args.model, args.gpu)
        _emit(json.dumps(record, indent=2) + "\n", args.out, "json")
        if not result.fits:
            # the JSON says so ("fits": false) and is written whole; the run still fails as a non-fit does
            raise KvsizeError(result.fit_message)
    elif args.format == "csv":
        provenance = provenance_rows([scenario.engine], [args.gpu])
        flat = _flat({k: v for k, v in record.items() if k != "llamacpp_buffers"})
        flat.update(flat_columns(record.get("llamacpp_buffers")))
        _emit(_csv_text(with_provenance_columns([flat], provenance)), args.out, "csv")
    else:
        text = render_table(record)
        if buffers is not None:
            text += "\n".join(table_lines(buffers)) + "\n"
        _emit(text, args.out)
    return 0


def _print_release_comparison(scenario, engines: list[str], fmt: str, out: str | None, gpu: str) -> int:
    from sizing.planners.upgrade import compare_releases

    result = compare_releases(scenario, engines)
    rows = []
    for label, value in (
        ("rules", lambda c: c.rules), ("model runner", lambda c: c.estimate.model_runner.upper()),
        ("weights_bytes", lambda c: c.estimate.breakdown.weights_bytes),
        ("activation_bytes", lambda c: c.estimate.breakdown.activation_bytes),
        ("non_torch_bytes", lambda c: c.estimate.breakdown.non_torch_bytes),
        ("cuda_graph_bytes", lambda c: c.estimate.breakdown.cuda_graph_bytes),
        ("kv_budget_bytes", lambda c: c.estimate.printed_kv_budget_bytes),
        ("block_size", lambda c: c.estimate.block_size), ("num_blocks", lambda c: c.estimate.num_blocks),
        ("gpu_kv_cache_size_tokens", lambda c: c.estimate.max_tokens),
        ("pool_tokens_per_group", lambda c: c.pool_tokens),
        ("requests_at_max_model_len", lambda c: c.estimate.max_concurrency),
        ("max_concurrency_ratio", lambda c: round(c.estimate.max_concurrency_ratio, 2)),
        ("started", lambda c: _started(c.engine)),
    ):
        rows.append({"term": label, **{c.engine: value(c) for c in result.columns}})
    if fmt == "json":
        _emit(json.dumps({"releases": [c.engine for c in result.columns], "rows": rows,
                          "changes": list(result.changes)}, indent=2) + "\n", out, "json")
        return 0
    if fmt == "csv":
        _emit(_csv_text(with_provenance_columns(rows, provenance_rows(engines, [gpu]))), out, "csv")
        return 0
    width = max(22, *(len(c.engine) + 2 for c in result.columns))
    lines = [f"{scenario.model_name} on {scenario.gpu_name}, release by release", ""]
    lines.append(f"  {'':<26}" + "".join(f"{c.engine:>{width}}" for c in result.columns))
    for row in rows[1:]:
        cells = []
        for c in result.columns:
            v = row[c.engine]
            cells.append(_gib(v) if row["term"].endswith("_bytes") else
                         (f"{v:,}" if isinstance(v, int) else str(v)))
        lines.append(f"  {row['term']:<26}" + "".join(f"{cell:>{width}}" for cell in cells))
    lines += ["", "  gpu_kv_cache_size_tokens is vLLM's \"GPU KV cache size\" line (0.21+: max concurrency x max_model_len);",
              "  pool_tokens_per_group is what the pool holds (blocks x block size per layer group).", ""]
    lines += [f"  rules: {c.engine} follows {c.rules}" for c in result.columns]
    lines += [f"  evidence: {_evidence(c.engine)}" for c in result.columns if _evidence(c.engine)]
    lines += ["", "What changes:"] + [f"  - {change}" for change in result.changes or ("nothing in the rules kvsize "
                                                                                     "models for this scenario",)]
    _emit("\n".join(lines) + "\n", out)
    return 0


def _evidence(engine_spec: str) -> str:
    """Whether the release was started, and kvsize's figures on its starts (or the nearest started one's)."""
    from sizing.engines import engine_evidence

    evidence = engine_evidence(engine_spec)
    return evidence.sentence() if evidence else ""


def _started(engine_spec: str) -> str:
    from sizing.engines import engine_evidence

    evidence = engine_evidence(engine_spec)
    return "-" if evidence is None else evidence.started_version or "never"

"""`kvsize sweep`: a grid of scenarios to CSV, XLSX or JSON."""

from __future__ import annotations

import argparse
import json
import sys

from sizing.errors import KvsizeError

from app.options import (TOKENS_HELP, _add_scenario_options, _int_or_error, _list, _tokens_or_error,
                         _warn_beyond_positions, scenario_from_args)
from app.output import _checked_outs, _csv_text, _label, _Progress, _write_by_kind
from app.provenance import provenance_rows, say, with_provenance_columns


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="a grid of scenarios to CSV, XLSX or JSON")
    p.add_argument("--models", type=_list, required=True, help="comma-separated model ids or config.json paths")
    p.add_argument("--gpus", type=_list, default=["h100-sxm"], help="comma-separated GPU ids (default h100-sxm)")
    p.add_argument("--engines", type=_list, default=["vllm"],
                   help="comma-separated engines, NAME or NAME@VERSION (default vllm)")
    p.add_argument("--formats", type=_list, default=["auto"], help="comma-separated KV formats (default auto)")
    p.add_argument("--contexts", type=_list, default=["8k", "32k", "128k"],
                   help=f"comma-separated max_model_len values (default 8k,32k,128k; {TOKENS_HELP})")
    p.add_argument("--tp", type=_list, default=["1"], help="comma-separated TP sizes (default 1)")
    _add_scenario_options(p, single=False)
    p.add_argument("--out", action="append", required=True,
                   help="output file: .csv, .xlsx or .json (repeatable: every one is written, or none)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sizing.planners.sweep import SweepGrid, run_sweep

    outs = _checked_outs(args.out, list(args.models))
    kinds = {out.suffix.lower() for out in outs}
    from sizing.cache.formats import get_format

    for name in args.formats:
        get_format(name, option="--formats")  # refuse an unknown format before writing anything
    grid = SweepGrid(
        models=args.models, gpus=args.gpus, engines=args.engines, formats=args.formats,
        contexts=[_tokens_or_error(c) for c in args.contexts],
        tensor_parallel_sizes=[_int_or_error(t, "--tp") for t in args.tp],
    )
    from sizing.planners.sweep import MAX_SWEEP_ROWS, XLSX_MAX_ROWS

    size = grid.size
    limit = XLSX_MAX_ROWS if ".xlsx" in kinds else MAX_SWEEP_ROWS
    if size > limit:
        raise KvsizeError(f"the grid has {size:,} scenarios; a sweep writes at most {limit:,} rows"
                          + (" to an .xlsx sheet (use .csv)" if ".xlsx" in kinds else "") + "; sweep fewer values")
    if any(e.strip().lower().startswith("llamacpp") for e in grid.engines):
        from app.commands.llamacpp_buffers import check_sweep_weights

        check_sweep_weights(args.weights_dtype)
    base = scenario_from_args(args, args.models[0], args.gpus[0], "ideal", 1, None, "auto", "auto")
    from sizing.profiles import load_model

    for model in args.models:
        _warn_beyond_positions(model, load_model(model)[1], grid.contexts)
    from sizing.engines.started import release_evidence
    from sizing.engines import get_engine

    for name in grid.engines:
        # as estimate says it: whether the release these rows follow was started, and what it does not confirm
        engine = get_engine(name.strip())
        evidence = release_evidence(engine.name, engine.version)
        if evidence is not None:
            say(_label(evidence.sentence()), evidence.sentence())
        if engine.release is not None and engine.release.unconfirmed:
            say("warning", f"{engine.release.name} rules: {engine.release.unconfirmed}")
    progress = None if args.no_progress or not sys.stderr.isatty() else _Progress()
    rows = run_sweep(grid, base, progress=progress)
    if not rows:
        raise KvsizeError("the sweep produced no rows")
    provenance = provenance_rows(grid.engines, grid.gpus)
    _write_by_kind(outs, lambda: _csv_text(with_provenance_columns(rows, provenance)),
                   lambda: json.dumps(rows) + "\n", lambda: _sweep_xlsx(rows, grid, base, provenance))
    for out in outs:
        print(f"kvsize: wrote {len(rows):,} rows to {out}", file=sys.stderr)
    return 0


def _sweep_xlsx(rows: list[dict], grid, base, provenance: list[dict]) -> bytes:
    from app.spreadsheet import xlsx_bytes
    from sizing.planners.sweep import NOT_SIZED, sweep_assumptions

    # sized rows apart from the ones an engine cannot run, so every count column holds integers
    sized = [r for r in rows if r["status"] != NOT_SIZED]
    not_sized = [{k: r[k] for k in ("model", "gpu", "engine", "kv_cache_dtype", "tensor_parallel_size",
                                     "max_model_len_tokens", "reason")} for r in rows if r["status"] == NOT_SIZED]
    sheets = {"scenarios": [{k: v for k, v in r.items() if k != "reason"} for r in sized]}
    if not_sized:
        sheets["not sized"] = not_sized
    sheets["assumptions"] = sweep_assumptions(grid, base)
    sheets["provenance"] = provenance
    return xlsx_bytes(sheets)

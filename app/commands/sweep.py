"""`kvsize sweep`: a grid of scenarios to CSV, XLSX or JSON."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sizing.errors import KvsizeError

from app.options import (_add_scenario_options, _int_or_error, _list, _tokens_or_error, _warn_beyond_positions,
                         scenario_from_args)
from app.output import _atomic_write, _csv_text, _Progress


def add_parser(sub) -> None:
    p = sub.add_parser("sweep", help="a grid of scenarios to CSV, XLSX or JSON")
    p.add_argument("--models", type=_list, required=True, help="comma-separated model ids or config.json paths")
    p.add_argument("--gpus", type=_list, default=["h100-sxm"], help="comma-separated GPU ids (default h100-sxm)")
    p.add_argument("--engines", type=_list, default=["vllm"], help="comma-separated engines, NAME or NAME@VERSION (default vllm)")
    p.add_argument("--formats", type=_list, default=["auto"], help="comma-separated KV formats (default auto)")
    p.add_argument("--contexts", type=_list, default=["8k", "32k", "128k"],
                   help="comma-separated max_model_len values (default 8k,32k,128k)")
    p.add_argument("--tp", type=_list, default=["1"], help="comma-separated TP sizes (default 1)")
    _add_scenario_options(p, single=False)
    p.add_argument("--out", required=True, help="output file: .csv, .xlsx or .json")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sizing.planners.sweep import SweepGrid, run_sweep

    out = Path(args.out)
    kind = out.suffix.lower()
    if kind not in (".csv", ".xlsx", ".json"):
        raise KvsizeError(f"--out must end in .csv, .xlsx or .json, got {out.name!r}")
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
    limit = XLSX_MAX_ROWS if kind == ".xlsx" else MAX_SWEEP_ROWS
    if size > limit:
        raise KvsizeError(f"the grid has {size:,} scenarios; a sweep writes at most {limit:,} rows"
                          + (" to an .xlsx sheet (use .csv)" if kind == ".xlsx" else "") + "; sweep fewer values")
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
            print(f"kvsize: warning: {evidence.sentence()}", file=sys.stderr)
        if engine.release is not None and engine.release.unconfirmed:
            print(f"kvsize: warning: {engine.release.name} rules: {engine.release.unconfirmed}", file=sys.stderr)
    progress = None if args.no_progress or not sys.stderr.isatty() else _Progress()
    rows = run_sweep(grid, base, progress=progress)
    if not rows:
        raise KvsizeError("the sweep produced no rows")
    if kind == ".csv":
        _atomic_write(out, _csv_text(rows).encode())
    elif kind == ".json":
        _atomic_write(out, (json.dumps(rows) + "\n").encode())
    else:
        from app.spreadsheet import xlsx_bytes
        from sizing.planners.sweep import sweep_assumptions

        # sized rows apart from the ones an engine cannot run, so every count column holds integers
        sized = [r for r in rows if r["status"] != "n/a"]
        not_sized = [{k: r[k] for k in ("model", "gpu", "engine", "kv_cache_dtype", "tensor_parallel_size",
                                         "max_model_len_tokens", "reason")} for r in rows if r["status"] == "n/a"]
        sheets = {"scenarios": [{k: v for k, v in r.items() if k != "reason"} for r in sized]}
        if not_sized:
            sheets["not sized"] = not_sized
        sheets["assumptions"] = sweep_assumptions(grid, base)
        _atomic_write(out, xlsx_bytes(sheets))
    print(f"kvsize: wrote {len(rows):,} rows to {out}", file=sys.stderr)
    return 0

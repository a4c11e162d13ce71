"""`kvsize compare`: every KV format for one scenario."""

from __future__ import annotations

import argparse
import json

from sizing.errors import KvsizeError

from app.options import _add_scenario_options, _warn_beyond_positions, scenario_from_args
from app.output import _csv_text, _emit


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help="every KV format for one scenario")
    _add_scenario_options(p)
    p.add_argument("--format", choices=["table", "json", "csv"], default="table", help="output form (default table)")
    p.add_argument("--out", default=None)
    p.set_defaults(run=run)


def compare_rows(args: argparse.Namespace) -> list[dict]:
    from sizing.cache.formats import FORMAT_NAMES
    from sizing.planners.compare import compare

    base = scenario_from_args(args, args.model, args.gpu, "ideal", args.tensor_parallel_size,
                              args.max_model_len, "auto", "auto")
    from sizing.engines import get_engine
    from sizing.capacity.scenario import check_tensor_parallel

    check_tensor_parallel(base.shape, base.tensor_parallel_size, get_engine(args.engine))
    rows = compare(base, args.engine, FORMAT_NAMES)
    if args.max_model_len:
        _warn_beyond_positions(args.model, base.shape, [args.max_model_len])
    if rows and all(r["status"].startswith("n/a: ") for r in rows):
        from collections import Counter

        # nothing to compare: say once why most rows could not be sized
        raise KvsizeError(Counter(r["status"] for r in rows).most_common(1)[0][0].removeprefix("n/a: "))
    return rows


def run(args: argparse.Namespace) -> int:
    rows = compare_rows(args)
    buffers = _llamacpp_buffers(args)
    if buffers is not None:
        from app.commands.llamacpp_buffers import flat_columns
        from sizing.engines.llamacpp_quant import buffers_record

        columns = flat_columns(buffers_record(buffers))
        for r in rows:  # the same buffers for every cache type llama.cpp runs (f16 compute copies aside)
            r.update({k: (v if r["engine"] == "llamacpp" else None) for k, v in columns.items()})
    if args.format == "json":
        _emit(json.dumps(rows, indent=2) + "\n", args.out, "json")
    elif args.format == "csv":
        from app.provenance import provenance_rows, with_provenance_columns

        _emit(_csv_text(with_provenance_columns(rows, provenance_rows([args.engine], [args.gpu]))), args.out, "csv")
    else:
        head = f"{'format':<22}{'engine':<10}{'bytes/token':>13}{'metadata':>10}{'vs bf16':>9}" \
               f"{'max tokens':>14}{'max conc.':>11}  status"
        lines = [head]
        for r in rows:
            lines.append(
                f"{r['format']:<22}{r['engine']:<10}{r['kv_bytes_per_token']:>13,}{r['kv_metadata_bytes_per_token']:>10,}"
                f"{r['ratio_to_bf16']:>9.3f}{r['max_tokens']:>14,}{r['max_concurrency']:>11,}  {r['status']}"
                + ("  <- recommended" if r.get("recommended") else "")
            )
        best = next((r for r in rows if r.get("recommended")), None)
        lines.append("")
        lines.append(f"recommended: {best['format']} ({best['max_concurrency']:,} requests at this length; "
                     f"{best['quality']}): the most requests among the near-lossless formats {best['engine']} runs "
                     "on this GPU that fit; smaller formats above need your own evaluation" if best else
                     "recommended: none (no near-lossless format the engine runs on this GPU fits)")
        if buffers is not None:
            from app.commands.llamacpp_buffers import table_lines

            lines += table_lines(buffers)
        _emit("\n".join(lines) + "\n", args.out)
    return 0


def _llamacpp_buffers(args: argparse.Namespace):
    """llama.cpp's buffers beside the cache for the scenario (f16 cache), or None for another engine."""
    from sizing.engines import get_engine

    if get_engine(args.engine).name != "llamacpp":
        return None
    from app.commands.llamacpp_buffers import serve_buffers_of

    base = scenario_from_args(args, args.model, args.gpu, args.engine, args.tensor_parallel_size,
                              args.max_model_len, "fp16", "fp16")
    return serve_buffers_of(base, "fp16", "fp16")

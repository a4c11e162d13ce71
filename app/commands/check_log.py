"""`kvsize check-log`: predict an engine startup log's run and compare, term by term."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.options import _logged_model
from app.output import _gib


def add_parser(sub) -> None:
    p = sub.add_parser("check-log", help="predict a real engine startup log's run and compare, term by term")
    p.add_argument("log", help="a vLLM, SGLang or TensorRT-LLM startup log, or - for standard input")
    p.add_argument("--model", default=None,
                   help="bundled profile id or config.json of the logged model (default: the bundled profile "
                        "whose Hugging Face id the log names)")
    p.add_argument("--gpu", default=None,
                   help="bundled GPU id (kvsize gpus); needed where the log does not print the GPU's total")
    p.add_argument("--weights-dtype", default="auto", help="what the checkpoint stores (auto, bf16, fp8, int8, ...)")
    p.add_argument("--engine-version", default=None,
                   help="the engine's version where the log does not print it (SGLang), e.g. 0.4.9")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output form (default table)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import dataclasses

    from sizing.inputs import read_limited
    from sizing.evidence.logs import MAX_LOG_BYTES, compare_log, log_scenario, read_log
    from sizing.profiles import gpu_profile, load_model
    from sizing.engines.releases import version_key

    text = read_limited(Path(args.log), MAX_LOG_BYTES, "LOG", "an engine startup log (or - for standard input)",
                        stdin_ok=True).decode("utf-8", "replace")
    run = read_log(text)
    if args.engine_version:
        version_key(args.engine_version)  # refuses a malformed version in one line
        run = dataclasses.replace(run, version=args.engine_version)
    name, shape = load_model(_logged_model(args.model, run.model))
    scenario, where = log_scenario(run, name, shape, gpu_profile(args.gpu) if args.gpu else None, args.weights_dtype)
    result = compare_log(run, scenario)
    rows = [dict(term=t, predicted=p, logged=lg, difference=None if lg is None else p - lg,
                 difference_percent=None if not lg else round(100 * (p - lg) / lg, 2)) for t, p, lg in result.rows]
    read = {k: {"value": v, "from": src} for k, (v, src) in where.read.items()}
    assumed = {k: {"value": v, "because": why} for k, (v, why) in where.assumed.items()}
    if args.format == "json":
        print(json.dumps(dict(engine=run.engine, version=run.version, model=run.model, rules=result.rules,
                              read_from_log=read, assumed=assumed, not_modelled=list(where.not_modelled),
                              unknown=list(where.unknown), rows=rows),
                         indent=2, default=str))
        return 0
    print(f"{run.engine} {run.version or '(version not in the log)'} log of {run.model or name}; predicted with "
          f"{result.rules}")
    if read:
        print("  read from the log: " + ", ".join(f"{k}={v} ({src})" for k, (v, src) in where.read.items()))
    if assumed:
        print("  assumed: " + ", ".join(f"{k}={v} ({why})" for k, (v, why) in where.assumed.items()))
    if where.not_modelled:
        print("  warning: the log sets " + ", ".join(where.not_modelled) + ", which move memory kvsize does not model")
    if where.unknown:
        print("  warning: the log sets " + ", ".join(where.unknown) + ", which kvsize does not know: whether they move "
              "memory is not known, and the figures leave them out")
    print(f"  {'term':<22}{'predicted':>18}{'logged':>18}{'difference':>16}")
    for r in rows:
        shown = _gib if r["term"].endswith("_bytes") else "{:,}".format
        fmt = lambda v: "-" if v is None else shown(v)  # noqa: E731
        diff = "-" if r["difference_percent"] is None else f"{r['difference_percent']:+.2f}%"
        print(f"  {r['term']:<22}{fmt(r['predicted']):>18}{fmt(r['logged']):>18}{diff:>16}")
    print("  (the engine prints GiB to two decimals: ±0.005 GiB on every logged figure)")
    print(verdict(rows))
    return 0


def verdict(rows: list[dict]) -> str:
    """One line, as `kvsize verify` ends: the KV budget and the token count held to 1% of what the engine logged."""
    from measure.verify import TOLERANCE

    held = [r for r in rows if r["term"] in ("kv_budget_bytes", "max_tokens") and r["logged"]]
    if not held:
        return "  no verdict: the log prints neither the KV budget nor the tokens in cache"
    off = [f"{r['term']} {r['difference_percent']:+.2f}%" for r in held
           if abs(r["predicted"] / r["logged"] - 1) > TOLERANCE]
    terms = " and ".join(r["term"] for r in held)
    if off:
        return f"  DISAGREES beyond {TOLERANCE:.0%}: " + "; ".join(off)
    return f"  agrees within {TOLERANCE:.0%} ({terms})"

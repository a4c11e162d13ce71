"""`kvsize plan`: a fleet for a workload: GPUs, KV format, TP, speed, cost, serve command."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sizing.errors import KvsizeError

from app.commands.plan_designs import _prices, designs_from_args
from app.options import (_add_scenario_options, _int_or_error, _list, _positive_float, _positive_int, _size,
                         _check_beyond_positions, scenario_from_args)
from app.output import _checked_outs, _csv_text, _write_by_kind
from app.provenance import provenance_rows, say, with_provenance_columns


def add_parser(sub) -> None:
    p = sub.add_parser("plan", help="a fleet for a workload: GPUs, KV format, TP, speed, cost, serve command")
    p.add_argument("--workload", required=True, help="workload file (.yaml, .yml or .json)")
    p.add_argument("--model", required=True, help="bundled profile id, a config.json, or a folder holding one")
    p.add_argument("--gpus", type=_list, default=["h100-sxm", "h200"],
                   help="comma-separated GPU ids to choose from (default h100-sxm,h200)")
    p.add_argument("--engine", default="vllm", help="vllm, sglang, trtllm, lmdeploy, llamacpp or ideal")
    p.add_argument("--formats", type=_list, default=["auto", "fp8_e4m3", "nvfp4"],
                   help="comma-separated KV formats to choose from (default auto,fp8_e4m3,nvfp4)")
    p.add_argument("--tp", type=_list, default=["1", "2", "4", "8"],
                   help="comma-separated TP sizes to choose from (default 1,2,4,8)")
    p.add_argument("--price", default=None, help="USD per GPU-hour overrides, e.g. 'h100-sxm=2.1,h200=3.2'")
    p.add_argument("--kv-efficiency", default=None,
                   help="bandwidth efficiencies, e.g. 'fp8_e4m3=0.7,default=0.75,weights=0.8,mfu=0.5'")
    p.add_argument("--efficiency-report", default=None,
                   help="measurement report whose decode_efficiency replaces the assumed efficiencies")
    p.add_argument("--quality-report", default=None, help="measurement report whose attention errors to show")
    p.add_argument("--out", action="append", default=[], help="write .csv, .xlsx or .json (repeatable)")
    p.add_argument("--top", type=_positive_int, default=12, help="candidates shown in the summary")
    p.add_argument("--itl-target-ms", "--itl-ms", dest="itl_target_ms", type=_positive_float, default=None,
                   help="inter-token latency each replica must keep at the peak (overrides the workload's)")
    p.add_argument("--ttft-ms", type=_positive_float, default=None,
                   help="mean time to first token at the peak (overrides the workload's ttft_target_ms); with a "
                        "TTFT or ITL target, plan also searches aggregated and disaggregated designs")
    p.add_argument("--target-percentile", type=int, choices=(50, 90, 99), default=None,
                   help="percentile of requests at which the TTFT and ITL targets hold (overrides the workload's "
                        "target_percentile; default 50)")
    p.add_argument("--host-memory", type=_size, default=None,
                   help="host DRAM for KV per replica (an offload tier; with the workload's sessions and a target, "
                        "the designs are searched with and without it)")
    p.add_argument("--disk", type=_size, default=None, help="local NVMe for KV per replica (a tier below host memory)")
    p.add_argument("--host-link", default="pcie5-x16", help="link of the host tier (kvsize links; default pcie5-x16)")
    p.add_argument("--disk-link", default="nvme-gen4", help="link of the disk tier (kvsize links; default nvme-gen4)")
    p.add_argument("--pd-link", default="nvlink4-peer",
                   help="link a disaggregated design ships KV over (kvsize links), or none (default nvlink4-peer: "
                        "prefill and decode GPUs in one host)")
    _add_scenario_options(p, single=False)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sizing.planners.answer import answer_record, design_deployment, headline
    from sizing.planners.fleet import plan_record, plan_summary

    outs = _checked_outs(args.out, [getattr(args, "workload", None), getattr(args, "model", None)])
    plan, base, rules, notes = plan_from_args(args)
    designs = designs_from_args(args, plan, base)
    best, chosen = designs["best"], designs["targets"]
    answer = headline(best, chosen)
    record = plan_record(plan, answer_record(best, chosen), designs["serve"], rules, notes, designs)
    record["deployment"] = design_deployment(best, plan, base, args.model)
    rows = record["candidates"]
    provenance = provenance_rows([args.engine], args.gpus) if outs else []

    def xlsx() -> bytes:
        from app.spreadsheet import xlsx_bytes

        summary = plan_summary(plan, record["cheapest"], designs["serve"], [r.explanation for r in rules if r.fires])
        return xlsx_bytes({"summary": summary, "designs": designs["rows"], "frontier": designs["frontier"],
                           "capacity_only": rows, "pools": record["pools"], "cost": record["cost"],
                           "guidance": record["guidance"], "quality": record["quality"], "provenance": provenance})

    _write_by_kind(outs, lambda: _csv_text(with_provenance_columns(rows, provenance)),
                   lambda: json.dumps(record, indent=2) + "\n", xlsx)
    sys.stdout.write(render_plan(plan, rows, rules, notes, answer, args.top))
    sys.stdout.write(designs["text"])
    for out in outs:
        print(f"kvsize: wrote {out}", file=sys.stderr)
    if plan.cheapest is None:
        reasons = list(dict.fromkeys(r["reason"].removeprefix("n/a: ") for r in rows if r.get("reason")))
        more = f" (and {len(reasons) - 3} more, in the table above)" if len(reasons) > 3 else ""
        print("kvsize: error: no candidate serves the workload: " + "; ".join(reasons[:3]) + more, file=sys.stderr)
        return 2
    if best is None:
        print(f"kvsize: error: no design serves the workload under {chosen.sentence()}; loosen the targets, or add "
              "faster GPUs or larger TP sizes (the designs table gives each one's reason)", file=sys.stderr)
        return 1  # a target not met, as against bad input (2)
    return 0


def plan_from_args(args: argparse.Namespace):
    """(fleet plan, base scenario, guidance, quality notes, serve command of the cheapest)."""
    from sizing.planners.fleet import build_candidates, load_draft, plan_fleet, unconfirmed_pairs, unsupported_pairs
    from sizing.cache.formats import get_format
    from sizing.planners.guidance import evaluate_rules, quality_notes
    from sizing.profiles import measured_efficiency
    from sizing.efficiency import efficiency_from_report, quality_section
    from sizing.planners.speed import parse_efficiency_overrides
    from sizing.planners.workload import read_workload

    if args.pipeline_parallel_size != 1:
        raise KvsizeError("plan sizes replicas of TP GPUs; --pipeline-parallel-size is not supported here")
    if args.concurrency != 1:
        raise KvsizeError("plan takes the peak from the workload's peak_concurrency; drop --concurrency")
    workload = read_workload(args.workload)
    if args.itl_target_ms is not None:
        workload = workload.model_copy(update={"itl_target_ms": args.itl_target_ms})
    if args.ttft_ms is not None:
        workload = workload.model_copy(update={"ttft_target_ms": args.ttft_ms})
    if args.target_percentile is not None:
        workload = workload.model_copy(update={"target_percentile": args.target_percentile})
    base = scenario_from_args(args, args.model, args.gpus[0], args.engine, 1, None, "auto", "auto")
    efficiency = measured_efficiency()
    if args.efficiency_report:
        efficiency = efficiency_from_report(_read_report(args.efficiency_report, "--efficiency-report"),
                                            f"--efficiency-report {Path(args.efficiency_report).name}")
    efficiency = parse_efficiency_overrides(args.kv_efficiency, efficiency)
    tps = [_int_or_error(t, "--tp") for t in args.tp]
    _some_tp_splits_the_heads(base, tps, args.engine)
    _check_beyond_positions(args.model, base.shape, [b.max_context_tokens for b in workload.mix()], args.engine)
    formats = [get_format(f, base.shape.serving_dtype, option="--formats").name for f in args.formats]
    distinct = list(dict.fromkeys(formats))
    candidates = build_candidates(args.gpus, distinct, tps, _prices(args.price), args.engine)
    for gpu, fmt, why in unsupported_pairs(args.gpus, distinct, args.engine):
        say("warning", f"{fmt} left out on {gpu}: {why}")
    unconfirmed = unconfirmed_pairs(args.gpus, distinct, args.engine)
    if unconfirmed:
        say("note", "no engine source confirms " + ", ".join(f"{f} on {g}" for g, f in unconfirmed)
            + f" with {args.engine} (kvsize support)")
    plan = plan_fleet(base, candidates, workload, efficiency, load_draft(workload))
    report = quality_section(_read_report(args.quality_report, "--quality-report"),
                             f"--quality-report {Path(args.quality_report).name}") if args.quality_report else None
    notes = quality_notes(formats, base.shape.serving_dtype, report,
                          Path(args.quality_report).name if args.quality_report else None)
    return plan, base, evaluate_rules(workload, engine=args.engine, gpu_ids=tuple(args.gpus)), notes


def _read_report(path: str, option: str) -> dict:
    """A measurement report through the one bounded reader (a few MiB at most; finite numbers of bounded digits, any
    other refused by its field), remembered as one of the run's inputs."""
    from sizing.inputs import load_json, read_limited

    p = Path(path)
    what = "a JSON measurement report (kvsize measure)"
    report = load_json(read_limited(p, MAX_REPORT_BYTES, option, what), f"{option} {p.name}", what,
                       MAX_REPORT_BYTES, finite=True)
    if not isinstance(report, dict):
        raise KvsizeError(f"{option}: {p} holds a JSON {type(report).__name__}, not a measurement report (an object)")
    return report


MAX_REPORT_BYTES = 64 * 1024 * 1024


def _some_tp_splits_the_heads(base, tps: list[int], engine: str) -> None:
    """Refuse up front when no --tp can split the model: no candidate could be sized."""
    from sizing.engines import get_engine
    from sizing.capacity.scenario import check_tensor_parallel

    errors = []
    for tp in tps:
        try:
            check_tensor_parallel(base.shape, tp, get_engine(engine))
            return
        except KvsizeError as e:
            errors.append(e)
    if errors:
        raise errors[0]


def render_plan(plan, rows: list[dict], rules, notes, answer: str, top: int) -> str:
    from sizing.planners.answer import CAPACITY_ONLY
    from sizing.engines import get_engine
    from sizing.planners.deployment import pinned_engine
    from sizing.planners.fleet import HOURS_PER_MONTH

    w = plan.workload
    release = pinned_engine(get_engine(plan.engine))
    engine = plan.engine if release == plan.engine else f"{plan.engine} (release {release})"
    lines = [f"Fleet plan: {plan.model_name} on {engine}, workload {w.name!r}: peak {w.peak_concurrency:,} "
             f"concurrent requests, prefix cache share {w.prefix_cache_share:.0%}"]
    lines.append("  mix: " + ", ".join(f"{b.label} tokens {b.share_percent:g}% of requests (out {b.output_tokens:,})"
                                        for b in w.mix()))
    lines += ["", answer, "", f"Candidates, {CAPACITY_ONLY} (never the answer: the designs below serve prefill too):"]
    head = (f"{'gpu':<11}{'kv format':<20}{'tp':>3}{'gpus':>6}{'req/repl':>9}{'split':>7}{'ITL ms':>9}"
            f"{'tok/s/GPU':>11}{'$/h':>9}{'$/M tok':>9}{'vs bf16':>9}")
    lines.append(head)
    fitting = [r for r in rows if r["fits"]]  # candidate_rows ranks them: cheapest first
    for r in fitting[:top]:
        saving = f"{-r['savings_vs_bf16_percent']:+.0f}%" if r["savings_vs_bf16_percent"] is not None else "-"
        lines.append(f"{r['gpu']:<11}{r['kv_format']:<20}{r['tensor_parallel_size']:>3}{r['gpus']:>6}"
                     f"{r['requests_per_replica']:>9}{r['gpus_per_bucket_pools']:>7}{r['itl_ms']:>9.2f}"
                     f"{r['tokens_per_s_per_gpu']:>11,.0f}{r['fleet_usd_per_hour']:>9.2f}"
                     f"{r['usd_per_million_output_tokens']:>9.3f}{saving:>9}")
    refused = [r for r in rows if not r["fits"]]
    if refused:
        lines.append(f"  ({len(refused)} candidate(s) do not fit or cannot run; see --out for reasons, e.g. "
                     f"{refused[0]['gpu']} {refused[0]['kv_format']} TP {refused[0]['tensor_parallel_size']}: "
                     f"{refused[0]['reason']})")
    target = f"ITL target {w.itl_target_ms:g} ms" if w.itl_target_ms else "no ITL target (--itl-target-ms)"
    lines.append("  gpus: one shared pool; split: one pool per length bucket (capacity only); ITL at the peak batch "
                 f"per replica, no prefill; ranked by fleet $/h that holds the peak's KV, {target}; "
                 f"efficiency: {plan.efficiency.source}")
    lines.append("")
    best = plan.cheapest
    if best:
        c = best.candidate
        lines.append(f"Fewest dollars that hold the peak's KV ({CAPACITY_ONLY}): {best.gpus} × {c.gpu.name} "
                     f"({c.kv_format} KV, TP {c.tensor_parallel_size}) — {best.reason}; ${best.usd_per_hour:,.2f}/h "
                     f"(${best.usd_per_hour * HOURS_PER_MONTH:,.0f} a month of {HOURS_PER_MONTH} h) at "
                     f"${c.gpu.usd_per_hour:g}/GPU-h ({c.gpu.price_source})")
    else:
        lines.append("No candidate fits: try larger TP, more memory per GPU, or a smaller KV format.")
    lines.append("")
    lines.append("Guidance:")
    lines += [f"  - {r.explanation}" for r in rules]
    lines.append("Quality notes:")
    for n in notes:
        measured = (f"; measured attention error {n.measured_attention_error:.1%} ({n.measured_where})"
                    if n.measured_attention_error is not None else "")
        lines.append(f"  - {n.format}: {n.published} [{n.source}]{measured}")
    return "\n".join(lines) + "\n"

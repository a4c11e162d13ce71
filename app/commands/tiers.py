"""`kvsize tiers`: KV tiers below HBM, reload against recompute, prefix hit rates."""

from __future__ import annotations

import argparse
import json
import sys

from sizing.errors import KvsizeError
from sizing.units import GiB

from app.options import _add_scenario_options, _positive_fraction, _size, _tokens, scenario_from_args
from app.output import _checked_outs, _csv_text, _label, _write_by_kind
from app.provenance import say


def add_parser(sub) -> None:
    p = sub.add_parser("tiers", help="KV tiers below HBM: what each holds, reload vs recompute, prefix hit rates")
    p.add_argument("--workload", required=True, help="workload file (.yaml, .yml or .json); its sessions give the reuse")
    _add_scenario_options(p)
    p.add_argument("--kv-cache-dtype", default="auto", help="KV format, as the engine spells it (default auto)")
    p.add_argument("--host-memory", type=_size, default=None,
                   help="host DRAM for KV per replica, e.g. 256GiB (vLLM --kv-offloading-size, summed over TP ranks)")
    p.add_argument("--disk", type=_size, default=None, help="local NVMe for KV per replica, e.g. 2TB")
    p.add_argument("--remote", type=_size, default=None, help="remote/shared KV store per replica, e.g. 10TB")
    for kind, default in (("host", "pcie5-x16"), ("disk", "nvme-gen4"), ("remote", "ethernet-400g")):
        p.add_argument(f"--{kind}-link", default=default, help=f"link of the {kind} tier (kvsize links; default {default})")
    p.add_argument("--session-tokens", type=_tokens, default=32768,
                   help="tokens of one session brought back to HBM in the reload figures (default 32k)")
    p.add_argument("--mfu", type=_positive_fraction, default=None,
                   help="prefill MFU for recomputing, in (0, 1] (default 0.5)")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output form (default table)")
    p.add_argument("--out", action="append", default=[],
                   help="write .xlsx (sheets: tiers, reuse), .csv (the tiers) or .json (repeatable)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from sizing.efficiency import DEFAULT_MFU
    from sizing.planners.tiers import engine_offload_options, tiers_for
    from sizing.planners.workload import read_workload

    outs = _checked_outs(args.out, [getattr(args, "workload", None), getattr(args, "model", None)])
    workload = read_workload(args.workload)
    scenario = scenario_from_args(args, args.model, args.gpu, args.engine, args.tensor_parallel_size,
                                  args.max_model_len, args.kv_cache_dtype, args.kv_cache_dtype)
    sizes = {k: v for k, v in (("host", args.host_memory), ("disk", args.disk), ("remote", args.remote)) if v}
    links = {"host": args.host_link, "disk": args.disk_link, "remote": args.remote_link}
    e, plan = tiers_for(scenario, workload, sizes, links, args.session_tokens,
                        DEFAULT_MFU if args.mfu is None else args.mfu)
    for w in e.warnings:  # the same warnings estimate gives (a format the GPU cannot run, ...)
        say(_label(w), w)
    record = tiers_record(e, plan, workload, engine_offload_options(e.engine.name, sizes.get("host", 0),
                                                                    scenario.tensor_parallel_size))
    tier_rows = record["tiers"]
    reuse_rows = [dict({k: v for k, v in r.items() if k != "hit_by_tier"},
                       **{f"hit_{k}": v for k, v in r["hit_by_tier"].items()}) for r in record["reuse"]]

    def csv() -> str:
        if not tier_rows:
            raise KvsizeError("--out .csv holds the tiers, and none was given (--host-memory, --disk, --remote)")
        return _csv_text(tier_rows)

    def xlsx() -> bytes:
        from app.spreadsheet import xlsx_bytes

        summary = [dict(item=k, value=v, note="") for k, v in record.items() if not isinstance(v, (list, dict))]
        return xlsx_bytes({"summary": summary, "tiers": tier_rows, "reuse": reuse_rows})

    _write_by_kind(outs, csv, lambda: json.dumps(record, indent=2) + "\n", xlsx)
    if args.format == "json":
        sys.stdout.write(json.dumps(record, indent=2) + "\n")
    else:
        sys.stdout.write(render_tiers(record))
    for out in outs:
        print(f"kvsize: wrote {out}", file=sys.stderr)
    return 0


def tiers_record(e, plan, workload, offload_options: str) -> dict:
    return {
        "schema": "kvsize.tiers/1", "model": e.scenario.model_name, "gpu": e.scenario.gpu_name,
        "engine": e.engine.name, "kv_cache_dtype": e.k_format, "tensor_parallel_size": e.scenario.tensor_parallel_size,
        "kv_bytes_per_token_per_gpu": plan.kv_bytes_per_token_per_gpu, "gpus_per_replica": plan.gpus,
        "workload": workload.name, "hbm_reuse_tokens": plan.hbm_reuse_tokens,
        "tiers": [dict(name=t.name, capacity_bytes=t.capacity_bytes, tokens=t.tokens, sessions_warm=t.sessions_warm,
                       reload_seconds=t.reload_seconds, recompute_seconds=t.recompute_seconds,
                       reload_beats_recompute=t.reload_beats_recompute, route=t.route, links=t.links)
                  for t in plan.tiers],
        "reuse": [dict(label=r.label, share_percent=r.share_percent, reused_tokens=r.reused_tokens,
                       hit_rate=r.hit_rate, hit_by_tier=dict(zip(["hbm", *(t.name for t in plan.tiers)], r.hit_by_tier)))
                  for r in plan.reuse],
        "prefill_tokens_per_request": plan.prefill_tokens_per_request,
        "prefill_tokens_saved_per_request": plan.prefill_tokens_saved_per_request,
        "prefill_work_saved": plan.prefill_work_saved,
        "ttft_seconds_no_reuse": plan.ttft_seconds_no_reuse, "ttft_seconds": plan.ttft_seconds,
        "engine_options": offload_options,
    }


def render_tiers(r: dict) -> str:
    lines = [f"KV tiers: {r['model']} on {r['gpu']} ({r['engine']}, {r['kv_cache_dtype']} KV, TP "
             f"{r['tensor_parallel_size']}): {r['kv_bytes_per_token_per_gpu']:,} B per token per GPU, "
             f"workload {r['workload']!r}",
             f"  HBM left for prefixes at the peak: {r['hbm_reuse_tokens']:,} tokens"]
    if r["tiers"]:
        lines.append(f"  {'tier':<8}{'capacity GiB':>13}{'tokens':>15}{'sessions':>10}{'reload ms':>11}"
                     f"{'recompute ms':>14}  faster")
    for t in r["tiers"]:
        lines.append(f"  {t['name']:<8}{t['capacity_bytes'] / GiB:>13,.1f}{t['tokens']:>15,}{t['sessions_warm']:>10,}"
                     f"{t['reload_seconds'] * 1e3:>11.1f}{t['recompute_seconds'] * 1e3:>14.1f}  "
                     f"{'reload' if t['reload_beats_recompute'] else 'recompute'}")
    if r["tiers"]:
        lines.append("  (times for one session of --session-tokens; routes to HBM: " +
                     "; ".join(f"{t['name']} over {t['route']}" for t in r["tiers"]) +
                     "; kvsize links gives each link's figures and source)")
    for x in r["reuse"]:
        where = ", ".join(f"{k} {v:.1%}" for k, v in x["hit_by_tier"].items())
        lines.append(f"  reuse {x['label']!r} ({x['share_percent']:g}% of requests, {x['reused_tokens']:,} tokens): "
                     f"hit {x['hit_rate']:.1%} ({where})")
    if not r["reuse"]:
        lines.append("  the workload has no sessions: give `sessions:` to see hit rates (examples/multi-turn-chat.yaml)")
    lines.append(f"  prefill work saved {r['prefill_work_saved']:.1%}; mean TTFT (prefill) "
                 f"{r['ttft_seconds_no_reuse'] * 1e3:,.1f} ms without reuse, {r['ttft_seconds'] * 1e3:,.1f} ms with it")
    if r["engine_options"]:
        lines.append(f"  engine options for the host tier: {r['engine_options']}")
    return "\n".join(lines) + "\n"

"""`kvsize plan`'s designs: aggregated and disaggregated fleets under the latency targets, and their frontier."""

from __future__ import annotations

import argparse
from pathlib import Path

from sizing.errors import KvsizeError
from sizing.units import GiB

from app.options import _int_or_error

MAX_USD_PER_GPU_HOUR = 1000  # USD per GPU-hour: well above any published rental (profiles/gpus, 2 to 6)


def designs_from_args(args: argparse.Namespace, plan, base) -> dict:
    """Aggregated and disaggregated designs under the targets (given, or kvsize's stated default), the cheapest and
    the frontier: the cheapest is the plan's answer."""
    from dataclasses import replace

    from sizing.planners.fleet import build_candidates
    from sizing.cache.formats import get_format
    from sizing.planners.slo import TierOption, cheapest, design_row, frontier, pd_link, ranked, search_designs

    from sizing.planners.answer import targets_for

    w = plan.workload
    chosen = targets_for(w)
    targets = chosen.targets
    link, shared, same_host = pd_link(args.pd_link)
    from sizing.planners.tiers import check_tier_links

    check_tier_links({"host": args.host_memory or 0, "disk": args.disk or 0},
                     {"host": args.host_link, "disk": args.disk_link})
    formats = list(dict.fromkeys(get_format(f, base.shape.serving_dtype, option="--formats").name for f in args.formats))
    tps = [_int_or_error(t, "--tp") for t in args.tp]
    candidates = build_candidates(args.gpus, formats, tps, _prices(args.price), args.engine)
    from sizing.planners.held import hold_designs

    plain = search_designs(base, candidates, w, plan.efficiency, targets, link, shared, same_host=same_host)
    held = hold_designs(plain, base, w, plan.efficiency, targets)
    found = held.designs
    best = cheapest(found)
    text = render_designs(chosen, best, found, frontier(found), args.pd_link.strip(), args.top, held)
    sizes = {k: v for k, v in (("host", args.host_memory), ("disk", args.disk)) if v}
    commands = []
    if sizes:
        tiered = search_designs(base, candidates, w, plan.efficiency, targets, link, shared, same_host=same_host,
                                tiers=TierOption(sizes, {"host": args.host_link, "disk": args.disk_link}))
        text += render_tier_savings(plain, tiered, sizes)  # both by the queueing model: tiers are not simulated
        best = cheapest(tiered) or best
        found = found + [replace(d, kind=f"{d.kind} + tiers") for d in tiered]
    if best is not None:
        from sizing.planners.slo import design_serve_commands

        commands = design_serve_commands(best, base, w, _hf_id(args.model), sizes.get("host", 0))
        text += "  serve the chosen design:\n" + "".join(
            f"    {role}: {c.command or c.note}\n" for role, c in commands)
        extended = [n for n in (commands[0][1].note.split("; ") if commands else ()) if "rope_scaling" in n]
        if commands and commands[0][1].command and extended:
            text += f"    note: {extended[0]}\n"
    rows = [design_row(d) for d in ranked(found)]
    front = [design_row(d) for d in frontier(found)]
    return {"rows": rows, "frontier": front, "text": text, "met": best is not None, "best": best, "targets": chosen,
            "serve": [dict(role=role, command=c.command, note=c.note) for role, c in commands]}


def render_tier_savings(plain, tiered, sizes: dict) -> str:
    from sizing.planners.slo import cheapest

    size = ", ".join(f"{k} {v / GiB:,.0f} GiB" for k, v in sizes.items())
    hbm_only = cheapest([d for d in plain if d.kind == "aggregated"])
    lines = [f"  with KV tiers per replica ({size}; prefixes found there are reloaded, not prefilled; queueing model "
             "against queueing model, as the serving simulation does not run tiers):"]
    for kind in ("aggregated", "disaggregated"):
        d = cheapest([x for x in tiered if x.kind == kind])
        if d is None:
            lines.append(f"    cheapest {kind}: none meets the targets")
            continue
        fewer = hbm_only.gpus - d.gpus if hbm_only else 0
        saved = "" if not hbm_only else (
            f"; saves {fewer} GPU(s) against HBM-only aggregated serving ({hbm_only.gpus})" if fewer > 0 else
            f"; {-fewer} GPU(s) more than HBM-only aggregated serving ({hbm_only.gpus})" if fewer < 0 else
            f"; as many GPUs as HBM-only aggregated serving ({hbm_only.gpus})")
        lines.append(f"    cheapest {kind}: {d.layout}: {d.gpus} GPUs, ${d.usd_per_hour:,.2f}/h, TTFT "
                     f"{d.ttft_seconds * 1e3:,.0f} ms, ITL {d.itl_seconds * 1e3:.1f} ms{saved}")
    return "\n".join(lines) + "\n"


def render_designs(chosen, best, found, front_designs, link: str, top: int, held=None) -> str:
    from sizing.planners.held import none_of_kind
    from sizing.planners.slo import cheapest, design_row

    front = [design_row(d) for d in front_designs]
    lines = ["", f"Designs that serve prefill and decode at the peak, for {chosen.sentence()} "
                 f"(P/D link: {link}; docs/formulas.md, 'Latency targets' and 'Designs held to the serving "
                 "simulation'):"]
    if held is not None:
        lines.append(f"  held to the serving simulation: {held.simulated} replica(s) run step by step at their share "
                     f"of the peak; {held.skipped} design(s) could not cost less than the cheapest that meets the "
                     "targets" + (f"; {held.unsimulated} left unsimulated, so never chosen" if held.unsimulated
                                  else ""))
    agg = cheapest([d for d in found if d.kind == "aggregated"])
    dis = cheapest([d for d in found if d.kind == "disaggregated"])
    for name, d in (("aggregated", agg), ("disaggregated", dis)):
        if d is None:
            lines.append(f"  cheapest {name}: {none_of_kind(found, name)}")
            continue
        lines.append(f"  cheapest {name}: {d.layout}: {d.gpus} GPUs, ${d.usd_per_hour:,.2f}/h, "
                     f"${d.usd_per_million_output_tokens:,.3f}/M tok, TTFT {d.ttft_seconds * 1e3:,.0f} ms, "
                     f"ITL {d.itl_seconds * 1e3:.1f} ms ({d.reason})")
    if agg and dis:
        fewer = agg.gpus - dis.gpus
        lines.append(f"  disaggregation {'saves' if fewer > 0 else 'costs'} {abs(fewer)} GPU(s) and "
                     f"${abs(agg.usd_per_hour - dis.usd_per_hour):,.2f}/h against aggregated serving")
    if best is not None:
        lines.append(f"  chosen (cheapest per hour at the peak): {best.label}")
        if not any(r["design"] == best.label for r in front):
            lines.append("  (faster designs serve more requests at the same concurrency, so they can cost less per "
                         "token while costing more per hour: the frontier below)")
    lines.append(f"  frontier (cost per million output tokens against ITL and TTFT), {min(top, len(front))} of "
                 f"{len(front)}:")
    for r in front[:top]:
        lines.append(f"    ${r['usd_per_million_output_tokens']:>8.3f}/M tok  ITL {r['itl_ms']:>6.1f} ms  "
                     f"TTFT {r['ttft_ms']:>7,.0f} ms  {r['gpus']:>4} GPUs  {r['design']}")
    return "\n".join(lines) + "\n"


def _hf_id(model: str) -> str:
    """What an engine is started with: the profile's Hugging Face id, or the local folder given."""
    from sizing.profiles import model_ids, model_profile

    if model.lower() in {m.lower() for m in model_ids()}:
        return model_profile(model).hf_id
    path = Path(model)
    return str(path.parent if path.name == "config.json" else path)


def _prices(text: str | None) -> dict[str, float]:
    from sizing.units import parse_assignments

    prices = parse_assignments(text, "--price", "GPU=USD_PER_HOUR", "h100-sxm=2.49")
    for gpu, usd in prices.items():
        # no GPU rents for a thousand times an H100's rate: a larger figure is a typo that only overflows the costs
        if not 0 < usd <= MAX_USD_PER_GPU_HOUR:
            raise KvsizeError(f"--price: {gpu}={usd:g} must be above 0 and at most {MAX_USD_PER_GPU_HOUR:,} "
                              "USD per GPU-hour")
    return prices

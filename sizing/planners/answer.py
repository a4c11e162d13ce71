"""The one fleet answer a buyer acts on: the cheapest design that serves the workload, its prefill and its decode
at the arrival rate its peak implies (sizing/planners/slo.py), under the latency targets given, or under kvsize's
stated default targets where none is given. The capacity-only table, which holds the peak's KV and counts no
prefill, is shown beside it and is never the answer."""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..capacity.scenario import Scenario
from .deployment import estimate_deployment
from .fleet import HOURS_PER_MONTH, FleetPlan, replica_estimate
from .slo import Design, Targets, design_row
from .workload import Workload

# Where no target is given, the answer still has to serve prefill: MLPerf Inference's datacenter server scenario
# for Llama-2-70B bounds TTFT at 2 s and the time per output token at 200 ms (mlcommons.org, "LLM inference v5.0").
DEFAULT_TTFT_SECONDS = 2.0
DEFAULT_ITL_SECONDS = 0.2
DEFAULT_TARGETS_SOURCE = ("kvsize's default: MLPerf Inference's datacenter server bounds for Llama-2-70B "
                          "(TTFT 2 s, time per output token 200 ms)")
CAPACITY_ONLY = "capacity only: holds the peak's KV, prefill not counted"


@dataclass(frozen=True)
class ChosenTargets:
    targets: Targets
    ttft_given: bool  # by the workload or the command line; else kvsize's default
    itl_given: bool
    source: str  # of the given targets

    @property
    def given(self) -> bool:
        return self.ttft_given and self.itl_given

    def sentence(self) -> str:
        t = self.targets
        parts = [(f"TTFT ≤ {t.ttft_seconds * 1e3:,.0f} ms", self.ttft_given),
                 (f"ITL ≤ {t.itl_seconds * 1e3:,.0f} ms", self.itl_given)]
        given = [p for p, g in parts if g]
        defaulted = [p for p, g in parts if not g]
        out = f"{' and '.join(given)} ({self.source})" if given else ""
        out = f"p{t.percentile} of requests: " + out if out else f"p{t.percentile} of requests"
        if defaulted:
            out += ("; " if out else "") + (
                f"{' and '.join(defaulted)} by {DEFAULT_TARGETS_SOURCE}, as no target was given for "
                f"{'it' if len(defaulted) == 1 else 'them'} (set ttft_target_ms and itl_target_ms in the workload, "
                "or --ttft-ms and --itl-ms)")
        return out


def targets_for(workload: Workload, source: str = "the workload's targets") -> ChosenTargets:
    """The workload's targets (a command line's override is already in it); a target not given takes the stated
    default, so the answer never rests on an unbounded TTFT or ITL."""
    ttft, itl = workload.ttft_target_ms, workload.itl_target_ms
    targets = Targets(ttft / 1000 if ttft else DEFAULT_TTFT_SECONDS, itl / 1000 if itl else DEFAULT_ITL_SECONDS,
                      workload.target_percentile)
    return ChosenTargets(targets, bool(ttft), bool(itl), source)


def headline(design: Design | None, chosen: ChosenTargets) -> str:
    """The answer in one line: the fleet that serves the workload, or why none does."""
    if design is None:
        return f"Fleet that serves the workload: none meets {chosen.sentence()}"
    return (f"Fleet that serves the workload: {design.gpus} GPUs, ${design.usd_per_hour:,.2f}/h "
            f"(${design.usd_per_hour * HOURS_PER_MONTH:,.0f} a month of {HOURS_PER_MONTH} h): {design.label}; "
            f"p{chosen.targets.percentile} TTFT {design.ttft_seconds * 1e3:,.0f} ms, ITL "
            f"{design.itl_seconds * 1e3:.1f} ms at {design.requests_per_second:,.2f} requests/s ({design.basis}"
            f"{'; ' + design.speed_source if design.speed_source else ''}); "
            f"targets: {chosen.sentence()}")


def answer_record(design: Design | None, chosen: ChosenTargets) -> dict:
    """The plan JSON's `cheapest`: the chosen design as plain values, with the targets it was chosen under."""
    t = chosen.targets
    targets = dict(ttft_ms=t.ttft_seconds * 1e3, itl_ms=t.itl_seconds * 1e3, percentile=t.percentile,
                   ttft_given=chosen.ttft_given,
                   itl_given=chosen.itl_given, source=chosen.sentence())
    if design is None:
        return dict(design=None, targets=targets, reason=f"no design meets {chosen.sentence()}")
    row = design_row(design)
    row["usd_per_month"] = round(design.usd_per_hour * HOURS_PER_MONTH)
    return row | dict(targets=targets)


def design_deployment(design: Design | None, plan: FleetPlan, base: Scenario, model: str) -> dict | None:
    """One decode (or aggregated) replica of the chosen design, as `kvsize watch --plan` reads it: the requests it
    holds are the peak shared by the design's decode replicas, at the mix's longest context."""
    if design is None:
        return None
    sized = next((p for p in plan.plans if p.candidate == design.decode and p.fits and p.shared is not None), None)
    if sized is None:
        return None
    requests = math.ceil(plan.workload.peak_concurrency / max(1, design.decode_replicas))
    return estimate_deployment(replica_estimate(base, sized), model, design.decode.gpu.id, requests,
                               sized.shared.requests_per_replica)

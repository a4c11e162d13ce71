"""The serving simulation's terms of the engine's Triton attention kernels that are fitted last, every other term
fixed (scripts/fit_serving_terms.py calls them): the pace of one program's KV read, on the one-request points whose
decode is that pace, and the share of the prefill FLOP rate the per-token-head formats' prompt attention reaches.
Each searches a grid by halving its bracket: the squared relative error of the simulated against the measured
figures falls and then rises along it."""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.steps import LEAST_STEPS, climbs  # noqa: E402
from sizing.evidence.serving import point_replica, predict_point, served_settings  # noqa: E402

# the prompt attention of the formats the format traces read: their servers' closed-loop points of 8,000 tokens and
# more, where the prompt's attention is a large part of the first token's time (a 32,000-token prompt's attention is
# half its FLOPs); the 1,000-token points' first tokens carry the engine compiling its packed-attention kernel on the
# first requests (a JIT warning in the server's log) and little attention
PREFILL_ATTENTION_TERM = "engine_prefill_attention_share"
PREFILL_ATTENTION_LEAST_TOKENS = 8000
SHARE_GRID = [round(0.001 * k, 3) for k in range(1, 1001)]  # 0.001-1.000

# the program pace: batch b22's one request in flight on five models in int8_per_token_head (2 to 8 KV heads, 4 to
# 8 query heads a KV head) at prompts of 8,000 and 32,000 tokens, where each decode step splits the request's cache
# into 16 segments and 32-128 programs read 500-2,000 tokens each: far from the HBM rate, the step is the programs'
# pace; the 2,000-token points, whose segments are 125 tokens, stay out to judge it. Batch b25 did the same for
# int4_per_token_head (Qwen2.5-7B-Instruct and Llama-3.1-8B at 8,000 and 32,000 tokens)
PACE_TERM = "engine_program_pace_tokens_per_s"
PACE_BATCHES = ("b22-prompt-tiles", "b25-int4-pace")
PACE_LEAST_TOKENS = 8000
PACE_GRID = [round(1e5 * k) for k in range(10, 1001)]  # 1 to 100 tokens a microsecond, 0.1 apart
UNBOUND_PACE = float(PACE_GRID[-1])  # a pace no step reaches: the read is bound by everything else
PROGRAMS_PER_SM = range(1, 9)
# counts whose squared errors lie within this share of the least are the fit's tie: re-assigning a few steps to the
# point they ran in (measure.steps.point_windows, cut at the load generator's exit) moved int8_per_token_head's split
# read from 4 and 6 an SM 0.005% apart to 0.19% apart, so differences of that size are the traces' noise
SM_ERROR_TIE = 0.01
# per grid, the formats whose programs sharing an SM a ramp of steps has shown. int8_per_token_head's decode steps
# climb where its segments need another round of 4 an SM and where the launched grid puts a third whole-cache program
# on one (b18's, b21's and b23's Qwen2.5 ramps, out of the fit, and b24's, predicted); int4_per_token_head's segments
# where b26's ramp climbed (8 -> 9 and 16 -> 17 requests: rounds of 4 an SM), and its whole-cache steps at 40 -> 41
# (a third program on an SM), which only a pace of one program alone fitted beside the pair places: fitted first on
# steady steps where three share an SM, that pace is no faster than the SM's rate shared among three
SM_SHARE_FORMATS = {"split": ("int4_per_token_head", "int8_per_token_head"),
                    "whole": ("int4_per_token_head", "int8_per_token_head")}


def settings_format(settings: dict) -> str:
    """The KV format kvsize resolves for a server's settings."""
    return point_replica(settings, ROOT)[0].kv_format


def _least_on_grid(grid: list, error: Callable[[int], float]):
    lo, hi = 0, len(grid) - 1
    while hi - lo > 2:
        a, b = lo + (hi - lo) // 3, hi - (hi - lo) // 3
        lo, hi = (lo, b) if error(a) <= error(b) else (a, hi)
    return grid[min(range(lo, hi + 1), key=error)]


def _squared_error(points: list[dict], terms: dict, figure: str) -> float:
    """The squared relative error of the simulated median `figure` ("ttft" or "itl") of `points` under `terms`
    against the measured one."""
    return sum((getattr(predict_point(served_settings(p), ROOT, terms=terms), f"{figure}_ms")[50]
                / p["measured"][f"{figure}_p50_ms"] - 1) ** 2 for p in points)


def _by_format(points: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for p in points:
        out.setdefault(settings_format(p["settings"]), []).append(p)
    return out


def prefill_attention_fitted_on(points: list[dict], servers: tuple[str, ...]) -> list[dict]:
    return [p for p in points if p["server"] in servers and p["settings"]["loop"] == "closed"
            and p["settings"]["input_len"] >= PREFILL_ATTENTION_LEAST_TOKENS]


def fit_prefill_attention(points: list[dict], terms: dict, servers: tuple[str, ...]) -> dict[str, float]:
    """Per format of `servers`, the share of the prefill FLOP rate its prompt attention reaches, every other term
    fixed: the value on SHARE_GRID whose simulated median TTFTs leave the least squared relative error against the
    measured ones."""
    shares = {}
    for fmt, own in sorted(_by_format(prefill_attention_fitted_on(points, servers)).items()):
        @cache
        def error(k: int, fmt=fmt, own=own) -> float:
            return _squared_error(own, {**terms, PREFILL_ATTENTION_TERM: {fmt: SHARE_GRID[k]}}, "ttft")
        shares[fmt] = _least_on_grid(SHARE_GRID, error)
    return shares


def pace_fitted_on(points: list[dict]) -> list[dict]:
    return [p for p in points if p["batch"] in PACE_BATCHES and p["settings"]["loop"] == "closed"
            and p["settings"]["concurrency"] == 1 and p["settings"]["input_len"] >= PACE_LEAST_TOKENS]


def fit_program_pace(points: list[dict], terms: dict, trace_rows: Callable[[dict], list[dict]],
                     request_term: str, ramp_rows: Callable[[dict], list[dict]] = lambda trial: []
                     ) -> dict[str, dict[str, float]]:
    """Per format, the cached tokens a program reads a second, every other term fixed, each the value on PACE_GRID
    leaving the least squared relative error: a segment's (the split cache), with its cost each layer, against the
    measured median inter-token gaps of its one-request points (fit_split_alone); then a whole request's
    against the median periods of the decode-only step groups `trace_rows` gives (the format traces', each group
    counted once a step), the split pace fixed. `ramp_rows`: the groups of every count of the ramps among them,
    where a format's SM edges show (_fit_sm_share)."""
    paces = {}
    for fmt, own in sorted(_by_format(pace_fitted_on(points)).items()):
        alone = fit_split_alone(fmt, own, terms)
        whole, _ = _rate_on_grid(fmt, lambda v: {**terms, PACE_TERM: {fmt: {**alone, "whole": v}}}, trace_rows,
                                 request_term)
        pace = {"whole": whole, **alone}
        for grid in ("split", "whole"):
            if fmt in SM_SHARE_FORMATS[grid]:
                pace.update(_fit_sm_share(fmt, pace, grid, terms, trace_rows, request_term, ramp_rows))
        paces[fmt] = pace
    return paces


def paced_split_shares(points: list[dict], terms: dict) -> dict[str, float]:
    """`terms`' engine_split_kv_efficiency with each format whose pace is fitted (pace_fitted_on) at its whole
    cache's share: the split share was fitted on the format traces before any pace, so it took in the time the
    programs' pace and rounds now give (int4_per_token_head 0.065 against 0.116 whole); fitted again beside them, no
    trace step is bound by it (the squared error is flat from 0.08 up), and the bytes of a split read are the same
    bytes over the same HBM as a whole-cache read's."""
    paced = {settings_format(p["settings"]) for p in pace_fitted_on(points)}
    return {f: terms["engine_kv_efficiency"][f] if f in paced else share
            for f, share in terms["engine_split_kv_efficiency"].items()}


def fit_split_alone(fmt: str, own: list[dict], terms: dict) -> dict[str, float]:
    """A split program's pace alone and the seconds its read costs each KV layer beside it ("split", and
    "split_layer_s" where above zero), every other term fixed: the pair leaving the least squared relative error of
    the simulated median inter-token gaps of the one-request points `own` against the measured ones, the whole cache's
    pace unbound. One request's step reads its segments in one round, so its gap is linear in both, base + tokens /
    pace + layers x seconds: three simulations a point give the three, least squares the pair (the seconds held at
    zero where they would come out below it), the pace then put on PACE_GRID and the seconds to 0.1 us."""

    def gaps(split: float, layer_s: float) -> list[float]:
        trial = {**terms, PACE_TERM: {fmt: {"whole": UNBOUND_PACE, "split": split, "split_layer_s": layer_s}}}
        return [predict_point(served_settings(p), ROOT, terms=trial).itl_ms[50] for p in own]
    slow, fast, probe = 5e6, 10e6, 5e-5
    at_slow, at_fast, probed = gaps(slow, 0.0), gaps(fast, 0.0), gaps(slow, probe)
    rows = []
    for p, a, b, c in zip(own, at_slow, at_fast, probed):
        measured = p["measured"]["itl_p50_ms"]
        tokens = (a - b) / (1 / slow - 1 / fast)  # ms a token a second of pace
        rows.append(((a - tokens / slow) / measured - 1, tokens / measured, (c - a) / probe / measured))
    xx, yy, xy = (sum(r[i] * r[j] for r in rows) for i, j in ((1, 1), (2, 2), (1, 2)))
    cx, cy = (sum(r[0] * r[i] for r in rows) for i in (1, 2))
    det = xx * yy - xy * xy
    inverse, layer_s = (-(cx * yy - cy * xy) / det, -(cy * xx - cx * xy) / det) if det else (0.0, 0.0)
    if layer_s <= 0:
        inverse, layer_s = -cx / xx, 0.0
    split = float(min(PACE_GRID, key=lambda v: abs(v - 1 / inverse)))
    layer_s = round(layer_s, 7)
    return {"split": split, **({"split_layer_s": layer_s} if layer_s > 0 else {})}


def _trace_error(fmt: str, trial: dict, trace_rows: Callable[[dict], list[dict]], request_term: str) -> float:
    """The squared relative error of `fmt`'s decode-only step groups (`trace_rows` under `trial`), each counted once
    a step."""
    return sum(r["steps"] * ((r["base"] + r["kv"] + trial[request_term] * r["decoding"]) / r["measured"] - 1) ** 2
               for r in trace_rows(trial) if r["format"] == fmt)


def _fit_sm_share(fmt: str, pace: dict, grid: str, terms: dict, trace_rows: Callable[[dict], list[dict]],
                  request_term: str, ramp_rows: Callable[[dict], list[dict]]) -> dict:
    """`grid`'s ("split": segment, "whole": whole-cache) programs an SM holds at once and the cached tokens an SM
    reads a second across them (fit_sm_pair), the rest of `fmt`'s pace fixed; the whole cache's with its pace alone
    refitted beside them (fit_sm_pair's `alone`): that pace was fitted on steps where as many programs share an SM
    as the pair now binds, so it is then known only where fewer do."""
    count, rate = f"{grid}_programs_per_sm", f"{grid}_sm"
    if grid == "whole":
        per_sm, value, alone = fit_sm_pair(
            fmt, lambda k, r, a: {**terms, PACE_TERM: {fmt: {**pace, grid: a, count: k, rate: r}}},
            trace_rows, ramp_rows, request_term, alone=True)
        return {grid: alone, count: per_sm, rate: value}
    per_sm, value = fit_sm_pair(fmt, lambda k, r: {**terms, PACE_TERM: {fmt: {**pace, count: k, rate: r}}},
                                trace_rows, ramp_rows, request_term)
    return {count: per_sm, rate: value}


def _rate_on_grid(fmt: str, trial: Callable[[float], dict], trace_rows: Callable[[dict], list[dict]],
                  request_term: str) -> tuple[float, float]:
    """(value, squared error) of the rate on PACE_GRID that `trial(rate)` leaves the least squared relative error of
    `fmt`'s step groups `trace_rows` gives under."""
    @cache
    def error(k: int) -> float:
        return _trace_error(fmt, trial(float(PACE_GRID[k])), trace_rows, request_term)
    value = _least_on_grid(PACE_GRID, error)
    return float(value), error(PACE_GRID.index(value))


def fit_sm_pair(fmt: str, trial_at: Callable[..., dict], trace_rows: Callable[[dict], list[dict]],
                ramp_rows: Callable[[dict], list[dict]], request_term: str, alone: bool = False) -> tuple:
    """(programs an SM holds at once on PROGRAMS_PER_SM, cached tokens an SM reads a second across them on
    PACE_GRID), the terms `trial_at(count, rate)` gives. For each count, the rate leaving the least squared relative
    error of the step groups `trace_rows` gives (each counted once a step). With `alone`, `trial_at(count, rate,
    pace)` also takes the pace of one program alone, and the answer ends with it: for each count the SM's rate with
    that pace unbound, then the pace, then the rate again, each on PACE_GRID. The count: where `ramp_rows` holds
    ramps of `fmt`, the count whose simulated steps climb where the ramps' measured ones do, missing as few climbs
    as any count (a count sets where a step needs another round or another program on an SM, which a ramp shows
    count by count and squared errors barely see), of those the one whose pair leaves the least squared error; else
    the count whose pair leaves the least squared error; either way, of counts within SM_ERROR_TIE of that least
    error, the fewest programs (a count above every climb the ramps reached is not shown by them)."""
    fits: dict[int, tuple[tuple[float, ...], float]] = {}
    for per_sm in PROGRAMS_PER_SM:
        if not alone:
            value, error = _rate_on_grid(fmt, lambda r, k=per_sm: trial_at(k, r), trace_rows, request_term)
            fits[per_sm] = ((value,), error)
            continue
        rate, _ = _rate_on_grid(fmt, lambda r, k=per_sm: trial_at(k, r, UNBOUND_PACE), trace_rows, request_term)
        pace, _ = _rate_on_grid(fmt, lambda a, k=per_sm, r=rate: trial_at(k, r, a), trace_rows, request_term)
        rate, error = _rate_on_grid(fmt, lambda r, k=per_sm, a=pace: trial_at(k, r, a), trace_rows, request_term)
        fits[per_sm] = ((rate, pace), error)

    def missed_climbs(per_sm: int) -> int | None:
        """The counts where the ramps' measured step climbs (measure.steps.climbs) and the simulated one does not,
        or the other way round; None without a ramp of `fmt`."""
        trial = trial_at(per_sm, *fits[per_sm][0])
        rows = sorted((dict(point=r["point"], decoding=r["decoding"], measured=r["measured"],
                            simulated=r["base"] + r["kv"] + trial[request_term] * r["decoding"])
                       for r in ramp_rows(trial) if r["format"] == fmt), key=lambda r: (r["point"], r["decoding"]))
        if not rows:
            return None
        measured, simulated = ({(b["point"], b["decoding"]) for b, _ in climbs(rows, key=key)}
                               for key in ("measured", "simulated"))
        return len(measured ^ simulated)
    missed = {}
    for per_sm in fits:  # the first count tells whether there is a ramp at all
        missed[per_sm] = missed_climbs(per_sm)
        if missed[per_sm] is None:
            break
    candidates = list(fits) if None in missed.values() else [k for k in fits if missed[k] == min(missed.values())]
    least = min(fits[k][1] for k in candidates)
    # squared errors this close do not tell counts apart (int8_per_token_head's split read: 4 and 6 an SM within
    # 0.2% of each other, while its ramps out of the fit climb where rounds of 4 end): the fewest programs of them
    per_sm = min(k for k in candidates if fits[k][1] <= least * (1 + SM_ERROR_TIE))
    return (per_sm, *fits[per_sm][0])


def fit_query_group_sm(terms: dict, group_rows: Callable[[dict, int], list[dict]],
                       request_term: str) -> dict[str, dict[int, dict]]:
    """`terms`' engine_query_group_waves with, per format whose whole-cache programs share an SM (SM_SHARE_FORMATS)
    and count of query heads a KV head it holds, the programs that build's SM holds at once and the SM's rate across
    them (fit_sm_pair), every other term fixed: the rate on the decode-only groups of the traces its waves were
    fitted on (`group_rows(trial, least)`: groups of `least` steps or more), the count where their ramps climb (a
    closed loop passes through every count of requests)."""
    out = {f: dict(groups) for f, groups in terms["engine_query_group_waves"].items()}
    for f, groups in out.items():
        if f not in SM_SHARE_FORMATS["whole"]:
            continue
        for q, waves in groups.items():
            def trial_at(k: int, rate: float, f=f, q=q, waves=waves) -> dict:
                return {**terms, "engine_query_group_waves": {**out, f: {**out[f], q: {
                    **waves, "whole_programs_per_sm": k, "whole_sm": rate}}}}

            def rows(trial: dict, least: int = LEAST_STEPS, q=q) -> list[dict]:
                return [r for r in group_rows(trial, least) if r["queries_per_kv"] == q]
            k, rate = fit_sm_pair(f, trial_at, rows, lambda trial: rows(trial, 1), request_term)
            groups[q] = {**waves, "whole_programs_per_sm": k, "whole_sm": rate}
    return out

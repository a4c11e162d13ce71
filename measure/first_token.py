"""The first token's way out, request by request, read off the committed step traces (benchmarks/first_token_way.py
prints it; docs/first-token-way.md).

Every prompt of a point has the same length and the engine finishes a prompt's chunks before it starts the next's,
so the prompt tokens the trace's steps scheduled are the point's prompts end to end, in the order the engine took
them: the client's send times give that order (first come, first served). A request's first token is sampled by the
step that prefilled its prompt's last token. Against that step's update (its own) and the next step's, the client's
arrival of the first token (send time plus TTFT) says which update let it out and what came after.

The two clocks differ (the client's monotonic one, the trace's wall clock) by a constant on one host. A server's
requests alone on the engine at the same prompt length tie them: what a loaded request's first token spends past its
update beyond what a lone one's does is the load's part, on whichever side of the engine core it falls. A point whose
prompt tokens are not its prompts end to end (a preempted request prefilled again) is left out.
"""

from __future__ import annotations

import statistics
from collections import Counter

from .serving import percentile, read_bench
from .steps import point_windows, server_folder, server_trace


def first_token_matches(steps: list, sent_s: list[float], ttfts_s: list[float], prompt_len: int) -> list[dict] | None:
    """Per request (in send order) whose prompt the steps prefilled: the index of its first and last prompt steps in
    `steps` (the point's steps, in order), the client's first-token arrival on its clock, and the first tokens the
    same step sampled. None where the steps' prompt tokens are not the requests' prompts end to end."""
    order = sorted(range(len(sent_s)), key=sent_s.__getitem__)
    firsts, lasts, done = {}, {}, 0
    for i, step in enumerate(steps):
        start, done = done, done + step.prompt_tokens
        for k in range(start // prompt_len, -(-done // prompt_len)):
            firsts.setdefault(k, i)
        for k in range(start // prompt_len, done // prompt_len):
            lasts[k] = i
    if done != len(sent_s) * prompt_len:
        return None
    out = []
    for k, j in enumerate(order):
        if k in lasts and lasts[k] + 1 < len(steps):
            out.append(dict(request=j, first_step=firsts[k], last_step=lasts[k], arrival_s=sent_s[j] + ttfts_s[j]))
    sampled = Counter(row["last_step"] for row in out)
    for row in out:
        row["same_step_firsts"] = sampled[row["last_step"]]
    return out


def _update_end(step) -> float:
    return step.updated_at + step.update_s


def _point_matches(server: dict):
    """(point, its load generator's result, its steps, first_token_matches) of each point of the server whose
    requests the steps' prompt tokens match."""
    steps = server_trace(server)
    for t0, t1, point in point_windows(server):
        bench = read_bench(server_folder(server) / f"{point['id']}.json.gz")
        if bench.failed or not bench.start_times or len(bench.start_times) != len(bench.ttfts):
            continue
        window = [s for s in steps if t0 <= s.scheduled_at <= t1]
        matches = first_token_matches(window, bench.start_times, bench.ttfts, point["input_len"])
        if matches:
            yield point, bench, window, matches


def _way_in_s(window: list, bench, match: dict) -> float:
    """A matched request's time from its send (the client's clock) to the schedule() of its first prompt step (the
    trace's): its way in and its wait in the engine's queue, on the two clocks' offset."""
    return window[match["first_step"]].scheduled_at - bench.start_times[match["request"]]


def request_rows(server: dict) -> list[dict]:
    """Per matched request of the server's points: the point, its load, its prompt, the client's first-token arrival
    less its own step's update end and less the next step's (`own_s`, `next_s`, on the two clocks' offset), the
    requests decoding in its own step and the first tokens that step sampled."""
    rows = []
    for point, bench, window, matches in _point_matches(server):
        for m in matches:
            own, following = window[m["last_step"]], window[m["last_step"] + 1]
            rows.append(dict(point=point["id"], concurrency=point.get("concurrency"),
                             request_rate=point.get("request_rate"), prompt=point["input_len"],
                             own_s=m["arrival_s"] - _update_end(own), next_s=m["arrival_s"] - _update_end(following),
                             decoding=own.decoding, same_step_firsts=m["same_step_firsts"]))
    return rows


def _spread(values: list[float]) -> float:
    """The middle 80%'s width: the 90th percentile less the 10th, as the load generator computes percentiles."""
    return percentile(values, 90) - percentile(values, 10)


def way_out_rows(server: dict, first_token_s_per_prompt_token: float, api_s_per_token: float) -> list[dict]:
    """Per loaded point of the server with requests alone at its prompt length: the requests matched, the median
    first-token time past the own step's update beyond the lone requests' (`own_extra_ms`) and the middle 80%'s
    width of that time past the own update and past the next one (`own_spread_ms`, `next_spread_ms`); and what the
    API server's handling of the step's outputs would add (`outputs_ms`: the requests decoding in that step, a token
    each at `api_s_per_token`, and the other first tokens sampled with it, each its prompt's tokens at
    `first_token_s_per_prompt_token`, shared among the API servers), the median over the requests."""
    rows = request_rows(server)
    lone = {}
    for r in rows:
        if r["concurrency"] == 1:
            lone.setdefault(r["prompt"], []).append(r["own_s"])
    api = server.get("api_server_count") or 1
    out = []
    for point in dict.fromkeys(r["point"] for r in rows if r["concurrency"] != 1):
        part = [r for r in rows if r["point"] == point]
        if part[0]["prompt"] not in lone:
            continue
        base = statistics.median(lone[part[0]["prompt"]])
        outputs = [(r["decoding"] * api_s_per_token
                    + (r["same_step_firsts"] - 1) * r["prompt"] * first_token_s_per_prompt_token) / api for r in part]
        out.append(dict(point=point, requests=len(part),
                        own_extra_ms=1e3 * (statistics.median(r["own_s"] for r in part) - base),
                        own_spread_ms=1e3 * _spread([r["own_s"] for r in part]),
                        next_spread_ms=1e3 * _spread([r["next_s"] for r in part]),
                        outputs_ms=1e3 * statistics.median(outputs)))
    return out


def burst_rows(server: dict) -> list[dict]:
    """Per closed loop of more than one request in flight the server ran under one API server (its opening requests
    sent together) with requests alone at the same prompt length: the requests sent together and the wait of the
    first of them from its send to the schedule() of the step that took it, beyond a request alone's (the median over
    the server's requests alone; the two clocks' offset cancels). One API server's loop reads and checks the requests
    that reached it before it hands the first to the engine (sizing/planners/front_end.py)."""
    if (server.get("api_server_count") or 1) != 1:
        return []
    matched = list(_point_matches(server))
    lone = {}
    for point, bench, window, matches in matched:
        if point.get("concurrency") == 1:
            lone.setdefault(point["input_len"], []).extend(_way_in_s(window, bench, m) for m in matches)
    rows = []
    for point, bench, window, matches in matched:
        together = point.get("concurrency") or 0
        if together < 2 or point["input_len"] not in lone:
            continue
        first = min(matches, key=lambda m: bench.start_times[m["request"]])
        rows.append(dict(point=point["id"], together=min(together, len(bench.start_times)), prompt=point["input_len"],
                         extra_s=_way_in_s(window, bench, first) - statistics.median(lone[point["input_len"]])))
    return rows

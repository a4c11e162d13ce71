"""The committed step traces (measure/step_trace.py's lines, kept beside a serving batch's points as steps.tsv.gz)
grouped for the simulation's step to be held to them: decode-only steps by the requests decoding, steps with prompt
chunks by their prompt tokens, each group's measured step beside the simulated one (benchmarks/step_trace.py prints
them; scripts/fit_serving_terms.py fits the engine's KV read share per format and each request's cost a step on
the decode-only ones, decode_groups).

A decoding request's cached tokens are taken as its prompt plus half its output (the steady state of fixed lengths),
the only figure the trace does not hold. The trace is read here, apart from measure/step_trace.py, which vLLM loads on
the GPU machine on its own.
"""

from __future__ import annotations

import statistics
from dataclasses import replace
from pathlib import Path

from sizing.evidence.serving import point_replica

from .serving import ROOT, SERVING, ServingError, load_points, read_bench, read_gzip, read_json

DECODING_BINS = (1, 16, 32, 64, 96, 128, 160, 192, 256, 320, 512)
PROMPT_BINS = (1, 256, 1024, 2048, 4096, 8193)
LEAST_STEPS = 20  # a group of fewer steps is not shown
LONGEST_S = 0.25  # a longer period is the engine waiting for work, not a step
# the --kv-cache-dtype values whose prompt attention vLLM runs in FlashAttention's kernels (the per-token-head integer
# formats run theirs in Triton kernels, launched from Python more slowly)
FLASH_KV_CACHE_DTYPES = ("auto", "bf16", "fp8", "fp8_e4m3")


def server_folder(server: dict) -> Path:
    """Where a planned server's files are kept: its batch's folder, then its tag."""
    return SERVING / server["batch"] / server["tag"]


def server_trace(server: dict) -> list:
    """The server's steps, in order (read_steps of its steps.tsv.gz)."""
    return read_steps(server_folder(server) / "steps.tsv.gz")


def traced_servers() -> list[dict]:
    plan = read_json(SERVING / "plan.json")
    return [s for s in plan["servers"] if s.get("step_trace") and (server_folder(s) / "steps.tsv.gz").exists()]


HOST_PACED_SERVERS = ("b11-llama1b-api4",)  # its steps are the host's (docs/step-trace.md): no GPU term shows there


def gpu_paced_servers(batches: tuple[str, ...]) -> list[dict]:
    """The traced servers of `batches` whose steps the GPU sets: every one but the host-paced Llama-3.2-1B."""
    return [s for s in traced_servers() if s["batch"] in batches and s["tag"] not in HOST_PACED_SERVERS]


def point_windows(server: dict) -> list[tuple[float, float, dict]]:
    """(start, end, point) of each point the server ran: its load generator's process, from start to exit, as the
    meta file stamps it. A window never reaches past the generator's own exit: a point of a few seconds is followed
    within milliseconds by the next, whose steps are not its own."""
    out = []
    folder = server_folder(server)
    for p in server["points"]:
        meta = folder / f"{p['id']}.meta.json"
        if meta.exists() and (folder / f"{p['id']}.json.gz").exists():
            stamps = read_json(meta)
            out.append((stamps["started"], stamps["ended"], p))
    return out


def cached_tokens(point: dict) -> int:
    """A decoding request's cached tokens at a point: its prompt plus half its output (the steady state of fixed
    lengths), the one figure the trace does not hold."""
    return point["input_len"] + point["output_len"] // 2


def _bin(value: int, edges: tuple[int, ...]) -> tuple[int, int] | None:
    for lo, hi in zip(edges, edges[1:]):
        if lo <= value < hi:
            return lo, hi
    return None


def server_settings(server: dict) -> dict:
    """The server's settings as points.json holds them for any of its points (they differ only in the load)."""
    return next(p.settings for p in load_points() if p.server == server["tag"]).model_dump(mode="json")


def point_steps(server: dict):
    """(step, point, previous step, next step) of every step of the server's trace taken while one of its points
    ran, the engine busy (the previous and next steps as the trace holds them, None at its ends).

    Under async scheduling the engine core launches a step before it takes the previous step's output, and a step
    with a prompt chunk takes milliseconds to launch (run past the CUDA graph, layer by layer): the previous step's
    update waits for that launch, so part of the chunk's time shows in the period before it (Llama-3.1-8B, b11: a
    decode step of about 50 requests before a lone 1,000-token chunk 21.2 ms, the chunk's own 11.2, a decode step
    otherwise 7.2). A decode-only step followed by a chunk is therefore no decode step's length, and a step with
    chunks is measured together with the one before it (prompt_rows)."""
    steps = server_trace(server)
    windows = point_windows(server)
    points, scheduled = [], {}
    for step in steps:  # every step, the long ones too, counts toward where the next chunk starts
        point = next((p for t0, t1, p in windows if t0 <= step.scheduled_at <= t1), None)
        if point is not None:
            step.prompt_start = scheduled.get(point["id"], 0)
            scheduled[point["id"]] = step.prompt_start + step.prompt_tokens
        points.append(point)
    for i, (step, point) in enumerate(zip(steps, points)):
        if point is not None and step.period_s is not None and step.period_s <= LONGEST_S:
            yield step, point, steps[i - 1] if i else None, steps[i + 1] if i + 1 < len(steps) else None


def prompt_chunks(start: int, tokens: int, prompt_len: int) -> list[tuple[int, int]]:
    """(start, end) within each prompt of the prompt tokens [start, start + tokens) of a point's stream: every
    prompt of a point is `prompt_len` tokens, and the engine finishes a prompt's chunks before it starts the next's
    (a partly prefilled request is scheduled before any waiting one), so the stream is the prompts end to end."""
    out, end = [], start + tokens
    while start < end:
        offset = start % prompt_len
        take = min(prompt_len - offset, end - start)
        out.append((offset, offset + take))
        start += take
    return out


def _decode_only(step, following) -> bool:
    """A decode-only step whose period is its own: the next step carries no prompt chunk."""
    return step.prompt_requests == 0 and (following is None or following.prompt_requests == 0)


def decode_groups(server: dict, least: int = LEAST_STEPS) -> list[dict]:
    """The decode-only steps of one traced server by the point they ran in and the requests decoding, groups of
    `least` steps or more (LEAST_STEPS: what a fit of the step's terms reads; 1: every count a closed loop passed
    through): the point's id, the requests decoding, the cached tokens each holds, the steps and their median period
    in seconds."""
    groups = {}
    for step, point, _, following in point_steps(server):
        if _decode_only(step, following):
            groups.setdefault((point["id"], step.decoding), (point, []))[1].append(step.period_s)
    return [dict(point=pid, decoding=n, cached=cached_tokens(point), steps=len(periods),
                 measured_s=statistics.median(periods))
            for (pid, n), (point, periods) in sorted(groups.items()) if len(periods) >= least]


def server_rows(server: dict, terms: dict | None = None) -> tuple[list[dict], list[dict]]:
    """(decode-only groups, prompt-chunk groups) of one traced server, simulated with the fitted terms unless
    `terms` gives trial ones."""
    model, _ = point_replica(server_settings(server), ROOT, terms=terms)
    gpu_only = replace(model, floor_s=0.0, core_s_per_token=0.0, api_s_per_token=0.0)
    decode, prompt = {}, {}
    for step, point, previous, following in point_steps(server):
        cached = cached_tokens(point)
        if _decode_only(step, following):
            key = _bin(step.decoding, DECODING_BINS)
            if key:
                decode.setdefault(key, []).append((step, cached))
        elif step.prompt_requests and previous is not None and previous.period_s is not None:
            key = _bin(step.prompt_tokens, PROMPT_BINS)
            if key:
                prompt.setdefault(key, []).append((step, point, previous))
    return ([_decode_row(model, gpu_only, key, group) for key, group in sorted(decode.items())
             if len(group) >= LEAST_STEPS],
            [_prompt_row(model, key, group) for key, group in sorted(prompt.items()) if len(group) >= LEAST_STEPS])


def _decode_row(model, gpu_only, key, group) -> dict:
    g = int(statistics.median(s.decoding for s, _ in group))
    cached = int(statistics.median(c for _, c in group))
    return dict(bin=key, steps=len(group), decoding=g,
                measured_ms=1e3 * statistics.median(s.period_s for s, _ in group),
                simulated_ms=1e3 * model.decode_seconds(g, g * cached),
                gpu_ms=1e3 * gpu_only.decode_seconds(g, g * cached), host_ms=1e3 * model.host_seconds(g),
                schedule_ms=1e3 * statistics.median(s.schedule_s for s, _ in group),
                update_ms=1e3 * statistics.median(s.update_s for s, _ in group))


def _prompt_row(model, key, group) -> dict:
    """A group of steps with prompt chunks, each measured with the step before it (point_steps says why): the
    median of the two periods' sum against the two steps simulated."""
    def simulated(step, point) -> float:
        # the step's prompt tokens are where the point's stream of prompts had reached (prompt_chunks): a chunk late
        # in its prompt attends to all the tokens before it
        chunks = prompt_chunks(step.prompt_start, step.prompt_tokens, point["input_len"])
        return model.seconds(step.decoding, step.decoding * cached_tokens(point), chunks)

    return dict(bin=key, steps=len(group), decoding=int(statistics.median(s.decoding for s, _, _ in group)),
                prompt_tokens=int(statistics.median(s.prompt_tokens for s, _, _ in group)),
                prompt_requests=int(statistics.median(s.prompt_requests for s, _, _ in group)),
                measured_ms=1e3 * statistics.median(s.period_s + p.period_s for s, _, p in group),
                simulated_ms=1e3 * statistics.median(simulated(s, pt) + simulated(p, pt) for s, pt, p in group))

# ---------------------------------------------------------------------------------------------- reading a trace

TRACE_LIMIT_BYTES = 8 * 1024 * 1024  # gzipped; a 40 s open loop of a 1B model writes about 120 KB
TRACE_UNPACKED_LIMIT = 64 * 1024 * 1024


class TraceError(ServingError):
    """A trace file that is not what this module writes."""


class Step:
    """One engine step as the trace saw it: its schedule() call and the update_from_output() that took its
    tokens, paired in order. `period_s` is the time from the previous step's update to this one's: with the engine
    busy, the step's own length (under async scheduling the next step's scheduling overlaps it)."""

    __slots__ = ("scheduled_at", "schedule_s", "prompt_requests", "prompt_tokens", "decoding", "running", "waiting",
                 "updated_at", "update_s", "period_s", "prompt_start")

    def __init__(self, s: list[str], u: list[str], previous_update_at: float | None):
        self.scheduled_at, self.schedule_s = float(s[1]), float(s[2]) - float(s[1])
        self.prompt_requests, self.prompt_tokens, self.decoding = int(s[3]), int(s[4]), int(s[5])
        self.running, self.waiting = int(s[6]), int(s[7])
        self.updated_at, self.update_s = float(u[1]), float(u[2]) - float(u[1])
        self.period_s = None if previous_update_at is None else self.updated_at - previous_update_at
        self.prompt_start = 0  # the prompt tokens its point scheduled before it (point_steps sets it)


def read_steps(path: Path) -> list[Step]:
    """The steps of a gzipped trace, in order. Calls that scheduled nothing are dropped (their updates still end
    the period before the next step); a malformed line raises TraceError naming it."""
    text = read_gzip(path, TRACE_LIMIT_BYTES, TRACE_UNPACKED_LIMIT).decode("utf-8", errors="replace")
    schedules, updates = [], []
    for n, line in enumerate(text.splitlines(), start=1):
        fields = line.split("\t")
        if fields[0] == "S" and len(fields) == 8:
            schedules.append(fields)
        elif fields[0] == "U" and len(fields) == 4:
            updates.append(fields)
        else:
            raise TraceError(f"{path}: line {n} is neither an S line of 8 fields nor a U line of 4: {line[:80]!r}")
        try:
            [float(x) for x in fields[1:]]
        except ValueError:
            raise TraceError(f"{path}: line {n} holds a field that is not a number: {line[:80]!r}") from None
    # every schedule() call is answered by one update_from_output(), in order, empty ones included
    steps, previous = [], None
    for s, u in zip(schedules, updates):
        if int(s[4]) + int(s[5]) > 0:
            steps.append(Step(s, u, previous))
        previous = float(u[1])
    return steps


def committed_steps(server: dict, gpu: str = "h200") -> list[dict]:
    """Per closed loop of one traced server whose decode-only steps were predicted before its batch ran (the batch's
    <batch>-sim-predictions-<gpu>.json `decode_steps`): by requests decoding, the measured median step against the
    committed one, in ms."""
    path = SERVING / f"{server['batch']}-sim-predictions-{gpu}.json"
    if not path.exists():
        return []
    committed = {s["id"]: s["step_ms"] for s in read_json(path).get("decode_steps", [])}
    return [dict(point=g["point"], decoding=g["decoding"], steps=g["steps"], measured_ms=1e3 * g["measured_s"],
                 committed_ms=committed[g["point"]][str(g["decoding"])])
            for g in decode_groups(server, least=1) if str(g["decoding"]) in committed.get(g["point"], {})]


def climbs(rows: list[dict], least: float = 0.05, key: str = "committed_ms") -> list[tuple[dict, dict]]:
    """(row below, row above) of one point's consecutive counts of requests (rows in that order) where the step
    `key` names (the committed one unless named) climbs by `least` or more: where another round of programs, or
    another program an SM, begins."""
    out = []
    for below, above in zip(rows, rows[1:]):
        if (below["point"] == above["point"] and above["decoding"] == below["decoding"] + 1
                and above[key] >= (1 + least) * below[key]):
            out.append((below, above))
    return out


HELD_RATIO = 0.6  # an update this much sooner after the one before than that one after its own is a held one


def first_count_holds(server: dict) -> dict[str, list[int]]:
    """Where a step with prompt chunks first runs more requests, counted in FIRST_USE_PAD, than any such step of its
    server before, whether the step before it had its output held back: that step's update came late, and this
    step's own soon after (under HELD_RATIO of the other's period). [held, first steps] below FIRST_USE_LIMIT
    requests ("below") and from it on ("above")."""
    from sizing.planners.serving import FIRST_USE_LIMIT, padded_requests

    steps = server_trace(server)
    out = {"below": [0, 0], "above": [0, 0]}
    seen = 0
    for before, first in zip(steps, steps[1:]):
        padded = padded_requests(first.prompt_requests + first.decoding)
        if first.prompt_requests == 0 or padded <= seen:
            continue
        seen = padded
        side = out["below" if padded < FIRST_USE_LIMIT else "above"]
        side[1] += 1
        if before.period_s and first.period_s is not None and first.period_s < HELD_RATIO * before.period_s:
            side[0] += 1
    return out


HANDLING_BOUND_S = 0.5  # a request whose time outside the steps is past this was paired with another's steps


def prompt_handling_rows(server: dict) -> list[dict]:
    """Per request of the server's one-request points (each alone on the engine, so its steps are the run of steps
    from its first prompt chunk on): the time the server spent on it outside the engine's steps, in two parts read
    off the client's timestamps against the trace's (two clocks, so only differences within one request are taken):

    - `outside_s`: its latency less the span from its first chunk's schedule() to its last token's update: the
      front end's way in (HTTP, tokenizing, the hand-off to the engine core) and the last token's way out;
    - `first_token_s`: its TTFT less the span from its first chunk's schedule() to the update of the step after its
      prompt's last chunk (under async scheduling the first token reaches the client with the second's step): the
      way in and the first token's way out.

    Both grow with the prompt (b22, b25, b28: about 2 and 5 us a prompt token), the first token's more: what it
    carries beyond the last token's is the first output's handling, once a request."""
    steps, folder = server_trace(server), server_folder(server)
    rows = []
    for t0, t1, point in point_windows(server):
        if point.get("concurrency") != 1:
            continue
        bench = read_bench(folder / f"{point['id']}.json.gz")
        window = [s for s in steps if t0 <= s.scheduled_at <= t1]
        # a request's run begins with a prompt chunk after a step without one; the load generator's test request
        # comes first, so the point's requests are the last runs
        firsts = [i for i, s in enumerate(window) if s.prompt_requests and (i == 0 or not window[i - 1].prompt_requests)]
        chunks = -(-point["input_len"] // server["max_num_batched_tokens"])  # prefilled a budget's chunk a step
        for i, ttft, latency in zip(firsts[-len(bench.ttfts):], bench.ttfts, bench.latencies):
            last = i + chunks - 1 + point["output_len"] - 1
            if ttft <= 0 or last >= len(window):
                continue
            start = window[i].scheduled_at
            second, final = window[i + chunks], window[last]
            outside = latency - (final.updated_at + final.update_s - start)
            first = ttft - (second.updated_at + second.update_s - start)
            if 0 <= outside <= HANDLING_BOUND_S and 0 <= first <= HANDLING_BOUND_S:
                rows.append(dict(point=point["id"], prompt=point["input_len"], outside_s=outside, first_token_s=first))
    return rows


def _dense(model) -> bool:
    """Whether a step model's architecture is dense: no routed experts, no MLA (their layers launch more)."""
    return not (model.shape.num_experts or model.shape.is_mla)


def lone_prompt_rows(server: dict, terms: dict | None = None) -> list[dict]:
    """Per prompt step of the server's one-request points (a whole prompt in one chunk, nothing decoding beside it):
    the step's span from its schedule() to its update, the model's layers (and of them its MoE and MLA layers), whether
    the step ran past the largest CUDA graph or replayed its pieces (kvsize's estimate of the engine's, sizing/planners/graph_steps.py) and the
    GPU's part of it and the host's launch as the simulation gives them (with `terms`, profiles/serving.json's
    unless given). Alone on the engine the step's span is the longer of the GPU's part and the host's launch of its layers (a step with a prompt
    chunk replays no full graph: each layer's attention is launched between the graph's pieces, or, past the graph,
    every kernel)."""
    model, _ = point_replica(server_settings(server), ROOT, terms=terms)
    steps = server_trace(server)
    rows = []
    for t0, t1, point in point_windows(server):
        if point.get("concurrency") != 1:
            continue
        tokens = point["input_len"]
        for s in steps:
            if t0 <= s.scheduled_at <= t1 and s.prompt_requests == 1 and s.decoding == 0 and s.prompt_tokens == tokens:
                rows.append(dict(point=point["id"], layers=model.shape.num_layers, tokens=tokens,
                                 moe_layers=model.moe_layers, mla_layers=model.mla_layers,
                                 eager=model.graphs.eager(tokens, True), piecewise=model.graphs.piecewise(tokens, True),
                                 span_s=s.updated_at - s.scheduled_at,
                                 gpu_s=model.gpu_seconds(0, 0, [(0, tokens)]),
                                 launch_s=model.launch_seconds(0, [(0, tokens)]), dense=_dense(model)))
    return rows


def launch_rows(server: dict) -> list[dict]:
    """Per step of the server with prompt chunks where the trace shows the host's launch of it, past the largest CUDA
    graph (kvsize's estimate of the engine's, sizing/planners/graph_steps.py; every kernel launched from Python) or
    under it (the graph's pieces replayed, each layer's attention launched between them). Under async scheduling the
    engine core launches that step before it takes the previous step's tokens, so the previous step's period is the
    launch wherever it outlasts that step on the GPU. Taken where the previous step only decoded and lasted more than
    twice the decode-only step after the chunk (b30's Qwen3-8B: 37 ms before a 1,000-token chunk past the graph, 5
    after it; b32's Qwen2.5-3B: 15 ms before a 300-token chunk under it, 3 after): the point, the model's layers,
    whether the step ran past the graph, the launch in seconds and whether the model is dense (no routed experts, no
    MLA)."""
    model, _ = point_replica(server_settings(server), ROOT)
    rows = []
    for step, point, previous, following in point_steps(server):
        if (not step.prompt_requests or previous is None or following is None or previous.prompt_requests
                or following.prompt_requests):
            continue
        if None in (previous.period_s, following.period_s) or previous.period_s > LONGEST_S:
            continue
        if previous.period_s > 2 * following.period_s:
            tokens = step.prompt_tokens + step.decoding
            rows.append(dict(point=point["id"], layers=model.shape.num_layers, tokens=tokens,
                             eager=model.graphs.eager(tokens, True), launch_s=previous.period_s,
                             dense=_dense(model)))
    return rows

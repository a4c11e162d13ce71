"""A serving engine's steps, simulated: what a load generator would measure against one replica (docs/formulas.md,
'Serving simulation').

vLLM's scheduler (v1, chunked prefill on) builds each step from a token budget of max_num_batched_tokens: every
running request that is decoding takes one token, then prompts take the rest in chunks, first the one being
prefilled, then waiting requests in arrival order while fewer than max_num_seqs run and the KV pool has blocks for
their prompt. A request's first token comes at the end of the step that prefills its prompt's last chunk; each later
token costs one step. When a step finds no block for a decoding request, the newest running request is preempted
(its blocks freed, its prompt and output so far prefilled again later), as vLLM's recompute preemption does.

A step's time is sizing/planners/step_model.py's StepModel.

With async scheduling (vLLM 0.26 and later, on by default: the release's in-flight batches beyond the pipeline
stages) the engine schedules and launches step N+1 before it processes step N's output, so a token reaches the client
when the step after the one that sampled it ends; where no step follows, when its own ends. Every gap keeps its
length; the first token comes one step later, which in a burst of prompts is a whole prefill step.

A request reaches the engine through its API server's event loop (sizing/planners/front_end.py): its parse, its
prompt tokenized beside the loop, its hand-over, in turn with the other requests' and with the streaming of every
step's tokens. A closed loop (N in flight, `vllm bench serve --max-concurrency N --request-rate inf`) starts N requests
at once and each finished one's client sends the next once the loop has streamed its last token; an open loop sends
them at a Poisson rate. The result is the load
generator's figures: TTFT and ITL percentiles over requests and gaps, output tokens and requests per second.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field, replace

from ..cache.layers import kv_heads_per_rank
from ..efficiency import DecodeEfficiency
from ..errors import KvsizeError
from .front_end import FrontEnd
from .graph_steps import SPLIT_KV_SEGMENTS, graphed_steps, split_kv_requests
from .moe_routing import routing_overhead_s
from .step_model import (StepModel, engine_efficiency, query_group_waves, query_tile_fill, step_overhead,
                         with_twins)

MAX_SIMULATED_STEPS = 2_000_000  # a point of 10^4 prompts of 10^3 tokens at batch 8 takes ~10^6 steps
PERCENTILES = (50, 90, 99)
SIMULATED = "serving simulation"  # the basis of a figure this simulation gave (a design held to it: held.py)
# past this share of its step time set by the host (StepModel.host_side_seconds), a run's speed is the host's as much
# as the GPU's: the same server and load ran 5.4 ms and 12.6 ms a gap on two H200 hosts (batches b9, b10), and at
# 120 requests/s sent, one host held 107.6 and the other 74.4 (b9-llama1b-api4-p04, b10-llama1b-api4-p02)
HOST_PACED_SHARE = 0.5
HOST_SPREAD = "the same server ran 2.3x apart on two H200 hosts and held 108 and 74 requests/s at most"
# the launch is the host's too: Qwen3-30B-A3B's 1,000-token prompt alone past its 512-token graph (b35, b39, b40's
# lone_prompt_rows, measure/steps.py)
LAUNCH_SPREAD = ("a 1,000-token prompt of Qwen3-30B-A3B alone, launched past the graph, spanned 58-63 ms on two H200 "
                 "hosts and 86-109 ms on a third")
# The first step with prompt chunks whose requests, counted in eights, outnumber any such step the server has run
# holds back the last step's output until it has run itself: vLLM 0.33.0's engine core processed that output one
# step late, then the step's own at once (b21's Qwen2.5-3B in int8_per_token_head: 714 ms then 38 ms between
# output updates, against 356 ms either side, at the first steps of 65 and 73 requests; 25 of the 31 first counts
# below 256 of measure/serving/b21-wave-fill/b21-qwen25-3b-int8/steps.tsv.gz). Its clients saw a gap of two steps,
# the slowest 1% of gaps of a burst of long prompts on a fresh server. Over the one-GPU traces of batches b11-b40
# (measure/steps.py first_count_holds; docs/step-trace.md), 505 of 915 such first steps below 256 requests held
# it back (many of the others come straight after another first step, whose late update hides theirs), and 16
# of 199 from 256 on, as often as the steps' own spread gives: none past FIRST_USE_LIMIT.
FIRST_USE_PAD = 8
FIRST_USE_LIMIT = 256


@dataclass(frozen=True)
class Load:
    """What the load generator sends: fixed lengths (ignore_eos), a closed loop of `concurrency` or an open loop
    at `request_rate` per second (Poisson, seeded)."""

    input_tokens: int
    output_tokens: int
    num_prompts: int
    concurrency: int | None = None
    request_rate: float | None = None
    seed: int = 0
    # each request's (input, output) tokens in the order sent, where the load generator recorded them (a dataset of
    # varied lengths); empty: every request has the fixed lengths above
    lengths: tuple[tuple[int, int], ...] = ()
    # figures over the requests sent in this range only (a steady state, past a closed loop's opening burst and
    # before its drain); None: every request, as the load generator reports them
    measured: tuple[int, int] | None = None
    # prompts arrive with their KV already in the pool (shipped from a prefill pool): they take blocks, not compute
    prefilled: bool = False
    # an open loop's send times as the load generator recorded them (seconds after its first send, one a request,
    # in order): replayed instead of drawing Poisson arrivals from the seed, so that a measured run is held to the
    # very load it sent; empty: drawn
    sent_at: tuple[float, ...] = ()
    # the most requests the server had in flight at once before this load (its earlier loads'), which sets the
    # counts of requests its steps with prompt chunks have already run (FIRST_USE_PAD); None: a server that has run
    # every count, as one serving traffic for a while has (the planner's steady state)
    server_seen_requests: int | None = None

    def length(self, k: int) -> tuple[int, int]:
        """The k-th request's input and output tokens."""
        return self.lengths[k] if self.lengths else (self.input_tokens, self.output_tokens)

    def __post_init__(self) -> None:
        if self.lengths and (len(self.lengths) != self.num_prompts
                             or any(i < 1 or o < 1 for i, o in self.lengths)):
            raise KvsizeError(f"the load's per-request lengths must be {self.num_prompts} pairs of at least 1 token "
                              "in and 1 out")
        if (self.concurrency is None) == (self.request_rate is None):
            raise KvsizeError("a load is a closed loop (concurrency) or an open loop (request rate), one of them")
        for name, value in (("input tokens", self.input_tokens), ("output tokens", self.output_tokens),
                            ("prompts", self.num_prompts)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise KvsizeError(f"the load's {name} must be a whole number of at least 1, got {value!r}")
        if self.concurrency is not None and (isinstance(self.concurrency, bool) or self.concurrency < 1):
            raise KvsizeError(f"the load's concurrency must be at least 1, got {self.concurrency!r}")
        if self.request_rate is not None and not (math.isfinite(self.request_rate) and self.request_rate > 0):
            raise KvsizeError(f"the load's request rate must be a positive number per second, got {self.request_rate}")
        if self.sent_at and (self.request_rate is None or len(self.sent_at) != self.num_prompts
                             or not all(math.isfinite(t) and t >= 0 for t in self.sent_at)
                             or any(b < a for a, b in zip(self.sent_at, self.sent_at[1:]))):
            raise KvsizeError(f"the load's send times must be {self.num_prompts} times in order, of at least 0 s, "
                              "and only for an open loop (a request rate)")
        if self.server_seen_requests is not None and (isinstance(self.server_seen_requests, bool)
                                                      or not isinstance(self.server_seen_requests, int)
                                                      or self.server_seen_requests < 0):
            raise KvsizeError(f"the load's earlier requests in flight must be a whole number of at least 0, got "
                              f"{self.server_seen_requests!r}")
        if self.measured is not None and not (0 <= self.measured[0] < self.measured[1] <= self.num_prompts):
            raise KvsizeError(f"the load's measured requests {self.measured} must be a range within its "
                              f"{self.num_prompts} prompts")


@dataclass(frozen=True)
class Scheduler:
    """The scheduler's limits and the pool, as the engine started."""

    max_num_batched_tokens: int
    max_num_seqs: int
    block_size: int
    num_blocks: int
    # steps a sampled token waits before it reaches the client: with async scheduling the engine schedules and
    # launches step N+1 before it processes step N's output (a batch queue of two), 0 without
    output_delay_steps: int = 0
    # a step with prompt chunks of more requests than any before holds back the last step's output (FIRST_USE_PAD):
    # where the engine core launches the steps itself, one GPU under async scheduling (b16's Llama-3.1-70B at TP 2,
    # whose workers run them, kept its updates a step apart through 23 such steps)
    first_use_holds: bool = False
    # the API server processes (--api-server-count), each one event loop (front_end.py)
    api_servers: int = 1


@dataclass
class _Request:
    index: int  # in the order sent
    arrival: float  # at the engine
    prompt: int  # tokens to prefill (grows to prompt + output so far after a preemption)
    output: int
    original_prompt: int
    done_prefill: int = 0
    generated: int = 0
    first_token_at: float | None = None
    last_token_at: float = 0.0
    gaps: list[float] = field(default_factory=list)
    times: list[float] = field(default_factory=list)  # when each token was sampled (the end of its step)
    # tokens whose KV the request holds: its prefilled chunks and one per token sampled since (0 once preempted)
    in_cache: int = 0
    sent_at: float = 0.0  # by the client: TTFT and latency count from here


@dataclass(frozen=True)
class Served:
    """What the load generator reports, from simulated timestamps."""

    ttft_ms: dict[int, float]
    itl_ms: dict[int, float]
    output_tokens_per_s: float
    requests_per_s: float
    duration_s: float
    preemptions: int
    steps: int
    # each request's mean gap between its tokens, (last − first token) / (output − 1): the load generator's TPOT,
    # over requests of more than one token
    tpot_ms: dict[int, float] = field(default_factory=dict)
    # the share of the run's step time the host set (StepModel.host_side_seconds at least the step): there the figures
    # are the host CPUs' more than the GPU's, and hosts differ
    host_paced_share: float = 0.0
    # of the steps with prompt chunks, the share of their time the host's launch of the layers set (past the largest
    # CUDA graph, or between its pieces): there the TTFT is the host CPU's
    launch_paced_prompt_share: float = 0.0

    @property
    def host_paced(self) -> bool:
        return self.host_paced_share >= HOST_PACED_SHARE


def _percentile(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile, as the load generator computes it."""
    s = sorted(values)
    if not s:
        return math.nan
    k = (len(s) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def simulate(model: StepModel, engine: Scheduler, load: Load, decode_runs: bool = True) -> Served:
    """Run the load against one replica, step by step (runs of steps that only decode in one pass, unless
    `decode_runs` is off: the same figures, slower)."""
    rng = random.Random(load.seed)
    # a prefilled request (disaggregated: its KV shipped from a prefill replica) was handled there, once
    handling = 0.0 if load.prefilled else model.request_handling_s
    parse = min(model.request_parse_s, handling)
    front = FrontEnd(engine.api_servers, parse, handling - parse,
                     0.0 if load.prefilled else model.prompt_in_s_per_token,
                     0.0 if load.prefilled else model.api_s_per_token * engine.api_servers)
    # requests handed to the engine that it has not taken yet: (at the engine, order sent, sent by the client)
    pending: list[tuple[float, int, float]] = []
    sends = 0  # requests a closed loop's client has sent
    if load.request_rate is not None:
        for i, at in enumerate(load.sent_at or _poisson_sends(rng, load.request_rate, load.num_prompts)):
            front.send(at, i, load.length(i)[0])
    waiting: deque[_Request] = deque()
    running: list[_Request] = []
    finished: list[_Request] = []
    free_blocks = engine.num_blocks
    now, steps, preemptions = 0.0, 0, 0
    # the request counts (in FIRST_USE_PAD) of the steps with prompt chunks the server has run; None: all of them
    seen = None if load.server_seen_requests is None or not engine.first_use_holds else padded_requests(
        load.server_seen_requests)
    held: set[float] = set()  # the ends of the steps whose output the next step held back
    step_time = host_time = 0.0  # every step's seconds, and those of the steps the host set
    prompt_time = launch_time = 0.0  # the steps with prompt chunks', and those of them the host's launch set

    def blocks(tokens: int) -> int:
        return -(-tokens // engine.block_size)

    def send(at: float, order: int, client_at: float) -> None:
        prompt, output = load.length(order)
        waiting.append(_Request(order, at, prompt, output, prompt, sent_at=client_at))

    def client_sends(at: float, on_last_token: bool = True) -> None:  # a closed loop's next request
        nonlocal sends
        front.send(at, sends, load.length(sends)[0], on_last_token)
        sends += 1

    def retire() -> None:
        """Finished requests leave the pool; a closed loop sends the next as each one finishes."""
        nonlocal running, free_blocks
        done = [r for r in running if r.generated >= r.output]
        if not done:
            return
        running = [r for r in running if r.generated < r.output]
        for r in done:
            free_blocks += blocks(r.in_cache)
            finished.append(r)
            if load.concurrency is not None and sends < load.num_prompts:
                client_sends(now)

    ends: dict[float, float] = {}  # each step's end by its start
    if load.concurrency is not None:
        for _ in range(min(load.concurrency, load.num_prompts)):
            client_sends(0.0, on_last_token=False)
    while len(finished) < load.num_prompts:
        for handed in front.advance(now):
            heapq.heappush(pending, handed)
        while pending and pending[0][0] <= now:
            send(*heapq.heappop(pending))
        # the next request to reach the engine comes no sooner than the front end's next piece of work
        next_in = min(pending[0][0] if pending else math.inf, front.next_at())
        if not waiting and not running:
            if next_in == math.inf:
                raise KvsizeError(f"the simulated load left {load.num_prompts - len(finished)} requests that never "
                                  "reached the engine")
            now = next_in  # idle until the next arrival
            continue
        run = decode_runs and _decode_run(model, engine, running, waiting, free_blocks, now, next_in)
        if run:
            # steps that only decode, until the first request finishes or the next one arrives: every request gets
            # the same tokens at the same times, the step by step loop's arithmetic in one pass
            times, used = run
            host = model.host_side_seconds(len(running), [])
            for dt in times:  # step by step, as the loop below adds them: the same sums to the last bit
                step_time += dt
                if host >= dt:
                    host_time += dt
            steps += len(times)
            if steps > MAX_SIMULATED_STEPS:
                raise KvsizeError(f"the simulated load ran past {MAX_SIMULATED_STEPS:,} engine steps; fewer prompts")
            clock = [now]
            for dt in times:
                now += dt
                clock.append(now)
            ends.update(zip(clock, clock[1:]))
            for end in clock[1:]:
                front.stream(end, len(running))
            for r in running:
                r.generated += len(times)
                r.in_cache += len(times)
                r.times.extend(clock[1:])
            free_blocks -= used
            retire()
            continue
        steps += 1
        if steps > MAX_SIMULATED_STEPS:
            raise KvsizeError(f"the simulated load ran past {MAX_SIMULATED_STEPS:,} engine steps; fewer prompts")
        budget = engine.max_num_batched_tokens
        decoding = [r for r in running if r.done_prefill >= r.prompt]
        # a decoding request needs a block for its next token; the newest running request gives way when none is left
        preempted: set[int] = set()
        for r in decoding:
            if r.index in preempted:
                continue
            new_block = r.in_cache % engine.block_size == 0  # its next token starts a block
            while new_block and free_blocks < 1 and len(running) > 1:
                victim = running.pop()
                free_blocks += blocks(victim.in_cache)
                preemptions += 1
                preempted.add(victim.index)
                victim.prompt = victim.original_prompt + victim.generated
                victim.done_prefill = victim.in_cache = 0
                waiting.appendleft(victim)
            if new_block and r.index not in preempted:
                free_blocks -= 1
        if preempted:
            decoding = [r for r in decoding if r.index not in preempted]
        decoding = decoding[:budget]
        budget -= len(decoding)
        chunks: list[tuple[_Request, int]] = []
        for r in running:
            if r.done_prefill < r.prompt and budget > 0:
                n = min(budget, r.prompt - r.done_prefill)
                chunks.append((r, n))
                budget -= n
        while waiting and len(running) < engine.max_num_seqs and (budget > 0 or load.prefilled):
            r = waiting[0]
            if blocks(r.prompt) > free_blocks:
                break
            waiting.popleft()
            free_blocks -= blocks(r.prompt)
            running.append(r)
            if load.prefilled and r.generated == 0:
                # its KV arrived whole: it decodes from the next step, its first token already sampled by the prefill
                r.done_prefill = r.in_cache = r.prompt
                r.generated = 1
                r.in_cache += 1
                r.first_token_at = now
                continue
            n = min(budget, r.prompt)
            if n <= 0:
                break
            chunks.append((r, n))
            budget -= n
        count = padded_requests(len(decoding) + len(chunks))
        if chunks and seen is not None and count > seen:
            seen = count
            if count < FIRST_USE_LIMIT:
                held.add(now)
        cached = sum(r.in_cache for r in decoding)
        spans = [(r.done_prefill, r.done_prefill + n) for r, n in chunks]
        dt = model.seconds(len(decoding), cached, spans)
        step_time += dt
        if model.host_side_seconds(len(decoding), spans) >= dt:
            host_time += dt
        if spans:
            prompt_time += dt
            if model.launch_seconds(len(decoding), spans) >= dt:
                launch_time += dt
        if any(r.arrival < now for r in decoding) or any(r.arrival < now for r, _ in chunks):
            # launched with work the engine held before the last step ended (async scheduling queues it behind
            # that step); a step of only requests that arrived at its start (a closed loop's successors, sent once
            # the client had the last token) did not hold back the last step's output
            ends[now] = now + dt
        now += dt
        for r in decoding:
            r.generated += 1
            r.in_cache += 1
            r.times.append(now)
        sampled = len(decoding)
        for r, n in chunks:
            r.done_prefill += n
            r.in_cache += n
            if r.done_prefill >= r.prompt:
                r.generated += 1  # the step that prefills the last chunk samples a token
                r.in_cache += 1
                r.times.append(now)
                sampled += 1
        front.stream(now, sampled)
        retire()
    first_token_s = 0.0 if load.prefilled else model.first_token_s_per_prompt_token
    for r in finished:
        _deliver(r, ends, engine.output_delay_steps, held, first_token_s * r.original_prompt)
    return replace(_figures(finished, load, preemptions, steps),
                   host_paced_share=host_time / step_time if step_time else 0.0,
                   launch_paced_prompt_share=launch_time / prompt_time if prompt_time else 0.0)


def padded_requests(requests: int) -> int:
    """A step's requests rounded up to FIRST_USE_PAD, the count by which the engine tells a first use."""
    return -(-requests // FIRST_USE_PAD) * FIRST_USE_PAD


# The engine lets a first token out with its own step's update, not the next one's (measure/first_token.py,
# docs/first-token-way.md): in b35's and b36's bursts of 32 prompts of 1,000 tokens the first tokens follow that update
# within 4.0-14.0 ms (the middle 80%) and the next step's only within 105.1-786.4 ms, 23.5-27.1 ms later than a request
# alone, about what the API server spends on the step's other first outputs (18.5-18.7 ms by the fitted per-token
# term). A step launched kernel by kernel holds the engine core until the GPU has nearly run it, so the update before
# it and the schedule after it both wait for it. Simulated so (the update after the next step's launch, past the graph
# after the whole next step; the API server's time on each step's outputs; a closed loop's client sending on the last
# token; a step holding the requests that reached the engine by the start of the step before, or by its own start
# after a step past the graph; the handling read to match and every term refitted), over the 553 points after b35
# p50 TTFT within 10% rose from 265 to 275 but p99 ITL within 25% fell from 398 to 384, output tokens/s within 10%
# from 446 to 433 and most requests a second from 118 to 117 of 192; b36, committed both ways before it ran, came
# within 10% on 8 of 12 as below and 6 so. The one-step wait stays, standing in for those mechanisms together
def _deliver(r: _Request, ends: dict[float, float], delay: int, held: set[float] | None = None,
             first_token_s: float = 0.0) -> None:
    """When the client receives each token: the end of the step that sampled it or, with async scheduling, of the
    step after (the engine processes a step's output once the next step is launched; where none followed, the
    engine waited on the step itself), a step later again where that next step held the output back (`held`:
    FIRST_USE_PAD). The first token takes `first_token_s` more on its way back, and the tokens sampled meanwhile
    reach the client with it. Sets the request's first and last token times and its gaps."""
    times = r.times
    for _ in range(delay):
        times = [ends.get(t, t) for t in times]
    if delay and held:
        times = [ends.get(d, d) if t in held else d for t, d in zip(r.times, times)]
    if r.first_token_at is None:  # sampled here, not shipped with a prefilled prompt's KV
        r.first_token_at = times[0] + first_token_s
        times = [max(t, r.first_token_at) for t in times[1:]]
    clock = [r.first_token_at, *times]
    r.gaps = [b - a for a, b in zip(clock, clock[1:])]
    r.last_token_at = clock[-1]


def _decode_run(model: StepModel, engine: Scheduler, running: list[_Request], waiting, free_blocks: int,
                now: float, arrival: float) -> tuple[list[float], int] | None:
    """(step times, blocks taken) of the steps to come while every running request only decodes: none is being
    prefilled, none waiting can be let in (no seat, or no blocks even before these steps take theirs), the pool has a
    block for every token, all fit the token budget. They last until the first request finishes or, in an open loop,
    a step ends at or past the next arrival. None when the next step is not such a step."""
    n = len(running)
    if n == 0 or n > engine.max_num_batched_tokens or any(r.done_prefill < r.prompt for r in running):
        return None
    size = engine.block_size
    first = sum(1 for r in running if r.in_cache % size == 0)
    if waiting and n < engine.max_num_seqs and -(-waiting[0].prompt // size) <= free_blocks - first:
        return None
    k = min(r.output - r.generated for r in running)
    if k < 2 or _blocks_taken(running, k, size) > free_blocks:
        return None
    cached = sum(r.in_cache for r in running)
    times = []
    for j in range(k):
        dt = model.decode_seconds(n, cached + j * n)
        times.append(dt)
        now += dt
        if now >= arrival:
            break
    return times, _blocks_taken(running, len(times), size)


def _blocks_taken(running: list[_Request], steps: int, size: int) -> int:
    """Blocks `steps` more tokens take for each request: one wherever a token starts a block."""
    return sum((r.in_cache + steps + size - 1) // size - (r.in_cache + size - 1) // size for r in running)


def _figures(finished: list[_Request], load: Load, preemptions: int, steps: int) -> Served:
    """The load generator's figures over the measured requests. Over every request, throughput is what finished
    over the time to the last token; over a closed loop's steady state it is Little's law, the requests in flight
    over the measured requests' mean latency."""
    if load.measured is not None:
        finished = [r for r in finished if load.measured[0] <= r.index < load.measured[1]]
    ttfts = [r.first_token_at - r.sent_at for r in finished]
    gaps = [g for r in finished for g in r.gaps]
    duration = max(r.last_token_at for r in finished)
    requests_per_s = len(finished) / duration
    if load.measured is not None and load.concurrency is not None:
        duration -= min(r.sent_at for r in finished)
        requests_per_s = load.concurrency * len(finished) / sum(r.last_token_at - r.sent_at for r in finished)
    output_per_request = sum(r.output for r in finished) / len(finished)
    tpots = [(r.last_token_at - r.first_token_at) / (r.output - 1) for r in finished if r.output > 1]
    return Served({q: 1e3 * _percentile(ttfts, q) for q in PERCENTILES},
                  {q: 1e3 * _percentile(gaps, q) for q in PERCENTILES},
                  requests_per_s * output_per_request, requests_per_s, duration, preemptions,
                  steps, {q: 1e3 * _percentile(tpots, q) for q in PERCENTILES})


def _poisson_sends(rng: random.Random, rate: float, n: int) -> list[float]:
    """`n` send times of a Poisson process at `rate` a second, the first at 0."""
    sends, t = [], 0.0
    for _ in range(n):
        sends.append(t)
        t += rng.expovariate(rate)
    return sends


def serving_replica(scenario, hbm_bandwidth_gb_s: float, bf16_dense_tflops: float, multiprocessors: int,
                    efficiency: DecodeEfficiency, per_layer_overhead_s: float | None = None,
                    prefill_mfu: float | None = None, engine_kv: dict[str, float] | None = None,
                    terms: dict | None = None, api_servers: int = 1
                    ) -> tuple[StepModel, Scheduler]:
    """One replica as the engine starts it (kvsize's estimate gives the pool, the release's batch defaults and its
    largest CUDA graph; `api_servers`: its --api-server-count, vLLM's default 1) and its step model on a GPU of that
    bandwidth, FLOP/s and SM count; the per-layer
    overhead, the prefill MFU, the engine's KV read efficiencies and the other terms (`terms`: any of
    profiles/serving.json's, by name) are the fitted ones unless given."""
    from ..capacity.estimate import estimate
    from ..engines.memory import resolve_weights_dtype

    e = estimate(scenario)
    s = e.scenario
    fitted = step_overhead().model_dump()
    fitted.update(terms or {})
    overhead = fitted["per_layer_step_overhead_s"] if per_layer_overhead_s is None else per_layer_overhead_s
    mfu = fitted["prefill_mfu"] if prefill_mfu is None else prefill_mfu
    kv = fitted["engine_kv_efficiency"] if engine_kv is None else engine_kv
    group = query_group_waves(fitted, e.k_format, s.shape)
    if group is not None:  # the kernel compiled for this model's query heads a KV head reads its full waves so
        kv = {**kv, fitted["engine_kernel_twins"].get(e.k_format, e.k_format): group["kv_efficiency"]}
    model = StepModel(s.shape, e.layout, resolve_weights_dtype(s.weights_dtype, s.shape), s.tensor_parallel_size,
                      hbm_bandwidth_gb_s, bf16_dense_tflops,
                      engine_efficiency(efficiency, kv, fitted["engine_weights_efficiency"]), e.k_format,
                      overhead, mfu, fitted["tp_per_layer_step_overhead_s"], fitted["step_floor_s"],
                      fitted["moe_layer_step_overhead_s"], graphed_steps(s, e.engine),
                      fitted["eager_moe_layer_launch_s"],
                      fitted["frontend_core_s_per_token"], fitted["frontend_api_s_per_token"] / max(api_servers, 1),
                      fitted["request_handling_s"], fitted["request_step_overhead_s"],
                      _prompt_attention_share(fitted, e.k_format, s.shape),
                      **_kv_kernel(s, e, multiprocessors, fitted, kv, group),
                      prompt_in_s_per_token=fitted["prompt_in_s_per_token"],
                      first_token_s_per_prompt_token=fitted["first_token_s_per_prompt_token"],
                      eager_layer_launch_s=fitted["eager_layer_launch_s"],
                      piecewise_layer_launch_s=fitted["piecewise_layer_launch_s"],
                      request_parse_s=fitted["request_parse_s"],
                      moe_tile_fixed_k=fitted["moe_tile_fixed_k"],
                      eager_mla_layer_launch_s=fitted["eager_mla_layer_launch_s"],
                      piecewise_mla_layer_launch_s=fitted["piecewise_mla_layer_launch_s"],
                      mla_layer_overhead_s=fitted["mla_layer_step_overhead_s"],
                      moe_routing_overhead_s=routing_overhead_s(s.shape.architectures,
                                                                fitted["moe_layer_step_overhead_s"]))
    paged = e.pool.paged
    release = e.engine.release
    delay = release.in_flight_extra_batches if release is not None else 0
    engine = Scheduler(s.max_num_batched_tokens, s.max_num_seqs, e.block_size if paged else 1,
                       e.num_blocks if paged else e.max_tokens, delay,
                       first_use_holds=delay > 0 and s.tensor_parallel_size * s.pipeline_parallel_size == 1,
                       api_servers=max(api_servers, 1))
    return model, engine


def _prompt_attention_share(fitted: dict, kv_format: str, shape) -> float:
    """The share of the prefill FLOP rate `kv_format`'s prompt attention reaches (profiles/serving.json's, a twin's
    included), where it runs in the engine's Triton kernel scaled by the query rows a program fills (query_tile_fill);
    1 for a format run in bf16's kernel."""
    share = with_twins(fitted["engine_prefill_attention_share"], fitted["engine_kernel_twins"]).get(kv_format)
    return 1.0 if share is None else share * query_tile_fill(shape)


def _kv_kernel(scenario, e, multiprocessors: int, fitted: dict, engine_kv: dict[str, float],
               group: dict | None = None) -> dict:
    """The StepModel fields of a KV format the engine decodes in whole-request programs (profiles/serving.json's
    engine_programs_per_sm, a twin's included; `group`: the waves of the kernel compiled for the model's query heads
    a KV head, where they differ): the programs a wave holds on this GPU, the requests a decode-only step splits each
    request's cache for, and a split read's time over a full wave's; none for another format."""
    twins = fitted["engine_kernel_twins"]
    per_sm = with_twins(fitted["engine_programs_per_sm"], twins).get(e.k_format)
    if per_sm is None:
        return {}
    per_sm = per_sm if group is None else group["programs_per_sm"]
    heads = kv_heads_per_rank(scenario.shape.num_kv_heads, scenario.tensor_parallel_size)
    whole = with_twins(engine_kv, twins)[e.k_format]
    split = with_twins(fitted["engine_split_kv_efficiency"], twins)[e.k_format]
    pace = with_twins(fitted["engine_program_pace_tokens_per_s"], twins).get(e.k_format, {})
    if group is not None and group.get("whole_sm"):  # this build's own programs sharing an SM
        pace = {**pace, "whole_programs_per_sm": group["whole_programs_per_sm"], "whole_sm": group["whole_sm"]}
    return dict(kv_wave_programs=multiprocessors * per_sm, split_kv_time_ratio=whole / split,
                split_kv_requests=split_kv_requests(scenario, e.engine, heads),
                kv_whole_pace_tokens_per_s=pace.get("whole", 0.0), kv_split_pace_tokens_per_s=pace.get("split", 0.0),
                kv_split_segments=SPLIT_KV_SEGMENTS, kv_split_layer_s=pace.get("split_layer_s") or 0.0,
                kv_split_programs_per_sm=pace.get("split_programs_per_sm") or 0,
                kv_split_sm_tokens_per_s=pace.get("split_sm") or 0.0,
                kv_whole_programs_per_sm=pace.get("whole_programs_per_sm") or 0,
                kv_whole_sm_tokens_per_s=pace.get("whole_sm") or 0.0,
                multiprocessors=multiprocessors)

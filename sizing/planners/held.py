"""Designs held to the serving simulation (sizing/planners/serving.py, docs/formulas.md 'Designs held to the
serving simulation'): the replicas a design needs are the fewest whose simulated engine keeps the targets.

The queueing model (sizing/planners/slo.py) prices every design quickly but knows nothing of a real engine's
scheduling: prompts chunked into decode steps, a pool that fills and preempts, the stalls a long prompt puts into
every running request's tokens. Here one replica of the design is run step by step under its share of the peak, a
closed loop of c requests in flight with the workload's mix of lengths, and its median (or the percentile the
targets name) TTFT and ITL are read as a load generator would. The most requests per replica that keep the targets,
c*, gives the replicas: ⌈N / c*⌉.

A disaggregated design's decode replicas are simulated the same way, their prompts arriving already in the pool;
its prefill pool keeps the queueing model, run at the rate the simulated decode pool sustains.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..capacity.scenario import Scenario
from ..efficiency import DecodeEfficiency
from ..engines import get_engine
from .fleet import Candidate, replica_model
from .serving import HOST_PACED_SHARE, HOST_SPREAD, LAUNCH_SPREAD, SIMULATED, Load, Served, serving_replica, simulate
from .step_model import queries_per_kv_head
from .step_notes import simulation_source
from ..errors import KvsizeError
from .slo import MAX_PREFILL_BUSY, Design, Targets, _failed, _prefill, disaggregated_design, prefill_pool
from .workload import Workload

NOT_SIMULATED = "not simulated"  # how a pruned design's reason begins
# Requests measured per point past the closed loop's opening burst of c (each sent in a steady state of c in flight):
# at least this many, so that a mix's rare long prompts (5% in examples/workload.yaml) are met a few times and a
# percentile does not hang on whether one of them happened to be queued ahead. At 64, Llama-3.1-70B on
# examples/shared-prefix.yaml (40K- and 100K-token prompts, 70/30) gave a p50 TTFT that crossed the 2 s target and came
# back between 4 and 8 in flight, and its fleet moved from 232 to 536 GPUs on a 17 ms term; at 128 and at 256 it holds
# at 152-160 GPUs (Llama-3.1-8B on examples/workload.yaml: 14 GPUs at 64, 16 at 128 and 256).
MIN_MEASURED_REQUESTS = 256
# Designs simulated per plan, cheapest lower bound first: each costs some ten simulations of a replica, and a design
# whose lower bound already costs more than one simulated is never simulated.
MAX_SIMULATED_DESIGNS = 12
_GOLDEN_FRACTION = (math.sqrt(5) - 1) / 2  # a low-discrepancy walk through the mix: every share met within 1/n


def mix_lengths(workload: Workload, n: int) -> tuple[tuple[int, int], ...]:
    """(prompt tokens to prefill, output tokens) of n requests drawn from the workload's mix in proportion to its
    shares; the shared prefix (prefix_cache_share) is found in the cache, not prefilled."""
    mix = workload.mix()
    cumulative, total = [], 0.0
    for b in mix:
        total += b.share_percent / 100
        cumulative.append(total)
    out = []
    for k in range(n):
        u = (k * _GOLDEN_FRACTION) % 1.0
        b = next((b for b, c in zip(mix, cumulative) if u < c), mix[-1])
        prompt = max(1, round(b.mean_prompt_tokens * (1 - workload.prefix_cache_share)))
        out.append((prompt, b.output_tokens))
    return tuple(out)


def steady_load(workload: Workload, concurrency: int, prefilled: bool = False) -> Load:
    """A closed loop of `concurrency` requests in flight: the opening burst of c, then the measured requests (each
    sent while c are in flight), then c more so that the measured ones finish before the loop drains."""
    measured = max(concurrency, MIN_MEASURED_REQUESTS)
    n = 2 * concurrency + measured
    return Load(1, 1, n, concurrency=concurrency, lengths=mix_lengths(workload, n),
                measured=(concurrency, concurrency + measured), prefilled=prefilled)


@dataclass(frozen=True)
class Replica:
    """One replica of a candidate as the simulation runs it."""

    candidate: Candidate
    model: object  # StepModel
    engine: object  # Scheduler
    most_requests: int  # the pool's hold at the mix (or max_num_seqs): past it requests queue for blocks
    step_at: object  # ReplicaModel.step_at: the decode step alone at the peak spread over so many replicas
    prompt_seconds: float  # the mix's mean prompt at the least it takes to prefill here (its FLOPs)
    api_servers: int = 1  # vLLM's --api-server-count: its API servers share the streaming (StepModel.api_s_per_token)
    more_api_servers: bool = False  # the engine runs several API servers (vLLM's --api-server-count)
    speed_source: str = ""  # step_notes.simulation_source for this replica

    def with_api_servers(self, n: int) -> Replica:
        """The same replica under `n` API servers, which share the API server's streaming work."""
        per_token = self.model.api_s_per_token * self.api_servers / n
        return replace(self, model=replace(self.model, api_s_per_token=per_token), api_servers=n)

    def served(self, workload: Workload, concurrency: int, prefilled: bool = False) -> Served:
        engine = replace(self.engine, max_num_seqs=concurrency)
        return simulate(self.model, engine, steady_load(workload, concurrency, prefilled))


def replica_for(base: Scenario, candidate: Candidate, workload: Workload, efficiency: DecodeEfficiency) -> Replica:
    """The candidate's replica, sized for the workload's longest request; the blocks of the one shared prefix prefix
    caching keeps are not free for requests."""
    sized = replica_model(base, candidate, workload, efficiency)
    g, tp = candidate.gpu, candidate.tensor_parallel_size
    longest = max(b.max_context_tokens for b in workload.mix())
    scenario = g.scenario(base, k_cache_dtype=candidate.kv_format, v_cache_dtype=candidate.kv_format,
                          tensor_parallel_size=tp, pipeline_parallel_size=1, max_model_len=longest, concurrency=1)
    model, engine = serving_replica(scenario, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors,
                                    sized.efficiency)
    shared_prefix = max(int(workload.prefix_cache_share * b.mean_prompt_tokens) for b in workload.mix())
    prefix_blocks = -(-shared_prefix // engine.block_size) if shared_prefix else 0
    engine = replace(engine, num_blocks=max(0, engine.num_blocks - prefix_blocks))
    prompts = [(b.share_percent / 100, max(1, round(b.mean_prompt_tokens * (1 - workload.prefix_cache_share))))
               for b in workload.mix()]
    source = simulation_source(sized.estimate.engine.name, sized.estimate.engine.version, g.id, model.kv_format,
                               queries_per_kv_head(model.shape))
    return Replica(candidate, model, engine, min(workload.peak_concurrency, sized.shared.requests_per_replica),
                   sized.step_at, sum(share * model.prefill_compute_seconds(t) for share, t in prompts),
                   more_api_servers=get_engine(base.engine).name == "vllm", speed_source=source)


def _met(served: Served, targets: Targets) -> bool:
    """TTFT over requests and the ITL a request sees, its mean gap (TPOT: a median gap between decode steps hides
    the stalls prompts put into them), at the targets' percentile."""
    q = targets.percentile
    return targets.met(served.ttft_ms[q] / 1e3, served.tpot_ms[q] / 1e3)


def most_in_flight(replica: Replica, workload: Workload, targets: Targets, prefilled: bool = False,
                   guess: int = 1) -> tuple[int, Served] | None:
    """The most requests one replica keeps in flight under the targets (more never serve faster: bisection), with
    its figures there; None when one request alone misses them. The search doubles up or halves down from `guess`
    (the queueing model's answer) before it bisects, so its costliest run is near the answer's load."""
    ok = {}

    def meets(c: int) -> bool:
        if c not in ok:
            served = replica.served(workload, c, prefilled)
            ok[c] = (_met(served, targets), served)
        return ok[c][0]

    most = replica.most_requests
    if most < 1:
        return None
    lo = hi = min(max(1, guess), most)
    if meets(lo):
        hi = most + 1  # past the pool
        while 2 * lo < hi and meets(2 * lo):
            lo *= 2
        hi = min(hi, 2 * lo)
    else:
        while lo > 1 and not meets(lo):
            hi, lo = lo, max(1, lo // 2)
        if not meets(lo):
            return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    return lo, ok[lo][1]


def _at_replicas(replica: Replica, workload: Workload, most: int, prefilled: bool) -> tuple[int, int, Served]:
    """(replicas, requests each, figures) when the peak is spread evenly over the fewest replicas holding `most`."""
    replicas = math.ceil(workload.peak_concurrency / most)
    each = math.ceil(workload.peak_concurrency / replicas)
    return replicas, each, replica.served(workload, each, prefilled)


# the API servers a host-paced vLLM replica is tried with (`--api-server-count`), as batches b8 and b9 ran them
MORE_API_SERVERS = 4


def host_note(served: Served) -> str:
    """What a design's reason adds where the host sets most of its steps, or its launch most of its prompt steps;
    empty where the GPU does."""
    note = ""
    if served.host_paced:
        note += (f"; the host sets {served.host_paced_share:.0%} of its step time (the engine core's work on each "
                 f"stream and the API server's streaming, or the launch of its layers): the speed is the host CPUs' as "
                 f"much as the GPU's ({HOST_SPREAD})")
    if served.launch_paced_prompt_share >= HOST_PACED_SHARE:
        note += (f"; the host's launch of the layers sets {served.launch_paced_prompt_share:.0%} of its prompt steps' "
                 f"time (prompts past the largest CUDA graph launch every kernel from Python): its TTFT is the host "
                 f"CPU's, which kvsize cannot know ({LAUNCH_SPREAD})")
    return note


def _more_api_servers(replica: Replica, workload: Workload, targets: Targets, found: tuple[int, Served],
                      guess: int, prefilled: bool = False) -> tuple[Replica, tuple[int, Served]]:
    """Where the host paces a vLLM replica at its answer, the same replica under MORE_API_SERVERS API servers when
    they keep more requests in flight under the targets (fewer replicas); else the replica as it was. `prefilled`:
    a disaggregated design's decode replica, its prompts arriving in its pool."""
    if not (replica.more_api_servers and found[1].host_paced):
        return replica, found
    more = replica.with_api_servers(MORE_API_SERVERS)
    held = most_in_flight(more, workload, targets, prefilled, guess=max(guess, found[0]))
    peak = workload.peak_concurrency
    if held is not None and math.ceil(peak / held[0]) < math.ceil(peak / found[0]):
        return more, held
    return replica, found


def hold_aggregated(design: Design, replica: Replica, workload: Workload, targets: Targets) -> Design:
    q = targets.percentile
    guess = _guess(design, workload)
    found = most_in_flight(replica, workload, targets, guess=guess)
    c = design.decode
    if found is not None:
        replica, found = _more_api_servers(replica, workload, targets, found, guess)
    if found is None:
        alone = replica.served(workload, 1)
        return replace(_failed("aggregated", c, None, (
            f"misses the targets in the serving simulation even at one request per replica: p{q} TTFT "
            f"{alone.ttft_ms[q]:,.0f} ms, ITL {alone.tpot_ms[q]:.1f} ms")), basis=SIMULATED)
    replicas, each, served = _at_replicas(replica, workload, found[0], False)
    tp = c.tensor_parallel_size
    gpus = replicas * tp
    rate = served.requests_per_s * replicas
    return Design("aggregated", c, replicas, None, 0, gpus, gpus * c.gpu.usd_per_hour, served.tpot_ms[q] / 1e3,
                  served.ttft_ms[q] / 1e3, 0.0, rate, served.output_tokens_per_s * replicas, True,
                  f"{replicas} replica(s) × TP {tp}, {each} requests in flight each (simulated: at most {found[0]} "
                  f"keep the targets; p99 TTFT {served.ttft_ms[99]:,.0f} ms, ITL {served.tpot_ms[99]:.1f} ms, "
                  f"p99 gap {served.itl_ms[99]:,.0f} ms){_api_note(replica.api_servers)}{host_note(served)}",
                  SIMULATED, replica.api_servers)


def _api_note(api_servers: int) -> str:
    if api_servers == 1:
        return ""
    return (f"; {api_servers} API servers (--api-server-count {api_servers}): one would pace the streams and hold "
            f"fewer requests")


@dataclass(frozen=True)
class DecodePool:
    """A decode-only replica's most requests in flight under the ITL target, prompts arriving in its pool."""

    replicas: int
    each: int
    served: Served | None  # at `each` in flight; None: one request alone misses the target
    alone: Served
    api_servers: int = 1  # vLLM's --api-server-count on each decode replica (more where the host paces it)


def _guess(design: Design, workload: Workload) -> int:
    """Requests in flight per decode replica in the queueing model's design (the pool's half where it found none)."""
    if design.decode_replicas:
        return math.ceil(workload.peak_concurrency / design.decode_replicas)
    return max(1, workload.peak_concurrency // 2)


def decode_pool(replica: Replica, workload: Workload, targets: Targets, guess: int) -> DecodePool:
    """The decode replicas under the ITL target alone (TTFT is the prefill pool's); a host-paced vLLM pool is tried
    under MORE_API_SERVERS API servers as an aggregated replica is."""
    itl = Targets(None, targets.itl_seconds, targets.percentile)
    found = most_in_flight(replica, workload, itl, prefilled=True, guess=guess)
    if found is None:
        return DecodePool(0, 0, None, replica.served(workload, 1, prefilled=True))
    replica, found = _more_api_servers(replica, workload, itl, found, guess, prefilled=True)
    replicas, each, served = _at_replicas(replica, workload, found[0], True)
    return DecodePool(replicas, each, served, found[1], replica.api_servers)


def hold_disaggregated(design: Design, pool: DecodePool, base: Scenario, workload: Workload, targets: Targets,
                       mfu: float) -> Design:
    """Decode replicas simulated with prompts arriving in the pool; the prefill pool by the queueing model at the
    ITL the simulated decode pool keeps, a shipped prompt's wait for blocks added to its TTFT."""
    q = targets.percentile
    decode, prefill = design.decode, design.prefill
    move = design.transfer_seconds
    if pool.served is None:
        return replace(_failed("disaggregated", decode, prefill, (
            f"decode misses the ITL target in the serving simulation even at one request per replica "
            f"(p{q} {pool.alone.tpot_ms[q]:.1f} ms)")), basis=SIMULATED)
    p = _prefill(base, prefill, decode.kv_format, workload, mfu, None)
    itl = pool.served.tpot_ms[q] / 1e3
    wait = pool.served.ttft_ms[q] / 1e3
    prefills = prefill_pool(workload, p, move + wait, itl, targets)
    if prefills is None:
        return replace(_failed("disaggregated", decode, prefill, (
            f"misses the TTFT target: prefill {p * 1e3:.0f} ms + KV transfer {move * 1e3:.1f} ms + decode admission "
            f"{wait * 1e3:.0f} ms")), basis=SIMULATED)
    note = f"; decode simulated, {pool.each} requests in flight each{_api_note(pool.api_servers)}"
    return disaggregated_design(decode, pool.replicas, prefill, prefills, itl, move, workload, SIMULATED,
                                note + host_note(pool.served), pool.api_servers)


# A request's token pace is at least the decode step of the requests decoding beside it; with prompts being
# prefilled some of the c in flight are not decoding, so the least-cost estimate takes the step of half of them.
DECODING_SHARE_FLOOR = 0.5


def _most_by_pace(replica: Replica, workload: Workload, itl_seconds: float | None) -> int:
    """The most requests in flight whose decode step alone, at DECODING_SHARE_FLOOR of them, keeps the ITL target."""
    most = replica.most_requests
    if itl_seconds is None or most < 1:
        return most

    def paced(c: int) -> bool:
        return replica.step_at(workload.peak_concurrency / max(1.0, c * DECODING_SHARE_FLOOR)).seconds <= itl_seconds

    if paced(most):
        return most
    lo, hi = 0, most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if paced(mid) else (lo, mid)
    return lo


def _least_rate(workload: Workload, targets: Targets) -> float:
    """Requests per second the peak's N in flight send at the least when each takes its targets: N / (TTFT + mean
    output × ITL); 0 without both targets."""
    if targets.ttft_seconds is None or targets.itl_seconds is None:
        return 0.0
    return workload.peak_concurrency / (targets.ttft_seconds + workload.mean("output_tokens") * targets.itl_seconds)


def _least_usd(design: Design, replica: Replica, workload: Workload, targets: Targets, prefill_seconds) -> float:
    """What a design of this candidate could cost at the least: replicas that hold at most what their pool and their
    decode step allow, and, at the least rate the targets imply, prefill that keeps up (an aggregated replica's
    prefill under its whole time, a prefill pool under MAX_PREFILL_BUSY)."""
    c = design.decode
    most = _most_by_pace(replica, workload, targets.itl_seconds)
    least = math.ceil(workload.peak_concurrency / most) if most > 0 else math.inf
    rate = _least_rate(workload, targets)
    if design.prefill is None:
        least = max(least, math.ceil(rate * replica.prompt_seconds - 1e-9))
        return least * c.tensor_parallel_size * c.gpu.usd_per_hour
    prefills = max(1, math.ceil(rate * prefill_seconds(design) / MAX_PREFILL_BUSY - 1e-9))
    return (least * c.tensor_parallel_size * c.gpu.usd_per_hour
            + prefills * design.prefill.tensor_parallel_size * design.prefill.gpu.usd_per_hour)


@dataclass(frozen=True)
class HeldDesigns:
    designs: list[Design]  # every design; those simulated say so in their basis
    simulated: int  # replicas simulated (one per candidate and role: aggregated, or decode of a disaggregated pool)
    skipped: int  # designs whose least cost already exceeded a simulated design that meets the targets
    unsimulated: int  # designs left out past MAX_SIMULATED_DESIGNS replicas


def hold_designs(designs: list[Design], base: Scenario, workload: Workload, efficiency: DecodeEfficiency,
                 targets: Targets, limit: int = MAX_SIMULATED_DESIGNS) -> HeldDesigns:
    """Every design the engine can run, held to the simulation in order of the least it could cost, until the next
    one's least cost exceeds the cheapest simulated one that meets the targets. A disaggregated design's decode
    pool is one simulation for every prefill pool paired with it."""
    replicas: dict[Candidate, Replica] = {}
    bounded = []

    def prompt_seconds(d: Design) -> float:  # the prefill pool's, as the queueing model runs it
        return _prefill(base, d.prefill, d.decode.kv_format, workload, efficiency.mfu, None)

    for d in designs:
        try:
            if d.decode not in replicas:
                replicas[d.decode] = replica_for(base, d.decode, workload, efficiency)
        except KvsizeError:  # a candidate the engine cannot run keeps the queueing model's reason
            continue
        r = replicas[d.decode]
        bounded.append((_least_usd(d, r, workload, targets, prompt_seconds), d, r))
    bounded.sort(key=lambda x: (x[0], x[1].gpus))
    held: dict[int, Design] = {}
    pools: dict[tuple[Candidate, bool], object] = {}  # (candidate, disaggregated) -> its simulated replica sizing
    best = math.inf
    skipped = unsimulated = 0
    for bound, d, r in bounded:
        key = (d.decode, d.prefill is not None)
        if bound > best:
            skipped += 1
            held[id(d)] = replace(d, meets=False, reason=(
                f"{NOT_SIMULATED}: by its pool and its decode step it costs at least ${bound:,.2f}/h, more than the "
                f"cheapest simulated design (${best:,.2f}/h); queueing model: {d.reason}"))
            continue
        if key not in pools and len(pools) >= limit:
            unsimulated += 1
            held[id(d)] = replace(d, meets=False, reason=(
                f"{NOT_SIMULATED} (kvsize simulates the {limit} replicas that could cost least), so never chosen; "
                f"queueing model: {d.reason}"))
            continue
        if d.prefill is None:
            h = pools.get(key) or pools.setdefault(key, hold_aggregated(d, r, workload, targets))
        else:
            pool = pools.get(key) or pools.setdefault(key, decode_pool(r, workload, targets, _guess(d, workload)))
            h = hold_disaggregated(d, pool, base, workload, targets, efficiency.mfu)
        h = replace(h, speed_source=r.speed_source)
        held[id(d)] = h
        if h.meets:
            best = min(best, h.usd_per_hour)
    return HeldDesigns([held.get(id(d), d) for d in designs], len(pools), skipped, unsimulated)



def none_of_kind(designs: list[Design], kind: str) -> str:
    """Why no design of a kind heads its column: none met the targets, or none was simulated because none could cost
    less than the chosen one."""
    of_kind = [d for d in designs if d.kind == kind]
    pruned = [d for d in of_kind if d.reason.startswith(NOT_SIMULATED)]
    if of_kind and len(pruned) == len(of_kind):
        return (f"none simulated: all {len(pruned)} could not cost less than the chosen design (the designs table "
                "gives each one's least cost)")
    return "none meets the targets"

"""Designs against latency targets: aggregated replicas that prefill and decode, or disaggregated
prefill and decode pools that ship each request's KV between them; the cheapest design that meets
TTFT and ITL targets, and the frontier of cost against latency.

Both kinds share the workload's peak of N requests in flight. A request lasts its TTFT plus its
output tokens at the ITL, so the pool serves λ = N / (TTFT + Σ share × output × ITL) requests per
second (Little's law). Prefill is compute-bound (sizing/planners/speed.py prefill_seconds), one prompt at a
time per replica; prompts wait as in an M/D/1 queue, W = ρ p / (2 (1 − ρ)) for a replica busy ρ of
the time with prompts of p seconds.

Aggregated: every replica also prefills its share λ / R of the prompts, which takes ρ = λ p / R of
its time from decoding (chunked prefill interleaves them; the work is the same), so its inter-token
latency is the decode step / (1 − ρ) and its TTFT is p + W.

Disaggregated: decode replicas only decode (their step is the ITL); prefill replicas, on their own
GPU kind and TP, take λ p_P / R_P of their time; each request's KV, its prompt's tokens in the
decode pool's format and layout, crosses the P/D link one layer at a time (sizing/planners/tiers.py
layered_send_seconds) before its first token: TTFT = p_P + W + transfer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from ..errors import KvsizeError
from .fleet import SECONDS_PER_HOUR, Candidate, replica_model
from ..capacity.scenario import Scenario
from ..capacity.estimate import estimate
from ..efficiency import DecodeEfficiency
from .serving import PERCENTILES as TARGET_PERCENTILES  # a design's targets hold at one the simulation reports
from .speed import prefill_seconds
from .tiers import LinkFit, layered_send_seconds
from .workload import Workload

# what sized a design
QUEUEING_MODEL = "queueing model"  # this module's M/D/1 model; held.py's designs say serving.SIMULATED
MAX_PREFILL_BUSY = 0.95  # a prefill queue busier than this has no steady state worth planning on
FIXED_POINT_ROUNDS = 500  # iterations to converge λ and the ITL to 1e-12 (a few dozen suffice)


@dataclass(frozen=True)
class Targets:
    ttft_seconds: float | None = None
    itl_seconds: float | None = None
    percentile: int = 50  # of requests' TTFT and of inter-token gaps, where the serving simulation holds a design

    def __post_init__(self) -> None:
        if self.percentile not in TARGET_PERCENTILES:
            raise KvsizeError(f"the targets' percentile must be one of {', '.join(map(str, TARGET_PERCENTILES))}, "
                              f"got {self.percentile!r}")
        for name, value in (("TTFT", self.ttft_seconds), ("ITL", self.itl_seconds)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise KvsizeError(f"the {name} target must be a positive finite number of seconds, got {value}")

    def met(self, ttft: float, itl: float) -> bool:
        return ((self.ttft_seconds is None or ttft <= self.ttft_seconds)
                and (self.itl_seconds is None or itl <= self.itl_seconds))


@dataclass(frozen=True)
class Design:
    kind: Literal["aggregated", "disaggregated"]
    decode: Candidate
    decode_replicas: int
    prefill: Candidate | None  # disaggregated only
    prefill_replicas: int
    gpus: int
    usd_per_hour: float
    itl_seconds: float
    ttft_seconds: float
    transfer_seconds: float  # KV shipped from prefill to decode, per request (disaggregated)
    requests_per_second: float
    output_tokens_per_second: float
    meets: bool
    reason: str
    # what sized it: the queueing model (sizing/planners/slo.py) or the serving simulation (sizing/planners/held.py)
    basis: str = QUEUEING_MODEL
    api_servers: int = 1  # vLLM's --api-server-count on its (decode) replicas (held.py tries more where the host paces)
    # where a simulated design's step terms were measured, and what is carried from there (serving.simulation_source)
    speed_source: str = ""

    @property
    def usd_per_million_output_tokens(self) -> float:
        if not self.output_tokens_per_second:
            return math.inf
        return self.usd_per_hour / (self.output_tokens_per_second * SECONDS_PER_HOUR / 1e6)

    @property
    def layout(self) -> str:
        d = self.decode
        own = f"{self.decode_replicas} × {d.gpu.id} TP{d.tensor_parallel_size} {d.kv_format}"
        if self.prefill is None:
            return own
        p = self.prefill
        return f"prefill {self.prefill_replicas} × {p.gpu.id} TP{p.tensor_parallel_size}, decode {own}"

    @property
    def label(self) -> str:
        return f"{self.kind}: {self.layout}"


def _mdl_wait(busy: float, service: float) -> float:
    return busy * service / (2 * (1 - busy))


def aggregated_at(replicas: int, step_seconds: float, prefill: float, workload: Workload
                  ) -> tuple[float, float, float] | None:
    """(ITL, TTFT, requests per second) of `replicas` replicas that prefill and decode, or None when
    prefill alone would keep them busy. λ depends on the ITL and the ITL on λ: a fixed point, found
    by iterating from the decode step alone (λ falls as the ITL rises, so it converges)."""
    n, output = workload.peak_concurrency, workload.mean("output_tokens")
    itl, busy = step_seconds, 0.0
    for _ in range(FIXED_POINT_ROUNDS):
        rate = n / (prefill + _mdl_wait(busy, prefill) + output * itl)
        new_busy = rate * prefill / replicas
        if new_busy >= MAX_PREFILL_BUSY:
            return None
        done = abs(new_busy - busy) <= 1e-13
        busy, itl = new_busy, step_seconds / (1 - new_busy)
        if done:
            break
    return itl, prefill + _mdl_wait(busy, prefill), n / (prefill + _mdl_wait(busy, prefill) + output * itl)


@dataclass(frozen=True)
class TierOption:
    """KV tiers below each replica's HBM (sizing/planners/tiers.py): prompts whose prefix is found there are
    not prefilled again; their KV is reloaded instead."""

    sizes: dict
    links: dict
    session_tokens: int = 32768


def _prefill(base: Scenario, candidate: Candidate, kv_format: str, workload: Workload, mfu: float,
             tiers: TierOption | None) -> float:
    """Mean seconds a replica of `candidate` spends on one prompt: its prefill, or with tiers and the
    workload's sessions, the prefill of what is not found plus the reload of what is."""
    tp, g = candidate.tensor_parallel_size, candidate.gpu
    if tiers is None:
        return prefill_seconds(base.shape, int(workload.mean("mean_prompt_tokens")), tp, g.bf16_dense_tflops, mfu)
    from .tiers import tiers_for

    return tiers_for(_on(base, g, kv_format, tp, workload), workload, tiers.sizes, tiers.links, tiers.session_tokens,
                     mfu)[1].ttft_seconds


def _on(base: Scenario, gpu, kv_format: str, tp: int, workload: Workload) -> Scenario:
    """One replica of `base` on `gpu` (a GpuOffer), sized for the workload's longest request."""
    return gpu.scenario(base, k_cache_dtype=kv_format, v_cache_dtype=kv_format, tensor_parallel_size=tp,
                        pipeline_parallel_size=1, max_model_len=max(b.max_context_tokens for b in workload.mix()),
                        concurrency=1)


def _aggregated(base: Scenario, candidate: Candidate, workload: Workload, efficiency: DecodeEfficiency,
                targets: Targets, tiers: TierOption | None = None) -> Design:
    model = replica_model(base, candidate, workload, efficiency)
    tp, g = candidate.tensor_parallel_size, candidate.gpu
    prefill = _prefill(base, candidate, candidate.kv_format, workload, model.efficiency.mfu, tiers)
    least = model.shared.replicas
    if model.shared.requests_per_replica <= 0:
        return _failed("aggregated", candidate, None, "one request of the mix does not fit")

    def at(r: int):
        return aggregated_at(r, model.step_at(r).seconds, prefill, workload)

    def ok(r: int) -> bool:
        got = at(r)
        return got is not None and targets.met(got[1], got[0])

    most = workload.peak_concurrency
    if not ok(most):
        got = at(most)
        why = ("prefill alone keeps every replica busy" if got is None else
               f"at one request per replica ITL {got[0] * 1e3:.1f} ms, TTFT {got[1] * 1e3:.0f} ms")
        return _failed("aggregated", candidate, None, f"misses the targets: {why}")
    lo, hi = least - 1, most  # ok(hi); the fewest replicas that meet the targets, by bisection
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid >= least and ok(mid):
            hi = mid
        else:
            lo = mid
    itl, ttft, rate = at(hi)
    gpus = hi * tp
    return Design("aggregated", candidate, hi, None, 0, gpus, gpus * g.usd_per_hour, itl, ttft, 0.0, rate,
                  rate * workload.mean("output_tokens"), True,
                  f"{hi} replica(s) × TP {tp}, prefill busy {rate * prefill / hi:.0%} of their time")


def _failed(kind, decode: Candidate, prefill: Candidate | None, reason: str) -> Design:
    return Design(kind, decode, 0, prefill, 0, 0, 0.0, math.inf, math.inf, 0.0, 0.0, 0.0, False, reason)


def transfer_seconds(layout, tp: int, workload: Workload, link: LinkFit, link_shared: bool) -> float:
    """A mean prompt's KV in the decode pool's layout (one decode GPU's), one send per layer; a link the
    node's GPUs share (a NIC) carries every GPU's share."""
    tokens = int(workload.mean("mean_prompt_tokens"))
    per_layer = [sum(spec.bytes_for(tokens)) for spec in layout.kv.values()]
    if link_shared:
        per_layer = [b * tp for b in per_layer]
    return layered_send_seconds(link, per_layer) if per_layer else 0.0


def _disaggregated(base: Scenario, decode: Candidate, prefill_candidate: Candidate, workload: Workload,
                   efficiency: DecodeEfficiency, targets: Targets, link: LinkFit, link_shared: bool,
                   tiers: TierOption | None = None) -> Design:
    model = replica_model(base, decode, workload, efficiency)
    if model.shared.requests_per_replica <= 0:
        return _failed("disaggregated", decode, prefill_candidate, "one request of the mix does not fit the decode GPU")
    # The prefill GPU must hold one prompt's KV: its own estimate at the longest request.
    pe = estimate(_on(base, prefill_candidate.gpu, decode.kv_format, prefill_candidate.tensor_parallel_size, workload))
    if not pe.fits:
        return _failed("disaggregated", decode, prefill_candidate, f"the prefill GPU cannot hold a prompt: {pe.fit_message}")
    p = _prefill(base, prefill_candidate, decode.kv_format, workload, model.efficiency.mfu, tiers)
    move = transfer_seconds(model.estimate.layout, decode.tensor_parallel_size, workload, link, link_shared)
    least, most = model.shared.replicas, workload.peak_concurrency
    itl_ok = [r for r in (least, most) if targets.itl_seconds is None or model.step_at(r).seconds <= targets.itl_seconds]
    if not itl_ok:
        return _failed("disaggregated", decode, prefill_candidate,
                       f"decode misses the ITL target even at one request per replica "
                       f"({model.step_at(most).seconds * 1e3:.1f} ms)")
    lo, hi = least - 1, most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if mid >= least and (targets.itl_seconds is None or model.step_at(mid).seconds <= targets.itl_seconds):
            hi = mid
        else:
            lo = mid
    decode_replicas, itl = hi, model.step_at(hi).seconds
    pool = prefill_pool(workload, p, move, itl, targets)
    if pool is None:
        return _failed("disaggregated", decode, prefill_candidate,
                       f"misses the TTFT target: prefill {p * 1e3:.0f} ms + KV transfer {move * 1e3:.1f} ms")
    return disaggregated_design(decode, decode_replicas, prefill_candidate, pool, itl, move, workload)


@dataclass(frozen=True)
class PrefillPool:
    replicas: int
    ttft_seconds: float
    requests_per_second: float
    busy: float


def prefill_pool(workload: Workload, prompt_seconds: float, move: float, itl: float,
                 targets: Targets) -> PrefillPool | None:
    """The fewest prefill replicas whose TTFT (prefill, its M/D/1 queue and the KV transfer) meets the target while
    the decode pool keeps `itl`; None when no number of them does. λ depends on TTFT; more replicas never raise a
    replica's load or the queue, so the first that meets it is found by bisection (a peak of millions of requests
    costs some twenty evaluations, not millions)."""
    p, output = prompt_seconds, workload.mean("output_tokens")

    def at(replicas: int) -> tuple[PrefillPool, bool]:
        ttft, rate, busy = p + move, 0.0, 0.0
        for _ in range(FIXED_POINT_ROUNDS):
            rate = workload.peak_concurrency / (ttft + output * itl)
            new_busy = rate * p / replicas
            done = abs(new_busy - busy) <= 1e-13
            busy = new_busy
            if busy >= MAX_PREFILL_BUSY:
                break
            ttft = p + _mdl_wait(busy, p) + move
            if done:
                break
        return PrefillPool(replicas, ttft, rate, busy), busy < MAX_PREFILL_BUSY and targets.met(ttft, itl)

    most = workload.peak_concurrency
    if not at(most)[1]:
        return None
    lo, hi = 0, most
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if at(mid)[1] else (mid, hi)
    return at(hi)[0]


def disaggregated_design(decode: Candidate, decode_replicas: int, prefill: Candidate, pool: PrefillPool, itl: float,
                         move: float, workload: Workload, basis: str = QUEUEING_MODEL, note: str = "",
                         api_servers: int = 1) -> Design:
    gpus = decode_replicas * decode.tensor_parallel_size + pool.replicas * prefill.tensor_parallel_size
    cost = (decode_replicas * decode.tensor_parallel_size * decode.gpu.usd_per_hour
            + pool.replicas * prefill.tensor_parallel_size * prefill.gpu.usd_per_hour)
    rate = pool.requests_per_second
    return Design("disaggregated", decode, decode_replicas, prefill, pool.replicas, gpus, cost, itl,
                  pool.ttft_seconds, move, rate, rate * workload.mean("output_tokens"), True,
                  f"P:D = {pool.replicas}:{decode_replicas} replicas, prefill busy {pool.busy:.0%}, "
                  f"KV {move * 1e3:.1f} ms per request over the P/D link{note}", basis, api_servers)


PD_LINK_KINDS = ("peer", "remote")  # prefill and decode GPUs talk over NVLink in one host, or a network


def pd_link(key: str, option: str = "--pd-link") -> tuple[LinkFit | None, bool, bool]:
    """(link, shared by the node's GPUs, within one host) for a P/D link name; (None, False, False) for none."""
    from ..profiles import link_ids, link_profile
    from .tiers import link_fit

    key = key.strip()
    if key.lower() == "none":
        return None, False, False
    profile = link_profile(key, option)
    if profile.kind not in PD_LINK_KINDS:
        raise KvsizeError(f"{option} {key} is a {profile.kind} link; prefill and decode GPUs talk over a peer link "
                          "(NVLink) or a network: one of "
                          + ", ".join(k for k in link_ids() if link_profile(k).kind in PD_LINK_KINDS) + ", or none")
    return link_fit(key), profile.shared_by_gpus, profile.kind == "peer"


def search_designs(base: Scenario, candidates: list[Candidate], workload: Workload, efficiency: DecodeEfficiency,
                   targets: Targets, link: LinkFit | None = None, link_shared: bool = False,
                   prefill_candidates: list[Candidate] | None = None, same_host: bool = False,
                   tiers: TierOption | None = None) -> list[Design]:
    """Every aggregated candidate, and with a P/D link every (prefill GPU and TP, decode candidate)
    pair; designs a candidate cannot run keep their reason. A link within one host (NVLink) pairs
    only GPUs of one kind: a host holds one kind."""
    if tiers is not None and not workload.sessions:
        raise KvsizeError("KV tiers need the workload's sessions (what requests reuse) to save any prefill: add a "
                          "sessions: list (examples/multi-turn-chat.yaml)")
    designs = []
    for c in candidates:
        try:
            designs.append(_aggregated(base, c, workload, efficiency, targets, tiers))
        except KvsizeError as err:
            designs.append(_failed("aggregated", c, None, str(err)))
    if link is not None:
        prefills = prefill_candidates if prefill_candidates is not None else _distinct_prefill(candidates)
        for d in candidates:
            for p in prefills:
                if same_host and p.gpu.id != d.gpu.id:
                    continue
                try:
                    designs.append(_disaggregated(base, d, p, workload, efficiency, targets, link, link_shared,
                                                  tiers))
                except KvsizeError as err:
                    designs.append(_failed("disaggregated", d, p, str(err)))
    return designs


def _distinct_prefill(candidates: list[Candidate]) -> list[Candidate]:
    """Prefill replicas by GPU and TP (their KV format is the decode pool's)."""
    seen = {}
    for c in candidates:
        seen.setdefault((c.gpu.id, c.tensor_parallel_size), c)
    return list(seen.values())


def ranked(designs: list[Design]) -> list[Design]:
    """Designs that meet the targets, cheapest per hour first (then fewer GPUs, then a format of published
    near-lossless accuracy before one without, as the capacity table ranks them, then lower TTFT and ITL); then the
    rest."""
    from .guidance import NEAR_LOSSLESS_FORMATS

    return sorted(designs, key=lambda d: (not d.meets, d.usd_per_hour, d.gpus,
                                          d.decode.kv_format not in NEAR_LOSSLESS_FORMATS, d.ttft_seconds,
                                          d.itl_seconds))


def cheapest(designs: list[Design]) -> Design | None:
    first = next(iter(ranked(designs)), None)
    return first if first is not None and first.meets else None


def frontier(designs: list[Design]) -> list[Design]:
    """Designs meeting the targets that no other beats on cost per million output tokens, ITL and
    TTFT together; cheapest first."""
    meeting = [d for d in designs if d.meets]
    out = []
    for d in meeting:
        key = (d.usd_per_million_output_tokens, d.itl_seconds, d.ttft_seconds)
        dominated = any(
            all(a <= b for a, b in zip(k2, key)) and k2 != key
            for k2 in ((o.usd_per_million_output_tokens, o.itl_seconds, o.ttft_seconds) for o in meeting))
        if not dominated:
            out.append(d)
    return sorted(out, key=lambda d: (d.usd_per_million_output_tokens, d.itl_seconds, d.ttft_seconds))


def design_row(d: Design) -> dict:
    """A design as plain values, for tables and spreadsheets."""
    return dict(
        design=d.label, kind=d.kind, meets=d.meets, decode_gpu=d.decode.gpu.id, kv_format=d.decode.kv_format,
        decode_tp=d.decode.tensor_parallel_size, decode_replicas=d.decode_replicas,
        prefill_gpu=d.prefill.gpu.id if d.prefill else None,
        prefill_tp=d.prefill.tensor_parallel_size if d.prefill else None, prefill_replicas=d.prefill_replicas,
        gpus=d.gpus, usd_per_hour=round(d.usd_per_hour, 2),
        usd_per_million_output_tokens=round(d.usd_per_million_output_tokens, 4)
        if math.isfinite(d.usd_per_million_output_tokens) else None,
        ttft_ms=round(d.ttft_seconds * 1e3, 1) if math.isfinite(d.ttft_seconds) else None,
        itl_ms=round(d.itl_seconds * 1e3, 2) if math.isfinite(d.itl_seconds) else None,
        kv_transfer_ms=round(d.transfer_seconds * 1e3, 2), requests_per_second=round(d.requests_per_second, 3),
        basis=d.basis, speed_source=d.speed_source, reason=d.reason,
    )


def design_serve_commands(design: Design, base: Scenario, workload: Workload, model_id: str,
                          host_tier_bytes: int = 0) -> list[tuple[str, object]]:
    """(role, ServeCommand) for each kind of replica of a design: one for aggregated, prefill and
    decode for disaggregated (sizing/engines/serve.py spells each engine's options)."""
    from ..engines import get_engine
    from ..capacity.budget import chosen_fraction
    from ..engines.serve import ServeSettings, serve_command
    from ..capacity.context_limit import rope_scaling_for

    engine = get_engine(base.engine)
    longest = max(b.max_context_tokens for b in workload.mix())
    out = []
    roles = [("replica", design.decode, design.decode_replicas)] if design.prefill is None else [
        ("prefill", design.prefill, design.prefill_replicas), ("decode", design.decode, design.decode_replicas)]
    for role, candidate, replicas in roles:
        tp = candidate.tensor_parallel_size
        fraction = chosen_fraction(candidate.gpu.scenario(base, tensor_parallel_size=tp, pipeline_parallel_size=1,
                                                          max_model_len=longest), engine)
        per_replica = max(1, math.ceil(workload.peak_concurrency / max(1, design.decode_replicas)))
        settings = ServeSettings(
            model=model_id, kv_format=design.decode.kv_format, serving_dtype=base.shape.serving_dtype,
            tensor_parallel_size=tp, max_model_len=longest, memory_fraction=fraction,
            block_size=base.block_size or engine.block_size_default,
            max_num_seqs=per_replica if role != "prefill" else (base.max_num_seqs or 256), cache_tokens=0,
            language_model_only=base.language_model_only,
            enforce_eager=base.enforce_eager, rope_scaling=rope_scaling_for(base.model_name, base.shape, longest, engine),
            api_server_count=design.api_servers if role != "prefill" else 1)
        command = serve_command(engine.name, settings, None if role == "replica" else role, host_tier_bytes)
        out.append((f"{role} × {replicas}", command))
    return out

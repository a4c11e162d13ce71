"""Fleet planning: how many GPUs of which kind, in which KV format, for a workload
(docs/formulas.md, 'Fleet').

A candidate is (GPU, KV format, TP). A replica is one engine instance on TP GPUs. For each
candidate the peak concurrency of the mix is served

- from one shared pool: every replica runs with max_model_len = the longest bucket, and a
  request of bucket b reserves the engine's pages for its own length; a replica holds
  ⌊(KV budget − shared prefix) / Σ_b share_b × bytes_b⌋ requests (at most max_num_seqs);
- or from one pool per bucket: replicas of bucket b run with max_model_len = its length and
  serve peak × share_b requests.

Speed at the peak comes from bytes moved (sizing.planners.speed), cost from the GPU's hourly price.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

from ..errors import KvsizeError
from ..cache.formats import get_format
from ..cache.layers import build_layout, kv_heads_per_rank
from ..engines import get_engine
from ..engines.memory import resolve_weights_dtype
from ..capacity.estimate import Estimate, estimate
from ..capacity.context_limit import check_context
from ..capacity.scenario import Scenario
from ..capacity.budget import engine_weight_bytes
from ..config import ModelShape
from ..efficiency import DecodeEfficiency
from .speed import decode_step, itl_slope_seconds_per_token, prefill_seconds
from .step_model import engine_efficiency
from .step_notes import engine_read_basis, engine_shares_note
from ..units import GiB
from .workload import Bucket, Workload

SECONDS_PER_HOUR = 3600


@dataclass(frozen=True)
class GpuOffer:
    """A GPU kind as the planner buys it."""

    id: str
    name: str
    memory_bytes: int
    hbm_bandwidth_gb_s: float
    bf16_dense_tflops: float
    usd_per_hour: float
    price_source: str
    multiprocessors: int | None = None
    nvml_memory_mib: int | None = None  # nvidia-smi's total, which SGLang's default fraction reads
    architecture: str | None = None  # sm90, gfx942: which KV formats the engine runs there
    copy_bandwidth_gb_s: float | None = None  # measured device copy, where measured
    issue_rate: float | None = None  # SMs x boost clock (MHz), where the clock is known

    @classmethod
    def from_profile(cls, gpu_id: str, profile, usd_per_hour: float | None = None) -> GpuOffer:
        """`profile`: a GpuProfile; `usd_per_hour` overrides its indicative price."""
        if usd_per_hour is not None and not usd_per_hour > 0:
            raise KvsizeError(f"--price for {gpu_id} must be a positive USD per GPU-hour, got {usd_per_hour}")
        from ..profiles import issue_rate

        source = "given with --price" if usd_per_hour is not None else f"{profile.price_source} ({profile.price_date})"
        return cls(gpu_id, profile.name, profile.memory_bytes, profile.hbm_bandwidth_gb_s, profile.bf16_dense_tflops,
                   usd_per_hour if usd_per_hour is not None else profile.price_usd_per_hour, source,
                   profile.multiprocessors, profile.nvml_memory_mib, profile.architecture,
                   profile.copy_bandwidth_gb_s, issue_rate(profile))

    def scenario(self, base: Scenario, **changes) -> Scenario:
        """`base` on this GPU, with `changes` to its other fields."""
        return replace(base, gpu_name=self.name, gpu_memory_bytes=self.memory_bytes,
                       gpu_multiprocessors=self.multiprocessors, gpu_nvml_mib=self.nvml_memory_mib,
                       gpu_architecture=self.architecture, **changes)


@dataclass(frozen=True)
class Candidate:
    gpu: GpuOffer
    kv_format: str
    tensor_parallel_size: int


@dataclass(frozen=True)
class Draft:
    """A speculative-decoding draft model served beside the target on every replica."""

    name: str
    shape: ModelShape
    kv_cache_dtype: str = "auto"


@dataclass(frozen=True)
class PoolPlan:
    """Replicas that serve some of the traffic with one max_model_len."""

    name: str
    max_model_len: int
    requests: float  # peak requests this pool serves
    bytes_per_request: float  # KV (+ state, + draft KV) per rank, mix-weighted
    requests_per_replica: int
    replicas: int
    kv_budget_bytes: int  # per rank
    limited_by: str  # "kv cache", "max_num_seqs", "recurrent-state slots" or "itl target"


@dataclass(frozen=True)
class CandidatePlan:
    candidate: Candidate
    engine: str
    fits: bool
    reason: str
    shared: PoolPlan | None
    per_bucket: tuple[PoolPlan, ...]
    gpus: int  # shared pool
    gpus_per_bucket_pools: int
    kv_bytes_per_token: int  # per rank
    cache_tokens: int  # tokens one replica's KV pool holds (at the longest bucket's max_model_len)
    decode_batch: float  # requests per replica at the peak
    itl_seconds: float  # at the peak, shared pool
    itl_weights_seconds: float
    itl_kv_seconds: float
    itl_slope_seconds_per_1k_tokens: float
    kv_efficiency: float
    tokens_per_second_per_gpu: float
    fleet_tokens_per_second: float
    prefill_seconds: dict[str, float]  # per bucket, one prompt on one replica
    usd_per_hour: float
    usd_per_million_output_tokens: float
    savings_vs_bf16_percent: float | None = None
    efficiency_basis: str = ""  # the GPU the kernel efficiencies were measured on, and how they were carried over

    @property
    def best_gpus(self) -> int:
        return min(self.gpus, self.gpus_per_bucket_pools) if self.fits else 0


# A month as cloud price pages bill it: 730 hours (8,760 hours a year / 12).
HOURS_PER_MONTH = 730


@dataclass(frozen=True)
class FleetPlan:
    workload: Workload
    model_name: str
    engine: str
    plans: tuple[CandidatePlan, ...]
    efficiency: DecodeEfficiency

    def ranked(self) -> list[CandidatePlan]:
        """Candidates that serve the workload, cheapest first (then fewer GPUs, then a format of published
        near-lossless accuracy before one without, then lower ITL); then the rest."""
        from .guidance import NEAR_LOSSLESS_FORMATS

        return sorted(self.plans, key=lambda p: (not p.fits, p.usd_per_hour if p.fits else 0.0,
                                                 p.gpus if p.fits else 0,
                                                 p.candidate.kv_format not in NEAR_LOSSLESS_FORMATS if p.fits else 0,
                                                 p.itl_seconds if p.fits else 0.0))

    @property
    def cheapest(self) -> CandidatePlan | None:
        ranked = self.ranked()
        return ranked[0] if ranked and ranked[0].fits else None


def _request_bytes(e: Estimate, tokens: int) -> int:
    return e.pool.request_units(tokens) * e.pool.unit_bytes + e.state_bytes_per_request


def _draft_terms(draft: Draft | None, tp: int, scenario: Scenario) -> tuple[int, object]:
    """(draft weights per rank, draft layout per rank) or (0, None); the draft loads as the target does
    (the scenario's engine and GPU)."""
    if draft is None:
        return 0, None
    heads_tp = tp
    try:
        kv_heads_per_rank(draft.shape.num_kv_heads, tp)
    except KvsizeError:
        heads_tp = 1  # a draft whose heads do not split runs unsharded on each rank
    wfmt = resolve_weights_dtype("auto", draft.shape)
    weights = engine_weight_bytes(get_engine(scenario.engine), draft.shape, wfmt, heads_tp,
                                  range(draft.shape.num_layers), True, True, True, scenario.gpu_architecture)
    fmt = draft.kv_cache_dtype
    layout = build_layout(draft.shape, fmt, fmt, heads_tp, range(draft.shape.num_layers), {}, None)
    return weights, layout


def _pool_plan(name: str, e: Estimate, mix: list[tuple[float, Bucket]], requests: float, prefix_share: float,
               draft_layout, max_num_seqs: int) -> PoolPlan:
    """`mix`: (share of this pool's requests, bucket) pairs summing to 1."""
    per_request = 0.0
    shared_prefix = 0
    for share, b in mix:
        shared = int(prefix_share * b.mean_prompt_tokens)
        shared_prefix = max(shared_prefix, shared)
        unique = b.max_context_tokens - shared
        draft = 0
        if draft_layout is not None:
            draft = sum(draft_layout.sequence_bytes(b.max_context_tokens))
        per_request += share * (_request_bytes(e, unique) + draft)
    # One copy of the shared prefix per replica: prefix caching keeps it once for every request.
    prefix_bytes = e.pool.request_units(shared_prefix) * e.pool.unit_bytes if shared_prefix else 0
    usable = e.kv_budget_bytes - e.pool.fixed_bytes - prefix_bytes - e.state_set_aside_bytes
    by_kv = int(usable // per_request) if per_request > 0 and usable > 0 else 0
    per_replica = min(by_kv, max_num_seqs)
    limited = "max_num_seqs" if max_num_seqs < by_kv else "kv cache"
    if e.state_pool and e.state_pool.max_requests < per_replica:
        per_replica, limited = e.state_pool.max_requests, "recurrent-state slots"
    replicas = math.ceil(requests / per_replica - 1e-9) if per_replica > 0 else 0
    return PoolPlan(name, e.max_model_len, requests, per_request, per_replica, replicas, e.kv_budget_bytes, limited)


@dataclass(frozen=True)
class ReplicaModel:
    """One candidate's replica against a workload: its estimate, its shared pool at the peak and the
    decode step at any replica count (the batch is the peak shared among the replicas)."""

    estimate: Estimate
    shared: PoolPlan
    per_bucket: tuple[PoolPlan, ...]
    step_at: Callable[[int], object]  # replicas -> DecodeStep
    efficiency: DecodeEfficiency  # carried to the candidate's GPU
    basis: str


def replica_model(base: Scenario, candidate: Candidate, workload: Workload, efficiency: DecodeEfficiency,
                  draft: Draft | None = None) -> ReplicaModel:
    mix = workload.mix()
    longest = max(b.max_context_tokens for b in mix)
    tp = candidate.tensor_parallel_size
    g = candidate.gpu
    draft_weights, draft_layout = _draft_terms(draft, tp, g.scenario(base))
    scenario = g.scenario(base, k_cache_dtype=candidate.kv_format, v_cache_dtype=candidate.kv_format,
                          tensor_parallel_size=tp, pipeline_parallel_size=1, max_model_len=longest, concurrency=1,
                          extra_weights_bytes=draft_weights)
    check_context(base.model_name, base.shape, longest, get_engine(base.engine), option="workload context")
    e = estimate(scenario)  # KvsizeError (TP split, unsupported format) goes to the caller
    max_seqs = e.scenario.max_num_seqs  # the engine release's default where the user gave none
    shared = _pool_plan("shared", e, [(b.share_percent / 100, b) for b in mix], float(workload.peak_concurrency),
                        workload.prefix_cache_share, draft_layout, max_seqs)
    per_bucket = []
    for b in mix:
        eb = e if b.max_context_tokens == longest else estimate(replace(scenario, max_model_len=b.max_context_tokens))
        per_bucket.append(_pool_plan(b.label, eb, [(1.0, b)], workload.peak_concurrency * b.share_percent / 100,
                                     workload.prefix_cache_share, draft_layout, max_seqs))
    fmt_name = e.k_format
    weights_fmt = resolve_weights_dtype(base.weights_dtype, base.shape)
    kernels = efficiency.on_gpu(g.id, g.hbm_bandwidth_gb_s, g.copy_bandwidth_gb_s, g.issue_rate)
    # the weights and the formats the engine's own servers read at the shares they were measured at, as the serving
    # simulation reads them (step_model.engine_efficiency): the decode step here is the simulation's without prefill
    carried = engine_efficiency(kernels)
    basis = (engine_read_basis(fmt_name, g.id, efficiency) or
             ("assumed (no measured kernels)" if efficiency.reference_gpu is None else
              f"not measured: {fmt_name} assumed {kernels.kv_default:.0%}" if fmt_name not in kernels.kv else
              f"modelled from decode kernels measured on {efficiency.reference_gpu}" if kernels is efficiency
              else kernels.basis))

    def step_at(replicas: int):
        batch = workload.peak_concurrency / replicas
        requests = [(batch * b.share_percent / 100, b.mean_decode_length) for b in mix]
        st = decode_step(base.shape, e.layout, weights_fmt, tp, requests, g.hbm_bandwidth_gb_s, carried, fmt_name)
        if draft_layout is not None:
            # The draft's KV is read too; its weights are small and its step overlaps the verify step.
            extra = sum(n * sum(draft_layout.sequence_bytes(t)) for n, t in requests)
            st = replace(st, kv_read_bytes=st.kv_read_bytes + int(extra))
        return st

    return ReplicaModel(e, shared, tuple(per_bucket), step_at, carried, basis)


def plan_candidate(base: Scenario, candidate: Candidate, workload: Workload, efficiency: DecodeEfficiency,
                   draft: Draft | None = None) -> CandidatePlan:
    """One candidate against the workload; a candidate that cannot hold one request says why."""
    mix = workload.mix()
    tp = candidate.tensor_parallel_size
    g = candidate.gpu
    model = replica_model(base, candidate, workload, efficiency, draft)
    e, shared, per_bucket, step_at, efficiency, basis = (model.estimate, model.shared, list(model.per_bucket),
                                                         model.step_at, model.efficiency, model.basis)
    fmt_name = e.k_format
    fits = shared.requests_per_replica > 0
    gpus = shared.replicas * tp
    gpus_split = sum(p.replicas for p in per_bucket) * tp if all(p.requests_per_replica for p in per_bucket) else 0
    if fits:
        reason = (f"{shared.replicas} replica(s) × TP {tp}: {shared.requests_per_replica} requests each "
                  f"(limited by {shared.limited_by})")
    else:
        reason = (f"does not fit: one request of the mix needs {shared.bytes_per_request / GiB:.2f} GiB of KV per GPU, "
                  f"available {max(e.kv_budget_bytes, 0) / GiB:.2f} GiB; try a larger TP, a smaller KV format or a "
                  f"GPU with more memory")

    target = workload.itl_target_ms / 1000 if workload.itl_target_ms else None
    if fits and target is not None and step_at(shared.replicas).seconds > target:
        # More replicas, smaller batches: the fewest replicas whose step meets the target.
        most = workload.peak_concurrency  # one request per replica
        if step_at(most).seconds > target:
            fits = False
            reason = (f"does not meet the inter-token target: {step_at(most).seconds * 1000:.1f} ms at one "
                      f"request per replica > {workload.itl_target_ms:g} ms; try a larger TP or a faster GPU")
        else:
            lo, hi = shared.replicas, most
            while hi - lo > 1:
                mid = (lo + hi) // 2
                lo, hi = (lo, mid) if step_at(mid).seconds <= target else (mid, hi)
            shared = replace(shared, replicas=hi, limited_by="itl target",
                             requests_per_replica=math.ceil(workload.peak_concurrency / hi))
            gpus = hi * tp
            reason = (f"{hi} replica(s) × TP {tp}: at most {shared.requests_per_replica} requests each to keep "
                      f"inter-token latency ≤ {workload.itl_target_ms:g} ms")
    batch = workload.peak_concurrency / shared.replicas if fits else 0.0
    step = step_at(max(1, shared.replicas))
    kv_eff = efficiency.for_format(fmt_name)
    slope = itl_slope_seconds_per_token(e.kv_bytes_per_token, batch, g.hbm_bandwidth_gb_s, kv_eff) * 1000
    fleet_tps = workload.peak_concurrency / step.seconds if fits and step.seconds else 0.0
    usd_hour = gpus * g.usd_per_hour
    per_million = usd_hour / (fleet_tps * SECONDS_PER_HOUR / 1e6) if fleet_tps else math.inf
    prefill = {b.label: prefill_seconds(base.shape, b.mean_prompt_tokens, tp, g.bf16_dense_tflops, efficiency.mfu)
               for b in mix}
    return CandidatePlan(
        candidate=candidate, engine=e.engine.name, fits=fits, reason=reason, shared=shared,
        per_bucket=tuple(per_bucket), gpus=gpus if fits else 0, gpus_per_bucket_pools=gpus_split,
        kv_bytes_per_token=e.kv_bytes_per_token, cache_tokens=e.max_tokens, decode_batch=batch, itl_seconds=step.seconds if fits else 0.0,
        itl_weights_seconds=step.weights_seconds, itl_kv_seconds=step.kv_seconds if fits else 0.0,
        itl_slope_seconds_per_1k_tokens=slope, kv_efficiency=kv_eff,
        tokens_per_second_per_gpu=fleet_tps / gpus if gpus else 0.0, fleet_tokens_per_second=fleet_tps,
        prefill_seconds=prefill, usd_per_hour=usd_hour if fits else 0.0, usd_per_million_output_tokens=per_million,
        efficiency_basis=basis,
    )


def plan_fleet(base: Scenario, candidates: list[Candidate], workload: Workload,
               efficiency: DecodeEfficiency | None = None, draft: Draft | None = None) -> FleetPlan:
    """Every candidate; those the engine cannot run are kept with the reason, not dropped."""
    if efficiency is None:
        from ..profiles import measured_efficiency

        efficiency = measured_efficiency()
    plans = []
    for c in candidates:
        try:
            plans.append(plan_candidate(base, c, workload, efficiency, draft))
        except KvsizeError as err:
            plans.append(_refused(c, base.engine, str(err)))
    # Savings against bf16 KV on the same GPU and TP (cost of the fleet per hour).
    reference = {(p.candidate.gpu.id, p.candidate.tensor_parallel_size): p for p in plans
                 if p.fits and _is_bf16(p.candidate.kv_format, base.shape)}
    out = []
    for p in plans:
        ref = reference.get((p.candidate.gpu.id, p.candidate.tensor_parallel_size))
        saving = 100 * (1 - p.usd_per_hour / ref.usd_per_hour) if ref and p.fits and ref.usd_per_hour else None
        out.append(replace(p, savings_vs_bf16_percent=saving))
    return FleetPlan(workload, base.model_name, base.engine, tuple(out),
                     replace(efficiency, source=f"{efficiency.source}; {engine_shares_note(efficiency)}"))


def _is_bf16(name: str, shape: ModelShape) -> bool:
    return get_format(name, shape.serving_dtype).name in ("bf16", "fp16")


def _refused(c: Candidate, engine: str, why: str) -> CandidatePlan:
    return CandidatePlan(candidate=c, engine=engine, fits=False, reason=f"n/a: {why}", shared=None, per_bucket=(),
                         gpus=0, gpus_per_bucket_pools=0, kv_bytes_per_token=0, cache_tokens=0, decode_batch=0.0, itl_seconds=0.0,
                         itl_weights_seconds=0.0, itl_kv_seconds=0.0, itl_slope_seconds_per_1k_tokens=0.0,
                         kv_efficiency=0.0, tokens_per_second_per_gpu=0.0, fleet_tokens_per_second=0.0,
                         prefill_seconds={}, usd_per_hour=0.0, usd_per_million_output_tokens=math.inf)


def candidate_rows(plan: FleetPlan) -> list[dict]:
    """One flat row per candidate, for tables and spreadsheets, in FleetPlan.ranked() order."""
    rows = []
    for rank, p in enumerate(plan.ranked(), start=1):
        c = p.candidate
        rows.append(dict(
            rank=rank if p.fits else None, gpu=c.gpu.id, kv_format=c.kv_format, tensor_parallel_size=c.tensor_parallel_size, engine=p.engine,
            fits=p.fits, gpus=p.gpus, replicas=p.shared.replicas if p.shared else 0,
            requests_per_replica=p.shared.requests_per_replica if p.shared else 0,
            gpus_per_bucket_pools=p.gpus_per_bucket_pools, kv_bytes_per_token=p.kv_bytes_per_token,
            itl_ms=round(p.itl_seconds * 1000, 3), itl_slope_ms_per_1k_tokens=round(
                p.itl_slope_seconds_per_1k_tokens * 1000, 4),
            kv_efficiency=p.kv_efficiency, kv_efficiency_basis=p.efficiency_basis,
            tokens_per_s_per_gpu=round(p.tokens_per_second_per_gpu, 1),
            prefill_ms_mean=round(1000 * sum(b.share_percent / 100 * p.prefill_seconds.get(b.label, 0.0)
                                             for b in plan.workload.mix()), 2),
            fleet_tokens_per_s=round(p.fleet_tokens_per_second, 1), usd_per_gpu_hour=c.gpu.usd_per_hour,
            fleet_usd_per_hour=round(p.usd_per_hour, 2), fleet_usd_per_month=round(p.usd_per_hour * HOURS_PER_MONTH),
            usd_per_million_output_tokens=(round(p.usd_per_million_output_tokens, 4)
                                           if math.isfinite(p.usd_per_million_output_tokens) else None),
            savings_vs_bf16_percent=(round(p.savings_vs_bf16_percent, 1)
                                     if p.savings_vs_bf16_percent is not None else None),
            reason=p.reason,
        ))
    return rows


def plan_summary(plan: FleetPlan, answer: dict, serve: list[dict], fired_rules: list[str] = ()) -> list[dict]:
    """The answer on one sheet, as (item, value, note) rows: the fleet that serves the workload (the plan JSON's
    `cheapest`), what it costs, how to start it, and the workload and prices it rests on."""
    w = plan.workload
    rows = [dict(item="model", value=plan.model_name, note=""), dict(item="engine", value=plan.engine, note="")]
    targets = answer["targets"]
    if answer.get("design") is None:
        rows.append(dict(item="recommendation", value="no design serves the workload", note=answer["reason"][:1000]))
    else:
        rows += [
            dict(item="recommendation", value=answer["design"], note=answer["reason"]),
            dict(item="GPUs", value=answer["gpus"], note="prefill and decode, at the peak's arrival rate"),
            dict(item="KV cache format", value=answer["kv_format"], note="decode replicas"),
            dict(item="fleet usd per hour", value=answer["usd_per_hour"], note=""),
            dict(item="fleet usd per month", value=answer["usd_per_month"],
                 note=f"{HOURS_PER_MONTH} h a month (8,760 h a year / 12)"),
            dict(item="usd per million output tokens", value=answer["usd_per_million_output_tokens"], note=""),
            dict(item=f"TTFT p{targets['percentile']} (ms)", value=answer["ttft_ms"], note=_speed_note(answer, "ttft")),
            dict(item=f"ITL p{targets['percentile']} (ms)", value=answer["itl_ms"], note=_speed_note(answer, "itl")),
            dict(item="TTFT target (ms)", value=targets["ttft_ms"],
                 note="given" if targets["ttft_given"] else "kvsize's default"),
            dict(item="ITL target (ms)", value=targets["itl_ms"],
                 note="given" if targets["itl_given"] else "kvsize's default"),
            dict(item="targets", value=targets["source"], note=""),
        ]
        rows += [dict(item=f"serve command ({s['role']})", value=s.get("command") or "", note=s.get("note") or "")
                 for s in serve]
    capacity = plan.cheapest
    if capacity is not None:
        c = capacity.candidate
        rows.append(dict(item="capacity only (not the answer)", value=f"{capacity.gpus} × {c.gpu.name}",
                         note=f"holds the peak's KV, prefill not counted: {c.kv_format} KV, TP "
                              f"{c.tensor_parallel_size}, ${capacity.usd_per_hour:,.2f}/h"))
    rows += [
        dict(item="workload", value=w.name, note=f"peak {w.peak_concurrency:,} concurrent requests"),
        dict(item="prefix cache share", value=w.prefix_cache_share, note="share of prompt tokens served from cache"),
    ]
    rows += [dict(item=f"bucket {b.label}", value=b.share_percent,
                  note=f"% of requests; up to {b.max_context_tokens:,} tokens, {b.output_tokens:,} output tokens")
             for b in w.mix()]
    prices = {p.candidate.gpu.id: p.candidate.gpu for p in plan.plans}
    rows += [dict(item=f"price {g.id}", value=g.usd_per_hour, note=f"usd per GPU-hour; {g.price_source}")
             for g in prices.values()]
    rows.append(dict(item="decode efficiency", value=plan.efficiency.source, note=""))
    rows += [dict(item="guidance", value=text, note="") for text in fired_rules]
    return rows


def _speed_note(answer: dict, figure: str) -> str:
    """Where the answer's TTFT or ITL comes from (sizing/planners/held.py, or the queueing model of slo.py)."""
    from .serving import SIMULATED

    if answer.get("basis") == SIMULATED:
        source = f"; {answer['speed_source']}" if answer.get("speed_source") else ""
        return ("serving simulation: the engine's steps at the design's share of the peak, over requests" if
                figure == "ttft" else "serving simulation: each request's mean gap between tokens (TPOT)") + source
    return ("queueing model, with queueing at the arrival rate" if figure == "ttft" else
            "queueing model, prefill interleaved")


def bucket_rows(plan: FleetPlan) -> list[dict]:
    rows = []
    for p in plan.plans:
        for pool in ((p.shared,) if p.shared else ()) + p.per_bucket:
            rows.append(dict(
                gpu=p.candidate.gpu.id, kv_format=p.candidate.kv_format,
                tensor_parallel_size=p.candidate.tensor_parallel_size, pool=pool.name,
                max_model_len=pool.max_model_len, peak_requests=round(pool.requests, 2),
                kv_bytes_per_request=int(pool.bytes_per_request), requests_per_replica=pool.requests_per_replica,
                replicas=pool.replicas, gpus=pool.replicas * p.candidate.tensor_parallel_size,
                limited_by=pool.limited_by, kv_budget_bytes_per_gpu=pool.kv_budget_bytes,
                prefill_ms=round(1000 * p.prefill_seconds[pool.name], 2) if pool.name in p.prefill_seconds else None,
            ))
    return rows


def build_candidates(gpu_ids: list[str], formats: list[str], tensor_parallel_sizes: list[int],
                     prices: dict[str, float] | None = None, engine: str = "vllm") -> list[Candidate]:
    from ..profiles import gpu_profile

    prices = prices or {}
    unknown_prices = set(prices) - set(gpu_ids)
    if unknown_prices:
        raise KvsizeError(f"--price names GPUs not in --gpus: {', '.join(sorted(unknown_prices))}")
    refused = unsupported_pairs(gpu_ids, formats, engine)
    left_out = {(g, f) for g, f, _ in refused}
    offers = {g: GpuOffer.from_profile(g, gpu_profile(g), prices.get(g)) for g in gpu_ids}
    out = [Candidate(offers[g], f, tp)
           for g in gpu_ids for f in formats if (g, f) not in left_out for tp in tensor_parallel_sizes]
    if not out:
        g, f, why = refused[0]
        raise KvsizeError(f"no GPU in --gpus ({', '.join(gpu_ids)}) can run --formats {', '.join(formats)} with "
                          f"{engine} (e.g. {f} on {g}: {why}); add a GPU that can (kvsize gpus) or another format")
    return out


def _verdicts(gpu_ids: list[str], formats: list[str], engine: str):
    """((GPU, format), Support) for every pair but `auto`, the engine named as get_engine names it."""
    from ..engines import get_engine
    from ..profiles import gpu_profile
    from ..engines.support import runs_on

    name = get_engine(engine).name
    for g in gpu_ids:
        profile = gpu_profile(g)
        for f in formats:
            if f != "auto":
                yield (g, f), runs_on(name, get_format(f), profile)


def unsupported_pairs(gpu_ids: list[str], formats: list[str], engine: str = "vllm") -> list[tuple[str, str, str]]:
    """(GPU, format, why) for each pair the engine cannot run there (sizing/engines/support.py, runs_on)."""
    return [(g, f, v.source) for (g, f), v in _verdicts(gpu_ids, formats, engine) if v.status == "unsupported"]


def unconfirmed_pairs(gpu_ids: list[str], formats: list[str], engine: str = "vllm") -> list[tuple[str, str]]:
    """(GPU, format) pairs the support table neither confirms nor rules out for this engine."""
    return [(g, f) for (g, f), v in _verdicts(gpu_ids, formats, engine) if v.status == "unconfirmed"]


def load_draft(workload: Workload) -> Draft | None:
    from ..profiles import load_model

    if workload.draft is None:
        return None
    try:
        name, shape = load_model(workload.draft.model)
    except KvsizeError as e:
        raise KvsizeError(f"workload draft.model: {e}") from None
    return Draft(name, shape, workload.draft.kv_cache_dtype)


PLAN_SCHEMA = "kvsize.plan/1"


def cost_rows(plan: FleetPlan) -> list[dict]:
    return [dict(gpu=r["gpu"], kv_format=r["kv_format"], tensor_parallel_size=r["tensor_parallel_size"],
                 gpus=r["gpus"], usd_per_gpu_hour=r["usd_per_gpu_hour"], fleet_usd_per_hour=r["fleet_usd_per_hour"],
                 fleet_tokens_per_s=r["fleet_tokens_per_s"],
                 usd_per_million_output_tokens=r["usd_per_million_output_tokens"],
                 savings_vs_bf16_percent=r["savings_vs_bf16_percent"])
            for r in candidate_rows(plan) if r["fits"]]


def replica_estimate(base: Scenario, chosen: CandidatePlan):
    """One replica of a candidate, sized as the plan sized it: its GPU, format and TP, at the shared pool's length."""
    from ..capacity.estimate import estimate

    c, pool = chosen.candidate, chosen.shared
    return estimate(c.gpu.scenario(base, engine=chosen.engine, k_cache_dtype=c.kv_format, v_cache_dtype=c.kv_format,
                                   tensor_parallel_size=c.tensor_parallel_size,
                                   max_model_len=pool.max_model_len if pool else base.max_model_len))


def guidance_rows(rules) -> list[dict]:
    """The guidance rules as rows of plain values (the plan's JSON and XLSX)."""
    return [dict(rule=r.rule.name, above_tokens=r.rule.above_tokens, share_percent=round(r.share_percent, 2),
                 threshold_percent=r.rule.min_share_percent, fires=r.fires, explanation=r.explanation)
            for r in rules]


def quality_rows(notes) -> list[dict]:
    """The formats' quality notes as rows of plain values."""
    return [dict(format=n.format, published=n.published, source=n.source,
                 measured_attention_error=n.measured_attention_error, measured_where=n.measured_where)
            for n in notes]


def cheapest_key(p) -> dict | None:
    """The chosen candidate, as the plan's JSON names it."""
    if p is None:
        return None
    return dict(gpu=p.candidate.gpu.id, kv_format=p.candidate.kv_format,
                tensor_parallel_size=p.candidate.tensor_parallel_size, gpus=p.gpus)


def plan_record(plan, answer: dict, serve: list[dict], rules, notes, designs: dict) -> dict:
    """The plan as plain values: what `kvsize plan --out plan.json` writes (the front ends only render it). `cheapest`
    is the answer (sizing/planners/answer.py), `capacity_only` the candidate that merely holds the peak's KV."""
    commands = [s["command"] for s in serve if s.get("command")]
    return dict(schema=PLAN_SCHEMA, model=plan.model_name, engine=plan.engine,
                workload=plan.workload.model_dump(mode="json"), efficiency_source=plan.efficiency.source,
                cheapest=answer, capacity_only=cheapest_key(plan.cheapest),
                serve_command=commands[-1] if commands else None, design_serve_commands=serve,
                designs=designs["rows"], frontier=designs["frontier"], candidates=candidate_rows(plan),
                pools=bucket_rows(plan), cost=cost_rows(plan), guidance=guidance_rows(rules),
                quality=quality_rows(notes))

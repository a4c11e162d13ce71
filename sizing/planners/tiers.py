"""KV cache tiers beyond HBM and the links between them: how much each tier holds, how long a
session takes to come back, and whether bringing it back beats computing its prefill again.

A link is `seconds = transfers × latency + bytes / bandwidth` (LinkFit). Its two numbers come from
a measurement report (`measure/transfer.py`, fitted by fit_link) or, for links not measured, from
the sourced figures in profiles/links.json. Offloading a session gathers its blocks in HBM and
copies them over the link; reloading copies them back and scatters them (HostTransfer).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import KvsizeError


@dataclass(frozen=True)
class LinkFit:
    """A link: a start latency, a cost for each further transfer in a batch, and a sustained rate."""

    latency_s: float
    per_transfer_s: float
    bandwidth_bytes_per_s: float
    source: str

    def seconds(self, nbytes: int, transfers: int = 1) -> float:
        return self.latency_s + (transfers - 1) * self.per_transfer_s + nbytes / self.bandwidth_bytes_per_s


def fit_link(points: Iterable[tuple], source: str) -> LinkFit:
    """A link from (bytes, seconds) or (bytes, transfers, seconds) points, minimising the squared
    relative error of `latency + (transfers − 1) × per_transfer + bytes / bandwidth` (weighted linear
    least squares in latency, per_transfer and 1 / bandwidth; per_transfer is 0 where every point is
    one transfer)."""
    pts = [(float(p[0]), float(p[1]) if len(p) == 3 else 1.0, float(p[-1])) for p in points]
    if len(pts) < 2 or any(not (b > 0 and k >= 1 and t > 0 and math.isfinite(b) and math.isfinite(t))
                           for b, k, t in pts):
        raise KvsizeError(f"{source}: a link fit needs at least two points of positive bytes and seconds")
    batched = len({k for _, k, _ in pts}) > 1
    rows = [((1.0, k - 1, b) if batched else (1.0, b), t) for b, k, t in pts]
    solution = _weighted_least_squares(rows)
    if solution is None:
        raise KvsizeError(f"{source}: the points do not span enough sizes to fit a link")
    latency, per_transfer, inverse = (solution if batched else (solution[0], 0.0, solution[1]))
    if inverse <= 0:
        raise KvsizeError(f"{source}: the fitted bandwidth is not positive")
    return LinkFit(max(latency, 0.0), max(per_transfer, 0.0), 1 / inverse, source)


def _weighted_least_squares(rows: list[tuple[tuple[float, ...], float]]) -> tuple[float, ...] | None:
    """x minimising sum((row · x / t − 1)^2): the normal equations, solved by Gaussian elimination."""
    n = len(rows[0][0])
    a = [[sum(r[i] * r[j] / t**2 for r, t in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] / t for r, t in rows) for i in range(n)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if abs(a[pivot][col]) < 1e-300:
            return None
        a[col], a[pivot], b[col], b[pivot] = a[pivot], a[col], b[pivot], b[col]
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [x - f * y for x, y in zip(a[r], a[col])]
                b[r] -= f * b[col]
    return tuple(b[i] / a[i][i] for i in range(n))


@dataclass(frozen=True)
class HostTransfer:
    """HBM <-> host memory for paged KV: a gather (or scatter) in HBM and one copy over the link."""

    d2h: LinkFit
    h2d: LinkFit
    hbm: LinkFit

    def offload_seconds(self, nbytes: int) -> float:
        return self.hbm.seconds(nbytes) + self.d2h.seconds(nbytes)

    def reload_seconds(self, nbytes: int) -> float:
        return self.h2d.seconds(nbytes) + self.hbm.seconds(nbytes)


def host_transfer_from_report(report: dict, name: str) -> HostTransfer:
    """The fits of a `measure.transfer host` report's contiguous sweeps."""
    by_direction = {d: [(p["bytes"], p["seconds"]) for p in report["host_contiguous"] if p["direction"] == d]
                    for d in ("d2h", "h2d")}
    device = report.get("device", {}).get("name", "?")
    return HostTransfer(
        d2h=fit_link(by_direction["d2h"], f"{name}: HBM to pinned host on {device}"),
        h2d=fit_link(by_direction["h2d"], f"{name}: pinned host to HBM on {device}"),
        hbm=fit_link([(p["bytes"], p["seconds"]) for p in report["hbm_contiguous"]], f"{name}: HBM copy on {device}"),
    )


# NCCL moves small messages with other protocols (LL, LL128) whose cost per send differs; the peer
# link is fitted on, and applies to, sends of at least this size (a request's KV per layer from
# about 8K prompt tokens on an 8B model).
PEER_FIT_MIN_MESSAGE_BYTES = 8 << 20


def peer_link_from_report(report: dict, name: str) -> LinkFit:
    device = report.get("device", {}).get("name", "?")
    points = [(p["bytes"], p.get("transfers", 1), p["seconds"]) for p in report["peer_contiguous"]
              if p["bytes"] // p.get("transfers", 1) >= PEER_FIT_MIN_MESSAGE_BYTES]
    return fit_link(points, f"{name}: NCCL send/recv between two {device} GPUs (sends of "
                            f"{PEER_FIT_MIN_MESSAGE_BYTES >> 20} MiB or more)")


def layered_send_seconds(link: LinkFit, layer_bytes: list[int]) -> float:
    """A request's KV sent one layer at a time (layer-wise P/D connectors): one transfer per layer."""
    return link.seconds(sum(layer_bytes), transfers=len(layer_bytes))


# -- tiers -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Tier:
    """One KV tier below HBM, sized for one replica (all its GPUs together)."""

    name: str
    capacity_bytes: int
    path: tuple[LinkFit, ...]  # the links a block crosses to reach HBM (a drive's blocks pass host memory)
    shared_by_gpus: tuple[bool, ...]  # per link: one for the node's GPUs (a drive, a NIC) or one per GPU
    route: str = ""  # the links' names, outermost first

    def __post_init__(self) -> None:
        if self.capacity_bytes < 0:
            raise KvsizeError(f"tier {self.name}: capacity must be zero or more bytes, got {self.capacity_bytes}")
        if len(self.path) != len(self.shared_by_gpus) or not self.path:
            raise KvsizeError(f"tier {self.name}: needs one or more links, each saying whether GPUs share it")


@dataclass(frozen=True)
class TierAnswer:
    name: str
    capacity_bytes: int
    tokens: int  # tokens of KV the tier holds for the replica
    sessions_warm: int  # sessions of session_tokens the tier keeps
    reload_seconds: float  # one session of session_tokens back into HBM
    recompute_seconds: float  # its prefill computed again instead
    route: str
    links: str  # each link with its source

    @property
    def reload_beats_recompute(self) -> bool:
        return self.reload_seconds < self.recompute_seconds


def reload_seconds(tier: Tier, bytes_per_gpu: int, gpus: int, hbm: LinkFit) -> float:
    """Each link of the path in turn (no overlap between them assumed), then the scatter into the
    pool; a link one GPU owns moves that GPU's share while the others move theirs."""
    total = hbm.seconds(bytes_per_gpu)
    for link, shared in zip(tier.path, tier.shared_by_gpus):
        total += link.seconds(bytes_per_gpu * gpus) if shared else link.seconds(bytes_per_gpu)
    return total


def tier_answers(tiers: list[Tier], kv_bytes_per_token_per_gpu: int, gpus: int, session_tokens: int,
                 recompute_seconds: float, hbm: LinkFit) -> list[TierAnswer]:
    if kv_bytes_per_token_per_gpu <= 0 or gpus <= 0 or session_tokens <= 0:
        raise KvsizeError("tiers need positive KV bytes per token, GPUs and session tokens")
    per_token = kv_bytes_per_token_per_gpu * gpus
    out = []
    for tier in tiers:
        tokens = tier.capacity_bytes // per_token
        out.append(TierAnswer(
            tier.name, tier.capacity_bytes, tokens, tokens // session_tokens,
            reload_seconds(tier, kv_bytes_per_token_per_gpu * session_tokens, gpus, hbm), recompute_seconds,
            tier.route, " → ".join(link.source for link in tier.path),
        ))
    return out


# -- prefix reuse ------------------------------------------------------------------------------

def lru_hit_rates(capacity_tokens: float, groups: list[tuple[int, int, float]]) -> list[float]:
    """Hit rate per group of an LRU cache of `capacity_tokens` tokens, by Che's approximation.

    A group is (sessions, tokens per session, mean seconds between reuses of one session), each
    session reused as a Poisson process. A session stays cached while it was last used within the
    cache's characteristic time T, which fills the cache: Σ sessions × tokens × (1 − e^(−T/τ)) = C;
    a group's hit rate is 1 − e^(−T/τ) (Che, Tung and Wang, IEEE JSAC 2002; Fricker, Robert and
    Roberts, ITC 2012, for its accuracy under LRU). When every session fits, every reuse hits."""
    if capacity_tokens < 0 or any(n <= 0 or s <= 0 or t <= 0 for n, s, t in groups):
        raise KvsizeError("LRU groups need positive sessions, tokens and reuse intervals, and capacity >= 0")
    if not groups:
        return []
    working_set = sum(n * s for n, s, _ in groups)
    if working_set <= capacity_tokens:
        return [1.0] * len(groups)
    if capacity_tokens == 0:
        return [0.0] * len(groups)

    def filled(t: float) -> float:
        return sum(n * s * -math.expm1(-t / tau) for n, s, tau in groups)

    lo, hi = 0.0, max(tau for _, _, tau in groups)
    while filled(hi) < capacity_tokens:
        hi *= 2
    for _ in range(200):  # bisection to float precision
        mid = (lo + hi) / 2
        if filled(mid) < capacity_tokens:
            lo = mid
        else:
            hi = mid
        if hi - lo <= 1e-12 * hi:
            break
    t = (lo + hi) / 2
    return [-math.expm1(-t / tau) for _, _, tau in groups]


# -- a replica's tiers against a workload ----------------------------------------------------

@dataclass(frozen=True)
class ReuseAnswer:
    """One kind of returning request: where its prefix is found, and what finding it saves."""

    label: str
    share_percent: float
    reused_tokens: int
    hit_by_tier: tuple[float, ...]  # HBM first, then each tier: the share of its reuses found there

    @property
    def hit_rate(self) -> float:
        return sum(self.hit_by_tier)


@dataclass(frozen=True)
class TierPlan:
    """One replica (a GPU kind, a KV format, a TP size) with KV tiers below its HBM pool."""

    kv_bytes_per_token_per_gpu: int
    gpus: int
    hbm_reuse_tokens: int  # pool tokens left over by the peak's requests: where HBM keeps prefixes
    tiers: tuple[TierAnswer, ...]
    reuse: tuple[ReuseAnswer, ...]
    prefill_tokens_per_request: float  # mean prompt tokens of the mix
    prefill_tokens_saved_per_request: float
    ttft_seconds_no_reuse: float  # mean prefill of one prompt on the replica, nothing reused
    ttft_seconds: float  # with the reuse: the rest computed, the hits brought from their tier

    @property
    def prefill_work_saved(self) -> float:
        return self.prefill_tokens_saved_per_request / self.prefill_tokens_per_request \
            if self.prefill_tokens_per_request else 0.0


def plan_tiers(tiers: list[Tier], kv_bytes_per_token_per_gpu: int, gpus: int, pool_tokens: int,
               in_flight_tokens: int, sessions, mean_prompt_tokens: float, session_tokens: int,
               prefill, hbm: LinkFit) -> TierPlan:
    """`sessions`: the workload's Sessions; `prefill(tokens)`: seconds to compute a prompt of that many
    tokens on the replica. A reuse is looked up in HBM, then in each tier in turn: the LRU hit rate
    of the capacity down to a tier, less that of the capacity above it (the tiers as one LRU cache,
    each holding what the faster ones above it pushed out)."""
    hbm_tokens = max(0, pool_tokens - in_flight_tokens)
    answers = tier_answers(tiers, kv_bytes_per_token_per_gpu, gpus, session_tokens, prefill(session_tokens), hbm)
    groups = [(g.sessions, g.reused_tokens, g.reuse_interval_s) for g in sessions]
    capacities = [hbm_tokens]
    for a in answers:
        capacities.append(capacities[-1] + a.tokens)
    cumulative = [lru_hit_rates(c, groups) for c in capacities]
    reuse = []
    for i, g in enumerate(sessions):
        rates = [cumulative[0][i]] + [cumulative[t][i] - cumulative[t - 1][i] for t in range(1, len(capacities))]
        reuse.append(ReuseAnswer(g.label, g.share_percent, g.reused_tokens, tuple(max(0.0, r) for r in rates)))
    saved = sum(r.share_percent / 100 * r.hit_rate * min(r.reused_tokens, mean_prompt_tokens) for r in reuse)
    ttft = prefill(mean_prompt_tokens)
    with_reuse = ttft
    per_token = kv_bytes_per_token_per_gpu
    for r in reuse:
        reused = min(r.reused_tokens, mean_prompt_tokens)
        rest = prefill(mean_prompt_tokens - reused)
        found = r.hit_by_tier[0] * rest
        for tier, share in zip(tiers, r.hit_by_tier[1:]):
            found += share * (rest + reload_seconds(tier, per_token * reused, gpus, hbm))
        with_reuse += r.share_percent / 100 * (found + (1 - r.hit_rate) * ttft - ttft)
    return TierPlan(kv_bytes_per_token_per_gpu, gpus, hbm_tokens, tuple(answers), tuple(reuse),
                    mean_prompt_tokens, saved, ttft, with_reuse)


# -- from a scenario -----------------------------------------------------------------------------

TIER_KINDS = ("host", "disk", "remote")
DEFAULT_TIER_LINKS = {"host": "pcie5-x16", "disk": "nvme-gen4", "remote": "ethernet-400g"}


def link_fit(key: str) -> LinkFit:
    from ..profiles import link_profile

    p = link_profile(key)
    return LinkFit(p.latency_us * 1e-6, p.per_transfer_us * 1e-6, p.bandwidth_gb_s * 1e9, f"{key}: {p.source}")


def check_tier_links(sizes: dict[str, int], links: dict[str, str]) -> None:
    """Each tier's link is of that tier's kind (a host link for host memory, a drive for the disk, a
    network for the remote store): an NVLink peer link is no way to host memory."""
    from ..profiles import link_ids, link_profile

    for kind, key in links.items():
        if kind in TIER_KINDS and (sizes.get(kind) or kind == "host"):
            profile = link_profile(key, f"--{kind}-link")
            if profile.kind != kind:
                fitting = [k for k in link_ids() if link_profile(k).kind == kind]
                raise KvsizeError(f"--{kind}-link {key} is a {profile.kind} link; the {kind} tier needs a {kind} link: "
                                  f"{', '.join(fitting)}")


def build_tiers(sizes: dict[str, int], links: dict[str, str]) -> list[Tier]:
    """Tiers of the given byte sizes (per replica), each over its link; a drive's and a remote store's
    blocks pass through host memory on their way to HBM, so their path includes the host link."""
    from ..profiles import link_profile

    check_tier_links(sizes, links)
    host_key = links.get("host", DEFAULT_TIER_LINKS["host"])
    out = []
    for kind in TIER_KINDS:
        size = sizes.get(kind, 0)
        if not size:
            continue
        key = links.get(kind, DEFAULT_TIER_LINKS[kind])
        path = [key] if kind == "host" else [key, host_key]
        out.append(Tier(kind, size, tuple(link_fit(k) for k in path),
                        tuple(link_profile(k).shared_by_gpus for k in path), " → ".join(path)))
    return out


def engine_offload_options(engine: str, host_bytes: int, tp: int) -> str:
    """How the engine is told the host tier's size (per replica here): sizing/engines/serve.py's launchers."""
    import shlex

    from ..engines.serve import LAUNCHERS

    launcher = LAUNCHERS.get(engine)
    if launcher is None or launcher.offload_args is None or not host_bytes:
        return ""
    args = launcher.offload_args(host_bytes, tp)
    if not args:  # configured by file (TensorRT-LLM's kv_cache_config)
        return f"kv_cache_config: {{host_cache_size: {host_bytes // tp}}}"
    return " ".join(shlex.quote(a) for a in args)


def tiers_for(scenario, workload, sizes: dict[str, int], links: dict[str, str], session_tokens: int,
              mfu: float) -> tuple[object, TierPlan]:
    """The replica the scenario describes, at the peak's requests per replica of the workload's mix,
    with the tiers given; returns (its estimate, the plan)."""
    from ..capacity.estimate import estimate
    from ..profiles import gpu_by_name, link_profile
    from .speed import prefill_seconds

    e = estimate(scenario)
    if e.kv_budget_bytes <= 0:
        raise KvsizeError(e.fit_message)
    s = e.scenario
    gpus = s.tensor_parallel_size * s.pipeline_parallel_size
    mean_prompt, mean_length = workload.mean("mean_prompt_tokens"), workload.mean("mean_decode_length")
    gpu = gpu_by_name(s.gpu_name)
    if gpu is None:
        raise KvsizeError(f"tiers need the GPU's bf16 throughput to compare reloading with recomputing; "
                          f"{s.gpu_name} is not a bundled GPU")
    tflops = gpu.bf16_dense_tflops
    copy_gb_s = gpu.copy_bandwidth_gb_s or gpu.hbm_bandwidth_gb_s
    hbm = LinkFit(0.0, 0.0, copy_gb_s * 1e9, f"HBM copy of {gpu.name}: {copy_gb_s:g} GB/s")
    for kind, key in links.items():
        if kind not in TIER_KINDS:
            raise KvsizeError(f"tier {kind!r}: kinds are {', '.join(TIER_KINDS)}")
        link_profile(key, f"--{kind}-link")  # an unknown link is named with the choices
    tiers = build_tiers(sizes, links)
    pool_tokens = e.pool.tokens(e.num_blocks) if e.pool.paged else e.num_blocks
    # At the peak a replica is as full as the mix lets it be: what its requests leave of the pool is
    # where HBM keeps prefixes for later.
    in_flight = int(min(workload.peak_concurrency, pool_tokens // max(1, int(mean_length))) * mean_length)
    plan = plan_tiers(tiers, e.kv_bytes_per_token, gpus, pool_tokens, in_flight, workload.sessions, mean_prompt,
                      session_tokens,
                      lambda n: prefill_seconds(s.shape, int(n), s.tensor_parallel_size, tflops, mfu), hbm)
    return e, plan

"""A running engine held against its plan: vLLM's Prometheus `/metrics` text read into typed figures,
and each figure compared with what kvsize planned (docs/formulas.md, 'Watching a deployment').

Metric names as vLLM 0.26 defines them (vllm/v1/metrics/loggers.py): `vllm:cache_config_info` (an
info gauge whose labels are the CacheConfig's fields: num_gpu_blocks, block_size, cache_dtype,
gpu_memory_utilization, ...), `vllm:kv_cache_usage_perc` (0..1), `vllm:num_requests_running`,
`vllm:num_requests_waiting`, and the counters `vllm:num_preemptions`, `vllm:prefix_cache_queries`
and `vllm:prefix_cache_hits` (exposed with `_total`). Several engines (data parallel) are summed.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..errors import KvsizeError
from ..planners.deployment import PlannedPool

MAX_METRICS_BYTES = 16 * 1024 * 1024
MAX_LINE_CHARS = 64 * 1024
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(?:\s+-?\d+)?$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


@dataclass(frozen=True)
class EngineMetrics:
    """What one scrape of a vLLM server says about its KV cache and load."""

    num_gpu_blocks: int | None = None
    block_size: int | None = None
    cache_dtype: str | None = None
    gpu_memory_utilization: float | None = None
    kv_cache_usage: float | None = None  # 0..1, the busiest engine's
    running: int | None = None
    waiting: int | None = None
    preemptions: float | None = None  # counter since start
    prefix_queries: float | None = None  # tokens queried (counter)
    prefix_hits: float | None = None  # tokens found cached (counter)
    engines: int = 0
    names: tuple[str, ...] = field(default_factory=tuple)  # the vllm: families the text holds

    @property
    def prefix_hit_rate(self) -> float | None:
        if not self.prefix_queries:
            return None
        return self.prefix_hits / self.prefix_queries if self.prefix_hits is not None else None


def _value(text: str, line: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise KvsizeError(f"the metrics line {_shown(line)} holds {_shown(text, 30)}, which is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise KvsizeError(f"the metrics line {_shown(line)} holds {_shown(text, 30)}; kvsize expects a finite count of "
                          "zero or more")
    return value


def _shown(text: str, limit: int = 100) -> str:
    """Scrape text as an error shows it: cut short, with terminal escapes and other control characters escaped."""
    return repr(text[:limit].encode("utf-8", "backslashreplace").decode("ascii", "backslashreplace"))


def _int_label(labels: dict, name: str) -> int | None:
    text = labels.get(name)
    if text in (None, "", "None"):
        return None
    if not re.fullmatch(r"\d{1,15}", text):
        raise KvsizeError(f"vllm:cache_config_info label {name}={text[:30]!r} is not a whole number")
    return int(text)


def read_metrics(text: str) -> EngineMetrics:
    """vLLM's figures from a Prometheus text scrape; refused in one line where it holds none of them."""
    if len(text) > MAX_METRICS_BYTES:
        raise KvsizeError(f"the metrics text is {len(text):,} bytes; a scrape is far smaller "
                          f"(at most {MAX_METRICS_BYTES:,} bytes)")
    sums: dict[str, float] = {}
    usage: float | None = None
    info: dict | None = None
    engines: set[str] = set()
    names: set[str] = set()
    seen: set[tuple[str, str]] = set()
    for raw in text.splitlines():
        line = raw.strip()[:MAX_LINE_CHARS]
        if not line.startswith("vllm:"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        name, labels_text, value_text = m.group(1), m.group(3) or "", m.group(4)
        if (name, labels_text) in seen:
            raise KvsizeError(f"the scrape holds the series {_shown(name + '{' + labels_text + '}')} twice; a "
                              "/metrics answer names each series once")
        seen.add((name, labels_text))
        labels = dict(_LABEL.findall(labels_text))
        names.add(name)
        engines.add(labels.get("engine", "0"))
        value = _value(value_text, line)
        if name == "vllm:cache_config_info":
            info = info or labels
        elif name == "vllm:kv_cache_usage_perc":
            usage = value if usage is None else max(usage, value)
        elif name in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:num_preemptions_total",
                      "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total"):
            sums[name] = sums.get(name, 0.0) + value
    if not names:
        raise KvsizeError("the metrics text holds no vllm: metric; expected a vLLM server's /metrics "
                          "(vllm:cache_config_info, vllm:kv_cache_usage_perc, ...)")
    info = info or {}
    util = info.get("gpu_memory_utilization")
    try:
        fraction = float(util) if util not in (None, "", "None") else None
    except ValueError:
        raise KvsizeError(f"vllm:cache_config_info label gpu_memory_utilization={util[:30]!r} is not a "
                          "number") from None
    running, waiting = sums.get("vllm:num_requests_running"), sums.get("vllm:num_requests_waiting")
    if usage is not None and usage > 1:
        raise KvsizeError(f"vllm:kv_cache_usage_perc is {usage:g}; vLLM reports it as a fraction from 0 to 1")
    hits, queries = sums.get("vllm:prefix_cache_hits_total"), sums.get("vllm:prefix_cache_queries_total")
    if hits is not None and queries is not None and hits > queries:
        raise KvsizeError(f"vllm:prefix_cache_hits_total ({hits:,.0f}) exceeds vllm:prefix_cache_queries_total "
                          f"({queries:,.0f}); a scrape cannot hit more tokens than it queried")
    return EngineMetrics(
        num_gpu_blocks=_int_label(info, "num_gpu_blocks"), block_size=_int_label(info, "block_size"),
        cache_dtype=info.get("cache_dtype"), gpu_memory_utilization=fraction, kv_cache_usage=usage,
        running=None if running is None else int(running), waiting=None if waiting is None else int(waiting),
        preemptions=sums.get("vllm:num_preemptions_total"), prefix_queries=sums.get("vllm:prefix_cache_queries_total"),
        prefix_hits=sums.get("vllm:prefix_cache_hits_total"), engines=len(engines), names=tuple(sorted(names)))


@dataclass(frozen=True)
class WatchLine:
    figure: str
    engine: str  # what the engine reports, as text
    planned: str  # what kvsize planned, as text
    inside: bool | None  # None: nothing to hold it against
    advice: str  # what to change; empty where the figure is inside the plan or has nothing to hold it to
    engine_value: float | int | str | None = None  # the same, as a number (a dtype as its name)
    planned_value: float | int | str | None = None
    unit: str = ""


# How far the engine's pool may be from the plan's and still be the plan's: kvsize's estimate is held to 1% of the
# engine's own startup figure (benchmarks/vllm_starts.py), so more than that is another server or a missed term.
POOL_TOLERANCE = 0.01

# KV dtypes a running vLLM reports that keep the model's own precision (16 bits or more)
MODEL_PRECISION = ("auto", "bf16", "bfloat16", "fp16", "float16", "half", "fp32", "float32")


def _smaller_format(cache_dtype: str | None) -> str:
    """What 'a smaller KV format' means from the one in use: never the one already running."""
    if cache_dtype is None or cache_dtype in MODEL_PRECISION:
        return "a smaller KV format (fp8, half the bytes)"
    return f"a 4-bit KV format where the GPU runs one (kvsize compare lists them; {cache_dtype} is in use)"


def watch(m: EngineMetrics, e: PlannedPool, concurrency: int, hit_rate: float | None = None,
          previous: EngineMetrics | None = None) -> list[WatchLine]:
    """Each figure of a scrape against the planned pool `e` (`concurrency` requests at its length) and,
    where given, the prefix hit rate the plan's tiers assumed. `previous`: an earlier scrape, so
    counters are read as what happened between the two."""
    out = []

    def line(figure, engine, planned, inside, advice, engine_value=None, planned_value=None, unit=""):
        out.append(WatchLine(figure, engine, planned, inside, advice if inside is False else "", engine_value,
                             planned_value, unit))

    smaller = _smaller_format(m.cache_dtype)
    if m.num_gpu_blocks is not None:
        planned = e.num_blocks
        error = m.num_gpu_blocks / planned - 1 if planned else math.inf
        more = planned and m.num_gpu_blocks > planned * (1 + POOL_TOLERANCE)
        line("KV blocks", f"{m.num_gpu_blocks:,} of {m.block_size or '?'} tokens",
             f"{planned:,} of {e.block_size} tokens "
             + (f"({100 * error:+.1f}%)" if planned else "(an estimate that does not fit: no pool)"),
             bool(planned) and abs(error) <= POOL_TOLERANCE and m.block_size in (None, e.block_size),
             ("the engine holds more blocks than planned: the plan does not describe this server (another "
              "--gpu-memory-utilization, --max-model-len or KV format, or kvsize's estimate is off: kvsize check-log "
              "on its log names the term that differs); its counts are then conservative" if more else
              "the engine holds fewer blocks than planned: check its --gpu-memory-utilization, --max-model-len and "
              "--kv-cache-dtype against the plan (kvsize check-log on its log names the term that differs)"),
             m.num_gpu_blocks, planned, "blocks")
    if m.cache_dtype is not None:
        want = e.kv_cache_dtype
        same = m.cache_dtype == want or (want == "auto" and m.cache_dtype in ("auto", e.kv_format)) or \
            (m.cache_dtype.startswith("fp8") and e.kv_format.startswith("fp8"))
        if m.cache_dtype in MODEL_PRECISION:
            advice = f"the engine keeps the model's precision where the plan chose {e.kv_format}: start it with " \
                     f"--kv-cache-dtype {want}"
        else:
            advice = f"the engine runs a {m.cache_dtype} cache where the plan chose {e.kv_format}: plan with " \
                     f"--kv-cache-dtype {m.cache_dtype}, or start the engine with --kv-cache-dtype {want}"
        line("KV dtype", m.cache_dtype, f"{want} ({e.kv_format})", same, advice, m.cache_dtype, e.kv_format)
    if m.running is not None:
        holds = concurrency <= e.holds  # a plan whose pool cannot hold its own peak vouches for nothing
        line("requests running", f"{m.running:,}",
             f"up to {concurrency:,} at {e.max_model_len:,} tokens (the pool holds {e.max_concurrency:,} of them)",
             m.running <= concurrency and holds,
             (f"more requests run than the plan's {concurrency:,}: plan for the real peak (kvsize plan, or "
              "--concurrency) or add replicas" + ("" if m.running <= e.max_concurrency else
                                                  "; the pool holds fewer of full length")) if holds else
             (f"the plan cannot hold its own peak: {concurrency:,} requests planned, its pool holds "
              f"{e.holds:,} of " + (f"{e.max_model_len:,} tokens" if e.holds_requests is None else "its mix")
              + f"; plan again (more replicas, {smaller} or a shorter --max-model-len)"),
             m.running, concurrency, "requests")
    if m.waiting is not None:
        line("requests waiting", f"{m.waiting:,}", "0 at the planned peak", m.waiting == 0,
             f"requests queue for KV blocks: add replicas, {smaller} or a shorter --max-model-len",
             m.waiting, 0, "requests")
    if m.kv_cache_usage is not None:
        line("KV cache usage", f"{100 * m.kv_cache_usage:.1f}%", "below 100%", m.kv_cache_usage < 0.99,
             f"the pool is full: requests are preempted or wait; add replicas or {smaller}",
             round(m.kv_cache_usage, 6), 0.99, "fraction of the pool")
    if m.preemptions is not None:
        since = m.preemptions - ((previous.preemptions or 0.0) if previous is not None else 0.0)
        reset = since < 0  # the counter went back: the server restarted between the scrapes
        if reset:
            since = m.preemptions
        line("preemptions", f"{since:,.0f}" + (" since the server restarted" if reset else
                                               " since the last scrape" if previous else " since start"), "0",
             since == 0, f"requests were evicted for lack of KV blocks: add replicas or {smaller}",
             int(since), 0, "preemptions")
    rate = m.prefix_hit_rate
    if previous is not None and m.prefix_queries is not None and previous.prefix_queries is not None \
            and m.prefix_queries >= previous.prefix_queries:  # a restart resets the counters: the scrape's own rate
        queries = m.prefix_queries - previous.prefix_queries
        rate = (m.prefix_hits - previous.prefix_hits) / queries if queries > 0 else None
    if rate is not None:
        line("prefix-cache hit rate", f"{100 * rate:.1f}%",
             "-" if hit_rate is None else f"{100 * hit_rate:.1f}% (the plan's tiers)",
             None if hit_rate is None else rate >= hit_rate * 0.9,
             "fewer prefixes are found than the tiers assumed: a larger host tier (--kv-offloading-size) or "
             "longer-lived sessions", round(rate, 6), hit_rate, "fraction of queried tokens")
    return out

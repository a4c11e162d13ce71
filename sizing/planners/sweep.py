"""A grid of scenarios for procurement spreadsheets: one flat row per scenario."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..engines import get_engine
from ..errors import KvsizeError
from ..cache.formats import get_format
from ..capacity.estimate import Estimate, LengthFigures, estimate_lengths
from ..capacity.scenario import Scenario, check_length
from ..profiles import gpu_profile, load_model
from .fleet import GpuOffer, unsupported_pairs
from ..engines.memory import resolve_weights_dtype
from ..efficiency import DecodeEfficiency
from .speed import decode_step
from ..units import GiB


# A grid larger than this is a typo (a comma list pasted twice, a range written out): two million rows
# take about half a minute and an 18 MB CSV per 100,000 rows.
MAX_SWEEP_ROWS = 2_000_000
XLSX_MAX_ROWS = 1_048_575  # Excel's sheet, less its header row
# the status of a row the engine cannot run (its reason says why); "n/a" would load as a blank in pandas
NOT_SIZED = "not sized"


@dataclass(frozen=True)
class SweepGrid:
    models: list[str]
    gpus: list[str]
    engines: list[str]
    formats: list[str]
    contexts: list[int]
    tensor_parallel_sizes: list[int]

    @property
    def size(self) -> int:
        return (len(self.models) * len(self.gpus) * len(self.engines) * len(self.formats)
                * len(self.contexts) * len(self.tensor_parallel_sizes))


COLUMNS = (
    "model", "gpu", "engine", "kv_cache_dtype", "tensor_parallel_size", "max_model_len_tokens", "status", "reason",
    "kv_bytes_per_token", "kv_metadata_bytes_per_token", "kv_bytes_per_sequence", "num_blocks", "max_tokens",
    "max_concurrency", "max_context_at_concurrency_tokens", "weights_gib_per_gpu", "kv_budget_gib_per_gpu",
    "gpu_memory_gib", "gpus_per_replica",
    # speed and cost with every slot full: min(max_concurrency, max_num_seqs) requests at max_model_len
    "decode_batch", "itl_ms", "tokens_per_s_per_gpu", "usd_per_gpu_hour", "usd_per_million_output_tokens",
)


def run_sweep(grid: SweepGrid, base: Scenario, progress: Callable[[int, int], None] | None = None,
              efficiency: DecodeEfficiency | None = None, prices: dict[str, float] | None = None) -> list[dict]:
    """Every combination of the grid; combinations an engine cannot run get a row that says why."""
    if efficiency is None:
        from ..profiles import measured_efficiency

        efficiency = measured_efficiency()
    prices = prices or {}
    for n in grid.contexts:
        check_length(n)
    rows: list[dict] = []
    total, done = grid.size, 0
    shapes = {m: load_model(m) for m in grid.models}
    gpus = {g: GpuOffer.from_profile(g, gpu_profile(g), prices.get(g)) for g in grid.gpus}
    engines = [e.strip() for e in grid.engines if get_engine(e)]  # validated; "vllm@0.19" keeps its version
    for model in grid.models:
        name, shape = shapes[model]
        for gpu in grid.gpus:
            g = gpus[gpu]
            for engine in engines:
                for fmt in grid.formats:
                    for tp in grid.tensor_parallel_sizes:
                        group = g.scenario(base, model_name=name, shape=shape, engine=engine, k_cache_dtype=fmt,
                                           v_cache_dtype=fmt, tensor_parallel_size=tp, max_model_len=None)
                        refusal = _refusal(group, gpu, fmt)
                        rows.extend(_group_rows(group, grid.contexts, model, gpu, fmt, g, efficiency, refusal))
                        done += len(grid.contexts)
                        if progress and (done % 1000 < len(grid.contexts) or done == total):
                            progress(done, total)
    return rows


def _refusal(s: Scenario, gpu: str, fmt: str) -> str | None:
    """Why the engine cannot run this format on this GPU, for every context alike; None if it can."""
    try:
        refused = unsupported_pairs([gpu], [get_format(fmt, s.shape.serving_dtype).name], s.engine)
    except KvsizeError as err:
        return str(err)
    return refused[0][2] if refused else None


def _group_rows(group: Scenario, contexts: list[int], model: str, gpu: str, fmt: str, offer: GpuOffer,
                efficiency: DecodeEfficiency, refusal: str | None) -> list[dict]:
    """One row per context of one (model, GPU, engine, format, TP) group: one estimate, then the
    figures that depend on the context."""
    base = _base_row(group, model, gpu, fmt, offer)
    if refusal is not None:
        return [{**base, "max_model_len_tokens": n, "status": NOT_SIZED, "reason": refusal} for n in contexts]
    try:
        figures = estimate_lengths(group, contexts)
    except KvsizeError as err:
        # The contexts were checked up front, so what is refused is the group itself.
        return [{**base, "max_model_len_tokens": n, "status": NOT_SIZED, "reason": str(err)} for n in contexts]
    return [_row(e, f, base, offer, efficiency) for e, f in figures]


def _base_row(s: Scenario, model: str, gpu: str, fmt: str, offer: GpuOffer) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(model=model, gpu=gpu, engine=s.engine, kv_cache_dtype=fmt, tensor_parallel_size=s.tensor_parallel_size,
               gpu_memory_gib=round(s.gpu_memory_bytes / GiB, 3),
               gpus_per_replica=s.tensor_parallel_size * s.pipeline_parallel_size)
    return row


def _row(e: Estimate, f: LengthFigures, base: dict, offer: GpuOffer, efficiency: DecodeEfficiency) -> dict:
    s = e.scenario
    row = dict(base)
    row.update(
        kv_cache_dtype=e.k_format, max_model_len_tokens=f.max_model_len,
        status="fits" if f.fits else "does not fit",
        kv_bytes_per_token=e.kv_bytes_per_token, kv_metadata_bytes_per_token=e.kv_metadata_bytes_per_token,
        kv_bytes_per_sequence=f.kv_bytes_per_sequence, num_blocks=e.num_blocks, max_tokens=f.max_tokens,
        # the engine serves no request longer than max_model_len, whatever the pool could hold
        max_concurrency=f.max_concurrency,
        max_context_at_concurrency_tokens=min(f.max_context_at_concurrency, f.max_model_len),
        weights_gib_per_gpu=round(e.breakdown.weights_bytes / GiB, 3),
        kv_budget_gib_per_gpu=round(e.kv_budget_bytes / GiB, 3), usd_per_gpu_hour=offer.usd_per_hour,
    )
    batch = min(f.max_concurrency, s.max_num_seqs)
    # Speed is modelled for one pipeline stage holding every layer (PP = 1) only.
    if batch > 0 and e.layout is not None and s.pipeline_parallel_size == 1:
        step = decode_step(s.shape, e.layout, resolve_weights_dtype(s.weights_dtype, s.shape), s.tensor_parallel_size,
                           [(batch, f.max_model_len)], offer.hbm_bandwidth_gb_s, efficiency, e.k_format)
        per_gpu = step.tokens_per_second / s.tensor_parallel_size
        row.update(decode_batch=batch, itl_ms=round(step.seconds * 1000, 3), tokens_per_s_per_gpu=round(per_gpu, 1),
                   usd_per_million_output_tokens=round(offer.usd_per_hour / (per_gpu * 3600 / 1e6), 4))
    return row


def sweep_assumptions(grid: SweepGrid, base: Scenario) -> list[dict]:
    """What a sweep's figures assume, as (item, value, note) rows: each engine's release, its rules and whether
    a real start confirmed them, the memory fraction and headroom, and each GPU's price and its date."""
    from ..engines.started import release_evidence

    rows = []
    for name in grid.engines:
        engine = get_engine(name.strip())
        evidence = release_evidence(engine.name, engine.version)
        rows.append(dict(item=f"engine {name.strip()}", value=engine.release.name if engine.release else engine.name,
                         note=engine.label + (f"; {evidence.sentence()}" if evidence else "")))
        fraction = base.memory_fraction if base.memory_fraction is not None else engine.memory_fraction_default
        rows.append(dict(item=f"memory fraction ({name.strip()})", value=fraction,
                         note="given" if base.memory_fraction is not None else "the release's default (SGLang's own "
                         "default depends on the GPU and settings: kvsize derives it per scenario)"))
    rows.append(dict(item="headroom (engines without their own fraction)", value=base.headroom, note=""))
    rows.append(dict(item="concurrency", value=base.concurrency, note="requests each fit is judged at"))
    for gpu in grid.gpus:
        g = gpu_profile(gpu)
        rows.append(dict(item=f"price usd per GPU hour ({gpu})", value=g.price_usd_per_hour,
                         note=f"price date {g.price_date}; {g.name}"))
    return rows

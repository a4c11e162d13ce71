"""A grid of scenarios for procurement spreadsheets: one flat row per scenario."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from .engines import get_engine
from .errors import KvsizeError
from .formats import get_format
from .plan import Scenario, estimate
from .profiles import gpu_profile, load_model
from .fleet import GpuOffer, unsupported_pairs
from .memory import resolve_weights_dtype
from .speed import DecodeEfficiency, decode_step
from .units import GiB


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
    "model", "gpu", "engine", "kv_cache_dtype", "tensor_parallel_size", "max_model_len_tokens", "status",
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
        from .profiles import measured_efficiency

        efficiency = measured_efficiency()
    prices = prices or {}
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
                        for context in grid.contexts:
                            scenario = replace(
                                base, model_name=name, shape=shape, gpu_name=g.name,
                                gpu_memory_bytes=g.memory_bytes, gpu_multiprocessors=g.multiprocessors, gpu_nvml_mib=g.nvml_memory_mib, gpu_architecture=g.architecture, engine=engine, k_cache_dtype=fmt,
                                v_cache_dtype=fmt, tensor_parallel_size=tp, max_model_len=context,
                            )
                            rows.append(_row(scenario, model, gpu, fmt, g, efficiency))
                            done += 1
                            if progress and (done % 1000 == 0 or done == total):
                                progress(done, total)
    return rows


def _row(s: Scenario, model: str, gpu: str, fmt: str, offer: GpuOffer, efficiency: DecodeEfficiency) -> dict:
    row = dict.fromkeys(COLUMNS)
    row.update(model=model, gpu=gpu, engine=s.engine, kv_cache_dtype=fmt, tensor_parallel_size=s.tensor_parallel_size,
               max_model_len_tokens=s.max_model_len, gpu_memory_gib=round(s.gpu_memory_bytes / GiB, 3),
               gpus_per_replica=s.tensor_parallel_size * s.pipeline_parallel_size)
    try:
        refused = unsupported_pairs([gpu], [get_format(fmt, s.shape.serving_dtype).name], s.engine)
        if refused:
            row["status"] = f"n/a: {refused[0][2]}"
            return row
        e = estimate(s)
    except KvsizeError as err:
        row["status"] = f"n/a: {err}"
        return row
    row.update(
        kv_cache_dtype=get_format(fmt, s.shape.serving_dtype, s.format_options).name,
        status="fits" if e.fits else "does not fit",
        kv_bytes_per_token=e.kv_bytes_per_token, kv_metadata_bytes_per_token=e.kv_metadata_bytes_per_token,
        kv_bytes_per_sequence=e.kv_bytes_per_sequence, num_blocks=e.num_blocks, max_tokens=e.max_tokens,
        max_concurrency=e.max_concurrency, max_context_at_concurrency_tokens=e.max_context_at_concurrency,
        weights_gib_per_gpu=round(e.breakdown.weights_bytes / GiB, 3),
        kv_budget_gib_per_gpu=round(e.kv_budget_bytes / GiB, 3), usd_per_gpu_hour=offer.usd_per_hour,
    )
    batch = min(e.max_concurrency, e.scenario.max_num_seqs)
    # Speed is modelled for one pipeline stage holding every layer (PP = 1) only.
    if batch > 0 and e.layout is not None and s.pipeline_parallel_size == 1:
        step = decode_step(s.shape, e.layout, resolve_weights_dtype(s.weights_dtype, s.shape), s.tensor_parallel_size,
                           [(batch, e.max_model_len)], offer.hbm_bandwidth_gb_s, efficiency, e.k_format)
        gpus = s.tensor_parallel_size * s.pipeline_parallel_size
        per_gpu = step.tokens_per_second / gpus
        row.update(decode_batch=batch, itl_ms=round(step.seconds * 1000, 3), tokens_per_s_per_gpu=round(per_gpu, 1),
                   usd_per_million_output_tokens=round(offer.usd_per_hour / (per_gpu * 3600 / 1e6), 4))
    return row

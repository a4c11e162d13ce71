"""One scenario under two or more engine releases, side by side: each term's change and the release
mechanism behind it, before a rollout moves the pool (docs/formulas.md, 'Release comparison')."""

from __future__ import annotations

from dataclasses import dataclass

from ..capacity.estimate import Estimate, estimate

from ..capacity.scenario import Scenario

from ..capacity.record import graphs_subtracted
from ..units import GiB


@dataclass(frozen=True)
class ReleaseColumn:
    engine: str  # as asked, e.g. vllm@0.25.1
    estimate: Estimate

    @property
    def rules(self) -> str:
        """The release range followed."""
        return self.estimate.engine.label

    @property
    def pool_tokens(self) -> int:
        """Tokens the pool holds per layer group (the pool's own count of its blocks): the cache itself,
        which vLLM 0.21+'s "GPU KV cache size" line (concurrency × max_model_len) is not."""
        e = self.estimate
        return e.pool.tokens(e.num_blocks) if e.pool is not None and e.pool.paged else e.max_tokens


@dataclass(frozen=True)
class ReleaseComparison:
    columns: tuple[ReleaseColumn, ...]
    changes: tuple[str, ...]  # what moved between consecutive releases, and why


def _mechanisms(a: Estimate, b: Estimate) -> list[str]:
    """The release rules that differ between two estimates of one scenario, in words."""
    ra, rb = a.engine.release, b.engine.release
    out = []
    if ra is None or rb is None:
        return out
    name = f"{ra.name} → {rb.name}"
    if a.max_concurrency != b.max_concurrency:  # what a planner buys on: the requests, then why they moved
        out.append(f"{name}: requests of {b.max_model_len:,} tokens the pool holds move from {a.max_concurrency:,} "
                   f"to {b.max_concurrency:,} ({b.max_concurrency - a.max_concurrency:+,})")
    if a.model_runner != b.model_runner:
        out.append(f"{name}: the model runner changes from {a.model_runner.upper()} to {b.model_runner.upper()}"
                   + (" (V2 profiles no CUDA graphs before sizing the KV cache, and samples with fewer fp32 copies)"
                      if "v2" in (a.model_runner, b.model_runner) else ""))
    graphs_a, graphs_b = graphs_subtracted(a), graphs_subtracted(b)
    if graphs_a != graphs_b:
        out.append(f"{name}: the CUDA-graph estimate is {'now' if graphs_b else 'no longer'} subtracted from the KV "
                   f"budget ({b.breakdown.cuda_graph_bytes / GiB:.2f} GiB)")
    if ra.memory_fraction_default != rb.memory_fraction_default and a.scenario.memory_fraction is None:
        out.append(f"{name}: the default --gpu-memory-utilization moves from {ra.memory_fraction_default} to "
                   f"{rb.memory_fraction_default}")
    if ra.in_flight_extra_batches != rb.in_flight_extra_batches and a.layout is not None and any(
            spec.kind in ("sliding", "chunked") for spec in a.layout.kv.values()):
        out.append(f"{name}: sliding-window layers keep the blocks of {1 + rb.in_flight_extra_batches} batches in "
                   f"flight instead of {1 + ra.in_flight_extra_batches} (async scheduling), so each request holds "
                   "more blocks")
    if ra.mamba_pages_per_request != rb.mamba_pages_per_request and "recurrent" in a.scenario.shape.layer_kinds:
        out.append(f"{name}: a request holds {rb.mamba_pages_per_request} Mamba state page(s) per group instead of "
                   f"{ra.mamba_pages_per_request}")
    if (ra.global_window_every_layer != rb.global_window_every_layer
            and a.scenario.shape.window_without_layer_types):
        out.append(f"{name}: the config's global sliding_window is applied to "
                   f"{'every layer' if rb.global_window_every_layer else 'no layer'} instead of "
                   f"{'every layer' if ra.global_window_every_layer else 'none'}")
    if a.activation is not None and b.activation is not None and a.activation.peak_bytes != b.activation.peak_bytes:
        out.append(f"{name}: the profiling run's peak moves by {(b.activation.peak_bytes - a.activation.peak_bytes) / GiB:+.2f} GiB")
    if a.breakdown.non_torch_bytes != b.breakdown.non_torch_bytes:
        out.append(f"{name}: memory outside torch moves by "
                   f"{(b.breakdown.non_torch_bytes - a.breakdown.non_torch_bytes) / GiB:+.2f} GiB")
    if (a.scenario.max_num_batched_tokens, a.scenario.max_num_seqs) != (b.scenario.max_num_batched_tokens,
                                                                         b.scenario.max_num_seqs):
        out.append(f"{name}: batch defaults move from {a.scenario.max_num_batched_tokens} tokens / "
                   f"{a.scenario.max_num_seqs} sequences to {b.scenario.max_num_batched_tokens} / {b.scenario.max_num_seqs}")
    return out


def compare_releases(scenario: Scenario, engines: list[str]) -> ReleaseComparison:
    """The scenario estimated under each engine release (at least two), in the order given."""
    columns = []
    for name in engines:
        columns.append(ReleaseColumn(name, estimate(scenario.evolve(engine=name))))
    changes = []
    for left, right in zip(columns, columns[1:]):
        changes += _mechanisms(left.estimate, right.estimate)
    return ReleaseComparison(tuple(columns), tuple(changes))

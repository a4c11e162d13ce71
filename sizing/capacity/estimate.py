"""One scenario in, one typed estimate out. The stages, top to bottom: the scenario prepared with the engine
release's defaults (scenario.py), the stage's memory terms and KV budget (budget.py), the pool and what it
holds at each length (concurrency.py), and the fit."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..engines import Budget, Engine, MemoryTerms, Pool
from ..cache.layers import CacheLayout, kv_heads_per_rank
from ..engines.memory import ActivationEstimate
from ..engines.state_pool import StatePool, state_split
from ..config import ModelShape
from ..units import GiB
from .budget import StageSetup, activation_context_key, chosen_fraction, stage_setup
from .context_limit import context_refusal, recipe_note
from .concurrency import concurrency_fits, max_concurrency, max_context, units_for
from .scenario import Scenario, check_length, pp_stages, prepared


@dataclass(frozen=True)
class Breakdown:
    """Per-GPU memory; the terms add up to total_bytes."""

    total_bytes: int
    weights_bytes: int
    activation_bytes: int
    non_torch_bytes: int
    cuda_graph_bytes: int
    kv_payload_bytes: int
    kv_metadata_bytes: int
    recurrent_state_bytes: int
    headroom_bytes: int
    free_bytes: int

    def terms(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if k != "total_bytes"}


@dataclass(frozen=True)
class Estimate:
    scenario: Scenario
    engine: Engine
    k_format: str
    v_format: str
    weights_format: str
    kv_heads_per_gpu: int
    kv_layers: int
    pipeline_stage: int
    max_model_len: int
    kv_payload_bytes_per_token: int
    kv_metadata_bytes_per_token: int
    kv_layer_fixed_bytes: int
    kv_bytes_per_sequence: int
    kv_reserved_bytes_per_sequence: int
    recurrent_state_bytes_per_sequence: int
    block_size: int
    num_blocks: int
    block_bytes: int
    max_tokens: int
    max_concurrency: int
    max_concurrency_ratio: float
    max_context_at_concurrency: int
    kv_budget_bytes: int
    budget_formula: str
    breakdown: Breakdown
    fits: bool
    fit_message: str
    warnings: tuple[str, ...]
    layout: CacheLayout | None = field(default=None, repr=False, compare=False)
    pool: Pool | None = field(default=None, repr=False, compare=False)
    activation: ActivationEstimate | None = field(default=None, repr=False, compare=False)
    first_stage_kv_budget_bytes: int | None = None  # rank 0's budget (what vLLM's log prints)
    model_runner: str = "v1"  # vLLM's model runner for this model ("v2" profiles no CUDA graphs before sizing)
    state_pool: StatePool | None = None  # the engine's own recurrent-state slots (SGLang), set aside whole

    @property
    def printed_kv_budget_bytes(self) -> int:
        """The budget the engine's log prints: rank 0's with pipeline stages, else the pool's."""
        first = self.first_stage_kv_budget_bytes
        return first if first is not None else self.kv_budget_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_payload_bytes_per_token + self.kv_metadata_bytes_per_token

    @property
    def state_set_aside_bytes(self) -> int:
        """Recurrent state the engine sets aside before its KV pool (SGLang's slot pool), whatever runs."""
        return state_split(self.state_pool, self.recurrent_state_bytes_per_sequence)[0]

    @property
    def state_bytes_per_request(self) -> int:
        """Recurrent state each running request adds beside its KV (none where a slot pool is set aside)."""
        return state_split(self.state_pool, self.recurrent_state_bytes_per_sequence)[1]


def estimate(scenario: Scenario) -> Estimate:
    """The estimate for one scenario; with pipeline parallelism, for its tightest stage.

    vLLM sizes every rank from its own profile and keeps the smallest pool; its log prints rank
    0's "Available KV cache memory", kept here as `first_stage_kv_budget_bytes`."""
    s, engine, k_name, v_name = prepared(scenario)
    stages = pp_stages(s.shape.num_layers, s.pipeline_parallel_size, s.pp_layer_partition)
    results = [_estimate_stage(s, engine, k_name, v_name, i, stage, len(stages)) for i, stage in enumerate(stages)]
    tightest = min(results, key=lambda e: (e.fits, e.max_concurrency, e.max_tokens))
    if tightest.pipeline_stage == 0:
        return tightest
    return replace(tightest, first_stage_kv_budget_bytes=results[0].kv_budget_bytes)


@dataclass(frozen=True)
class LengthFigures:
    """A stage's figures at one --max-model-len (the rest of its estimate does not depend on it)."""

    max_model_len: int
    request_units: int
    kv_bytes_per_sequence: int
    max_concurrency: int
    max_concurrency_ratio: float
    max_context_at_concurrency: int
    max_tokens: int
    fits: bool


def _kv_side(su: StageSetup) -> tuple[int, int, int | None]:
    """(the budget the KV pool and per-request state share, the state each running request adds, the running
    requests an engine's own state pool caps): a fixed state pool is set aside whole, then no request adds state."""
    aside, per_request = state_split(su.state_pool, su.state_bytes)
    cap = su.state_pool.max_requests if su.state_pool else None
    return max(0, max(0, su.budget.kv_budget_bytes) - aside), per_request, cap


def _length_figures(su: StageSetup, engine: Engine, concurrency: int, max_model_len: int) -> LengthFigures:
    pool = su.pool
    kv_budget, state, cap = _kv_side(su)
    units = units_for(pool, kv_budget - concurrency * state)
    seq_payload, seq_metadata = su.layout.sequence_bytes(max_model_len)
    request_units = pool.request_units(max_model_len)
    mc = max_concurrency(pool, kv_budget, max_model_len, state)
    mc = mc if cap is None else min(mc, cap)
    ratio = units_for(pool, kv_budget - state) / request_units if request_units else 0.0
    # Fitting is monotone in length, so the longest context up to max(max_position_embeddings, length)
    # is one cached search for every length up to max_position_embeddings.
    limit = max(su.shape.max_position_embeddings, max_model_len)
    mctx = max_context(pool, kv_budget, concurrency, state, limit) if cap is None or concurrency <= cap else 0
    fits = (su.budget.kv_budget_bytes > 0 and concurrency_fits(pool, kv_budget, max_model_len, state, 1)
            and concurrency <= mc)
    return LengthFigures(max_model_len, request_units, seq_payload + seq_metadata, mc, ratio, mctx,
                         engine.reported_tokens(pool, units, ratio, max_model_len), fits)


def estimate_lengths(scenario: Scenario, lengths: list[int]) -> list[tuple[Estimate, LengthFigures]]:
    """The figures at every length, each with an estimate holding what does not depend on the length:
    a sweep's columns without an estimate per row. Raises what estimate() raises; no error depends
    on the length but a bad one. A length past the model's own limit that no published rope-scaling
    recipe serves does not fit (context_limit.py)."""
    return [(e, replace(f, fits=False) if f.fits and context_refusal(scenario.model_name, scenario.shape,
                                                                     f.max_model_len, e.engine) else f)
            for e, f in _estimate_lengths(scenario, lengths)]


def _estimate_lengths(scenario: Scenario, lengths: list[int]) -> list[tuple[Estimate, LengthFigures]]:
    for n in lengths:
        check_length(n)
    first = estimate(scenario.at_length(lengths[0]))
    release = first.engine.release
    length_sets_defaults = (scenario.max_num_batched_tokens is None and release is not None
                            and release.profile_tokens == "v0_unchunked")
    if length_sets_defaults or scenario.pipeline_parallel_size > 1 or first.engine.activation_reads_context:
        # The profiled batch (V0), the tightest stage or an activation sized at the context (llama.cpp's compute
        # buffer at its -c) can change with the length: estimate each.
        return [(e, _figures_of(e)) for e in (estimate(scenario.at_length(n)) for n in lengths)]
    s, engine, k_name, v_name = prepared(scenario.at_length(lengths[0]))
    if any(len({read(s.at_length(n), engine) for n in lengths}) > 1 for read in (chosen_fraction,
                                                                              activation_context_key)):
        # SGLang's default fraction reads the context length, and so does vLLM's MLA workspace below 8 Ki tokens
        # (activation_context_key): each length has its own budget.
        return [(e, _figures_of(e)) for e in (estimate(scenario.at_length(n)) for n in lengths)]
    su = stage_setup(s, engine, k_name, v_name, 0, range(s.shape.num_layers), 1)
    return [(first, _length_figures(su, engine, s.concurrency, n)) for n in lengths]


def beyond_positions_warning(model: str, shape: ModelShape, contexts, engine=None) -> str | None:
    """What a plan says of contexts past the model's max_position_embeddings (the refusal where no published
    rope-scaling recipe serves them, else the recipe the serve command carries), or None."""
    beyond = sorted({c for c in contexts if c > shape.max_position_embeddings})
    if not beyond:
        return None
    return (context_refusal(model, shape, beyond[-1], engine, option="context")
            or recipe_note(model, shape, beyond[-1], engine))


def _figures_of(e: Estimate) -> LengthFigures:
    return LengthFigures(e.max_model_len, e.kv_reserved_bytes_per_sequence // e.pool.unit_bytes,
                         e.kv_bytes_per_sequence, e.max_concurrency, e.max_concurrency_ratio,
                         e.max_context_at_concurrency, e.max_tokens, e.fits)


def _estimate_stage(s: Scenario, engine: Engine, k_name: str, v_name: str, index: int, stage: range,
                    num_stages: int) -> Estimate:
    su = stage_setup(s, engine, k_name, v_name, index, stage, num_stages)
    shape, layout, pool, budget, terms, state = su.shape, su.layout, su.pool, su.budget, su.terms, su.state_bytes
    warnings = list(su.notes)
    max_model_len = s.max_model_len or engine.default_max_model_len(shape)
    # the model's own limit: a published rope-scaling recipe serves a longer context, else it is refused
    beyond = context_refusal(s.model_name, s.shape, max_model_len, engine)
    note = recipe_note(s.model_name, s.shape, max_model_len, engine)
    if note:
        warnings.append(note)
    at = _length_figures(su, engine, s.concurrency, max_model_len)
    if beyond:
        at = replace(at, fits=False)
    kv_budget = max(0, budget.kv_budget_bytes)
    aside, per_request_state = state_split(su.state_pool, state)
    state_reserved = aside + s.concurrency * per_request_state
    units = units_for(pool, kv_budget - state_reserved)
    page_payload, page_metadata = pool.payload_share()
    allocated = units * pool.unit_bytes
    kv_payload = allocated * page_payload // max(1, page_payload + page_metadata)
    kv_metadata = allocated - kv_payload + (layout.pool_fixed_bytes() if units else 0)
    free = kv_budget - state_reserved - allocated - (layout.pool_fixed_bytes() if units else 0)
    breakdown = Breakdown(
        total_bytes=s.gpu_memory_bytes,
        weights_bytes=terms.weights_bytes,
        activation_bytes=terms.activation_bytes,
        non_torch_bytes=terms.non_torch_bytes,
        cuda_graph_bytes=terms.cuda_graph_bytes,
        kv_payload_bytes=kv_payload,
        kv_metadata_bytes=kv_metadata,
        recurrent_state_bytes=state_reserved if budget.kv_budget_bytes > 0 else 0,
        headroom_bytes=budget.headroom_bytes,
        free_bytes=free if budget.kv_budget_bytes > 0 else budget.kv_budget_bytes,
    )
    cap = su.state_pool.max_requests if su.state_pool else None
    message = beyond or _fit_message(s, engine, budget, pool, max(0, kv_budget - aside), max_model_len,
                                     per_request_state, at, terms, cap)
    k_name = su.k_name
    return Estimate(
        scenario=s, engine=engine, k_format=k_name if k_name != "auto" else shape.serving_dtype,
        v_format=su.v_name, weights_format=su.weights_format,
        kv_heads_per_gpu=1 if shape.is_mla else kv_heads_per_rank(shape.num_kv_heads, s.tensor_parallel_size),
        kv_layers=len(layout.kv), pipeline_stage=index, max_model_len=max_model_len,
        kv_payload_bytes_per_token=su.payload_bytes_per_token, kv_metadata_bytes_per_token=su.metadata_bytes_per_token,
        kv_layer_fixed_bytes=layout.pool_fixed_bytes(),
        kv_bytes_per_sequence=at.kv_bytes_per_sequence,
        kv_reserved_bytes_per_sequence=at.request_units * pool.unit_bytes,
        recurrent_state_bytes_per_sequence=state,
        block_size=pool.block_size, num_blocks=units if pool.paged else pool.tokens(units),
        block_bytes=pool.unit_bytes if pool.paged else pool.per_token_bytes,
        max_tokens=at.max_tokens, max_concurrency=at.max_concurrency, max_concurrency_ratio=at.max_concurrency_ratio,
        max_context_at_concurrency=at.max_context_at_concurrency, kv_budget_bytes=budget.kv_budget_bytes,
        model_runner=su.model_runner,
        budget_formula=budget.formula, breakdown=breakdown, fits=at.fits, fit_message=message,
        warnings=tuple(warnings), layout=layout, pool=pool, activation=su.activation,
        first_stage_kv_budget_bytes=budget.kv_budget_bytes if index == 0 else None, state_pool=su.state_pool,
    )


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _fit_message(s: Scenario, engine: Engine, budget: Budget, pool: Pool, kv_budget: int, max_model_len: int,
                 state: int, at: LengthFigures, terms: MemoryTerms, state_cap: int | None = None) -> str:
    setting = engine.fraction_option or "--headroom"
    if budget.kv_budget_bytes <= 0:
        return (
            f"the model does not fit: weights {_gib(terms.weights_bytes)} + activation "
            f"{_gib(terms.activation_bytes)} + non-torch {_gib(terms.non_torch_bytes)} + CUDA graphs "
            f"{_gib(terms.cuda_graph_bytes)} leave {_gib(budget.kv_budget_bytes)} for the KV cache "
            f"({budget.formula}); try a larger --tensor-parallel-size, --weights-dtype fp8/int4, a larger GPU, "
            f"or raising {setting}"
        )
    if not concurrency_fits(pool, kv_budget, max_model_len, state, 1):
        need = at.request_units * pool.unit_bytes + state + pool.fixed_bytes
        longest = max_context(pool, kv_budget, 1, state, max_model_len)
        return (
            f"one request of --max-model-len {max_model_len} needs {_gib(need)} of KV cache, available "
            f"{_gib(kv_budget)}; the longest that fits is {longest} tokens; try decreasing --max-model-len, "
            f"a smaller --kv-cache-dtype, or raising {setting}"
        )
    mc, mctx = at.max_concurrency, at.max_context_at_concurrency
    if state_cap is not None and s.concurrency > state_cap:
        return (f"{s.concurrency} concurrent requests: {engine.name}'s recurrent-state slots run at most {state_cap} "
                f"at once, whatever the KV cache holds; try decreasing --concurrency, raising {setting}, or more "
                f"replicas, or a larger --mamba-full-memory-ratio in the engine")
    if s.concurrency > mc:
        need = s.concurrency * (at.request_units * pool.unit_bytes + state) + pool.fixed_bytes
        return (
            f"{s.concurrency} concurrent requests of {max_model_len} tokens need {_gib(need)} of KV cache, "
            f"available {_gib(kv_budget)}; at most {mc} fit at that length, and at {s.concurrency} requests "
            f"the longest context is {mctx} tokens; try a smaller --kv-cache-dtype, a larger "
            f"--tensor-parallel-size, or decreasing --concurrency or --max-model-len"
        )
    return f"fits: {s.concurrency} × {max_model_len} tokens (up to {mc} requests at this length)"

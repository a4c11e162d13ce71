"""One scenario in, one typed estimate out: KV bytes, blocks, capacity, fit, breakdown."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from functools import lru_cache

from ..hashing import hash_once
from ..engines import Budget, Engine, MemoryTerms, Pool, check_format_supported, get_engine
from ..errors import KvsizeError
from ..engines.started import architecture_evidence, release_evidence
from ..cache.formats import FormatOptions, get_format
from ..cache.layers import CacheLayout, build_layout, kv_heads_per_rank, parse_layer_overrides
from ..engines.vllm_args import CUDAGRAPH_MODES
from ..engines.memory import (ActivationEstimate, cuda_graph_estimate, engine_weight_format, profiling_peak,
                     resolve_weights_dtype, weight_bytes)
from ..engines.releases import find_release
from ..engines.support import support
from ..config import DTYPE_BYTES, DTYPE_NAMES, ModelShape, with_mtp_layers
from ..config.family import family
from ..units import GiB, MiB, cdiv, ceil_fraction

# NVML's total less CUDA's, measured on the H100 80GB HBM3 (85,520,809,984 − 85,017,493,504 B).
NVML_CUDA_GAP_BYTES = 503_316_480

DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192  # vLLM v1 default for the OpenAI server on data-center GPUs
DEFAULT_MAX_NUM_SEQS = 256
V0_CHUNKED_PREFILL_ABOVE = 32768  # vLLM V0 arg_utils: chunked prefill by default only for longer contexts


@hash_once
@dataclass(frozen=True)
class Scenario:
    model_name: str
    shape: ModelShape
    gpu_name: str
    gpu_memory_bytes: int
    engine: str = "vllm"
    k_cache_dtype: str = "auto"
    v_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    concurrency: int = 1
    block_size: int | None = None
    memory_fraction: float | None = None  # the engine's own fraction (gpu_memory_utilization, ...)
    kv_cache_memory_bytes: int | None = None
    weights_dtype: str = "auto"
    headroom: float = 0.10
    max_num_batched_tokens: int | None = None  # None: the engine release's default for this GPU
    max_num_seqs: int | None = None
    non_torch_bytes: int | None = None
    cuda_graph_bytes: int | None = None
    layer_kv_dtype: str | None = None
    format_options: FormatOptions = field(default_factory=FormatOptions)
    extra_weights_bytes: int = 0  # other models on the GPU, e.g. a speculative-decoding draft (per GPU)
    gpu_multiprocessors: int | None = None  # SMs: the Triton sampler's buffer has one row per SM
    dtype: str = "auto"  # the engine's --dtype (the model's compute dtype); auto: the engine's rule
    gpu_nvml_mib: int | None = None  # nvidia-smi's total, which SGLang's default fraction reads
    gpu_architecture: str | None = None  # sm90, gfx942, ...: which KV formats the engine runs (profiles/support.json)
    mtp_layers: int = 0  # speculative decoding with this many of the model's MTP layers (their KV and weights)
    # vLLM's usage context: "serve" (vllm serve, the OpenAI server) or "llm" (the offline LLM() class),
    # whose batch defaults differ (LLM(): 16,384 batched tokens on GPUs of 70 GiB and more)
    usage_context: str = "serve"
    # vLLM's CUDA graphs: NONE (--enforce-eager), PIECEWISE, FULL, FULL_DECODE_ONLY or FULL_AND_PIECEWISE;
    # None: the release's default. Capture sizes as compilation_config gives them (None: vLLM's rule).
    cudagraph_mode: str | None = None
    # torch.compile on (vLLM's default); off with --enforce-eager or compilation mode 0, where the profiling
    # run's forward is eager and no compile-time autotuning holds example copies
    torch_compile: bool = True
    # the compiled graph loaded from vLLM's compile cache (a restart of the same model and settings): no
    # compile runs, so no autotuning example copies (the first start compiles and holds them)
    compile_cache_hit: bool = False
    # a multimodal model served text-only (--language-model-only, or every --limit-mm-per-prompt 0):
    # vLLM builds no vision tower
    language_model_only: bool = False
    cudagraph_capture_sizes: tuple[int, ...] | None = None
    max_cudagraph_capture_size: int | None = None
    # SGLang's --cuda-graph-max-bs (its default fraction reserves 2 MiB per decode graph batch); None: its rule
    cuda_graph_max_bs: int | None = None

    @property
    def nvml_mib(self) -> int:
        """nvidia-smi's total in MiB; without a profile, CUDA's total plus the gap measured on the H100."""
        if self.gpu_nvml_mib is not None:
            return self.gpu_nvml_mib
        return (self.gpu_memory_bytes + NVML_CUDA_GAP_BYTES) // MiB

    @property
    def enforce_eager(self) -> bool:
        """vLLM's --enforce-eager: neither torch.compile nor CUDA graphs."""
        return not self.torch_compile and self.cudagraph_mode == "NONE"

    def at_length(self, max_model_len: int | None) -> Scenario:
        """This scenario at another --max-model-len."""
        return self.evolve(max_model_len=max_model_len)

    def evolve(self, **changes) -> Scenario:
        """dataclasses.replace without its per-call field introspection (a sweep makes thousands of
        scenarios); Scenario has no __post_init__, so the result is the same."""
        unknown_fields = changes.keys() - _SCENARIO_FIELDS
        if unknown_fields:
            raise TypeError(f"Scenario has no field {', '.join(sorted(unknown_fields))}")
        copy = object.__new__(Scenario)
        state = self.__getstate__()
        state.update(changes)
        copy.__dict__.update(state)
        return copy

    def validated(self) -> Scenario:
        for name, value, low in (
            ("--tensor-parallel-size", self.tensor_parallel_size, 1),
            ("--pipeline-parallel-size", self.pipeline_parallel_size, 1),
            ("--concurrency", self.concurrency, 1),
        ):
            _int_at_least(value, name, low)
        for name, value in (("--max-num-batched-tokens", self.max_num_batched_tokens),
                            ("--max-num-seqs", self.max_num_seqs), ("GPU multiprocessors", self.gpu_multiprocessors)):
            if value is not None:
                _int_at_least(value, name, 1)
        if self.max_model_len is not None:
            check_length(self.max_model_len)
        if self.usage_context not in ("serve", "llm"):
            raise KvsizeError(f"the usage context must be serve (vllm serve) or llm (the LLM() class), "
                              f"got {self.usage_context!r}")
        if self.cudagraph_mode is not None and self.cudagraph_mode not in CUDAGRAPH_MODES:
            raise KvsizeError(f"cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}, got {self.cudagraph_mode!r}")
        if self.block_size is not None:
            _int_at_least(self.block_size, "--block-size", 1)
        if not 0 <= self.headroom < 1:
            raise KvsizeError(f"--headroom must be a fraction in [0, 1), got {self.headroom}")
        if self.memory_fraction is not None and not 0 < self.memory_fraction <= 1:
            raise KvsizeError(f"the engine's memory fraction must be in (0, 1], got {self.memory_fraction}")
        if self.gpu_memory_bytes <= 0:
            raise KvsizeError("GPU memory must be greater than zero")
        if self.kv_cache_memory_bytes is not None and self.kv_cache_memory_bytes > self.gpu_memory_bytes:
            raise KvsizeError(f"--kv-cache-memory {self.kv_cache_memory_bytes:,} bytes exceeds the GPU's "
                              f"{self.gpu_memory_bytes:,} bytes ({self.gpu_name}); give at most the GPU's memory")
        if self.extra_weights_bytes < 0:
            raise KvsizeError(f"extra weights must be zero or more bytes, got {self.extra_weights_bytes}")
        if self.pipeline_parallel_size > self.shape.num_layers:
            raise KvsizeError(
                f"--pipeline-parallel-size {self.pipeline_parallel_size} exceeds the model's "
                f"{self.shape.num_layers} layers"
            )
        return self


_SCENARIO_FIELDS = frozenset(f.name for f in fields(Scenario))


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

    @property
    def printed_kv_budget_bytes(self) -> int:
        """The budget the engine's log prints: rank 0's with pipeline stages, else the pool's."""
        first = self.first_stage_kv_budget_bytes
        return first if first is not None else self.kv_budget_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        return self.kv_payload_bytes_per_token + self.kv_metadata_bytes_per_token


def _int_at_least(value, option: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise KvsizeError(f"{option} must be an integer of at least {low}, got {value!r}")
    return value


def pp_stages(num_layers: int, pp: int) -> list[range]:
    """vLLM's get_pp_indices: an even split, extra layers going to the stages before the last."""
    sizes = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        sizes[-i] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return stages


def check_tensor_parallel(shape: ModelShape, tp: int, engine: Engine) -> None:
    if tp == 1 or engine.name in ("ideal", "llamacpp"):
        return
    heads = shape.num_attention_heads
    if heads % tp:
        raise KvsizeError(
            f"--tensor-parallel-size {tp} does not divide num_attention_heads {heads}; {engine.name} splits heads "
            f"evenly: use one of {', '.join(str(d) for d in range(1, heads + 1) if heads % d == 0 and d <= 64)}"
        )
    kv = shape.num_kv_heads
    if not shape.is_mla and (kv % tp if kv >= tp else tp % kv):
        raise KvsizeError(
            f"--tensor-parallel-size {tp} cannot split {kv} KV heads: it must divide them or be a multiple of them"
        )


def _format_warnings(engine: Engine, architecture: str | None, k_name: str, v_name: str, dtype: str) -> list[str]:
    out = [f"{row.name}: layout unconfirmed: {row.unconfirmed}"
           for row in dict.fromkeys(get_format(name, dtype) for name in (k_name, v_name)) if row.unconfirmed]
    if architecture is None or engine.name == "ideal":
        return out
    for name in dict.fromkeys((k_name, v_name)):
        fmt = get_format(name, dtype).name
        verdict = support(engine.name, fmt, architecture)
        failed = engine.release.kv_formats_failed.get(fmt) if engine.release is not None else None
        if failed:
            out.append(f"{engine.release.name} failed to start with {fmt} KV on a real GPU ({failed}); choose "
                       "another --kv-cache-dtype or check your build with kvsize verify")
        elif verdict.status == "unsupported":
            out.append(f"{engine.name} does not run {fmt} KV on {architecture} GPUs ({verdict.source}); "
                       "choose another --kv-cache-dtype or GPU")
        elif verdict.status == "unconfirmed":
            out.append(f"no engine source confirms {engine.name} runs {fmt} KV on {architecture} GPUs")
    return out


@lru_cache(maxsize=4096)
def _layout(shape: ModelShape, k: str, v: str, tp: int, stage: range, overrides: str | None,
            options: FormatOptions) -> CacheLayout:
    return build_layout(shape, k, v, tp, stage, parse_layer_overrides(overrides, shape.num_layers), options)


@lru_cache(maxsize=4096)
def _pool(engine: Engine, layout: CacheLayout, block_size: int, mnbt: int, pp: int) -> Pool:
    return engine.pool(layout, block_size, mnbt, pp)


@lru_cache(maxsize=4096)
def engine_weight_bytes(engine: Engine, shape: ModelShape, wfmt, tp: int, stage: range, first: bool, last: bool,
                        vision: bool = True, architecture: str | None = None) -> int:
    """The weights one GPU loads as the engine's release counts them: its kernels' zero points on this
    GPU, and the caching allocator's segment ends (docs/formulas.md, Weights)."""
    release = engine.release
    wfmt = engine_weight_format(wfmt, shape, release.activation_dtype_zero_points if release else None, architecture,
                                release.moe_keeps_checkpoint_zeros if release else False)
    allocator = release.weight_allocator if release is not None else None
    copies = 0
    if release is not None and release.mla_absorbed_weight_copies and shape.mla_kv_b_proj_params:
        copies = len(stage) * cdiv(shape.mla_kv_b_proj_params, tp) * DTYPE_BYTES[shape.serving_dtype]
    return weight_bytes(shape, wfmt, tp, stage, first, last, vision, allocator).total_bytes + copies


@lru_cache(maxsize=4096)
def _activation(shape, run, tokens, rows, tp, stage, first, last, sms, compiled=True) -> ActivationEstimate:
    return profiling_peak(shape, run, tokens, rows, tp, stage, first, last, sms, compiled)


def profiling_model(engine: Engine):
    """The engine release's profiling-run model; engines without release files use vLLM's newest."""
    newest = find_release("vllm", None)
    release = engine.release or newest
    return release.activation or newest.activation, release


def units_for(pool: Pool, budget_bytes: int) -> int:
    if pool.unit_bytes == 0:
        return 0
    return max(0, (budget_bytes - pool.fixed_bytes) // pool.unit_bytes)


def concurrency_fits(pool: Pool, budget_bytes: int, context_len: int, state_bytes: int, n: int) -> bool:
    remaining = budget_bytes - n * state_bytes
    if remaining < pool.fixed_bytes:
        return False
    return n * pool.request_units(context_len) <= units_for(pool, remaining)


def max_concurrency(pool: Pool, budget_bytes: int, context_len: int, state_bytes: int) -> int:
    request = pool.request_units(context_len)
    per_request = request * pool.unit_bytes + state_bytes
    if per_request == 0:
        return 0
    n = max(0, (budget_bytes - pool.fixed_bytes) // per_request)
    while concurrency_fits(pool, budget_bytes, context_len, state_bytes, n + 1):
        n += 1
    while n > 0 and not concurrency_fits(pool, budget_bytes, context_len, state_bytes, n):
        n -= 1
    return n


@lru_cache(maxsize=8192)
def max_context(pool: Pool, budget_bytes: int, concurrency: int, state_bytes: int, limit: int) -> int:
    """The longest context (up to `limit`) at which `concurrency` sequences fit; 0 if none."""
    if not concurrency_fits(pool, budget_bytes, 1, state_bytes, concurrency):
        return 0
    lo, hi = 1, limit
    if concurrency_fits(pool, budget_bytes, hi, state_bytes, concurrency):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if concurrency_fits(pool, budget_bytes, mid, state_bytes, concurrency):
            lo = mid
        else:
            hi = mid
    return lo


def with_engine_defaults(s: Scenario, engine: Engine | None = None) -> Scenario:
    """The scenario with the engine release's batch defaults filled in where the user gave none."""
    engine = engine or get_engine(s.engine)
    r = engine.release
    if s.max_num_batched_tokens is not None and s.max_num_seqs is not None:
        return s
    row = r.batch_default(s.gpu_memory_bytes, s.gpu_name) if r else None
    if row is not None and s.usage_context == "llm":
        row = row.for_llm_class()
    tokens = s.max_num_batched_tokens or (row.max_num_batched_tokens if row else DEFAULT_MAX_NUM_BATCHED_TOKENS)
    if s.max_num_batched_tokens is None and r is not None and r.profile_tokens == "v0_unchunked":
        # vLLM V0 (config.py SchedulerConfig): no chunked prefill up to 32K contexts, so one step
        # holds a whole max_model_len prompt; longer contexts turn chunking on at 2048 tokens.
        length = s.max_model_len or engine.default_max_model_len(s.shape)
        tokens = max(length, 2048) if length <= V0_CHUNKED_PREFILL_ABOVE else 2048
    seqs = s.max_num_seqs or (row.max_num_seqs if row else DEFAULT_MAX_NUM_SEQS)
    return s.evolve(max_num_batched_tokens=tokens, max_num_seqs=seqs)


def with_dtype(s: Scenario) -> Scenario:
    """The scenario with --dtype applied to the model's shape, and its MTP drafter layers added."""
    if s.mtp_layers:
        s = s.evolve(shape=with_mtp_layers(s.shape, _int_at_least(s.mtp_layers, "--mtp-layers", 0)), mtp_layers=0)
    if s.dtype in (None, "auto"):
        return s
    name = DTYPE_NAMES.get(str(s.dtype).strip().lower().removeprefix("torch."))
    if name is None:
        raise KvsizeError(f"--dtype must be auto, bfloat16, float16 or float32, got {s.dtype!r}")
    return s.evolve(shape=replace(s.shape, served_dtype=name), dtype="auto")


def estimate(scenario: Scenario) -> Estimate:
    """The estimate for one scenario; with pipeline parallelism, for its tightest stage.

    vLLM sizes every rank from its own profile and keeps the smallest pool; its log prints rank
    0's "Available KV cache memory", kept here as `first_stage_kv_budget_bytes`."""
    s, engine, k_name, v_name = _prepared(scenario)
    stages = pp_stages(s.shape.num_layers, s.pipeline_parallel_size)
    results = [_estimate_stage(s, engine, k_name, v_name, i, stage, len(stages)) for i, stage in enumerate(stages)]
    tightest = min(results, key=lambda e: (e.fits, e.max_concurrency, e.max_tokens))
    if tightest.pipeline_stage == 0:
        return tightest
    return replace(tightest, first_stage_kv_budget_bytes=results[0].kv_budget_bytes)


def _prepared(scenario: Scenario) -> tuple[Scenario, Engine, str, str]:
    """The validated scenario with the engine's defaults, and its K and V format names."""
    engine = get_engine(scenario.engine)
    s = with_engine_defaults(with_dtype(scenario.validated()), engine)
    shape = s.shape
    check_tensor_parallel(shape, s.tensor_parallel_size, engine)
    # one format for both (the usual --kv-cache-dtype) is named as that option in an error
    same = s.k_cache_dtype == s.v_cache_dtype
    k_fmt = get_format(s.k_cache_dtype, shape.serving_dtype, s.format_options,
                       "--kv-cache-dtype" if same else "--k-cache-dtype")
    v_fmt = get_format(s.v_cache_dtype, shape.serving_dtype, s.format_options,
                       "--kv-cache-dtype" if same else "--v-cache-dtype")
    check_format_supported(engine, k_fmt.name, k_fmt.engines, "--k-cache-dtype")
    check_format_supported(engine, v_fmt.name, v_fmt.engines, "--v-cache-dtype")
    if engine.name in ("vllm", "sglang", "trtllm", "lmdeploy") and k_fmt.name != v_fmt.name:
        raise KvsizeError(
            f"{engine.name} stores K and V in one format; --k-cache-dtype {k_fmt.name} and --v-cache-dtype "
            f"{v_fmt.name} differ (use --engine llamacpp or ideal for mixed K/V formats)"
        )
    return s, engine, k_fmt.name, v_fmt.name


@dataclass(frozen=True)
class _StageSetup:
    """What a pipeline stage's estimate takes from everything but --max-model-len and --concurrency."""

    shape: ModelShape
    k_name: str
    v_name: str
    notes: tuple[str, ...]
    layout: CacheLayout
    pool: Pool
    weights_format: str
    activation: ActivationEstimate
    terms: MemoryTerms
    fraction: float
    budget: Budget
    state_bytes: int  # recurrent state per sequence kept beside the pool
    payload_bytes_per_token: int
    metadata_bytes_per_token: int
    model_runner: str = "v1"


# The fields a stage's setup does not read: a sweep over contexts builds each setup once.
_PER_LENGTH_FIELDS = frozenset({"max_model_len", "concurrency", "model_name", "gpu_name"})
_SETUP_FIELDS = tuple(f.name for f in fields(Scenario) if f.name not in _PER_LENGTH_FIELDS)


def _setup_key(s: Scenario) -> tuple:
    return tuple(getattr(s, name) for name in _SETUP_FIELDS)


_SETUPS: dict[tuple, _StageSetup] = {}
_SETUPS_MAX = 4096


def _stage_setup(s: Scenario, engine: Engine, k_name: str, v_name: str, index: int, stage: range,
                 num_stages: int) -> _StageSetup:
    # Keyed by hand: an lru_cache would key on `s` whole, and so miss on every new length. SGLang's default
    # fraction reads the context length, so the fraction the engine would pick is part of the key.
    key = (_setup_key(s), _fraction(s, engine), engine, k_name, v_name, index, stage.start, stage.stop, num_stages)
    found = _SETUPS.get(key)
    if found is None:
        if len(_SETUPS) >= _SETUPS_MAX:
            _SETUPS.clear()
        found = _SETUPS[key] = _build_stage_setup(s, engine, k_name, v_name, index, stage, num_stages)
    return found


def _fraction(s: Scenario, engine: Engine) -> float:
    """The memory fraction asked for, else the engine's default for this scenario."""
    return s.memory_fraction if s.memory_fraction is not None else engine.default_fraction(
        s.nvml_mib, s.tensor_parallel_size, s.pipeline_parallel_size, fraction_inputs(s, s.shape))


def fraction_inputs(s: Scenario, shape: ModelShape):
    """What an engine's default memory fraction reads of the scenario beside the GPU (SGLang's rule)."""
    from ..engines.releases import FractionInputs

    return FractionInputs(mla=shape.is_mla, context_length=s.max_model_len,
                          chunked_prefill_size=s.max_num_batched_tokens, cuda_graph_max_bs=s.cuda_graph_max_bs,
                          cuda_graphs=s.cudagraph_mode != "NONE")


def _build_stage_setup(s: Scenario, engine: Engine, k_name: str, v_name: str, index: int, stage: range,
                       num_stages: int) -> _StageSetup:
    tp = s.tensor_parallel_size
    shape, k_name, v_name, built_notes = engine.build_model(s.shape, k_name, v_name)
    notes = (*shape.notes, *built_notes, *_format_warnings(engine, s.gpu_architecture, k_name, v_name,
                                                            shape.serving_dtype))
    if engine.release is not None and engine.release.unconfirmed:
        notes += (f"{engine.release.name} rules: {engine.release.unconfirmed}",)
    evidence = release_evidence(engine.name, engine.version)
    if evidence is not None:
        notes += (evidence.sentence(),)
        gpus = tp * s.pipeline_parallel_size
        if evidence.started_version and evidence.figures and gpus > evidence.figures.max_gpus_per_start:
            notes += (f"no start of {engine.name} {evidence.started_version} ran on more than "
                      f"{evidence.figures.max_gpus_per_start} GPU(s): at {gpus} GPUs the terms that come with TP and PP "
                      "(non-torch: NCCL's and the all-reduce's buffers) are read from source and public logs, not "
                      "confirmed by a start",)
    unstarted = architecture_evidence(engine.name, shape.architectures, family(shape))
    if unstarted:
        notes += (unstarted,)
    fraction = s.memory_fraction if s.memory_fraction is not None else engine.default_fraction(
        s.nvml_mib, tp, s.pipeline_parallel_size, fraction_inputs(s, shape))
    layout = _layout(shape, k_name, v_name, tp, stage, engine.layer_overrides(shape, k_name, s.layer_kv_dtype),
                     s.format_options)
    block_size = s.block_size or engine.block_size_for(layout)
    pool = _pool(engine, layout, block_size, s.max_num_batched_tokens, s.pipeline_parallel_size)

    wfmt = resolve_weights_dtype(s.weights_dtype, shape)
    first, last = index == 0, index == num_stages - 1
    # Per-tensor KV scales are attention-layer parameters, loaded with the weights.
    weights = (engine_weight_bytes(engine, shape, wfmt, tp, stage, first, last, not s.language_model_only,
                                   s.gpu_architecture)
               + layout.parameter_bytes()
               + s.extra_weights_bytes)
    run, rules = profiling_model(engine)
    runner = model_runner(engine, shape)
    if runner == "v2" and rules.activation_v2 is not None:
        run = rules.activation_v2
    above = dict(run.forward_above_model)
    if shape.model_type in above:
        notes += (f"activation: {rules.name}'s profiling forward of {shape.model_type} models ran above "
                  f"kvsize's model ({above[shape.model_type]}): the KV pool may be that much smaller; kvsize "
                  "verify measures it",)
    if engine.name == "vllm" and shape.vision_params and not s.language_model_only and first:
        notes += ("activation: vLLM also runs the vision encoder on its largest dummy images before sizing the KV "
                  "cache, which kvsize does not model (its starts of multimodal models ran text-only): the pool "
                  "may be smaller; --language-model-only serves the model without it, kvsize verify measures it",)
    rows = min(s.max_num_seqs, s.max_num_batched_tokens)
    act = _activation(shape, run, s.max_num_batched_tokens, rows, tp, stage, first, last,
                      s.gpu_multiprocessors or rows, s.torch_compile and not s.compile_cache_hit)
    non_torch = s.non_torch_bytes if s.non_torch_bytes is not None else rules.non_torch_bytes(
        tp, s.pipeline_parallel_size, runner, s.max_num_seqs * shape.vocab_size, shape.vocab_size * shape.hidden_size)
    graphs = s.cuda_graph_bytes if s.cuda_graph_bytes is not None else _cuda_graph_bytes(s, engine, rules, shape,
                                                                                          stage, runner)
    profiled = runner == "v1" or engine.release.model_runners.v2_profiles_cuda_graphs
    estimate_model = rules.cuda_graph_estimate
    if (graphs and profiled and s.cuda_graph_bytes is None and estimate_model is not None
            and estimate_model.fp8_kv_above_model and "fp8" in f"{k_name} {v_name}"):
        notes += (f"cuda graphs: with an fp8 KV cache {engine.release.name} measured more per graph than kvsize's "
                  f"estimate ({estimate_model.fp8_kv_above_model}): the KV pool may be that much smaller; "
                  "kvsize verify measures it",)
    terms = MemoryTerms(s.gpu_memory_bytes, weights, act.peak_bytes, non_torch, graphs, profiled)
    budget = engine.budget(terms, fraction, s.headroom)
    if s.kv_cache_memory_bytes is not None:
        budget = Budget(s.kv_cache_memory_bytes, s.gpu_memory_bytes - terms.model_bytes - s.kv_cache_memory_bytes,
                        s.gpu_memory_bytes, "--kv-cache-memory (fixed KV budget)")
    if engine.name == "sglang" and budget.headroom_bytes < 0:
        notes += ("activation and CUDA graphs exceed the memory outside --mem-fraction-static; lower it to avoid OOM",)
    payload_tok, metadata_tok = layout.token_bytes()
    # vLLM keeps a hybrid model's recurrent state in its block pool, not beside it.
    state = 0 if pool.holds_recurrent else layout.state_bytes_per_sequence()
    return _StageSetup(shape, k_name, v_name, notes, layout, pool, wfmt.name, act, terms, fraction, budget, state,
                       ceil_fraction(payload_tok), ceil_fraction(metadata_tok), runner)


def model_runner(engine: Engine, shape: ModelShape) -> str:
    """The vLLM model runner ("v1" or "v2") the engine release serves this model with."""
    rule = engine.release.model_runners if engine.name == "vllm" and engine.release else None
    if rule is None:
        return "v1"
    return rule.runner(shape.architectures, shape.num_experts > 0, shape.weights_quantization is not None,
                       "recurrent" in shape.layer_kinds)


def _cuda_graph_bytes(s: Scenario, engine: Engine, rules, shape: ModelShape, stage: range, runner: str = "v1") -> int:
    """The CUDA-graph term: 0 without graphs (--enforce-eager, cudagraph_mode NONE), vLLM's estimate
    from its capture sizes where the release models it, else the release's fixed figure."""
    if not engine.cuda_graphs or s.cudagraph_mode == "NONE":
        return 0
    model = rules.cuda_graph_estimate
    if model is None:
        return rules.cuda_graph_bytes(s.tensor_parallel_size)
    v1 = cuda_graph_estimate(shape, model, s.cudagraph_mode or "FULL_AND_PIECEWISE", s.tensor_parallel_size,
                             stage, s.max_num_seqs, s.max_num_batched_tokens, s.cudagraph_capture_sizes,
                             s.max_cudagraph_capture_size, compiled=s.torch_compile)
    return v1 + (len(stage) * model.v2_per_layer_bytes if runner == "v2" and v1 else 0)


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


def _length_figures(su: _StageSetup, engine: Engine, concurrency: int, max_model_len: int) -> LengthFigures:
    pool, state = su.pool, su.state_bytes
    kv_budget = max(0, su.budget.kv_budget_bytes)
    units = units_for(pool, kv_budget - concurrency * state)
    seq_payload, seq_metadata = su.layout.sequence_bytes(max_model_len)
    request_units = pool.request_units(max_model_len)
    mc = max_concurrency(pool, kv_budget, max_model_len, state)
    ratio = units_for(pool, kv_budget - state) / request_units if request_units else 0.0
    # Fitting is monotone in length, so the longest context up to max(max_position_embeddings, length)
    # is one cached search for every length up to max_position_embeddings.
    limit = max(su.shape.max_position_embeddings, max_model_len)
    mctx = max_context(pool, kv_budget, concurrency, state, limit)
    fits = (su.budget.kv_budget_bytes > 0 and concurrency_fits(pool, kv_budget, max_model_len, state, 1)
            and concurrency <= mc)
    return LengthFigures(max_model_len, request_units, seq_payload + seq_metadata, mc, ratio, mctx,
                         engine.reported_tokens(pool, units, ratio, max_model_len), fits)


def estimate_lengths(scenario: Scenario, lengths: list[int]) -> list[tuple[Estimate, LengthFigures]]:
    """The figures at every length, each with an estimate holding what does not depend on the length:
    a sweep's columns without an estimate per row. Raises what estimate() raises; no error depends
    on the length but a bad one."""
    for n in lengths:
        check_length(n)
    first = estimate(scenario.at_length(lengths[0]))
    release = first.engine.release
    length_sets_defaults = (scenario.max_num_batched_tokens is None and release is not None
                            and release.profile_tokens == "v0_unchunked")
    if length_sets_defaults or scenario.pipeline_parallel_size > 1:
        # The profiled batch (V0) or the tightest stage can change with the length: estimate each.
        return [(e, _figures_of(e)) for e in (estimate(scenario.at_length(n)) for n in lengths)]
    s, engine, k_name, v_name = _prepared(scenario.at_length(lengths[0]))
    if len({_fraction(s.at_length(n), engine) for n in lengths}) > 1:
        # SGLang's default fraction reads the context length: each length has its own budget.
        return [(e, _figures_of(e)) for e in (estimate(scenario.at_length(n)) for n in lengths)]
    su = _stage_setup(s, engine, k_name, v_name, 0, range(s.shape.num_layers), 1)
    return [(first, _length_figures(su, engine, s.concurrency, n)) for n in lengths]


def beyond_positions_warning(model: str, shape: ModelShape, contexts) -> str | None:
    """The warning for contexts past the model's max_position_embeddings, or None."""
    beyond = sorted({c for c in contexts if c > shape.max_position_embeddings})
    if not beyond:
        return None
    return (f"{model}: context {', '.join(f'{c:,}' for c in beyond)} exceeds the model's max_position_embeddings "
            f"{shape.max_position_embeddings:,}; quality beyond it is not assured")


def check_length(max_model_len) -> int:
    return _int_at_least(max_model_len, "--max-model-len", 1)


def _figures_of(e: Estimate) -> LengthFigures:
    return LengthFigures(e.max_model_len, e.kv_reserved_bytes_per_sequence // e.pool.unit_bytes,
                         e.kv_bytes_per_sequence, e.max_concurrency, e.max_concurrency_ratio,
                         e.max_context_at_concurrency, e.max_tokens, e.fits)


def _estimate_stage(s: Scenario, engine: Engine, k_name: str, v_name: str, index: int, stage: range,
                    num_stages: int) -> Estimate:
    su = _stage_setup(s, engine, k_name, v_name, index, stage, num_stages)
    shape, layout, pool, budget, terms, state = su.shape, su.layout, su.pool, su.budget, su.terms, su.state_bytes
    warnings = list(su.notes)
    max_model_len = s.max_model_len or engine.default_max_model_len(shape)
    if max_model_len > shape.max_position_embeddings:
        warnings.append(
            f"--max-model-len {max_model_len} exceeds the model's max_position_embeddings "
            f"{shape.max_position_embeddings}; quality beyond it is not assured"
        )
    at = _length_figures(su, engine, s.concurrency, max_model_len)
    kv_budget = max(0, budget.kv_budget_bytes)
    state_reserved = s.concurrency * state
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
    message = _fit_message(s, engine, budget, pool, kv_budget, max_model_len, state, at, terms)
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
        first_stage_kv_budget_bytes=budget.kv_budget_bytes if index == 0 else None,
    )


def _gib(n: int) -> str:
    return f"{n / GiB:.2f} GiB"


def _fit_message(s: Scenario, engine: Engine, budget: Budget, pool: Pool, kv_budget: int, max_model_len: int,
                 state: int, at: LengthFigures, terms: MemoryTerms) -> str:
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
    if s.concurrency > mc:
        need = s.concurrency * (at.request_units * pool.unit_bytes + state) + pool.fixed_bytes
        return (
            f"{s.concurrency} concurrent requests of {max_model_len} tokens need {_gib(need)} of KV cache, "
            f"available {_gib(kv_budget)}; at most {mc} fit at that length, and at {s.concurrency} requests "
            f"the longest context is {mctx} tokens; try a smaller --kv-cache-dtype, a larger "
            f"--tensor-parallel-size, or decreasing --concurrency or --max-model-len"
        )
    return f"fits: {s.concurrency} × {max_model_len} tokens (up to {mc} requests at this length)"


ESTIMATE_SCHEMA = "kvsize.estimate/1"


def tensor_parallel_notes(e: Estimate) -> tuple[str, ...]:
    """What changes per GPU at this TP size, term by term (docs/formulas.md, 'Engine releases'): each
    GPU's share of the weights and the KV heads, and the terms that do not shrink or that grow."""
    s = e.scenario
    tp = s.tensor_parallel_size
    if tp == 1:
        return ()
    shape = s.shape
    gib = e.breakdown.non_torch_bytes / GiB
    notes = [f"weights: each GPU holds 1/{tp} of every layer's weights, and of the embeddings and head "
             f"({e.breakdown.weights_bytes / GiB:.2f} GiB here)"]
    if shape.is_mla:
        notes.append("KV: the MLA latent is not split by TP: every GPU holds all of it, so KV per GPU does not "
                      "shrink")
    elif shape.num_kv_heads < tp:
        notes.append(f"KV: {shape.num_kv_heads} KV heads over {tp} GPUs: each holds one, replicated, so KV per GPU "
                     f"stops shrinking at TP {shape.num_kv_heads}")
    else:
        notes.append(f"KV: each GPU holds {e.kv_heads_per_gpu} of {shape.num_kv_heads} KV heads")
    if e.model_runner == "v2":
        notes.append("activation: the MLP's share shrinks with TP; the V2 sampler holds two model-dtype copies of "
                     "the all-gathered logits beside this GPU's shard, so it grows a little with TP")
    else:
        notes.append("activation: the MLP's share shrinks with TP; the sampler's logits are all-gathered and do not")
    if e.breakdown.cuda_graph_bytes:
        notes.append("CUDA graphs: the decode kernel's split-KV accumulators hold this GPU's query heads, so they "
                     "shrink with TP; the per-graph memory does not")
    notes.append(f"non-torch: NCCL's and the custom all-reduce's buffers come with TP ({gib:.2f} GiB per GPU "
                 f"under {e.engine.label.split(':')[0]})")
    return tuple(notes)


def graphs_subtracted(e: Estimate) -> bool:
    """Whether the engine takes its CUDA-graph estimate out of the KV budget for this model."""
    release = e.engine.release
    if release is None or "cuda_graphs" not in release.subtracts:
        return release is None
    return e.model_runner == "v1" or (release.model_runners is not None
                                      and release.model_runners.v2_profiles_cuda_graphs)


def engine_log_lines(e: Estimate) -> tuple[str, ...]:
    """The lines the engine prints at startup for this plan, worded as the engine words them, so a
    log can be held against them line by line (vLLM: gpu_worker.py and kv_cache_utils.py; SGLang:
    model_runner.py and memory_pool.py; TensorRT-LLM: resource_manager's MemUsageChange line)."""
    name = e.engine.name
    if e.kv_budget_bytes <= 0:
        return ()
    if name == "vllm":
        budget = e.printed_kv_budget_bytes
        release = e.engine.release
        graphs = ()
        if release is not None and release.cuda_graph_estimate is not None and graphs_subtracted(e) \
                and e.breakdown.cuda_graph_bytes:
            # gpu_model_runner.py profile_cudagraph_memory; the V2 runner prints none
            graphs = (f"Estimated CUDA graph memory: {e.breakdown.cuda_graph_bytes / GiB:.2f} GiB total",)
        return (*graphs, f"Available KV cache memory: {_gib(budget)}",
                f"GPU KV cache size: {e.max_tokens:,} tokens",
                f"Maximum concurrency for {e.max_model_len:,} tokens per request: {e.max_concurrency_ratio:.2f}x")
    allocated = e.breakdown.kv_payload_bytes + e.breakdown.kv_metadata_bytes
    if name == "sglang":
        half = f"{allocated // 2 / GiB:.2f} GB"  # SGLang divides by 2^30 and writes GB
        return (f"max_total_num_tokens={e.max_tokens}",
                f"KV Cache is allocated. #tokens: {e.max_tokens}, K size: {half}, V size: {half}")
    if name == "trtllm":
        return (f"[MemUsageChange] Allocated {_gib(allocated)} for max tokens in paged KV cache "
                f"({e.max_tokens}).",)
    return ()


def _evidence_record(e: Estimate) -> dict | None:
    """Whether the release was started, and kvsize's figures on its starts or the nearest started release's."""
    ev = release_evidence(e.engine.name, e.engine.version)
    if ev is None:
        return None
    f = ev.figures
    return {"version": ev.version or ev.started_version, "started": ev.started, "nearest_started": ev.nearest_version,
            "starts": f.starts if f else 0, "predictions": f.predictions if f else 0,
            "within_1pct": f.within_1pct if f else 0, "worst_token_error": f.worst_token_error if f else None,
            "gpus": list(f.gpus) if f else []}


def to_record(e: Estimate) -> dict:
    """The estimate as plain values: the stable JSON of `kvsize estimate --format json`."""
    s = e.scenario
    return {
        "schema": ESTIMATE_SCHEMA,
        "model": s.model_name,
        "gpu": s.gpu_name,
        "engine": e.engine.name,
        "model_runner": e.model_runner,
        "engine_release": e.engine.release.name if e.engine.release else None,
        "engine_rules": e.engine.label,
        "engine_release_evidence": _evidence_record(e),
        "engine_log_lines": list(engine_log_lines(e)),
        "tensor_parallel_notes": list(tensor_parallel_notes(e)),
        "k_cache_dtype": e.k_format,
        "v_cache_dtype": e.v_format,
        "weights_dtype": e.weights_format,
        "tensor_parallel_size": s.tensor_parallel_size,
        "pipeline_parallel_size": s.pipeline_parallel_size,
        "pipeline_stage": e.pipeline_stage,
        "kv_heads_per_gpu": e.kv_heads_per_gpu,
        "kv_layers": e.kv_layers,
        "max_model_len": e.max_model_len,
        "concurrency": s.concurrency,
        "block_size": e.block_size,
        "kv_bytes_per_token": e.kv_bytes_per_token,
        "kv_payload_bytes_per_token": e.kv_payload_bytes_per_token,
        "kv_metadata_bytes_per_token": e.kv_metadata_bytes_per_token,
        "kv_layer_fixed_bytes": e.kv_layer_fixed_bytes,
        "kv_bytes_per_sequence": e.kv_bytes_per_sequence,
        "kv_reserved_bytes_per_sequence": e.kv_reserved_bytes_per_sequence,
        "recurrent_state_bytes_per_sequence": e.recurrent_state_bytes_per_sequence,
        "num_blocks": e.num_blocks,
        "block_bytes": e.block_bytes,
        "max_tokens": e.max_tokens,
        "max_concurrency": e.max_concurrency,
        "max_concurrency_ratio": round(e.max_concurrency_ratio, 4),
        "max_context_at_concurrency": e.max_context_at_concurrency,
        "kv_budget_bytes": e.kv_budget_bytes,
        "budget_formula": e.budget_formula,
        "fits": e.fits,
        "fit_message": e.fit_message,
        "warnings": list(e.warnings),
        "breakdown": dict(total_bytes=e.breakdown.total_bytes, **e.breakdown.terms()),
    }

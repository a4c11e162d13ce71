"""What one server is asked to hold: the scenario (model shape, GPU, engine release, KV formats, parallelism,
lengths and the engine's own options), validated, with the engine release's defaults filled in where the
user gave none."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from ..hashing import hash_once
from ..engines import Engine, check_format_supported, get_engine
from ..errors import KvsizeError
from ..cache.formats import FormatOptions, get_format
from ..engines.vllm_args import CUDAGRAPH_MODES
from ..config import DTYPE_NAMES, ModelShape, with_mtp_layers
from ..units import MAX_SIZE_BYTES, MiB


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
    # layers per pipeline stage, first to last, as vLLM's VLLM_PP_LAYER_PARTITION gives them (None: its even split)
    pp_layer_partition: tuple[int, ...] | None = None
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
    # a multimodal model served as one (SGLang's enable_multimodal, unless language_only): its vision tower lowers
    # SGLang's default memory fraction
    serve_multimodal: bool = True
    # SGLang's --mamba-full-memory-ratio (its state pool's memory over attention memory; None: the release's), and
    # the SSM state's dtype (SGLang --mamba-ssm-dtype, vLLM --mamba-ssm-cache-dtype: fp32, bf16 or fp16; None: the
    # engine's rule from the config)
    mamba_full_memory_ratio: float | None = None
    mamba_ssm_dtype: str | None = None

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
        if self.mamba_full_memory_ratio is not None and not 0 < self.mamba_full_memory_ratio <= 100:
            raise KvsizeError(f"mamba_full_memory_ratio must be a ratio in (0, 100] such as 0.9, got "
                              f"{self.mamba_full_memory_ratio}")
        if self.mamba_ssm_dtype is not None and self.mamba_ssm_dtype not in ("fp32", "bf16", "fp16"):
            raise KvsizeError(f"mamba_ssm_dtype must be fp32, bf16 or fp16, got {self.mamba_ssm_dtype!r}")
        for name, value in (("GPU memory", self.gpu_memory_bytes), ("--kv-cache-memory", self.kv_cache_memory_bytes),
                            ("--non-torch-memory", self.non_torch_bytes),
                            ("--cuda-graph-memory", self.cuda_graph_bytes), ("extra weights", self.extra_weights_bytes)):
            # whole bytes only: a float of 1e180 bytes would round the pool's arithmetic into an endless count
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or abs(value) > MAX_SIZE_BYTES):
                raise KvsizeError(f"{name} must be a whole number of bytes of at most {MAX_SIZE_BYTES:,} (1 PiB), "
                                  f"got {value!r}")
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
        if self.pp_layer_partition is not None:
            check_layer_partition(self.pp_layer_partition, self.pipeline_parallel_size, self.shape.num_layers)
        return self


_SCENARIO_FIELDS = frozenset(f.name for f in fields(Scenario))


def _int_at_least(value, option: str, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise KvsizeError(f"{option} must be an integer of at least {low}, got {value!r}")
    return value


def check_layer_partition(partition: tuple[int, ...], pp: int, num_layers: int) -> None:
    """vLLM's own checks of VLLM_PP_LAYER_PARTITION (vllm/distributed/utils.py get_pp_indices): one count a stage,
    each at least one layer, adding up to the model's layers."""
    if len(partition) != pp:
        raise KvsizeError(f"--pp-layer-partition names {len(partition)} stages, but --pipeline-parallel-size is {pp}: "
                          "give one layer count a stage, first to last")
    if any(n < 1 for n in partition):
        raise KvsizeError(f"--pp-layer-partition {','.join(map(str, partition))}: every stage needs at least one layer")
    if sum(partition) != num_layers:
        raise KvsizeError(f"--pp-layer-partition {','.join(map(str, partition))} adds up to {sum(partition)} layers, "
                          f"the model has {num_layers}: the counts must add up to its layers")


def pp_stages(num_layers: int, pp: int, partition: tuple[int, ...] | None = None) -> list[range]:
    """vLLM's get_pp_indices: the layer counts VLLM_PP_LAYER_PARTITION gives, else an even split, extra layers going
    to the stages before the last."""
    if partition is not None:
        check_layer_partition(partition, pp, num_layers)
        sizes = list(partition)
    else:
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


def built_shape(s: Scenario) -> ModelShape:
    """The model as the scenario's engine release builds it, where that departs from config.json (vLLM builds
    MiniCPM3 without an MLA cache: sizing/engines/vllm.py _vllm_model)."""
    return get_engine(s.engine).build_model(s.shape, s.k_cache_dtype, s.v_cache_dtype)[0]


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


def prepared(scenario: Scenario) -> tuple[Scenario, Engine, str, str]:
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


def check_length(max_model_len) -> int:
    return _int_at_least(max_model_len, "--max-model-len", 1)

"""Engine startup logs: what vLLM, SGLang and TensorRT-LLM printed, read back into plain values.

`read_log` finds the engine, its version, the settings the run used and the figures it logged
(KV budget, tokens, and for vLLM each memory term). `compare_log` predicts the same run with the
release rules of that version and returns the two side by side, term by term.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace

from .errors import KvsizeError
from .units import GiB

MAX_LOG_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class LoggedRun:
    engine: str
    version: str | None
    model: str | None
    settings: dict = field(default_factory=dict)  # scenario fields the log states
    figures: dict = field(default_factory=dict)  # logged bytes or counts, by term name


def _first(pattern: str, text: str, cast=str):
    m = re.search(pattern, text)
    return cast(m.group(1).replace(",", "")) if m else None


def _gib(value: float | None) -> int | None:
    return None if value is None else round(value * GiB)


def _vllm(text: str) -> LoggedRun:
    version = _first(r"LLM engine \(v(\d+\.\d+\.\d+[^)]*)\)", text) or _first(r"version (\d+\.\d+\.\d+)", text)
    s: dict = {}
    args_text = _first(r"non-default args: (\{.*\})", text)
    args = {}
    if args_text:
        try:
            args = ast.literal_eval(args_text)
        except (ValueError, SyntaxError):
            args = {}
    model = args.get("model") or _first(r"with config: model='([^']+)'", text)
    for key, pattern, cast in (
        ("tensor_parallel_size", r"tensor_parallel_size=(\d+)", int),
        ("pipeline_parallel_size", r"pipeline_parallel_size=(\d+)", int),
        ("max_model_len", r"max_seq_len=(\d+)", int),
        ("kv_cache_dtype", r"kv_cache_dtype=([\w]+)", str),
        ("dtype", r"dtype=torch\.(\w+)", str),
        ("quantization", r"quantization=(\w+)", str),
        ("max_num_batched_tokens", r"max_num_batched_tokens=(\d+)", int),
        ("max_num_seqs", r"max_num_seqs to (\d+)", int),
    ):
        value = _first(pattern, text, cast)
        if value is not None:
            s[key] = value
    for key in ("gpu_memory_utilization", "max_num_seqs", "max_num_batched_tokens", "max_model_len",
                "tensor_parallel_size", "pipeline_parallel_size", "kv_cache_dtype", "dtype"):
        if key in args:
            s[key] = args[key]
    total = _first(r"total_memory=([\d.]+)GiB", text, float) or _first(r"total_gpu_memory \(([\d.]+)GiB\)", text, float)
    util = _first(r"gpu_memory_utilization \(([\d.]+)\)", text, float) or _first(r"Requested memory: ([\d.]+) \(util\)",
                                                                                 text, float)
    if util is not None and "gpu_memory_utilization" not in s:
        s["gpu_memory_utilization"] = util
    f = {
        "total_bytes": _gib(total),
        "weights_bytes": _gib(_first(r"weights memory: ([\d.]+) ?GiB", text, float)
                              or _first(r"Model loading took ([\d.]+) ?GiB", text, float)
                              or _first(r"model weights take ([\d.]+)GiB", text, float)),
        "activation_bytes": _gib(_first(r"torch peak memory increase: ([\d.]+) ?GiB", text, float)
                                 or _first(r"PyTorch activation peak memory takes ([\d.]+)GiB", text, float)),
        "non_torch_bytes": _gib(_first(r"non-torch forward increase memory: ([\d.]+) ?GiB", text, float)
                                or _first(r"non_torch_memory takes ([\d.]+)GiB", text, float)),
        "cuda_graph_bytes": _gib(_first(r"Estimated CUDA graph memory: ([\d.]+) ?GiB", text, float)),
        "kv_budget_bytes": _gib(_first(r"Available KV cache memory: ([\d.]+) ?GiB", text, float)
                                or _first(r"the rest of the memory reserved for KV Cache is ([\d.]+)GiB", text, float)),
        "max_tokens": _first(r"GPU KV cache size: ([\d,]+) tokens", text, int),
        "max_concurrency_ratio": _first(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", text, float),
    }
    return LoggedRun("vllm", version, model, s, {k: v for k, v in f.items() if v is not None})


def _sglang(text: str) -> LoggedRun:
    s: dict = {}
    for key, pattern, cast in (("tensor_parallel_size", r"tp_size=(\d+)", int),
                               ("memory_fraction", r"mem_fraction_static=([\d.]+)", float),
                               ("max_model_len", r"context_length=(\d+)", int),
                               ("kv_cache_dtype", r"kv_cache_dtype='(\w+)'", str)):
        value = _first(pattern, text, cast)
        if value is not None:
            s[key] = value
    k_size = _first(r"K size: ([\d.]+) GB", text, float)
    v_size = _first(r"V size: ([\d.]+) GB", text, float)
    f = {"max_tokens": _first(r"#tokens: (\d+)", text, int) or _first(r"max_total_num_tokens=(\d+)", text, int)}
    # "Load weight begin. avail mem=X GB" is the free memory profile_max_num_token starts from; the
    # end line's "mem usage" (or the drop in avail mem) is the weights. SGLang's GB are GiB.
    begin = _first(r"Load weight begin\. avail mem=([\d.]+) GB", text, float)
    end = _first(r"Load weight end\..*?avail mem=([\d.]+) GB", text, float)
    usage = _first(r"Load weight end\..*?mem usage=([\d.]+) GB", text, float)
    if begin is None and end is not None and usage is not None:
        begin = end + usage
    if begin is not None:
        f["free_at_start_bytes"] = _gib(begin)
    if usage is not None or (begin is not None and end is not None):
        f["weights_bytes"] = _gib(usage if usage is not None else begin - end)
    if k_size is not None and v_size is not None:
        f["kv_budget_bytes"] = _gib(k_size + v_size)  # SGLang divides by 1 << 30 and calls it GB
    return LoggedRun("sglang", _first(r"sglang[ =v]+(\d+\.\d+\.\d+)", text), _first(r"model_path='([^']+)'", text),
                     s, {k: v for k, v in f.items() if v is not None})


def _trtllm(text: str) -> LoggedRun:
    # TensorRT-LLM >= 0.9: "[MemUsageChange] Allocated X GiB for max tokens in paged KV cache (N)";
    # earlier C++ runtime: "Allocate N bytes for k/v cache." and "Using N tokens in paged KV cache."
    f = {"kv_budget_bytes": _gib(_first(r"Allocated ([\d.]+) GiB for max tokens in paged KV cache", text, float))
         or _first(r"Allocate (\d+) bytes for k/v cache", text, int),
         "max_tokens": _first(r"for max tokens in paged KV cache \((\d+)\)", text, int)
         or _first(r"Using (\d+) tokens in paged KV cache", text, int)}
    s: dict = {}
    fraction = _first(r"free_gpu_memory_fraction=([\d.]+)", text, float)
    if fraction is not None:
        s["memory_fraction"] = fraction
    return LoggedRun("trtllm", _first(r"TensorRT-LLM version: (\d+\.\d+\.\d+\S*)", text), None, s,
                     {k: v for k, v in f.items() if v is not None})


def read_log(text: str) -> LoggedRun:
    """The run a startup log describes; a log of no known engine, or with no KV figure, is refused."""
    if "Available KV cache memory" in text or "the rest of the memory reserved for KV Cache" in text:
        run = _vllm(text)
    elif "max_total_num_tokens" in text or "KV Cache is allocated" in text:
        run = _sglang(text)
    elif "paged KV cache" in text:
        run = _trtllm(text)
    else:
        raise KvsizeError("the log holds no KV cache line kvsize can read: expected vLLM's 'Available KV cache "
                          "memory', SGLang's 'KV Cache is allocated' or TensorRT-LLM's 'Allocated ... for max tokens "
                          "in paged KV cache'")
    return run


@dataclass(frozen=True)
class LogComparison:
    run: LoggedRun
    rules: str
    rows: tuple[tuple[str, int | float, int | float | None], ...]  # (term, predicted, logged)


def compare_log(run: LoggedRun, scenario) -> LogComparison:
    """Predict the logged run (scenario: model, GPU and settings already applied) and pair each
    logged figure with the prediction."""
    from .engines import get_engine
    from .plan import estimate

    engine = f"{run.engine}@{run.version}" if run.version else run.engine
    try:
        get_engine(engine)
    except KvsizeError:
        engine = run.engine  # a version kvsize keeps no rules for: its newest release, said in `rules`
    scenario = replace(scenario, engine=engine)
    free = run.figures.get("free_at_start_bytes")
    if free is not None and scenario.non_torch_bytes is None:
        # SGLang logs the free memory it sizes from: what the CUDA context, NCCL and any other
        # process took before it is then known, not modelled.
        scenario = replace(scenario, non_torch_bytes=scenario.gpu_memory_bytes - free)
    e = estimate(scenario)
    b = e.breakdown
    budget = e.first_stage_kv_budget_bytes if e.first_stage_kv_budget_bytes is not None else e.kv_budget_bytes
    predicted = {
        "total_bytes": b.total_bytes, "weights_bytes": b.weights_bytes, "activation_bytes": b.activation_bytes,
        "non_torch_bytes": b.non_torch_bytes, "cuda_graph_bytes": b.cuda_graph_bytes, "kv_budget_bytes": budget,
        "max_tokens": e.max_tokens, "max_concurrency_ratio": round(e.max_concurrency_ratio, 2),
        "free_at_start_bytes": b.total_bytes - b.non_torch_bytes,
    }
    rows = tuple((k, v, run.figures.get(k)) for k, v in predicted.items() if k in run.figures or k == "kv_budget_bytes")
    return LogComparison(run, e.engine.label, rows)

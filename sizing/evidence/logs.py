"""Engine startup logs: what vLLM, SGLang and TensorRT-LLM printed, read back into plain values.

`read_log` finds the engine, its version, the settings the run used and the figures it logged
(KV budget, tokens, and for vLLM each memory term). `compare_log` predicts the same run with the
release rules of that version and returns the two side by side, term by term.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from ..errors import KvsizeError
from ..units import GiB
from ..config import DTYPE_NAMES
from ..engines.vllm_args import read_logged_args

MAX_LOG_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class LoggedRun:
    engine: str
    version: str | None
    model: str | None
    settings: dict = field(default_factory=dict)  # the engine's settings the log states, under the engine's names
    figures: dict = field(default_factory=dict)  # logged bytes or counts, by term name
    sources: dict = field(default_factory=dict)  # setting -> the line it was read from


_NUMBER = re.compile(r"\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?")
MAX_FIGURE_DIGITS = 20  # no engine prints a figure longer; a longer one is a broken or hostile log


def _cast(raw: str, cast, line: str):
    """A figure as the engine prints it (thousands separators allowed), or one line naming it."""
    if not _NUMBER.fullmatch(raw) or len(raw.replace(",", "")) > MAX_FIGURE_DIGITS or (
            cast is int and "." in raw):
        raise KvsizeError(f"the log line {line.strip()[:100]!r} holds {raw[:40]!r}, which is not a "
                          f"{'whole number' if cast is int else 'number'} kvsize can read")
    return cast(raw.replace(",", ""))


def _first(pattern: str, text: str, cast=str):
    m = re.search(pattern, text)
    if not m:
        return None
    # thousands separators only inside numbers: a captured dict or name keeps its commas
    return m.group(1) if cast is str else _cast(m.group(1), cast, m.group(0))


MAX_MARKERS = 1000  # places one marker is tried at: an engine prints each of these lines a few times


def _first_from(marker: str, pattern: str, text: str, cast=str):
    """_first for a pattern that starts with `marker` (its literal text) and reaches a bounded way along that line:
    tried at the first MAX_MARKERS places the marker stands, each within its line, so that a log of the marker
    repeated is read in time linear in the log, not in the log times the pattern's reach."""
    compiled = re.compile(pattern)
    at = 0
    for _ in range(MAX_MARKERS):
        found = text.find(marker, at)
        if found < 0:
            return None
        line_end = text.find("\n", found)
        m = compiled.match(text, found, len(text) if line_end < 0 else line_end)
        if m:
            return m.group(1) if cast is str else _cast(m.group(1), cast, m.group(0))
        at = found + len(marker)
    return None


def _gib(value: float | None) -> int | None:
    return None if value is None else round(value * GiB)


def _numbers(pattern: str, text: str) -> list[float]:
    return [_cast(m.group(1), float, m.group(0)) for m in re.finditer(pattern, text)]


# A log line longer than this is no engine's: matching stops there, so a hostile line cannot make
# the patterns' scans quadratic. No pattern crosses a line break or runs unbounded for the same reason: a marker
# repeated without its closing character is passed over in time linear in the log.
MAX_LINE_CHARS = 64 * 1024
# vLLM's KV lines and the figure each must carry: a line without a readable figure is refused.
_VLLM_FIGURE_LINES = (("Available KV cache memory:", "kv_budget_bytes"), ("GPU KV cache size:", "max_tokens"),
                      ("Model loading took", "weights_bytes"), ("Estimated CUDA graph memory:", "cuda_graph_bytes"))


# The V2 model runner's source file as INFO ([model_runner.py:305]) and DEBUG ([v1/worker/gpu/model_runner.py:305])
# lines name it; the V1 runner's is gpu_model_runner.py.
_V2_RUNNER = re.compile(r"\[(?:v1/worker/gpu/)?model_runner\.py:")

# vLLM's engine config line ("Initializing a V1 LLM engine (v0.22.1) with config: ...") states what the
# engine resolved, defaults included; the "non-default args" dict states what the user set.
_CONFIG_FIELDS = (
    ("tensor_parallel_size", r"tensor_parallel_size=(\d+)", int),
    ("pipeline_parallel_size", r"pipeline_parallel_size=(\d+)", int),
    ("max_model_len", r"max_seq_len=(\d+)", int),
    ("kv_cache_dtype", r"kv_cache_dtype=(\w+)", str),
    ("dtype", r"dtype=torch\.(\w+)", str),
    ("quantization", r"quantization=(\w+)", str),
    ("enforce_eager", r"enforce_eager=(True|False)", str),
    ("cudagraph_mode", r"'cudagraph_mode': <CUDAGraphMode\.(\w+)", str),
    ("compilation_mode", r"'mode': <CompilationMode\.(\w+)", str),
)


# vLLM's line when a start loads its compiled graph from the compile cache (a restart: no compile runs)
COMPILE_CACHE_LINE = "Directly load the compiled graph"
# what a log states about how the engine ran, read here rather than as an EngineArgs field
_ENGINE_STATE = ("cudagraph_mode", "compilation_mode", "compile_cache_hit")


def _logged_dict(marker: str, text: str) -> str | None:
    """The {...} after the first `marker` on a line that closes it (from its brace to the line's last closing
    brace), found in time linear in the log: a line of `marker` repeated without a closing brace is passed over
    once, not rescanned from each repeat as a regular expression would."""
    at = 0
    while (found := text.find(marker, at)) >= 0:
        start = found + len(marker)
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        if text.startswith("{", start):
            close = text.rfind("}", start, min(line_end, start + MAX_LINE_CHARS + 2))
            if close > start:
                return text[start:close + 1]
            at = line_end  # no later repeat on this line closes either
        else:
            at = start
    return None


_PP_WORKER = re.compile(r"\(Worker_PP(\d{1,3})(?:_TP\d{1,4})? pid=")


def _last_stage_lines(text: str) -> str:
    """The lines of the last pipeline stage's workers and those of no stage (the engine's own), where the log's
    workers are named by stage; the text as it is otherwise."""
    stages = {int(m) for m in _PP_WORKER.findall(text)}
    if len(stages) < 2:
        return text
    last = max(stages)
    return "\n".join(ln for ln in text.splitlines()
                     if (m := _PP_WORKER.search(ln)) is None or int(m.group(1)) == last)


TEXT_ONLY_LINE = "All limits of multimodal modalities supported by the model are set to 0, running in text-only mode"


def _vllm(text: str) -> LoggedRun:
    version = (_first(r"LLM engine \(v(\d+\.\d+\.\d+[^)\n]{0,64})\)", text) or _first(r"vLLM API server version (\d+\.\d+\.\d+\S*)", text)
               or _first(r"(?<!NCCL )(?<!nccl )(?<!CUDA )(?<!torch )version (\d+\.\d+\.\d+)", text))
    settings: dict = {}
    sources: dict = {}

    def put(key, value, source):
        settings[key] = value
        sources[key] = source

    config_line = _first(r"(Initializing a V\d LLM engine .*)", text) or ""
    args = read_logged_args(_logged_dict("non-default args: ", text) or "")
    model = args.get("model") or _first(r"with config: model='([^'\n]{1,4096})'", text)
    for key, pattern, cast in _CONFIG_FIELDS:
        value = _first(pattern, config_line or text, cast)
        if value is not None and value != "None":
            put(key, value, "engine config line")
    if settings.get("enforce_eager") == "True":
        settings["enforce_eager"] = True
    elif "enforce_eager" in settings:
        settings.pop("enforce_eager"), sources.pop("enforce_eager")
    for key, value in args.items():
        if key not in ("model", "model_tag"):
            put(key, value, "non-default args")
    if COMPILE_CACHE_LINE in text:
        put("compile_cache_hit", True, "compile cache line")
    tokens = _first(r"max_num_batched_tokens=(\d+)", text, int)
    if tokens is not None:
        put("max_num_batched_tokens", tokens, "chunked prefill line")
    seqs = _first(r"max_num_seqs to (\d+)", text, int)
    if seqs is not None and "max_num_seqs" not in settings:
        put("max_num_seqs", seqs, "scheduler line")
    # vllm/config/model.py (0.33.0) says so where every modality's limit is 0, --language-model-only among them; 0.33.0's
    # INFO log prints no non-default args line to read the flag from
    if TEXT_ONLY_LINE in text and "language_model_only" not in settings:
        put("language_model_only", True, "text-only line")
    util = _first(r"gpu_memory_utilization \(([\d.]+)\)", text, float) or _first(r"Requested memory: ([\d.]+) \(util\)",
                                                                                 text, float)
    if util is not None and "gpu_memory_utilization" not in settings:
        put("gpu_memory_utilization", util, "memory profile line")
    total = (_first(r"total_memory=([\d.]+)GiB", text, float) or _first(r"total_gpu_memory \(([\d.]+)GiB\)", text, float))
    total_bytes = _gib(total)
    if total_bytes is None:
        exact = _first_from("MemorySnapshot(", r"MemorySnapshot\(.{0,400}?total_memory=(\d+)", text, int)
        total_bytes = exact
    runner = "v2" if ("Using V2 Model Runner" in text or _V2_RUNNER.search(text)) else None
    if runner is None and "gpu_model_runner.py:" in text:
        runner = "v1"
    if runner:
        put("model_runner", runner, "log lines' source file")
    available = _numbers(r"Available KV cache memory: ([\d.]+) ?GiB", text)
    # a pipeline-parallel run prints each stage's profiling lines; the last stage (it builds the sampler and its
    # state) is the one whose pool binds, so its terms are the ones read (vLLM plans every stage at the smallest)
    text = _last_stage_lines(text)
    graphs = _numbers(r"Estimated CUDA graph memory: ([\d.]+) ?GiB", text)
    loading = _numbers(r"Model loading took ([\d.]+) ?GiB", text)
    f = {
        "total_bytes": total_bytes,
        "weights_bytes": _gib(_first(r"weights memory: ([\d.]+) ?GiB", text, float)
                              or (max(loading) if loading else None)
                              or _first(r"model weights take ([\d.]+)GiB", text, float)),
        "activation_bytes": _gib(_first(r"torch peak memory increase: ([\d.]+) ?GiB", text, float)
                                 or _first(r"PyTorch activation peak memory takes ([\d.]+)GiB", text, float)),
        "non_torch_bytes": _gib(_first(r"non-torch forward increase memory: ([\d.]+) ?GiB", text, float)
                                or _first(r"non_torch_memory takes ([\d.]+)GiB", text, float)),
        "cuda_graph_bytes": _gib(max(graphs)) if graphs else None,
        # every rank sizes its own pool and the engine keeps the smallest
        "kv_budget_bytes": _gib(min(available) if available else
                                _first(r"the rest of the memory reserved for KV Cache is ([\d.]+)GiB", text, float)),
        "max_tokens": _first(r"GPU KV cache size: ([\d,]+) tokens", text, int),
        "max_concurrency_ratio": _first(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", text, float),
    }
    figures = {k: v for k, v in f.items() if v is not None}
    for marker, key in _VLLM_FIGURE_LINES:
        if marker in text and key not in figures:
            line = next(ln for ln in text.splitlines() if marker in ln)
            raise KvsizeError(f"the log line {line.strip()[:100]!r} holds no figure kvsize can read "
                              "(a cut-off, negative or non-numeric value)")
    return LoggedRun("vllm", version, model, settings, figures, sources)


# ServerArgs fields that move memory, as SGLang's "server_args=ServerArgs(...)" line prints them
SGLANG_LOGGED_ARGS = ("tp_size", "pp_size", "mem_fraction_static", "context_length", "kv_cache_dtype", "page_size",
                      "chunked_prefill_size", "max_running_requests", "disable_cuda_graph", "cuda_graph_max_bs",
                      "dtype", "mamba_full_memory_ratio", "mamba_ssm_dtype", "max_mamba_cache_size",
                      "disable_radix_cache")
# ServerArgs(tp_size=2, ...) up to 0.5.2x; from 0.5.23 the line prints a dict ({'tp_size': 2, ...})
_SGLANG_ARG = re.compile(r"(?:\b|')(" + "|".join(SGLANG_LOGGED_ARGS) + r")(?:=|': )('[^']{0,64}'|[\w.+-]{1,32})")


def sglang_server_args(text: str) -> dict:
    """The memory-moving ServerArgs of SGLang's `server_args=` line, as Python literals (None left out)."""
    line = next((ln for ln in text.splitlines() if "server_args=ServerArgs(" in ln or "server_args={" in ln), "")
    out: dict = {}
    for key, raw in _SGLANG_ARG.findall(line):
        if key in out or raw == "None":
            continue
        out[key] = raw.strip("'") if raw.startswith("'") else (raw == "True" if raw in ("True", "False") else raw)
    return out


def _sglang(text: str) -> LoggedRun:
    s: dict = {f"server_args.{k}": v for k, v in sglang_server_args(text).items()}
    # without a server_args line (older logs quote fragments), the settings are read where they stand
    for key, pattern, cast in () if s else (("tensor_parallel_size", r"tp_size=(\d+)", int),
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
    end = _first_from("Load weight end.", r"Load weight end\..{0,200}?avail mem=([\d.]+) GB", text, float)
    usage = _first_from("Load weight end.", r"Load weight end\..{0,200}?mem usage=([\d.]+) GB", text, float)
    if begin is None and end is not None and usage is not None:
        begin = end + usage
    if begin is not None:
        f["free_at_start_bytes"] = _gib(begin)
    if usage is not None or (begin is not None and end is not None):
        f["weights_bytes"] = _gib(usage if usage is not None else begin - end)
    # a hybrid model's Mamba pool takes its share of the same cache memory first (MambaPool)
    conv = _first(r"Mamba Cache is allocated\..{0,120}?conv_state size: ([\d.]+) ?GB", text, float)
    ssm = _first(r"Mamba Cache is allocated\..{0,200}?ssm_state size: ([\d.]+) ?GB", text, float)
    state = (conv or 0.0) + (ssm or 0.0)
    f["state_slots"] = _first(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+)", text, int)
    f["state_capped_requests"] = _first(r"max_running_requests is capped to (\d+) by the mamba state cache", text, int)
    if k_size is not None and v_size is not None:
        f["kv_budget_bytes"] = _gib(k_size + v_size + state)  # SGLang divides by 1 << 30 and calls it GB
    elif (latent := _first_from("KV Cache is allocated.", r"KV Cache is allocated\..{0,80}? KV size: ([\d.]+) GB", text,
                                 float)) is not None:
        f["kv_budget_bytes"] = _gib(latent + state)  # MLA's one latent pool (MLATokenToKVPool)
    return LoggedRun("sglang", _first(r"sglang[ =v]+(\d+\.\d+\.\d+)", text),
                     _first(r"model_path='([^'\n]{1,4096})'", text) or _first(r"'model_path': '([^'\n]{1,4096})'", text),
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
    if any(len(line) > MAX_LINE_CHARS for line in text.splitlines()):
        text = "\n".join(line[:MAX_LINE_CHARS] for line in text.splitlines())
    if ("Available KV cache memory" in text or "GPU KV cache size" in text
            or "the rest of the memory reserved for KV Cache" in text):
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
class LogSettings:
    """Where each setting of a logged run's scenario came from."""

    read: dict  # setting -> (value, the line it was read from)
    assumed: dict  # setting -> (value, why: the release default, the option given)
    ignored: tuple[str, ...] = ()  # logged settings that move no memory
    not_modelled: tuple[str, ...] = ()  # logged settings that move memory kvsize does not model
    unknown: tuple[str, ...] = ()  # logged settings kvsize has no classification of


def _log_gpu(run: LoggedRun, gpu):
    """The GPU the log ran on: the one given, else the bundled GPU whose CUDA total the log prints."""
    from ..profiles import gpu_profile, matching_gpus

    if gpu is not None:
        return gpu, "given (--gpu)"
    total = run.figures.get("total_bytes")
    if total is not None:
        found = matching_gpus(total_bytes=total, total_slack_bytes=total // 200)  # 0.5%: printed to 0.01 GiB
        if len(found) == 1:
            return gpu_profile(found[0]), f"the log's total ({total / GiB:.2f} GiB)"
        if found:
            # several GPUs have that total (an H100 and an A100 of 80 GB): asking beats the first alphabetically
            raise KvsizeError(f"the log's GPU total {total / GiB:.2f} GiB fits {len(found)} bundled GPUs "
                              f"({', '.join(found)}); give --gpu with the one it ran on")
        raise KvsizeError(f"the log's GPU total {total / GiB:.2f} GiB matches no bundled GPU; give --gpu "
                          "(kvsize gpus lists them)")
    raise KvsizeError("the log does not say which GPU it ran on (vLLM 0.21 and later print no total at INFO "
                      "level); give --gpu, e.g. --gpu h100-sxm (kvsize gpus lists them)")


def _log_engine(run: LoggedRun) -> str:
    """The engine rules for the logged version, refused where kvsize keeps none for it."""
    from ..engines import get_engine

    if not run.version:
        return run.engine
    engine = f"{run.engine}@{run.version}"
    try:
        get_engine(engine)
    except KvsizeError as e:
        # another release's rules would be a guess: say which ranges kvsize knows and how to choose one
        raise KvsizeError(f"the log is of {run.engine} {run.version}: {str(e).split(': ', 1)[-1]}; give "
                          "--engine-version to predict it with the rules of a release kvsize knows") from None
    return engine


def log_scenario(run: LoggedRun, model_name: str, shape, gpu=None, weights_dtype: str = "auto"):
    """The scenario a logged run describes, and which of its settings the log gave and which were
    assumed. `gpu`: a GpuProfile, or None to take it from the log's printed total."""
    from ..capacity.scenario import Scenario
    from ..engines.vllm_args import for_layers, read_engine_args

    g, gpu_source = _log_gpu(run, gpu)
    read: dict = {}
    assumed: dict = {"gpu": (g.name, gpu_source)} if gpu is not None else {}
    if gpu is None:
        read["gpu"] = (g.name, gpu_source)
    ignored: tuple[str, ...] = ()
    not_modelled: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    fields: dict = {}
    if run.engine == "vllm":
        args = {k: v for k, v in run.settings.items() if k != "model_runner" and k not in _ENGINE_STATE}
        if run.sources.get("dtype") == "engine config line" and DTYPE_NAMES.get(str(args.get("dtype"))) == shape.serving_dtype:
            args.pop("dtype")  # the engine's resolution of auto, not a choice of the user's
        settings = for_layers(read_engine_args(args, from_log=True), shape.layer_kinds)
        fields = dict(settings.fields)
        if str(run.settings.get("quantization", "")).lower() == "fp8" and shape.weights_quantization is None:
            fields["weights_dtype"] = "fp8"  # online fp8 of a 16-bit checkpoint (an fp8 checkpoint names its own)
        if run.settings.get("cudagraph_mode"):
            fields["cudagraph_mode"] = run.settings["cudagraph_mode"]
        if run.settings.get("compilation_mode") == "NONE":
            fields["torch_compile"] = False
        if run.settings.get("compile_cache_hit"):
            fields["compile_cache_hit"] = True
        ignored, not_modelled, unknown = settings.ignored, settings.not_modelled, settings.unknown
        for key in (*settings.used, *_ENGINE_STATE):
            if key in run.settings:
                read[key] = (run.settings[key], run.sources.get(key, "the log"))
        if "gpu_memory_utilization" not in run.settings and "kv_cache_memory_bytes" not in run.settings:
            assumed["gpu_memory_utilization"] = ("the release default", "not in the log")
        if "max_num_seqs" not in run.settings:
            assumed["max_num_seqs"] = ("the release default", "not in the log")
        if "kv_cache_dtype" not in run.settings:
            assumed["kv_cache_dtype"] = ("auto", "not in the log")
    elif any(k.startswith("server_args.") for k in run.settings):
        from ..engines.sglang_args import read_server_args

        args = {k.split(".", 1)[1]: v for k, v in run.settings.items() if k.startswith("server_args.")}
        settings = read_server_args(args)
        fields = dict(settings.fields)
        not_modelled = settings.not_modelled
        for key in settings.used:
            read[key] = (args[key], "SGLang's server_args line")
        if "mem_fraction_static" not in args:
            assumed["mem_fraction_static"] = ("SGLang's default for these settings", "not in the log")
    else:
        st = run.settings
        for key, field_name in (("tensor_parallel_size", "tensor_parallel_size"), ("max_model_len", "max_model_len"),
                                ("memory_fraction", "memory_fraction")):
            if key in st:
                fields[field_name] = st[key]
                read[key] = (st[key], "the log")
        if "kv_cache_dtype" in st:
            fields["k_cache_dtype"] = fields["v_cache_dtype"] = st["kv_cache_dtype"]
            read["kv_cache_dtype"] = (st["kv_cache_dtype"], "the log")
    if weights_dtype != "auto" or "weights_dtype" not in fields:
        fields["weights_dtype"] = weights_dtype  # --weights-dtype, where given, says what the checkpoint stores
    scenario = Scenario(model_name, shape, g.name, run.figures.get("total_bytes", g.memory_bytes),
                        engine=_log_engine(run), gpu_multiprocessors=g.multiprocessors,
                        gpu_nvml_mib=g.nvml_memory_mib, gpu_architecture=g.architecture, **fields)
    return scenario, LogSettings(read, assumed, ignored, not_modelled, unknown)


@dataclass(frozen=True)
class LogComparison:
    run: LoggedRun
    rules: str
    rows: tuple[tuple[str, int | float, int | float | None], ...]  # (term, predicted, logged)


def compare_log(run: LoggedRun, scenario) -> LogComparison:
    """Predict the logged run (scenario: model, GPU and settings already applied) and pair each
    logged figure with the prediction."""
    from ..capacity.estimate import estimate

    scenario = replace(scenario, engine=_log_engine(run))
    free = run.figures.get("free_at_start_bytes")
    if free is not None and scenario.non_torch_bytes is None:
        # SGLang logs the free memory it sizes from: what the CUDA context, NCCL and any other
        # process took before it is then known, not modelled.
        scenario = replace(scenario, non_torch_bytes=scenario.gpu_memory_bytes - free)
    e = estimate(scenario)
    b = e.breakdown
    budget = e.printed_kv_budget_bytes
    predicted = {
        "total_bytes": b.total_bytes, "weights_bytes": b.weights_bytes, "activation_bytes": b.activation_bytes,
        "non_torch_bytes": b.non_torch_bytes, "cuda_graph_bytes": b.cuda_graph_bytes, "kv_budget_bytes": budget,
        "max_tokens": e.max_tokens, "max_concurrency_ratio": round(e.max_concurrency_ratio, 2),
        "free_at_start_bytes": b.total_bytes - b.non_torch_bytes,
        # SGLang's own recurrent-state pool: its slots and the running requests they cap
        "state_slots": e.state_pool.slots if e.state_pool else None,
        "state_capped_requests": e.state_pool.max_requests if e.state_pool else None,
    }
    rows = tuple((k, v, run.figures.get(k)) for k, v in predicted.items()
                 if (k in run.figures and v is not None) or k == "kv_budget_bytes")
    return LogComparison(run, e.engine.label, rows)

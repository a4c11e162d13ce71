"""vLLM's own settings, under vLLM's names: a `vllm serve` command line, `LLM(...)` keyword arguments,
or the "non-default args: {...}" dict a startup log prints, read into the scenario fields they move.

Every EngineArgs field that moves memory is read here, once, and checked where it is read (the field
named, what was found, what is allowed); fields that move no memory are kept as "ignored"; fields
that move memory in ways kvsize does not model are kept as "not modelled", so the front ends can say
so instead of guessing.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field, replace

from ..errors import KvsizeError, shown
from .cudagraphs import uncompiled_cudagraph_mode
from .vllm_flags import flag_effect

# Fields that move memory in ways kvsize does not model; their presence is reported, never guessed.
NOT_MODELLED = frozenset({
    "cpu_offload_gb", "speculative_config", "lora_modules", "enable_lora", "max_lora_rank", "max_loras",
    "kv_transfer_config", "kv_offloading_size", "num_gpu_blocks_override", "enable_dbo",
    "mm_processor_cache_gb", "decode_context_parallel_size", "prefill_context_parallel_size",
})
# Methods that name the checkpoint's own quantization_config, which the config already gives kvsize.
CHECKPOINT_QUANTIZATION = ("awq", "gptq", "mxfp4", "gpt_oss_mxfp4", "compressed-tensors", "modelopt", "awq_marlin",
                           "gptq_marlin", "fp8")
# the SSM state dtypes vLLM (--mamba-ssm-cache-dtype, besides auto) and SGLang (--mamba-ssm-dtype) take, as kvsize
# names them
STATE_DTYPES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
CUDAGRAPH_MODES = ("NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE")
BOOLEAN_FLAGS = frozenset({"enforce_eager", "enable_prefix_caching", "no_enable_prefix_caching",
                           "trust_remote_code", "disable_log_stats", "enable_chunked_prefill",
                           "calculate_kv_scales", "enable_expert_parallel", "disable_custom_all_reduce",
                           "async_scheduling", "no_async_scheduling", "enable_auto_tool_choice",
                           "disable_log_requests", "enable_log_requests", "skip_tokenizer_init", "enable_lora",
                           "enable_sleep_mode", "disable_frontend_multiprocessing", "enable_dbo",
                           "language_model_only"})
# the flags read above, each into the scenario field it moves (the rest: profiles/engines/vllm-flags/0.33.0.json)
READ_FLAGS = frozenset({
    "model", "model_tag", "max_model_len", "gpu_memory_utilization", "kv_cache_dtype", "block_size", "max_num_seqs",
    "max_num_batched_tokens", "tensor_parallel_size", "pipeline_parallel_size", "kv_cache_memory_bytes",
    "enforce_eager", "language_model_only", "limit_mm_per_prompt", "compilation_config", "dtype", "quantization",
    "mamba_ssm_cache_dtype", "mamba_cache_dtype", "enable_prefix_caching", "max_cudagraph_capture_size",
    "cudagraph_capture_sizes", "load_format"})
# load formats that load the checkpoint's own tensors (or random ones of the same shapes: dummy)
PLAIN_LOAD_FORMATS = frozenset({"auto", "dummy", "safetensors", "pt", "npcache", "fastsafetensors", "runai_streamer"})
LIST_FLAGS = frozenset({"cudagraph_capture_sizes"})  # flags vLLM's parser takes several words for
SHORT_FLAGS = {"-tp": "tensor_parallel_size", "-pp": "pipeline_parallel_size", "-dp": "data_parallel_size",
               "-q": "quantization", "-cc": "compilation_config"}
_ENUM_REPR = re.compile(r"<(\w{1,64})\.(\w{1,64}): [^<>]{0,200}>")
_HUMAN_INT = re.compile(r"(\d+(?:\.\d+)?)([kKmMgGtT])")


@dataclass(frozen=True)
class VllmSettings:
    """What a vLLM launch sets, read into kvsize's scenario fields."""

    model: str | None
    usage_context: str  # "serve" (vllm serve) or "llm" (the LLM() class): their batch defaults differ
    fields: dict = field(default_factory=dict)  # Scenario field -> value
    used: tuple[str, ...] = ()  # vLLM names read into fields
    ignored: tuple[str, ...] = ()  # vLLM names that move no memory
    not_modelled: tuple[str, ...] = ()  # vLLM names that move memory kvsize does not model
    unknown: tuple[str, ...] = ()  # names kvsize has no classification of (profiles/engines/vllm-flags/0.33.0.json)


# settings whose memory effect kvsize leaves out only for a model with recurrent (Mamba) layers: prefix caching off
# changes a hybrid model's state pages (vLLM's mamba_cache_mode) and nothing of an attention-only model's pool
HYBRID_ONLY = frozenset({"enable_prefix_caching"})


def for_layers(settings: VllmSettings, layer_kinds) -> VllmSettings:
    """The settings as they bear on a model of these layer kinds: a hybrid-only setting of a model without recurrent
    layers moves no memory."""
    if "recurrent" in layer_kinds:
        return settings
    moved = tuple(k for k in settings.not_modelled if k in HYBRID_ONLY)
    return replace(settings, ignored=(*settings.ignored, *moved),
                   not_modelled=tuple(k for k in settings.not_modelled if k not in HYBRID_ONLY))


def _name(flag: str) -> str:
    return flag.lstrip("-").replace("-", "_")


MAX_INT_DIGITS = 20  # no count, length or size vLLM takes is written longer (2^64 has 20 digits)


def human_int(value, name: str) -> int:
    """An integer as vLLM's human_readable_int reads it: 32768, '32k' (10^3) or '32K' (2^10); at most 2^64."""
    n = _human_int(value, name)
    if n.bit_length() > 64:
        raise KvsizeError(f"{name} must be a whole number below 2^64, got {shown(value)}")
    return n


def _human_int(value, name: str) -> int:
    if isinstance(value, bool):
        raise KvsizeError(f"{name} must be a whole number, got {shown(value)}")
    if isinstance(value, int) and value.bit_length() <= 64:
        return value
    if isinstance(value, int):
        raise KvsizeError(f"{name} must be a whole number of at most {MAX_INT_DIGITS} digits, got one of "
                          f"{value.bit_length() * 0.30103:,.0f} digits")
    if isinstance(value, float) and value.is_integer():
        return int(value)
    text = str(value).strip()
    if sum(c.isdigit() for c in text[:10_000]) > MAX_INT_DIGITS:  # before int() or float(): no count is this long
        raise KvsizeError(f"{name} must be a whole number of at most {MAX_INT_DIGITS} digits, got {shown(value)}")
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    m = _HUMAN_INT.fullmatch(text)
    if m:
        number, suffix = m.groups()
        if suffix.islower():
            return int(float(number) * 10 ** (3 * "kmgt".index(suffix) + 3))
        if "." not in number:
            return int(number) * 2 ** (10 * "KMGT".index(suffix) + 10)
    raise KvsizeError(f"{name} must be a whole number such as 32768, 32k (x1000) or 32K (x1024), got {shown(value)}")


def _positive(value, name: str) -> int:
    n = human_int(value, name)
    if n <= 0:
        raise KvsizeError(f"{name} must be greater than zero, got {shown(value)}")
    return n


def _fraction(value, name: str) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise KvsizeError(f"{name} must be a fraction in (0, 1] such as 0.9, got {shown(value)}") from None
    if not 0 < f <= 1:
        raise KvsizeError(f"{name} must be a fraction in (0, 1] such as 0.9, got {shown(value)}")
    return f


def _flag(value, name: str) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise KvsizeError(f"{name} must be true or false, got {shown(value)}")


# vLLM skips a model's tower only when every modality it takes is at 0, and an unlisted one stays at its
# default of 999 (vllm/config/multimodal.py); kvsize does not know which a model takes, so both are needed
TOWER_MODALITIES = ("image", "video")


def _json_object(value, name: str, example: str) -> dict:
    """A dict setting as given: a dict, or its JSON text."""
    if isinstance(value, str):
        from ..inputs import NotJson, load_json

        try:
            value = load_json(value, name, f"a JSON object such as '{example}'", 1024 * 1024)
        except NotJson:
            raise KvsizeError(f"{name} must be a JSON object such as '{example}', got {shown(value)}") from None
    if not isinstance(value, dict):
        raise KvsizeError(f"{name} must be a JSON object such as '{example}', got {shown(value)}")
    return value


def _text_only(value, name: str) -> bool:
    """Whether --limit-mm-per-prompt sets image and video to 0 items (vLLM then serves the model text-only);
    a limit that leaves either out, or above 0, keeps the tower (and its encoder profiling, not modelled)."""
    value = _json_object(value, name, '{"image": 0, "video": 0}')
    if not value:
        raise KvsizeError(f"{name} must be a JSON object of modality counts such as {{\"image\": 0}}, got {shown(value)}")
    counts = []
    for modality, item in value.items():
        count = item.get("count") if isinstance(item, dict) else item
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise KvsizeError(f"{name}.{modality} must be a whole number of items (0 or more), got {shown(item)}")
        counts.append(count)
    return not any(counts) and all(m in value for m in TOWER_MODALITIES)


def _compilation(value, name: str) -> dict:
    """The CUDA-graph part of --compilation-config (a dict, JSON text, or an optimization level)."""
    if isinstance(value, (int, str)) and re.fullmatch(r"\d", str(value).strip()):
        level = int(value)
        return {"cudagraph_mode": "NONE", "torch_compile": False} if level == 0 else {}
    value = _json_object(value, name, '{"cudagraph_mode": "PIECEWISE"}')
    out: dict = {}
    compile_mode = value.get("mode", value.get("level"))
    if compile_mode is not None:
        text = str(compile_mode).upper().removeprefix("COMPILATIONMODE.")
        if text not in ("0", "1", "2", "3", "NONE", "STOCK_TORCH_COMPILE", "DYNAMO_TRACE_ONCE", "VLLM_COMPILE"):
            raise KvsizeError(f"{name}.mode must be 0-3 or NONE, STOCK_TORCH_COMPILE, DYNAMO_TRACE_ONCE, "
                              f"VLLM_COMPILE, got {shown(compile_mode)}")
        if text in ("0", "NONE"):
            out["torch_compile"] = False
    mode = value.get("cudagraph_mode")
    if mode is not None:
        mode = str(mode).upper().removeprefix("CUDAGRAPHMODE.")
        if mode not in CUDAGRAPH_MODES:
            raise KvsizeError(f"{name}.cudagraph_mode must be one of {', '.join(CUDAGRAPH_MODES)}, got {shown(mode)}")
        out["cudagraph_mode"] = mode
    if out.get("torch_compile") is False:
        out["cudagraph_mode"] = uncompiled_cudagraph_mode(out.get("cudagraph_mode", "FULL_AND_PIECEWISE"))
    sizes = value.get("cudagraph_capture_sizes")
    if sizes is not None:
        if not isinstance(sizes, (list, tuple)) or not sizes:
            raise KvsizeError(f"{name}.cudagraph_capture_sizes must be a list of batch sizes, got {shown(sizes)}")
        out["cudagraph_capture_sizes"] = tuple(sorted({_positive(s, f"{name}.cudagraph_capture_sizes") for s in sizes}))
    largest = value.get("max_cudagraph_capture_size")
    if largest is not None:
        out["max_cudagraph_capture_size"] = _positive(largest, f"{name}.max_cudagraph_capture_size")
    return out


def read_engine_args(args: dict, usage_context: str = "serve", from_log: bool = False) -> VllmSettings:
    """EngineArgs fields (vLLM's names, as `LLM(**kwargs)` or the log's non-default args hold them).
    from_log: the engine config line's resolved values (its quantization names the checkpoint's)."""
    fields: dict = {}
    used, ignored, not_modelled, unknown = [], [], [], []
    model = None
    for raw_key, value in args.items():
        key = _name(str(raw_key))
        name = f"the log's {key}" if from_log else f"--{key.replace('_', '-')}"
        if key in ("model", "model_tag"):  # model_tag: `vllm serve`'s positional model, which wins over --model
            model = str(value) if key == "model_tag" or model is None else model
        elif key == "max_model_len":
            n = human_int(value, name)
            if n != -1:  # -1 and auto: the model's own length
                fields["max_model_len"] = _positive(n, name)
        elif key == "gpu_memory_utilization":
            fields["memory_fraction"] = _fraction(value, name)
        elif key == "kv_cache_dtype":
            fields["k_cache_dtype"] = fields["v_cache_dtype"] = str(value)
        elif key in ("block_size", "max_num_seqs", "max_num_batched_tokens", "tensor_parallel_size",
                     "pipeline_parallel_size"):
            fields[key] = _positive(value, name)
        elif key == "kv_cache_memory_bytes":
            fields["kv_cache_memory_bytes"] = _positive(value, name)
        elif key == "enforce_eager":
            if _flag(value, name):  # no torch.compile and no CUDA graphs (vllm/config/vllm.py)
                fields["cudagraph_mode"] = "NONE"
                fields["torch_compile"] = False
        elif key == "language_model_only":
            if _flag(value, name):
                fields["language_model_only"] = True
        elif key == "limit_mm_per_prompt":
            if _text_only(value, name):
                fields["language_model_only"] = True  # vLLM builds no tower whose modalities are all 0
            else:
                not_modelled.append(key)  # the encoder's profiling run and cache: not modelled
                continue
        elif key == "compilation_config":
            fields.update(_compilation(value, name))
        elif key == "load_format":
            # the formats that read the checkpoint's tensors as they are (or none: dummy) load the weights kvsize
            # sizes; the others (bitsandbytes, gguf, sharded states, weights mapped from another process) do not
            text = str(value).lower()
            (ignored if text in PLAIN_LOAD_FORMATS else not_modelled).append(key)
            continue
        elif key == "enable_prefix_caching":
            # on by default; off, a hybrid model's state pages change (vLLM's mamba_cache_mode), which kvsize
            # sizes for the release's default only
            (ignored if _flag(value, name) else not_modelled).append(key)
            continue
        elif key in ("max_cudagraph_capture_size", "cudagraph_capture_sizes"):
            # the same fields as --compilation-config's, given as flags of their own
            fields.update(_compilation({key: _sizes(value, name) if key == "cudagraph_capture_sizes" else value}, name))
        elif key == "dtype":
            text = str(value).lower().removeprefix("torch.")
            allowed = ("auto", "half", "float16", "bfloat16", "float", "float32", "fp16", "bf16", "fp32")
            if text not in allowed:
                raise KvsizeError(f"{name} must be one of {', '.join(allowed)}, got {value!r}")
            fields["dtype"] = {"half": "float16", "float": "float32", "fp16": "float16", "bf16": "bfloat16",
                               "fp32": "float32"}.get(text, text)
        elif key == "quantization":
            method = None if value is None else str(value).lower()
            if method == "fp8" and not from_log:
                fields["weights_dtype"] = "fp8"  # online fp8 of a 16-bit checkpoint
            elif method not in (None, *CHECKPOINT_QUANTIZATION):
                not_modelled.append(key)
                continue
        elif key in ("mamba_ssm_cache_dtype", "mamba_cache_dtype"):
            text = str(value).lower().removeprefix("torch.")
            allowed = {"auto": None, **STATE_DTYPES}
            if text not in allowed:
                raise KvsizeError(f"{name} must be one of {', '.join(allowed)}, got {shown(value)}")
            if allowed[text] is None:
                ignored.append(key)  # the default: the model's own rule (its config, else the model dtype)
                continue
            if key == "mamba_cache_dtype":  # the conv state too, which kvsize keeps in the model dtype
                not_modelled.append(key)
                continue
            fields["mamba_ssm_dtype"] = allowed[text]
        elif key in NOT_MODELLED:
            if value not in (None, False, 0, {}, []):
                not_modelled.append(key)
            continue
        else:
            # every other flag as vLLM's source has it: moving no memory, moving memory kvsize does not model, or
            # one kvsize has no classification of (named, never taken as harmless)
            {"none": ignored, "memory": not_modelled}.get(flag_effect(key), unknown).append(key)
            continue
        if key not in ("model", "model_tag"):
            used.append(key)
    return VllmSettings(model, usage_context, fields, tuple(used), tuple(ignored), tuple(not_modelled),
                        tuple(unknown))


def _sizes(value, name: str) -> list:
    """--cudagraph-capture-sizes as a list: the command line's words, a JSON list, or the list itself."""
    if isinstance(value, (list, tuple)):
        return list(value)
    text = str(value).strip()
    if not text.startswith("["):
        return text.replace(",", " ").split()
    from ..inputs import NotJson, load_json

    try:
        found = load_json(text, name, "a JSON list of batch sizes such as [1, 2, 4, 8]", 1024 * 1024)
    except NotJson:
        found = None
    if not isinstance(found, list):
        raise KvsizeError(f"{name} must be a list of batch sizes like [1, 2, 4, 8], got {shown(text)}")
    return found


def read_command(argv: list[str]) -> VllmSettings:
    """`vllm serve MODEL --flag value ...` (also `python -m vllm.entrypoints.openai.api_server --model M`),
    or one `LLM(model=..., ...)` call, as its settings."""
    if len(argv) == 1 and argv[0].strip().startswith("LLM("):
        return read_llm_call(argv[0])
    words = list(argv)
    if words[:2] == ["vllm", "serve"]:
        words = words[2:]
    elif words and words[0] in ("serve",):
        words = words[1:]
    args: dict = {}
    positional = []
    i = 0
    while i < len(words):
        word = words[i]
        if word.startswith("-O") and len(word) == 3 and word[2].isdigit():
            args["compilation_config"] = word[2]
            i += 1
            continue
        if word.startswith("-") and not re.fullmatch(r"-\d+(\.\d+)?", word):
            flag, _, inline = word.partition("=")
            key = SHORT_FLAGS.get(flag) or _name(flag)
            dotted = next((f for f in ("compilation_config", "cc", "limit_mm_per_prompt")
                           if key.startswith(f + ".")), None)
            if dotted:  # vLLM's dotted form of a dict setting: --limit-mm-per-prompt.image 0
                field_name = "compilation_config" if dotted == "cc" else dotted
                sub = key.split(".", 1)[1]
                value = inline if inline else (words[i + 1] if i + 1 < len(words) else None)
                args.setdefault(field_name, {})
                if isinstance(args[field_name], dict):
                    args[field_name][sub] = _literal(value)
                i += 1 if inline else 2
                continue
            if inline:
                args[key] = inline
                i += 1
            elif key in BOOLEAN_FLAGS or i + 1 == len(words) or words[i + 1].startswith("--"):
                if key.startswith("no_") and key[3:] in BOOLEAN_FLAGS:
                    args[key[3:]] = False
                else:
                    args[key] = True
                i += 1
            elif key in LIST_FLAGS:  # nargs="+": every word up to the next flag
                j = i + 1
                while j < len(words) and not words[j].startswith("-"):
                    j += 1
                args[key] = words[i + 1:j]
                i = j
            else:
                args[key] = words[i + 1]
                i += 2
        else:
            positional.append(word)
            i += 1
    if positional:
        if len(positional) > 1 or "model" in args:
            raise KvsizeError(f"the vllm command names more than one model: {' '.join(positional)}")
        args["model"] = positional[0]
    return read_engine_args(args, "serve")


def _literal(value):
    try:
        return ast.literal_eval(value) if isinstance(value, str) else value
    except (ValueError, SyntaxError):
        return value


def read_llm_call(text: str) -> VllmSettings:
    """`LLM(model="...", max_model_len=32768, ...)`: literal keyword arguments only (nothing runs)."""
    try:
        call = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        raise KvsizeError(f"the LLM(...) call does not parse as Python: {text[:80]!r}") from None
    if not isinstance(call, ast.Call) or getattr(call.func, "id", None) != "LLM":
        raise KvsizeError("expected one call such as LLM(model=\"org/name\", max_model_len=32768)")
    args = {}
    for position, node in enumerate(call.args):
        if position == 0:
            args["model"] = _literal_node(node, "model")
        else:
            raise KvsizeError("LLM(...) takes the model as its only positional argument; give the rest by name")
    for kw in call.keywords:
        if kw.arg is None:
            raise KvsizeError("LLM(**kwargs) cannot be read; write each argument out by name")
        args[kw.arg] = _literal_node(kw.value, kw.arg)
    return read_engine_args(args, "llm")


def _literal_node(node, name: str):
    try:
        return ast.literal_eval(node)
    except ValueError:
        raise KvsizeError(f"LLM({name}=...) must be a literal value (a number, string, bool, list or dict)") from None


def read_logged_args(text: str) -> dict:
    """The dict a log's "non-default args: {...}" line prints (a Python literal), refused in one line
    when it is not one: settings read wrong would give a confident answer for another run."""
    if not text:
        return {}
    # enum members print as <CompilationMode.NONE: 0> inside a config dict; read each as its name
    text = _ENUM_REPR.sub(lambda m: repr(f"{m.group(1)}.{m.group(2)}"), text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError) as e:
        raise KvsizeError(f"the log's 'non-default args' line is not a readable dict ({type(e).__name__}: "
                          f"{str(e)[:80]}); fix the line or remove it and give the settings as options") from None
    if not isinstance(value, dict):
        raise KvsizeError(f"the log's 'non-default args' line holds a {type(value).__name__}, not a dict")
    return value

"""Option types and the helpers several commands use to read their options."""

from __future__ import annotations

import argparse
import math
from fractions import Fraction

from sizing.errors import KvsizeError
from sizing.units import parse_size
from sizing.engines.vllm_args import CUDAGRAPH_MODES

FRACTION_OPTIONS = {
    "gpu_memory_utilization": ("vllm", "--gpu-memory-utilization"),
    "mem_fraction_static": ("sglang", "--mem-fraction-static"),
    "free_gpu_memory_fraction": ("trtllm", "--free-gpu-memory-fraction"),
    "cache_max_entry_count": ("lmdeploy", "--cache-max-entry-count"),
}


def _positive_int(text: str, unit: str = "", scale: int = 1) -> int:
    try:
        value = int(text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number{unit}, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than zero, got {text!r}")
    return value


def _layer_partition(text: str) -> tuple[int, ...]:
    """Comma-separated layer counts, one a pipeline stage (vLLM's VLLM_PP_LAYER_PARTITION)."""
    parts = text.split(",")
    if len(text) > 400 or len(parts) > 64:
        raise argparse.ArgumentTypeError(f"expected at most 64 comma-separated layer counts, got {text[:40]!r}...")
    return tuple(_positive_int(part.strip(), " of layers per stage, comma-separated (17,15)") for part in parts)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


# token counts' suffixes, either case, in 1024s as engines size contexts: 32k = 32,768 and 1M = 1,048,576 tokens
TOKEN_SUFFIXES = {"k": 1024, "m": 1024 * 1024}
TOKENS_HELP = "k or K = 1,024 tokens, m or M = 1,048,576 (32k = 32,768; 1M = 1,048,576)"


def _tokens(text: str) -> int:
    """'32768', '32k', '128K' or '1M' (k = 1024 tokens, M = 1024 × 1024)."""
    t = str(text).strip().lower()
    if t[-1:] in TOKEN_SUFFIXES:
        return _positive_int(t[:-1], " of tokens such as 32768, 32k or 1M", TOKEN_SUFFIXES[t[-1]])
    return _positive_int(t, " of tokens such as 32768, 32k or 1M")


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a fraction such as 0.9, got {text!r}")
    if not 0 <= value <= 1:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text!r}")
    return value


def _positive_fraction(text: str) -> float:
    value = _fraction(text)
    # a share below 0.1% (an MFU of 1e-320) is no hardware's and only overflows what it divides
    if value < 1e-3:
        raise argparse.ArgumentTypeError(f"must be from 0.001 to 1, got {text!r}")
    return value


def _size(text: str, allow_zero: bool = False) -> int:
    try:
        value, note = parse_size(text, "size", allow_zero)
    except KvsizeError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("size "))
    if note:
        from app.provenance import say

        say("note", note.removeprefix("size "))
    return value


def _size_or_zero(text: str) -> int:
    return _size(text, allow_zero=True)


def _list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _tokens_or_error(text: str) -> int:
    try:
        return _tokens(text)
    except argparse.ArgumentTypeError as e:
        raise KvsizeError(f"--contexts: {e}") from None


def _int_or_error(text: str, option: str) -> int:
    try:
        return _positive_int(text)
    except argparse.ArgumentTypeError as e:
        raise KvsizeError(f"{option}: {e}") from None


def _add_scenario_options(p: argparse.ArgumentParser, single: bool = True, model_required: bool = True) -> None:
    if single:
        p.add_argument("--model", required=model_required, default=None,
                       help="bundled profile id, a config.json, or a folder holding one")
        p.add_argument("--gpu", default="h100-sxm", help="bundled GPU id (kvsize gpus)")
        p.add_argument("--engine", default="vllm", help="vllm, sglang, trtllm, lmdeploy, llamacpp or ideal; "
                       "NAME@VERSION (vllm@0.19) follows that release's rules, NAME alone the newest release "
                       "a real start confirmed (vLLM and SGLang) or the engine's one release file")
        # --tp as plan and sweep spell it
        p.add_argument("--tensor-parallel-size", "-tp", "--tp", type=_positive_int, default=1,
                       help="GPUs each replica's layers are split over (default 1)")
        p.add_argument("--max-model-len", type=_tokens, default=None,
                       help=f"tokens per request (default: the model's); {TOKENS_HELP}")
    p.add_argument("--gpu-memory", type=_size, default=None, help="override the GPU's memory, e.g. 80GiB")
    p.add_argument("--pipeline-parallel-size", "-pp", type=_positive_int, default=1,
                   help="pipeline stages (default 1)")
    p.add_argument("--pp-layer-partition", type=_layer_partition, default=None,
                   help="layers per pipeline stage, first to last, as vLLM's VLLM_PP_LAYER_PARTITION gives them "
                        "(e.g. 17,15; default: vLLM's even split)")
    p.add_argument("--concurrency", type=_positive_int, default=1, help="concurrent requests to plan for")
    p.add_argument("--block-size", type=_positive_int, default=None,
                   help="tokens per KV block (vLLM --block-size, SGLang --page-size, TRT-LLM tokens_per_block)")
    for dest, (_, flag) in FRACTION_OPTIONS.items():
        p.add_argument(flag, dest=dest, type=_fraction, default=None,
                       help=f"{FRACTION_OPTIONS[dest][0]}'s memory fraction (default: the release's rule)")
    p.add_argument("--kv-cache-memory", type=_size, default=None, help="fix the KV budget, e.g. 10GiB")
    p.add_argument("--weights-dtype", default="auto",
                   help="auto (the config's quantization_config), bf16, fp16, fp32, fp8, fp8_channel, fp8_tensor, "
                        "nvfp4, mxfp4, int8, int4, bnb4, bnb8, or intB_gN[_sym] (B bits in groups of N or "
                        "'channel', e.g. int4_g128_sym); with --engine llamacpp a GGUF type as llama-quantize names it "
                        "(f16, bf16, q8_0, q4_0, q4_K_M, q5_K_M, q6_K, ...)")
    p.add_argument("--headroom", type=_fraction, default=0.10,
                   help="share of GPU memory left unused by engines without their own fraction (default 0.10)")
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=None,
                   help="default: the engine release's default for the GPU (vLLM 0.19 on >= 70 GiB: 8192)")
    p.add_argument("--max-num-seqs", type=_positive_int, default=None,
                   help="default: the engine release's default for the GPU (vLLM 0.19 on >= 70 GiB: 1024)")
    p.add_argument("--non-torch-memory", type=_size_or_zero, default=None,
                   help="override memory outside torch per GPU, e.g. 2GiB (default: the release's measured figure)")
    p.add_argument("--cuda-graph-memory", type=_size_or_zero, default=None,
                   help="override CUDA graph memory per GPU, 0 for none (default: vLLM's estimate from its capture "
                        "sizes, or the release's measured figure)")
    p.add_argument("--enforce-eager", action="store_true",
                   help="vLLM --enforce-eager: no torch.compile and no CUDA graphs, so no graph memory is profiled "
                        "or captured")
    p.add_argument("--compile-cache", choices=["cold", "warm"], default="cold",
                   help="vLLM's torch.compile cache for this model and settings: cold (the first start, default) "
                        "compiles and autotunes during profiling, holding a copy of the embedding; warm (a "
                        "restart) loads the compiled graph and gets that memory as KV")
    p.add_argument("--language-model-only", action="store_true",
                   help="vLLM --language-model-only (or every --limit-mm-per-prompt 0): a multimodal model "
                        "served text-only builds no vision tower")
    p.add_argument("--cudagraph-mode", default=None, type=str.upper,
                   choices=CUDAGRAPH_MODES,
                   help="vLLM compilation_config cudagraph_mode (default: the release's, FULL_AND_PIECEWISE)")
    p.add_argument("--usage-context", choices=["serve", "llm"], default="serve",
                   help="how vLLM is started, which sets its batch defaults: serve (vllm serve, default) or llm "
                        "(the offline LLM() class: 16,384 batched tokens on GPUs of 70 GiB and more)")
    p.add_argument("--layer-kv-dtype", default=None, help="per-layer formats, e.g. 'first:2,last:2=bf16'")
    p.add_argument("--mtp-layers", type=int, default=0,
                   help="speculative decoding with N of the model's MTP layers (num_nextn_predict_layers): "
                        "their KV and weights are added (vLLM --speculative-config method mtp; default 0)")
    p.add_argument("--kivi-group", type=_positive_int, default=32, help="KIVI group size (default 32)")
    p.add_argument("--kivi-residual", type=int, default=128, help="KIVI fp16 recent tokens (default 128)")
    p.add_argument("--kvquant-outliers", type=_fraction, default=0.01,
                   help="KVQuant outlier share (default 0.01)")


def _memory_fraction(args: argparse.Namespace, engine: str) -> float | None:
    given = {dest: getattr(args, dest) for dest in FRACTION_OPTIONS if getattr(args, dest) is not None}
    for dest, value in given.items():
        owner, flag = FRACTION_OPTIONS[dest]
        if owner != engine:
            raise KvsizeError(f"{flag} belongs to --engine {owner}, not {engine}")
    return next(iter(given.values()), None)


def scenario_from_args(args: argparse.Namespace, model: str, gpu: str, engine: str, tp: int,
                       max_model_len: int | None, k: str, v: str):
    from sizing.engines import get_engine
    from sizing.cache.formats import FormatOptions
    from sizing.capacity.scenario import Scenario
    from sizing.profiles import gpu_profile, load_model

    name, shape = load_model(model)
    gpu_row = gpu_profile(gpu)
    engine_row = get_engine(engine)
    if engine_row.block_option is None and args.block_size is not None:
        raise KvsizeError(f"--block-size does not apply to --engine {engine_row.name} (it does not page its cache)")
    return Scenario(
        model_name=name, shape=shape, gpu_name=gpu_row.name,
        gpu_memory_bytes=args.gpu_memory or gpu_row.memory_bytes,
        engine=engine.strip(), k_cache_dtype=k, v_cache_dtype=v,
        tensor_parallel_size=tp, pipeline_parallel_size=args.pipeline_parallel_size,
        pp_layer_partition=args.pp_layer_partition,
        max_model_len=max_model_len, concurrency=args.concurrency, block_size=args.block_size,
        memory_fraction=_memory_fraction(args, engine_row.name), kv_cache_memory_bytes=args.kv_cache_memory,
        weights_dtype=args.weights_dtype, headroom=args.headroom,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        non_torch_bytes=args.non_torch_memory, cuda_graph_bytes=args.cuda_graph_memory,
        layer_kv_dtype=args.layer_kv_dtype, gpu_multiprocessors=gpu_row.multiprocessors, mtp_layers=args.mtp_layers,
        usage_context=args.usage_context, cudagraph_mode="NONE" if args.enforce_eager else args.cudagraph_mode,
        torch_compile=not args.enforce_eager, compile_cache_hit=args.compile_cache == "warm",
        language_model_only=args.language_model_only,
        gpu_nvml_mib=gpu_row.nvml_memory_mib if args.gpu_memory is None else None, gpu_architecture=gpu_row.architecture,
        format_options=FormatOptions(args.kivi_group, args.kivi_residual,
                                     Fraction(args.kvquant_outliers).limit_denominator(10**6)),
    )


def launch_scenario(args: argparse.Namespace, k_cache_dtype: str, v_cache_dtype: str):
    """The options' scenario, with a vLLM launch command after '--' read under vLLM's names (which may name
    the model)."""
    launch = _read_launch(args) if args.launch else None
    if args.model is None:
        raise KvsizeError("--model is required (or a vllm launch command after '--' that names the model)")
    scenario = scenario_from_args(args, args.model, args.gpu, args.engine, args.tensor_parallel_size,
                                  args.max_model_len, k_cache_dtype, v_cache_dtype)
    if launch is not None:
        scenario = scenario.evolve(usage_context=launch.usage_context, **launch.fields)
    return scenario


def _read_launch(args: argparse.Namespace):
    """The vLLM launch after '--': its model (where --model is not given) and the settings it moves,
    refused where they contradict a kvsize option given beside it."""
    from sizing.profiles import model_ids, model_profile
    from sizing.engines.vllm_args import read_command

    launch = read_command(args.launch)
    if not args.engine.strip().lower().startswith("vllm"):
        raise KvsizeError(f"a vllm launch command was given with --engine {args.engine}; use --engine vllm or vllm@VERSION")
    if args.model is None:
        if launch.model is None:
            raise KvsizeError("the vllm command names no model; give it, or --model")
        by_hf = {model_profile(k).hf_id.lower(): k for k in model_ids()}
        args.model = by_hf.get(launch.model.lower(), launch.model)
    given = {"max_model_len": args.max_model_len, "tensor_parallel_size": args.tensor_parallel_size
             if args.tensor_parallel_size != 1 else None, "block_size": args.block_size,
             "memory_fraction": args.gpu_memory_utilization, "kv_cache_memory_bytes": args.kv_cache_memory,
             "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens}
    for field, value in launch.fields.items():
        if given.get(field) is not None and given[field] != value:
            raise KvsizeError(f"{field} is {given[field]} in kvsize's options but {value} in the vllm command; "
                              "give it once")
    from app.provenance import say

    if launch.used:
        say("note", "from the vllm command: " + ", ".join(f"{k}={v}" for k, v in launch.fields.items()))
    if launch.ignored:
        say("note", "no memory effect: " + ", ".join(launch.ignored))
    if launch.not_modelled:
        say("warning", "the vllm command sets " + ", ".join(launch.not_modelled)
            + ", which move memory kvsize does not model: the figures leave them out")
    if launch.unknown:
        say("warning", "the vllm command sets " + ", ".join(launch.unknown) + ", which kvsize does not know (not "
            "among vLLM 0.33's flags it has classified): whether they move memory is not known; the figures leave "
            "them out")
    return launch


def _warn_beyond_positions(model: str, shape, contexts, engine=None) -> None:
    from sizing.capacity.estimate import beyond_positions_warning

    warning = beyond_positions_warning(model, shape, contexts, engine)
    if warning:
        from app.provenance import say

        say("warning", warning)


def _check_beyond_positions(model: str, shape, contexts, engine_spec: str) -> None:
    """Refuse a context past the model's own limit that no published rope-scaling recipe serves (exit 2, naming
    max_position_embeddings); say which recipe serves one that it does."""
    from sizing.capacity.context_limit import check_context
    from sizing.engines import get_engine

    engine = get_engine(engine_spec)
    for context in sorted(set(contexts), reverse=True):
        check_context(model, shape, context, engine, option="workload context")
    _warn_beyond_positions(model, shape, contexts, engine)


def _logged_model(spec: str | None, logged: str | None) -> str:
    from sizing.profiles import resolve_model_id

    if spec:
        return spec
    # a bundled id, a Hugging Face id or its chat/instruct variant; a local folder by its last part
    found = resolve_model_id(logged) if logged else None
    if found is None and logged:
        found = resolve_model_id(logged.rstrip("/").rsplit("/", 1)[-1])
    if found is not None:
        return found
    raise KvsizeError(f"the log names model {logged!r}, which is not a bundled profile; pass --model with its "
                      "config.json")

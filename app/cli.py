"""The `kvsize` command line. Heavy imports stay inside the commands that need them."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
from fractions import Fraction
from pathlib import Path

from sizing.errors import KvsizeError
from sizing.units import GiB, parse_size

INTERNAL_ERROR = 3  # exit status of an exception kvsize did not turn into a one-line error (0 done, 1 a check
# or target not met, 2 bad input or usage)
FRACTION_OPTIONS = {
    "gpu_memory_utilization": ("vllm", "--gpu-memory-utilization"),
    "mem_fraction_static": ("sglang", "--mem-fraction-static"),
    "free_gpu_memory_fraction": ("trtllm", "--free-gpu-memory-fraction"),
    "cache_max_entry_count": ("lmdeploy", "--cache-max-entry-count"),
}


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs) -> None:
        # No abbreviations: `plan --format json` must not be read as `--formats json`.
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> None:  # one line, exit 2
        raise KvsizeError(message)


def _positive_int(text: str, unit: str = "", scale: int = 1) -> int:
    try:
        value = int(text) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number{unit}, got {text!r}")
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than zero, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def _tokens(text: str) -> int:
    """'32768', '32k' or '128K' (K = 1024 tokens)."""
    t = str(text).strip().lower()
    if t.endswith("k"):
        return _positive_int(t[:-1], " of tokens such as 32768 or 32k", 1024)
    return _positive_int(t, " of tokens such as 32768 or 32k")


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
    if value == 0:
        raise argparse.ArgumentTypeError(f"must be above 0 and at most 1, got {text!r}")
    return value


def _size(text: str, allow_zero: bool = False) -> int:
    try:
        value, note = parse_size(text, "size", allow_zero)
    except KvsizeError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("size "))
    if note:
        print(f"kvsize: note: {note.removeprefix('size ')}", file=sys.stderr)
    return value


def _size_or_zero(text: str) -> int:
    return _size(text, allow_zero=True)


def _list(text: str) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError("expected a comma-separated list")
    return items


def _add_scenario_options(p: argparse.ArgumentParser, single: bool = True, model_required: bool = True) -> None:
    if single:
        p.add_argument("--model", required=model_required, default=None,
                       help="bundled profile id, a config.json, or a folder holding one")
        p.add_argument("--gpu", default="h100-sxm", help="bundled GPU id (kvsize gpus)")
        p.add_argument("--engine", default="vllm", help="vllm, sglang, trtllm, lmdeploy, llamacpp or ideal; "
                       "NAME@VERSION (vllm@0.19) follows that release's rules, NAME alone the newest")
        p.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1,
                       help="GPUs each replica's layers are split over (default 1)")
        p.add_argument("--max-model-len", type=_tokens, default=None, help="tokens per request (default: the model's)")
    p.add_argument("--gpu-memory", type=_size, default=None, help="override the GPU's memory, e.g. 80GiB")
    p.add_argument("--pipeline-parallel-size", "-pp", type=_positive_int, default=1,
                   help="pipeline stages (default 1)")
    p.add_argument("--concurrency", type=_positive_int, default=1, help="concurrent requests to plan for")
    p.add_argument("--block-size", type=_positive_int, default=None,
                   help="tokens per KV block (vLLM --block-size, SGLang --page-size, TRT-LLM tokens_per_block)")
    for dest, (_, flag) in FRACTION_OPTIONS.items():
        p.add_argument(flag, dest=dest, type=_fraction, default=None,
                       help=f"{FRACTION_OPTIONS[dest][0]}'s memory fraction (default: the release's rule)")
    p.add_argument("--kv-cache-memory", type=_size, default=None, help="fix the KV budget, e.g. 10GiB")
    p.add_argument("--weights-dtype", default="auto", help="auto, bf16, fp16, fp8, int8, int4, mxfp4")
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
                   help="vLLM --enforce-eager: no CUDA graphs, so no graph memory is profiled or captured")
    p.add_argument("--cudagraph-mode", default=None, type=str.upper,
                   choices=["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"],
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


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("kvsize")
    except PackageNotFoundError:
        return "(not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="kvsize", description="KV cache capacity planner for LLM serving.")
    parser.add_argument("--traceback", action="store_true", help="show the full error on failure")
    parser.add_argument("--version", action="version", version=f"kvsize {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("estimate", help="one scenario",
                       epilog="A vLLM launch may follow '--' as it is: kvsize estimate --gpu h100-sxm -- vllm serve "
                              "MODEL --max-model-len 32768 --enforce-eager, or -- 'LLM(model=\"MODEL\", "
                              "max_model_len=32768)'; its settings are read under vLLM's names.")
    _add_scenario_options(p, model_required=False)
    p.add_argument("--vs", action="append", default=[], metavar="ENGINE",
                   help="the same scenario under another release, side by side (repeatable): --engine vllm@0.25.1 "
                        "--vs vllm@0.26.0 shows each term's change and the mechanism behind it")
    p.add_argument("launch", nargs="*", help=argparse.SUPPRESS)
    p.add_argument("--kv-cache-dtype", default="auto",
                   help="KV format, as the engine spells it: auto, fp8, nvfp4, q8_0, ... (kvsize formats)")
    p.add_argument("--k-cache-dtype", default=None, help="K's format where it differs from V's")
    p.add_argument("--v-cache-dtype", default=None, help="V's format where it differs from K's")
    p.add_argument("--format", choices=["table", "json", "csv"], default="table", help="output form (default table)")
    p.add_argument("--out", default=None, help="write to this file instead of standard output")
    p.set_defaults(run=cmd_estimate)

    p = sub.add_parser("compare", help="every KV format for one scenario")
    _add_scenario_options(p)
    p.add_argument("--format", choices=["table", "json", "csv"], default="table", help="output form (default table)")
    p.add_argument("--out", default=None)
    p.set_defaults(run=cmd_compare)

    p = sub.add_parser("sweep", help="a grid of scenarios to CSV, XLSX or JSON")
    p.add_argument("--models", type=_list, required=True, help="comma-separated model ids or config.json paths")
    p.add_argument("--gpus", type=_list, default=["h100-sxm"], help="comma-separated GPU ids (default h100-sxm)")
    p.add_argument("--engines", type=_list, default=["vllm"], help="comma-separated engines, NAME or NAME@VERSION (default vllm)")
    p.add_argument("--formats", type=_list, default=["auto"], help="comma-separated KV formats (default auto)")
    p.add_argument("--contexts", type=_list, default=["8k", "32k", "128k"],
                   help="comma-separated max_model_len values (default 8k,32k,128k)")
    p.add_argument("--tp", type=_list, default=["1"], help="comma-separated TP sizes (default 1)")
    _add_scenario_options(p, single=False)
    p.add_argument("--out", required=True, help="output file: .csv, .xlsx or .json")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(run=cmd_sweep)

    for name, fn, text in (("models", cmd_models, "bundled model profiles"), ("gpus", cmd_gpus, "bundled GPUs"),
                           ("formats", cmd_formats, "KV cache formats"),
                           ("links", cmd_links, "links between KV tiers (host, disk, remote, peer GPUs)"),
                           ("support", cmd_support, "which KV format each engine runs on each GPU architecture")):
        p = sub.add_parser(name, help=text)
        p.add_argument("--format", choices=["table", "json"], default="table", help="output form (default table)")
        p.set_defaults(run=fn)

    p = sub.add_parser("plan", help="a fleet for a workload: GPUs, KV format, TP, speed, cost, serve command")
    p.add_argument("--workload", required=True, help="workload file (.yaml, .yml or .json)")
    p.add_argument("--model", required=True, help="bundled profile id, a config.json, or a folder holding one")
    p.add_argument("--gpus", type=_list, default=["h100-sxm", "h200"],
                   help="comma-separated GPU ids to choose from (default h100-sxm,h200)")
    p.add_argument("--engine", default="vllm", help="vllm, sglang, trtllm, lmdeploy, llamacpp or ideal")
    p.add_argument("--formats", type=_list, default=["auto", "fp8_e4m3", "nvfp4"],
                   help="comma-separated KV formats to choose from (default auto,fp8_e4m3,nvfp4)")
    p.add_argument("--tp", type=_list, default=["1", "2", "4", "8"],
                   help="comma-separated TP sizes to choose from (default 1,2,4,8)")
    p.add_argument("--price", default=None, help="USD per GPU-hour overrides, e.g. 'h100-sxm=2.1,h200=3.2'")
    p.add_argument("--kv-efficiency", default=None,
                   help="bandwidth efficiencies, e.g. 'fp8_e4m3=0.7,default=0.75,weights=0.8,mfu=0.5'")
    p.add_argument("--efficiency-report", default=None,
                   help="measurement report whose decode_efficiency replaces the assumed efficiencies")
    p.add_argument("--quality-report", default=None, help="measurement report whose attention errors to show")
    p.add_argument("--out", action="append", default=[], help="write .csv, .xlsx or .json (repeatable)")
    p.add_argument("--top", type=_positive_int, default=12, help="candidates shown in the summary")
    p.add_argument("--itl-target-ms", "--itl-ms", dest="itl_target_ms", type=_positive_float, default=None,
                   help="inter-token latency each replica must keep at the peak (overrides the workload's)")
    p.add_argument("--ttft-ms", type=_positive_float, default=None,
                   help="mean time to first token at the peak (overrides the workload's ttft_target_ms); with a "
                        "TTFT or ITL target, plan also searches aggregated and disaggregated designs")
    p.add_argument("--host-memory", type=_size, default=None,
                   help="host DRAM for KV per replica (an offload tier; with the workload's sessions and a target, "
                        "the designs are searched with and without it)")
    p.add_argument("--disk", type=_size, default=None, help="local NVMe for KV per replica (a tier below host memory)")
    p.add_argument("--host-link", default="pcie5-x16", help="link of the host tier (kvsize links; default pcie5-x16)")
    p.add_argument("--disk-link", default="nvme-gen4", help="link of the disk tier (kvsize links; default nvme-gen4)")
    p.add_argument("--pd-link", default="nvlink4-peer",
                   help="link a disaggregated design ships KV over (kvsize links), or none (default nvlink4-peer: "
                        "prefill and decode GPUs in one host)")
    _add_scenario_options(p, single=False)
    p.set_defaults(run=cmd_plan)

    p = sub.add_parser("tiers", help="KV tiers below HBM: what each holds, reload vs recompute, prefix hit rates")
    p.add_argument("--workload", required=True, help="workload file (.yaml, .yml or .json); its sessions give the reuse")
    _add_scenario_options(p)
    p.add_argument("--kv-cache-dtype", default="auto", help="KV format, as the engine spells it (default auto)")
    p.add_argument("--host-memory", type=_size, default=None,
                   help="host DRAM for KV per replica, e.g. 256GiB (vLLM --kv-offloading-size, summed over TP ranks)")
    p.add_argument("--disk", type=_size, default=None, help="local NVMe for KV per replica, e.g. 2TB")
    p.add_argument("--remote", type=_size, default=None, help="remote/shared KV store per replica, e.g. 10TB")
    for kind, default in (("host", "pcie5-x16"), ("disk", "nvme-gen4"), ("remote", "ethernet-400g")):
        p.add_argument(f"--{kind}-link", default=default, help=f"link of the {kind} tier (kvsize links; default {default})")
    p.add_argument("--session-tokens", type=_tokens, default=32768,
                   help="tokens of one session brought back to HBM in the reload figures (default 32k)")
    p.add_argument("--mfu", type=_positive_fraction, default=None,
                   help="prefill MFU for recomputing, in (0, 1] (default 0.5)")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output form (default table)")
    p.add_argument("--out", action="append", default=[],
                   help="write .xlsx (sheets: tiers, reuse), .csv (the tiers) or .json (repeatable)")
    p.set_defaults(run=cmd_tiers)

    p = sub.add_parser("measure", help="measure on an NVIDIA GPU and write a report (needs torch)")
    p.add_argument("--model", action="append", required=True, help="bundled model id (repeatable)")
    p.add_argument("--kv-cache-dtype", type=_list, default=["bf16"])
    p.add_argument("--blocks", type=_positive_int, default=256)
    p.add_argument("--layers", type=_positive_int, default=None, help="scale the model down to N layers")
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=0.9)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=2048)
    p.add_argument("--decode-batches", type=_list, default=["1", "8", "32"])
    p.add_argument("--decode-contexts", type=_list, default=["1024", "4096", "16384"])
    p.add_argument("--skip", type=_list, default=[], help="parts to skip: allocation, capacity, decode")
    p.add_argument("--out", required=True)
    p.set_defaults(run=cmd_measure)

    p = sub.add_parser("check-log", help="predict a real engine startup log's run and compare, term by term")
    p.add_argument("log", help="a vLLM, SGLang or TensorRT-LLM startup log")
    p.add_argument("--model", default=None,
                   help="bundled profile id or config.json of the logged model (default: the bundled profile "
                        "whose Hugging Face id the log names)")
    p.add_argument("--gpu", default=None,
                   help="bundled GPU id (kvsize gpus); needed where the log does not print the GPU's total")
    p.add_argument("--weights-dtype", default="auto", help="what the checkpoint stores (auto, bf16, fp8, int8, ...)")
    p.add_argument("--engine-version", default=None,
                   help="the engine's version where the log does not print it (SGLang), e.g. 0.4.9")
    p.add_argument("--format", choices=["table", "json"], default="table", help="output form (default table)")
    p.set_defaults(run=cmd_check_log)

    p = sub.add_parser("verify", help="start the real vLLM on this GPU with dummy weights and hold the estimate "
                                      "against what it prints (needs an NVIDIA GPU and vLLM)")
    _add_scenario_options(p, model_required=False)
    p.add_argument("--kv-cache-dtype", default="auto", help="KV format, as vLLM spells it (default auto)")
    p.add_argument("--vllm-path", default=None, help="a folder holding the vllm package, where it is not installed")
    p.add_argument("--timeout", type=_positive_int, default=420, help="seconds a start may take (default 420)")
    p.add_argument("--out", required=True, help="the report (.json): the whole log, the config and the checks")
    p.add_argument("launch", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(run=cmd_verify, vs=[])

    p = sub.add_parser("validate", help="re-check a measurement report against today's predictions")
    p.add_argument("reports", nargs="+")
    p.add_argument("--tolerance", type=float, default=None, help="override every relative tolerance")
    p.set_defaults(run=cmd_validate)
    return parser


class _Terminated(BaseException):
    """SIGTERM, raised where the program is so that half-written files are removed on the way out."""


def _on_sigterm(signum, frame):
    raise _Terminated


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    show_traceback = "--traceback" in argv
    import signal
    import threading

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        args = build_parser().parse_args(argv)
        return args.run(args)
    except KeyboardInterrupt:
        print("kvsize: interrupted; nothing was written", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # the reader went away (kvsize formats | head): stop quietly, as other command-line tools do
        try:
            sys.stdout = open(os.devnull, "w")
        except OSError:
            pass
        return 0
    except _Terminated:
        print("kvsize: terminated; nothing was written", file=sys.stderr)
        return 143
    except KvsizeError as e:
        if show_traceback:
            raise
        print(f"kvsize: error: {e}", file=sys.stderr)
        return 2
    except (OSError, ImportError) as e:
        if show_traceback:
            raise
        print(f"kvsize: error: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 - an escaped exception is a kvsize bug, never a silent success
        if show_traceback:
            raise
        print(f"kvsize: internal error: {type(e).__name__}: {str(e)[:200]} (a bug in kvsize: please report it with "
              "the command line; --traceback shows where)", file=sys.stderr)
        return INTERNAL_ERROR


# -- scenario building -----------------------------------------------------------------


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
    from sizing.formats import FormatOptions
    from sizing.plan import Scenario
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
        max_model_len=max_model_len, concurrency=args.concurrency, block_size=args.block_size,
        memory_fraction=_memory_fraction(args, engine_row.name), kv_cache_memory_bytes=args.kv_cache_memory,
        weights_dtype=args.weights_dtype, headroom=args.headroom,
        max_num_batched_tokens=args.max_num_batched_tokens, max_num_seqs=args.max_num_seqs,
        non_torch_bytes=args.non_torch_memory, cuda_graph_bytes=args.cuda_graph_memory,
        layer_kv_dtype=args.layer_kv_dtype, gpu_multiprocessors=gpu_row.multiprocessors, mtp_layers=args.mtp_layers,
        usage_context=args.usage_context, cudagraph_mode="NONE" if args.enforce_eager else args.cudagraph_mode,
        gpu_nvml_mib=gpu_row.nvml_memory_mib if args.gpu_memory is None else None, gpu_architecture=gpu_row.architecture,
        format_options=FormatOptions(args.kivi_group, args.kivi_residual,
                                     Fraction(args.kvquant_outliers).limit_denominator(10**6)),
    )


# -- output ----------------------------------------------------------------------------


def _emit(text: str, out: str | None, fmt: str | None = None) -> None:
    """Standard output, or a file written whole (a temporary file renamed into place)."""
    if out is not None and fmt is not None:
        suffix = Path(out).suffix.lower()
        expected = {"json": ".json", "csv": ".csv", "table": ".txt"}[fmt]
        if suffix not in (expected, "") and not (fmt == "table" and suffix in (".txt", ".md")):
            raise KvsizeError(f"--out {Path(out).name!r} does not match --format {fmt} (it writes {expected} text); "
                              f"name the file {Path(out).stem}{expected} or choose another --format")
    if out is None:
        sys.stdout.write(text)
        return
    _atomic_write(Path(out), text.encode())


def _checked_outs(paths: list[str], inputs: list[str | None] = ()) -> list[Path]:
    """Repeatable --out files: each a .csv, .xlsx or .json that can be written and is no input of the
    run, or none is written."""
    outs = [Path(o) for o in paths]
    _not_inputs(outs, list(inputs))
    for out in outs:
        if out.suffix.lower() not in (".csv", ".xlsx", ".json"):
            raise KvsizeError(f"--out must end in .csv, .xlsx or .json, got {out.name!r}")
        _check_out(out)
    return outs


def _not_inputs(outs: list[Path], inputs: list[str | None]) -> None:
    """An output never overwrites a file the same run reads."""
    for out in outs:
        for given in filter(None, inputs):
            try:
                same = Path(given).resolve() == out.resolve()
            except OSError:
                same = False
            if same:
                raise KvsizeError(f"--out {out} is the input file {given}; write the output elsewhere")


def _check_out(path: Path) -> Path:
    """The --out path, refused before anything is computed or written when it cannot be written."""
    path = path.resolve()
    if path.is_dir():
        raise KvsizeError(f"--out: {path} is a folder; give a file name such as {path / 'out.csv'}")
    if not path.parent.is_dir():
        raise KvsizeError(f"--out: folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise KvsizeError(f"--out: folder {path.parent} is not writable")
    return path


def _atomic_write(path: Path, data: bytes) -> None:
    _write_all([(path, data)])


def _write_all(files: list[tuple[Path, bytes]]) -> None:
    """Every output written whole or none at all: each to a temporary file beside its target, and only
    when all are written are they renamed into place (a failure removes the temporary files)."""
    staged: list[tuple[str, Path, Path]] = []
    try:
        for given, data in files:
            path = _check_out(given)
            try:
                fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:100]}.", suffix=".part")
            except OSError as e:
                raise KvsizeError(f"--out {given}: cannot write there ({e.strerror or e})") from None
            staged.append((tmp, path, given))
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                umask = os.umask(0)
                os.umask(umask)
                mode = path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~umask  # a replaced file keeps its mode
                os.chmod(tmp, mode)
            except OSError as e:
                raise KvsizeError(f"--out {given}: cannot write there ({e.strerror or e})") from None
        for tmp, path, given in staged:
            try:
                os.replace(tmp, path)
            except OSError as e:
                raise KvsizeError(f"--out {given}: cannot write there ({e.strerror or e})") from None
    finally:
        for tmp, _, _ in staged:
            Path(tmp).unlink(missing_ok=True)


def _gib(n: int) -> str:
    return f"{n / GiB:,.2f} GiB"


def _csv_text(rows: list[dict]) -> str:
    import csv
    import io

    buf = io.StringIO()
    columns = list(rows[0])
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(columns)
    writer.writerows([row.get(c) for c in columns] for row in rows)
    return buf.getvalue()


def _flat(record: dict) -> dict:
    flat = {k: v for k, v in record.items() if k not in ("breakdown", "warnings")}
    flat.update({f"breakdown_{k}": v for k, v in record["breakdown"].items()})
    flat["warnings"] = " | ".join(record["warnings"])
    return flat


def render_table(record: dict) -> str:
    b = record["breakdown"]
    lines = [
        f"model {record['model']} on {record['gpu']} ({record['engine_rules']}), TP {record['tensor_parallel_size']} "
        f"PP {record['pipeline_parallel_size']}, KV {record['k_cache_dtype']}/{record['v_cache_dtype']}, "
        f"weights {record['weights_dtype']}",
        f"  KV bytes per token         {record['kv_bytes_per_token']:>16,} B  (payload "
        f"{record['kv_payload_bytes_per_token']:,} + metadata {record['kv_metadata_bytes_per_token']:,}; "
        f"{record['kv_layers']} KV layers × {record['kv_heads_per_gpu']} KV heads per GPU)",
        f"  KV bytes per sequence      {record['kv_bytes_per_sequence']:>16,} B  at {record['max_model_len']:,} tokens "
        f"({_gib(record['kv_bytes_per_sequence'])}; engine reserves {_gib(record['kv_reserved_bytes_per_sequence'])})",
        f"  KV budget                  {record['kv_budget_bytes']:>16,} B  ({_gib(record['kv_budget_bytes'])} = "
        f"{record['budget_formula']})",
        f"  blocks                     {record['num_blocks']:>16,}    of {record['block_size']} tokens, "
        f"{record['block_bytes']:,} B each",
        f"  max tokens in cache        {record['max_tokens']:>16,}",
        f"  max concurrency            {record['max_concurrency']:>16,}    at {record['max_model_len']:,} tokens "
        f"({record['max_concurrency_ratio']:.2f}x)",
        f"  max context                {record['max_context_at_concurrency']:>16,}    tokens at "
        f"{record['concurrency']} concurrent requests",
        "  memory per GPU (GiB = 2^30 bytes):",
    ]
    for key, value in b.items():
        lines.append(f"    {key.removesuffix('_bytes'):<24}{value:>18,} B  {_gib(value):>14}")
    if record["engine_log_lines"]:
        lines.append(f"  {record['engine']} will print:")
        lines.extend(f"    {line}" for line in record["engine_log_lines"])
    lines.append(f"  {record['fit_message']}")
    lines.extend(f"  warning: {w}" for w in record["warnings"])
    return "\n".join(lines) + "\n"


# -- commands --------------------------------------------------------------------------


def _logged_model(spec: str | None, logged: str | None) -> str:
    from sizing.profiles import model_ids, model_profile

    if spec:
        return spec
    for key in model_ids():
        if logged and model_profile(key).hf_id.lower() == logged.lower():
            return key
    raise KvsizeError(f"the log names model {logged!r}, which is not a bundled profile; pass --model with its "
                      "config.json")


def cmd_check_log(args: argparse.Namespace) -> int:
    import dataclasses

    from sizing.inputs import read_limited
    from sizing.logs import MAX_LOG_BYTES, compare_log, log_scenario, read_log
    from sizing.profiles import gpu_profile, load_model
    from sizing.releases import version_key

    text = read_limited(Path(args.log), MAX_LOG_BYTES, "LOG", "an engine startup log").decode("utf-8", "replace")
    run = read_log(text)
    if args.engine_version:
        version_key(args.engine_version)  # refuses a malformed version in one line
        run = dataclasses.replace(run, version=args.engine_version)
    name, shape = load_model(_logged_model(args.model, run.model))
    scenario, where = log_scenario(run, name, shape, gpu_profile(args.gpu) if args.gpu else None, args.weights_dtype)
    result = compare_log(run, scenario)
    rows = [dict(term=t, predicted=p, logged=lg, difference=None if lg is None else p - lg,
                 difference_percent=None if not lg else round(100 * (p - lg) / lg, 2)) for t, p, lg in result.rows]
    read = {k: {"value": v, "from": src} for k, (v, src) in where.read.items()}
    assumed = {k: {"value": v, "because": why} for k, (v, why) in where.assumed.items()}
    if args.format == "json":
        print(json.dumps(dict(engine=run.engine, version=run.version, model=run.model, rules=result.rules,
                              read_from_log=read, assumed=assumed, not_modelled=list(where.not_modelled), rows=rows),
                         indent=2, default=str))
        return 0
    print(f"{run.engine} {run.version or '(version not in the log)'} log of {run.model or name}; predicted with "
          f"{result.rules}")
    if read:
        print("  read from the log: " + ", ".join(f"{k}={v} ({src})" for k, (v, src) in where.read.items()))
    if assumed:
        print("  assumed: " + ", ".join(f"{k}={v} ({why})" for k, (v, why) in where.assumed.items()))
    if where.not_modelled:
        print("  warning: the log sets " + ", ".join(where.not_modelled) + ", which move memory kvsize does not model")
    print(f"  {'term':<22}{'predicted':>18}{'logged':>18}{'difference':>16}")
    for r in rows:
        if r["term"].endswith("_bytes"):
            fmt = lambda v: "-" if v is None else f"{v / GiB:,.2f} GiB"  # noqa: E731
        else:
            fmt = lambda v: "-" if v is None else f"{v:,}"  # noqa: E731
        diff = "-" if r["difference_percent"] is None else f"{r['difference_percent']:+.2f}%"
        print(f"  {r['term']:<22}{fmt(r['predicted']):>18}{fmt(r['logged']):>18}{diff:>16}")
    print("  (the engine prints GiB to two decimals: ±0.005 GiB on every logged figure)")
    return 0


def cmd_estimate(args: argparse.Namespace) -> int:
    from sizing.plan import estimate, to_record

    k = args.k_cache_dtype or args.kv_cache_dtype
    v = args.v_cache_dtype or args.kv_cache_dtype
    launch = _read_launch(args) if args.launch else None
    if args.model is None:
        raise KvsizeError("--model is required (or a vllm launch command after '--' that names the model)")
    scenario = scenario_from_args(args, args.model, args.gpu, args.engine, args.tensor_parallel_size,
                                  args.max_model_len, k, v)
    if launch is not None:
        scenario = scenario.evolve(usage_context=launch.usage_context, **launch.fields)
    if args.vs:
        return _print_release_comparison(scenario, [args.engine, *args.vs], args.format, args.out)
    result = estimate(scenario)
    record = to_record(result)
    if not result.fits:
        raise KvsizeError(result.fit_message)
    for w in result.warnings:
        print(f"kvsize: warning: {w}", file=sys.stderr)
    if args.format == "json":
        _emit(json.dumps(record, indent=2) + "\n", args.out, "json")
    elif args.format == "csv":
        _emit(_csv_text([_flat(record)]), args.out, "csv")
    else:
        _emit(render_table(record), args.out)
    return 0


def _print_release_comparison(scenario, engines: list[str], fmt: str, out: str | None) -> int:
    from sizing.upgrade import compare_releases

    result = compare_releases(scenario, engines)
    rows = []
    for label, value in (
        ("rules", lambda c: c.rules), ("model runner", lambda c: c.estimate.model_runner.upper()),
        ("weights_bytes", lambda c: c.estimate.breakdown.weights_bytes),
        ("activation_bytes", lambda c: c.estimate.breakdown.activation_bytes),
        ("non_torch_bytes", lambda c: c.estimate.breakdown.non_torch_bytes),
        ("cuda_graph_bytes", lambda c: c.estimate.breakdown.cuda_graph_bytes),
        ("kv_budget_bytes", lambda c: c.estimate.first_stage_kv_budget_bytes or c.estimate.kv_budget_bytes),
        ("block_size", lambda c: c.estimate.block_size), ("num_blocks", lambda c: c.estimate.num_blocks),
        ("gpu_kv_cache_size_tokens", lambda c: c.estimate.max_tokens),
        ("pool_tokens_per_group", lambda c: c.pool_tokens),
        ("max_concurrency_ratio", lambda c: round(c.estimate.max_concurrency_ratio, 2)),
    ):
        rows.append({"term": label, **{c.engine: value(c) for c in result.columns}})
    if fmt == "json":
        _emit(json.dumps({"releases": [c.engine for c in result.columns], "rows": rows,
                          "changes": list(result.changes)}, indent=2) + "\n", out, "json")
        return 0
    if fmt == "csv":
        _emit(_csv_text(rows), out, "csv")
        return 0
    width = max(22, *(len(c.engine) + 2 for c in result.columns))
    lines = [f"{scenario.model_name} on {scenario.gpu_name}, release by release", ""]
    lines.append(f"  {'':<26}" + "".join(f"{c.engine:>{width}}" for c in result.columns))
    for row in rows[1:]:
        cells = []
        for c in result.columns:
            v = row[c.engine]
            cells.append(f"{v / GiB:,.2f} GiB" if row["term"].endswith("_bytes") else
                         (f"{v:,}" if isinstance(v, int) else str(v)))
        lines.append(f"  {row['term']:<26}" + "".join(f"{cell:>{width}}" for cell in cells))
    lines += ["", "  gpu_kv_cache_size_tokens is vLLM's \"GPU KV cache size\" line (0.21+: max concurrency x max_model_len);",
              "  pool_tokens_per_group is what the pool holds (blocks x block size per layer group).", ""]
    lines += [f"  rules: {c.engine} follows {c.rules}" for c in result.columns]
    lines += ["", "What changes:"] + [f"  - {change}" for change in result.changes or ("nothing in the rules kvsize "
                                                                                     "models for this scenario",)]
    _emit("\n".join(lines) + "\n", out)
    return 0


def _read_launch(args: argparse.Namespace):
    """The vLLM launch after '--': its model (where --model is not given) and the settings it moves,
    refused where they contradict a kvsize option given beside it."""
    from sizing.profiles import model_ids, model_profile
    from sizing.vllm_args import read_command

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
    if launch.used:
        print("kvsize: note: from the vllm command: " + ", ".join(
            f"{k}={v}" for k, v in launch.fields.items()), file=sys.stderr)
    if launch.ignored:
        print("kvsize: note: no memory effect: " + ", ".join(launch.ignored), file=sys.stderr)
    if launch.not_modelled:
        print("kvsize: warning: the vllm command sets " + ", ".join(launch.not_modelled)
              + ", which move memory kvsize does not model: the figures leave them out", file=sys.stderr)
    return launch


def compare_rows(args: argparse.Namespace) -> list[dict]:
    from sizing.formats import FORMAT_NAMES
    from sizing.plan import compare

    base = scenario_from_args(args, args.model, args.gpu, "ideal", args.tensor_parallel_size,
                              args.max_model_len, "auto", "auto")
    from sizing.engines import get_engine
    from sizing.plan import check_tensor_parallel

    check_tensor_parallel(base.shape, base.tensor_parallel_size, get_engine(args.engine))
    rows = compare(base, args.engine, FORMAT_NAMES)
    if args.max_model_len:
        _warn_beyond_positions(args.model, base.shape, [args.max_model_len])
    if rows and all(r["status"].startswith("n/a: ") for r in rows):
        from collections import Counter

        # nothing to compare: say once why most rows could not be sized
        raise KvsizeError(Counter(r["status"] for r in rows).most_common(1)[0][0].removeprefix("n/a: "))
    return rows


def _warn_beyond_positions(model: str, shape, contexts) -> None:
    from sizing.plan import beyond_positions_warning

    warning = beyond_positions_warning(model, shape, contexts)
    if warning:
        print(f"kvsize: warning: {warning}", file=sys.stderr)


def cmd_compare(args: argparse.Namespace) -> int:
    rows = compare_rows(args)
    if args.format == "json":
        _emit(json.dumps(rows, indent=2) + "\n", args.out, "json")
    elif args.format == "csv":
        _emit(_csv_text(rows), args.out, "csv")
    else:
        head = f"{'format':<22}{'engine':<10}{'bytes/token':>13}{'metadata':>10}{'vs bf16':>9}" \
               f"{'max tokens':>14}{'max conc.':>11}  status"
        lines = [head]
        for r in rows:
            lines.append(
                f"{r['format']:<22}{r['engine']:<10}{r['kv_bytes_per_token']:>13,}{r['kv_metadata_bytes_per_token']:>10,}"
                f"{r['ratio_to_bf16']:>9.3f}{r['max_tokens']:>14,}{r['max_concurrency']:>11,}  {r['status']}"
            )
        _emit("\n".join(lines) + "\n", args.out)
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from sizing.sweep import SweepGrid, run_sweep

    out = Path(args.out)
    kind = out.suffix.lower()
    if kind not in (".csv", ".xlsx", ".json"):
        raise KvsizeError(f"--out must end in .csv, .xlsx or .json, got {out.name!r}")
    from sizing.formats import get_format

    for name in args.formats:
        get_format(name, option="--formats")  # refuse an unknown format before writing anything
    grid = SweepGrid(
        models=args.models, gpus=args.gpus, engines=args.engines, formats=args.formats,
        contexts=[_tokens_or_error(c) for c in args.contexts],
        tensor_parallel_sizes=[_int_or_error(t, "--tp") for t in args.tp],
    )
    from sizing.sweep import MAX_SWEEP_ROWS, XLSX_MAX_ROWS

    size = grid.size
    limit = XLSX_MAX_ROWS if kind == ".xlsx" else MAX_SWEEP_ROWS
    if size > limit:
        raise KvsizeError(f"the grid has {size:,} scenarios; a sweep writes at most {limit:,} rows"
                          + (" to an .xlsx sheet (use .csv)" if kind == ".xlsx" else "") + "; sweep fewer values")
    base = scenario_from_args(args, args.models[0], args.gpus[0], "ideal", 1, None, "auto", "auto")
    from sizing.profiles import load_model

    for model in args.models:
        _warn_beyond_positions(model, load_model(model)[1], grid.contexts)
    progress = None if args.no_progress or not sys.stderr.isatty() else _Progress()
    rows = run_sweep(grid, base, progress=progress)
    if not rows:
        raise KvsizeError("the sweep produced no rows")
    if kind == ".csv":
        _atomic_write(out, _csv_text(rows).encode())
    elif kind == ".json":
        _atomic_write(out, (json.dumps(rows) + "\n").encode())
    else:
        from app.spreadsheet import xlsx_bytes

        _atomic_write(out, xlsx_bytes({"scenarios": rows}))
    print(f"kvsize: wrote {len(rows):,} rows to {out}", file=sys.stderr)
    return 0


class _Progress:
    """A bar on stderr with the time left, extrapolated from the rate so far."""

    width = 30

    def __init__(self) -> None:
        import time

        self._clock = time.monotonic
        self._start = self._clock()

    def __call__(self, done: int, total: int) -> None:
        filled = self.width * done // max(1, total)
        elapsed = self._clock() - self._start
        left = elapsed * (total - done) / done if done else 0.0
        end = "\n" if done == total else ""
        print(f"\r[{'#' * filled}{'.' * (self.width - filled)}] {done:,}/{total:,} scenarios, "
              f"{left:.1f} s left ", end=end, file=sys.stderr)


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


def cmd_models(args: argparse.Namespace) -> int:
    from sizing.profiles import bundled_shape, model_ids, model_profile

    rows = []
    for key in model_ids():
        shape, profile = bundled_shape(key), model_profile(key)
        kinds = {k: shape.layer_kinds.count(k) for k in dict.fromkeys(shape.layer_kinds)}
        rows.append(dict(id=key, name=profile.name, hf_id=profile.hf_id, attention=shape.attention_class,
                         layers=shape.num_layers, layer_kinds=kinds, kv_heads=shape.num_kv_heads,
                         head_dim=shape.head_dim, params=shape.total_params, source=profile.source))
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        kinds = " ".join(f"{k}:{n}" for k, n in r["layer_kinds"].items())
        print(f"{r['id']:<32}{r['attention']:<5}{r['layers']:>4} layers  kv_heads {r['kv_heads']:<4}"
              f"head_dim {r['head_dim']:<5}{r['params'] / 1e9:>8.2f}B params  {kinds}\n"
              f"{'':<32}source: {r['source']}")
    return 0


def cmd_gpus(args: argparse.Namespace) -> int:
    from sizing.profiles import gpu_ids, gpu_profile

    rows = [dict(id=k, **gpu_profile(k).model_dump()) for k in gpu_ids()]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        fp8 = f"{r['fp8_dense_tflops']:.0f}" if r["fp8_dense_tflops"] else "-"
        print(f"{r['id']:<13}{r['name']:<38}{r['memory_bytes'] / GiB:>7.2f} GiB CUDA total "
              f"(nvidia-smi {r['nvml_memory_mib']} MiB){r['hbm_bandwidth_gb_s']:>7.0f} GB/s  "
              f"bf16 {r['bf16_dense_tflops']:>5.0f}  fp8 {fp8:>5} TFLOP/s  "
              f"${r['price_usd_per_hour']:.2f}/h ({r['price_date']})\n{'':<13}memory: {r['memory_source']}; "
              f"specs: {r['spec_source']}")
    return 0


def cmd_formats(args: argparse.Namespace) -> int:
    from sizing.formats import all_formats

    rows = []
    for f in all_formats():
        p, m = f.k.token_bytes(128)
        rows.append(dict(name=f.name, family=f.family, summary=f.summary, engines=list(f.engines),
                         k_bytes_per_token_per_head_at_128=float(p + m), source=f.source,
                         quality=f.quality, quality_source=f.quality_source,
                         layout_confirmed=not f.unconfirmed, unconfirmed=f.unconfirmed))
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    for r in rows:
        print(f"{r['name']:<21}{r['k_bytes_per_token_per_head_at_128']:>7.1f} B/token/head (head_dim 128)  "
              f"{r['summary']}\n{'':<21}engines: {', '.join(r['engines'])}; layout: {r['source']}"
              + (f"\n{'':<21}layout unconfirmed: {r['unconfirmed']}" if r["unconfirmed"] else ""))
    return 0


def cmd_links(args: argparse.Namespace) -> int:
    from sizing.profiles import link_ids, link_profile

    rows = [dict(id=k, **link_profile(k).model_dump()) for k in link_ids()]
    if args.format == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return 0
    for r in rows:
        shared = "shared by the node's GPUs" if r["shared_by_gpus"] else "one per GPU"
        print(f"{r['id']:<15}{r['bandwidth_gb_s']:>8g} GB/s {r['latency_us']:>6g} us  {r['kind']:<7}{shared}\n"
              f"{'':<15}{r['name']}; {r['source']}")
    return 0


def cmd_tiers(args: argparse.Namespace) -> int:
    from sizing.speed import DEFAULT_MFU
    from sizing.tiers import engine_offload_options, tiers_for
    from sizing.workload import read_workload

    outs = _checked_outs(args.out, [getattr(args, "workload", None), getattr(args, "model", None)])
    workload = read_workload(args.workload)
    scenario = scenario_from_args(args, args.model, args.gpu, args.engine, args.tensor_parallel_size,
                                  args.max_model_len, args.kv_cache_dtype, args.kv_cache_dtype)
    sizes = {k: v for k, v in (("host", args.host_memory), ("disk", args.disk), ("remote", args.remote)) if v}
    links = {"host": args.host_link, "disk": args.disk_link, "remote": args.remote_link}
    e, plan = tiers_for(scenario, workload, sizes, links, args.session_tokens,
                        DEFAULT_MFU if args.mfu is None else args.mfu)
    for w in e.warnings:  # the same warnings estimate gives (a format the GPU cannot run, ...)
        print(f"kvsize: warning: {w}", file=sys.stderr)
    record = tiers_record(e, plan, workload, engine_offload_options(e.engine.name, sizes.get("host", 0),
                                                                    scenario.tensor_parallel_size))
    tier_rows = record["tiers"]
    reuse_rows = [dict({k: v for k, v in r.items() if k != "hit_by_tier"},
                       **{f"hit_{k}": v for k, v in r["hit_by_tier"].items()}) for r in record["reuse"]]
    pending = []
    for out in outs:
        kind = out.suffix.lower()
        if kind == ".json":
            pending.append((out, (json.dumps(record, indent=2) + "\n").encode()))
        elif kind == ".csv":
            if not tier_rows:
                raise KvsizeError("--out .csv holds the tiers, and none was given (--host-memory, --disk, --remote)")
            pending.append((out, _csv_text(tier_rows).encode()))
        else:
            from app.spreadsheet import xlsx_bytes

            summary = [dict(item=k, value=v, note="") for k, v in record.items() if not isinstance(v, (list, dict))]
            pending.append((out, xlsx_bytes({"summary": summary, "tiers": tier_rows, "reuse": reuse_rows})))
    _write_all(pending)
    if args.format == "json":
        sys.stdout.write(json.dumps(record, indent=2) + "\n")
    else:
        sys.stdout.write(render_tiers(record))
    for out in outs:
        print(f"kvsize: wrote {out}", file=sys.stderr)
    return 0


def tiers_record(e, plan, workload, offload_options: str) -> dict:
    return {
        "schema": "kvsize.tiers/1", "model": e.scenario.model_name, "gpu": e.scenario.gpu_name,
        "engine": e.engine.name, "kv_cache_dtype": e.k_format, "tensor_parallel_size": e.scenario.tensor_parallel_size,
        "kv_bytes_per_token_per_gpu": plan.kv_bytes_per_token_per_gpu, "gpus_per_replica": plan.gpus,
        "workload": workload.name, "hbm_reuse_tokens": plan.hbm_reuse_tokens,
        "tiers": [dict(name=t.name, capacity_bytes=t.capacity_bytes, tokens=t.tokens, sessions_warm=t.sessions_warm,
                       reload_seconds=t.reload_seconds, recompute_seconds=t.recompute_seconds,
                       reload_beats_recompute=t.reload_beats_recompute, route=t.route, links=t.links)
                  for t in plan.tiers],
        "reuse": [dict(label=r.label, share_percent=r.share_percent, reused_tokens=r.reused_tokens,
                       hit_rate=r.hit_rate, hit_by_tier=dict(zip(["hbm", *(t.name for t in plan.tiers)], r.hit_by_tier)))
                  for r in plan.reuse],
        "prefill_tokens_per_request": plan.prefill_tokens_per_request,
        "prefill_tokens_saved_per_request": plan.prefill_tokens_saved_per_request,
        "prefill_work_saved": plan.prefill_work_saved,
        "ttft_seconds_no_reuse": plan.ttft_seconds_no_reuse, "ttft_seconds": plan.ttft_seconds,
        "engine_options": offload_options,
    }


def render_tiers(r: dict) -> str:
    lines = [f"KV tiers: {r['model']} on {r['gpu']} ({r['engine']}, {r['kv_cache_dtype']} KV, TP "
             f"{r['tensor_parallel_size']}): {r['kv_bytes_per_token_per_gpu']:,} B per token per GPU, "
             f"workload {r['workload']!r}",
             f"  HBM left for prefixes at the peak: {r['hbm_reuse_tokens']:,} tokens"]
    if r["tiers"]:
        lines.append(f"  {'tier':<8}{'capacity GiB':>13}{'tokens':>15}{'sessions':>10}{'reload ms':>11}"
                     f"{'recompute ms':>14}  faster")
    for t in r["tiers"]:
        lines.append(f"  {t['name']:<8}{t['capacity_bytes'] / GiB:>13,.1f}{t['tokens']:>15,}{t['sessions_warm']:>10,}"
                     f"{t['reload_seconds'] * 1e3:>11.1f}{t['recompute_seconds'] * 1e3:>14.1f}  "
                     f"{'reload' if t['reload_beats_recompute'] else 'recompute'}")
    if r["tiers"]:
        lines.append("  (times for one session of --session-tokens; routes to HBM: " +
                     "; ".join(f"{t['name']} over {t['route']}" for t in r["tiers"]) +
                     "; kvsize links gives each link's figures and source)")
    for x in r["reuse"]:
        where = ", ".join(f"{k} {v:.1%}" for k, v in x["hit_by_tier"].items())
        lines.append(f"  reuse {x['label']!r} ({x['share_percent']:g}% of requests, {x['reused_tokens']:,} tokens): "
                     f"hit {x['hit_rate']:.1%} ({where})")
    if not r["reuse"]:
        lines.append("  the workload has no sessions: give `sessions:` to see hit rates (examples/multi-turn-chat.yaml)")
    lines.append(f"  prefill work saved {r['prefill_work_saved']:.1%}; mean TTFT (prefill) "
                 f"{r['ttft_seconds_no_reuse'] * 1e3:,.1f} ms without reuse, {r['ttft_seconds'] * 1e3:,.1f} ms with it")
    if r["engine_options"]:
        lines.append(f"  engine options for the host tier: {r['engine_options']}")
    return "\n".join(lines) + "\n"


def cmd_support(args: argparse.Namespace) -> int:
    from sizing.engines import ENGINES, engine_formats
    from sizing.profiles import gpu_ids, gpu_profile
    from sizing.support import support

    architectures = sorted({gpu_profile(g).architecture for g in gpu_ids()})
    rows = [dict(engine=engine, format=fmt, architecture=arch, **vars(support(engine, fmt, arch)))
            for engine in ENGINES if engine != "ideal" for fmt in engine_formats(engine)
            for arch in architectures]
    if args.format == "json":
        print(json.dumps(rows, indent=2))
        return 0
    mark = {"supported": "yes", "unsupported": "no", "unconfirmed": "?"}
    print(f"{'engine':<10}{'format':<22}" + "".join(f"{a:>8}" for a in architectures))
    for i in range(0, len(rows), len(architectures)):
        cells = rows[i:i + len(architectures)]
        print(f"{cells[0]['engine']:<10}{cells[0]['format']:<22}" + "".join(f"{mark[c['status']]:>8}" for c in cells))
    print("yes: supported, no: unsupported, ?: unconfirmed; sources: kvsize support --format json")
    return 0


def _prices(text: str | None) -> dict[str, float]:
    from sizing.units import parse_assignments

    return parse_assignments(text, "--price", "GPU=USD_PER_HOUR", "h100-sxm=2.49")


def _read_report(path: str, option: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise KvsizeError(f"{option}: {p} is not a file")
    try:
        report = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise KvsizeError(f"{option}: {p} is not a JSON measurement report ({e})") from None
    if not isinstance(report, dict):
        raise KvsizeError(f"{option}: {p} holds a JSON {type(report).__name__}, not a measurement report (an object)")
    return report


def _some_tp_splits_the_heads(base, tps: list[int], engine: str) -> None:
    """Refuse up front when no --tp can split the model: no candidate could be sized."""
    from sizing.engines import get_engine
    from sizing.plan import check_tensor_parallel

    errors = []
    for tp in tps:
        try:
            check_tensor_parallel(base.shape, tp, get_engine(engine))
            return
        except KvsizeError as e:
            errors.append(e)
    if errors:
        raise errors[0]


def plan_from_args(args: argparse.Namespace):
    """(fleet plan, base scenario, guidance, quality notes, serve command of the cheapest)."""
    from sizing.fleet import build_candidates, load_draft, plan_fleet, unconfirmed_pairs, unsupported_pairs
    from sizing.formats import get_format
    from sizing.guidance import evaluate_rules, quality_notes
    from sizing.profiles import measured_efficiency
    from sizing.speed import efficiency_from_report, parse_efficiency_overrides
    from sizing.workload import read_workload

    if args.pipeline_parallel_size != 1:
        raise KvsizeError("plan sizes replicas of TP GPUs; --pipeline-parallel-size is not supported here")
    if args.concurrency != 1:
        raise KvsizeError("plan takes the peak from the workload's peak_concurrency; drop --concurrency")
    workload = read_workload(args.workload)
    if args.itl_target_ms is not None:
        workload = workload.model_copy(update={"itl_target_ms": args.itl_target_ms})
    if args.ttft_ms is not None:
        workload = workload.model_copy(update={"ttft_target_ms": args.ttft_ms})
    base = scenario_from_args(args, args.model, args.gpus[0], args.engine, 1, None, "auto", "auto")
    efficiency = measured_efficiency()
    if args.efficiency_report:
        efficiency = efficiency_from_report(_read_report(args.efficiency_report, "--efficiency-report"),
                                            Path(args.efficiency_report).name)
    efficiency = parse_efficiency_overrides(args.kv_efficiency, efficiency)
    tps = [_int_or_error(t, "--tp") for t in args.tp]
    _some_tp_splits_the_heads(base, tps, args.engine)
    _warn_beyond_positions(args.model, base.shape, [b.max_context_tokens for b in workload.mix()])
    formats = [get_format(f, base.shape.serving_dtype, option="--formats").name for f in args.formats]
    distinct = list(dict.fromkeys(formats))
    candidates = build_candidates(args.gpus, distinct, tps, _prices(args.price), args.engine)
    for gpu, fmt, why in unsupported_pairs(args.gpus, distinct, args.engine):
        print(f"kvsize: warning: {fmt} left out on {gpu}: {why}", file=sys.stderr)
    unconfirmed = unconfirmed_pairs(args.gpus, distinct, args.engine)
    if unconfirmed:
        print("kvsize: note: no engine source confirms " + ", ".join(f"{f} on {g}" for g, f in unconfirmed)
              + f" with {args.engine} (kvsize support)", file=sys.stderr)
    plan = plan_fleet(base, candidates, workload, efficiency, load_draft(workload))
    report = _read_report(args.quality_report, "--quality-report") if args.quality_report else None
    notes = quality_notes(formats, base.shape.serving_dtype, report,
                          Path(args.quality_report).name if args.quality_report else None)
    return plan, base, evaluate_rules(workload), notes


def _hf_id(model: str) -> str:
    """What an engine is started with: the profile's Hugging Face id, or the local folder given."""
    from sizing.profiles import model_ids, model_profile

    if model.lower() in {m.lower() for m in model_ids()}:
        return model_profile(model).hf_id
    path = Path(model)
    return str(path.parent if path.name == "config.json" else path)


def cmd_plan(args: argparse.Namespace) -> int:
    from sizing.fleet import PLAN_SCHEMA, bucket_rows, candidate_rows, cost_rows, plan_serve_command, plan_summary

    outs = _checked_outs(args.out, [getattr(args, "workload", None), getattr(args, "model", None)])
    plan, base, rules, notes = plan_from_args(args)
    designs = designs_from_args(args, plan, base)
    cheapest = plan.cheapest
    serve = plan_serve_command(plan, base, cheapest, _hf_id(args.model)) if cheapest else None
    rows, pools, costs = candidate_rows(plan), bucket_rows(plan), cost_rows(plan)
    guidance = [dict(rule=r.rule.name, above_tokens=r.rule.above_tokens, share_percent=round(r.share_percent, 2),
                     threshold_percent=r.rule.min_share_percent, fires=r.fires, explanation=r.explanation)
                for r in rules]
    quality = [dict(format=n.format, published=n.published, source=n.source,
                    measured_attention_error=n.measured_attention_error, measured_where=n.measured_where)
               for n in notes]
    pending = []
    for out in outs:
        kind = out.suffix.lower()
        if kind == ".csv":
            pending.append((out, _csv_text(rows).encode()))
        elif kind == ".json":
            record = dict(schema=PLAN_SCHEMA, model=plan.model_name, engine=plan.engine,
                          workload=plan.workload.model_dump(mode="json"), efficiency_source=plan.efficiency.source,
                          cheapest=_cheapest_key(cheapest), serve_command=serve.command if serve else None,
                          candidates=rows, pools=pools, cost=costs, guidance=guidance, quality=quality)
            if designs is not None:
                record["designs"], record["frontier"] = designs["rows"], designs["frontier"]
                record["design_serve_commands"] = designs["serve"]
            pending.append((out, (json.dumps(record, indent=2) + "\n").encode()))
        else:
            from app.spreadsheet import xlsx_bytes

            summary = plan_summary(plan, serve.command if serve else None, [r.explanation for r in rules if r.fires])
            sheets = {"summary": summary, "candidates": rows, "pools": pools, "cost": costs, "guidance": guidance,
                      "quality": quality}
            if designs is not None:
                sheets |= {"designs": designs["rows"], "frontier": designs["frontier"]}
            pending.append((out, xlsx_bytes(sheets)))
    _write_all(pending)
    sys.stdout.write(render_plan(plan, rows, rules, notes, serve, args.top))
    if designs is not None:
        sys.stdout.write(designs["text"])
    for out in outs:
        print(f"kvsize: wrote {out}", file=sys.stderr)
    if designs is not None and not designs["met"]:
        print("kvsize: error: no design meets the latency targets; loosen --ttft-ms or --itl-ms, or add faster "
              "GPUs or larger TP sizes (the designs table gives each one's reason)", file=sys.stderr)
        return 1  # a target not met, as against bad input (2)
    if cheapest is None:
        reasons = list(dict.fromkeys(r["reason"].removeprefix("n/a: ") for r in rows if r.get("reason")))
        more = f" (and {len(reasons) - 3} more, in the table above)" if len(reasons) > 3 else ""
        print("kvsize: error: no candidate serves the workload: " + "; ".join(reasons[:3]) + more, file=sys.stderr)
        return 2
    return 0


def designs_from_args(args: argparse.Namespace, plan, base) -> dict | None:
    """With a TTFT or ITL target: aggregated and disaggregated designs, the cheapest and the frontier."""
    from dataclasses import replace

    from sizing.fleet import build_candidates
    from sizing.formats import get_format
    from sizing.slo import Targets, TierOption, cheapest, design_row, frontier, pd_link, ranked, search_designs

    w = plan.workload
    if w.ttft_target_ms is None and w.itl_target_ms is None:
        return None
    targets = Targets(w.ttft_target_ms / 1000 if w.ttft_target_ms else None,
                      w.itl_target_ms / 1000 if w.itl_target_ms else None)
    link, shared, same_host = pd_link(args.pd_link)
    from sizing.tiers import check_tier_links

    check_tier_links({"host": args.host_memory or 0, "disk": args.disk or 0},
                     {"host": args.host_link, "disk": args.disk_link})
    formats = list(dict.fromkeys(get_format(f, base.shape.serving_dtype, option="--formats").name for f in args.formats))
    tps = [_int_or_error(t, "--tp") for t in args.tp]
    candidates = build_candidates(args.gpus, formats, tps, _prices(args.price), args.engine)
    found = search_designs(base, candidates, w, plan.efficiency, targets, link, shared, same_host=same_host)
    best = cheapest(found)
    text = render_designs(targets, best, found, frontier(found), args.pd_link.strip(), args.top)
    sizes = {k: v for k, v in (("host", args.host_memory), ("disk", args.disk)) if v}
    commands = []
    if sizes:
        tiered = search_designs(base, candidates, w, plan.efficiency, targets, link, shared, same_host=same_host,
                                tiers=TierOption(sizes, {"host": args.host_link, "disk": args.disk_link}))
        text += render_tier_savings(found, tiered, sizes)
        best = cheapest(tiered) or best
        found = found + [replace(d, kind=f"{d.kind} + tiers") for d in tiered]
    if best is not None:
        from sizing.slo import design_serve_commands

        commands = design_serve_commands(best, base, w, _hf_id(args.model), sizes.get("host", 0))
        text += "  serve the chosen design:\n" + "".join(
            f"    {role}: {c.command or c.note}\n" for role, c in commands)
    rows = [design_row(d) for d in ranked(found)]
    front = [design_row(d) for d in frontier(found)]
    return {"rows": rows, "frontier": front, "text": text, "met": best is not None,
            "serve": [dict(role=role, command=c.command, note=c.note) for role, c in commands]}


def render_tier_savings(plain, tiered, sizes: dict) -> str:
    from sizing.slo import cheapest

    size = ", ".join(f"{k} {v / GiB:,.0f} GiB" for k, v in sizes.items())
    hbm_only = cheapest([d for d in plain if d.kind == "aggregated"])
    lines = [f"  with KV tiers per replica ({size}; prefixes found there are reloaded, not prefilled):"]
    for kind in ("aggregated", "disaggregated"):
        d = cheapest([x for x in tiered if x.kind == kind])
        if d is None:
            lines.append(f"    cheapest {kind}: none meets the targets")
            continue
        fewer = hbm_only.gpus - d.gpus if hbm_only else 0
        saved = "" if not hbm_only else (
            f"; saves {fewer} GPU(s) against HBM-only aggregated serving ({hbm_only.gpus})" if fewer > 0 else
            f"; {-fewer} GPU(s) more than HBM-only aggregated serving ({hbm_only.gpus})" if fewer < 0 else
            f"; as many GPUs as HBM-only aggregated serving ({hbm_only.gpus})")
        lines.append(f"    cheapest {kind}: {d.layout}: {d.gpus} GPUs, ${d.usd_per_hour:,.2f}/h, TTFT "
                     f"{d.ttft_seconds * 1e3:,.0f} ms, ITL {d.itl_seconds * 1e3:.1f} ms{saved}")
    return "\n".join(lines) + "\n"


def render_designs(targets, best, found, front_designs, link: str, top: int) -> str:
    from sizing.slo import cheapest, design_row

    front = [design_row(d) for d in front_designs]
    ttft = f"TTFT ≤ {targets.ttft_seconds * 1e3:g} ms" if targets.ttft_seconds else "no TTFT target"
    itl = f"ITL ≤ {targets.itl_seconds * 1e3:g} ms" if targets.itl_seconds else "no ITL target"
    lines = ["", f"Designs for {ttft}, {itl} (P/D link: {link}; docs/formulas.md, 'Latency targets'):"]
    agg = cheapest([d for d in found if d.kind == "aggregated"])
    dis = cheapest([d for d in found if d.kind == "disaggregated"])
    for name, d in (("aggregated", agg), ("disaggregated", dis)):
        if d is None:
            lines.append(f"  cheapest {name}: none meets the targets")
            continue
        lines.append(f"  cheapest {name}: {d.layout}: {d.gpus} GPUs, ${d.usd_per_hour:,.2f}/h, "
                     f"${d.usd_per_million_output_tokens:,.3f}/M tok, TTFT {d.ttft_seconds * 1e3:,.0f} ms, "
                     f"ITL {d.itl_seconds * 1e3:.1f} ms ({d.reason})")
    if agg and dis:
        fewer = agg.gpus - dis.gpus
        lines.append(f"  disaggregation {'saves' if fewer > 0 else 'costs'} {abs(fewer)} GPU(s) and "
                     f"${abs(agg.usd_per_hour - dis.usd_per_hour):,.2f}/h against aggregated serving")
    if best is not None:
        lines.append(f"  chosen (cheapest per hour at the peak): {best.label}")
        if not any(r["design"] == best.label for r in front):
            lines.append("  (faster designs serve more requests at the same concurrency, so they can cost less per "
                         "token while costing more per hour: the frontier below)")
    lines.append(f"  frontier (cost per million output tokens against ITL and TTFT), {min(top, len(front))} of "
                 f"{len(front)}:")
    for r in front[:top]:
        lines.append(f"    ${r['usd_per_million_output_tokens']:>8.3f}/M tok  ITL {r['itl_ms']:>6.1f} ms  "
                     f"TTFT {r['ttft_ms']:>7,.0f} ms  {r['gpus']:>4} GPUs  {r['design']}")
    return "\n".join(lines) + "\n"


def _cheapest_key(p) -> dict | None:
    if p is None:
        return None
    return dict(gpu=p.candidate.gpu.id, kv_format=p.candidate.kv_format,
                tensor_parallel_size=p.candidate.tensor_parallel_size, gpus=p.gpus)


def render_plan(plan, rows: list[dict], rules, notes, serve, top: int) -> str:
    from sizing.fleet import HOURS_PER_MONTH

    w = plan.workload
    lines = [f"Fleet plan: {plan.model_name} on {plan.engine}, workload {w.name!r}: peak {w.peak_concurrency:,} "
             f"concurrent requests, prefix cache share {w.prefix_cache_share:.0%}"]
    lines.append("  mix: " + ", ".join(f"{b.label} tokens {b.share_percent:g}% of requests (out {b.output_tokens:,})"
                                        for b in w.mix()))
    lines.append("")
    head = (f"{'gpu':<11}{'kv format':<20}{'tp':>3}{'gpus':>6}{'req/repl':>9}{'split':>7}{'ITL ms':>9}"
            f"{'tok/s/GPU':>11}{'$/h':>9}{'$/M tok':>9}{'vs bf16':>9}")
    lines.append(head)
    fitting = [r for r in rows if r["fits"]]  # candidate_rows ranks them: cheapest first
    for r in fitting[:top]:
        saving = f"{-r['savings_vs_bf16_percent']:+.0f}%" if r["savings_vs_bf16_percent"] is not None else "-"
        lines.append(f"{r['gpu']:<11}{r['kv_format']:<20}{r['tensor_parallel_size']:>3}{r['gpus']:>6}"
                     f"{r['requests_per_replica']:>9}{r['gpus_per_bucket_pools']:>7}{r['itl_ms']:>9.2f}"
                     f"{r['tokens_per_s_per_gpu']:>11,.0f}{r['fleet_usd_per_hour']:>9.2f}"
                     f"{r['usd_per_million_output_tokens']:>9.3f}{saving:>9}")
    refused = [r for r in rows if not r["fits"]]
    if refused:
        lines.append(f"  ({len(refused)} candidate(s) do not fit or cannot run; see --out for reasons, e.g. "
                     f"{refused[0]['gpu']} {refused[0]['kv_format']} TP {refused[0]['tensor_parallel_size']}: "
                     f"{refused[0]['reason']})")
    target = f"ITL target {w.itl_target_ms:g} ms" if w.itl_target_ms else "no ITL target (--itl-target-ms)"
    lines.append("  gpus: one shared pool; split: one pool per length bucket (capacity only); ITL at the peak batch "
                 f"per replica; cheapest = lowest fleet $/h that holds the peak, {target}; "
                 f"efficiency: {plan.efficiency.source}")
    lines.append("")
    best = plan.cheapest
    if best:
        c = best.candidate
        lines.append(f"Cheapest: {best.gpus} × {c.gpu.name} ({c.kv_format} KV, TP {c.tensor_parallel_size}) — "
                     f"{best.reason}; ${best.usd_per_hour:,.2f}/h (${best.usd_per_hour * HOURS_PER_MONTH:,.0f} a month of "
                     f"{HOURS_PER_MONTH} h) at ${c.gpu.usd_per_hour:g}/GPU-h ({c.gpu.price_source})")
    else:
        lines.append("No candidate fits: try larger TP, more memory per GPU, or a smaller KV format.")
    lines.append("")
    lines.append("Guidance:")
    lines += [f"  - {r.explanation}" for r in rules]
    lines.append("Quality notes:")
    for n in notes:
        measured = (f"; measured attention error {n.measured_attention_error:.1%} ({n.measured_where})"
                    if n.measured_attention_error is not None else "")
        lines.append(f"  - {n.format}: {n.published} [{n.source}]{measured}")
    if serve:
        lines.append("")
        lines.append(f"Serve ({serve.engine}; {serve.note}):" if serve.command else f"Serve: {serve.note}")
        if serve.command:
            lines.append(f"  {serve.command}")
    return "\n".join(lines) + "\n"


def cmd_measure(args: argparse.Namespace) -> int:
    from measure.run import _model_and_layers, run_measurement
    from sizing.profiles import model_profile

    for spec in args.model:
        model_profile(_model_and_layers(spec, args.layers)[0])  # an unknown name is refused before the GPU is asked
    _check_out(Path(args.out))

    return run_measurement(args)


def cmd_verify(args: argparse.Namespace) -> int:
    from measure.verify import run_verify
    from sizing.profiles import model_profile, read_config_file

    launch = _read_launch(args) if args.launch else None
    if args.model is None:
        raise KvsizeError("--model is required (or a vllm launch command after '--' that names the model)")
    out = _check_out(Path(args.out))
    if out.suffix.lower() != ".json":
        raise KvsizeError(f"--out {out.name!r}: a verify report is JSON; name it {out.stem}.json")
    scenario = scenario_from_args(args, args.model, args.gpu, args.engine, args.tensor_parallel_size,
                                  args.max_model_len, args.kv_cache_dtype, args.kv_cache_dtype)
    if launch is not None:
        scenario = scenario.evolve(usage_context=launch.usage_context, **launch.fields)
    path = Path(args.model)
    config = read_config_file(path) if path.suffix == ".json" or path.is_dir() else model_profile(args.model).config
    return run_verify(scenario, config, out, scenario.usage_context, args.vllm_path, args.timeout)


def cmd_validate(args: argparse.Namespace) -> int:
    from measure.validate import validate_files

    return validate_files(args.reports, args.tolerance)


if __name__ == "__main__":
    sys.exit(main())

"""`kvsize verify`: start the real vLLM on this machine's GPU with dummy weights for the user's config
and settings, and hold kvsize's prediction against the lines vLLM prints, term by term.

The report keeps the whole log and the config, so `kvsize validate` re-checks it without a GPU:
it reads the log again, predicts again with today's rules, and fails where the KV budget or the
token count is more than 1% off (or the stored figures are not what the log says).
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import tempfile
from pathlib import Path

from sizing.errors import KvsizeError
from sizing.units import GiB

from .report_io import write_report

VERIFY_SCHEMA = "kvsize.verify/1"
TOLERANCE = 0.01  # the real-engine goal: KV budget and tokens within 1%


def engine_args(scenario) -> dict:
    """The scenario's settings under vLLM's EngineArgs names (what a start passes to vLLM)."""
    s = scenario
    out: dict = {}
    for field, name in (("max_model_len", "max_model_len"), ("tensor_parallel_size", "tensor_parallel_size"),
                        ("pipeline_parallel_size", "pipeline_parallel_size"), ("block_size", "block_size"),
                        ("memory_fraction", "gpu_memory_utilization"), ("max_num_seqs", "max_num_seqs"),
                        ("max_num_batched_tokens", "max_num_batched_tokens"),
                        ("kv_cache_memory_bytes", "kv_cache_memory_bytes")):
        value = getattr(s, field)
        if value is not None and not (field.endswith("parallel_size") and value == 1):
            out[name] = value
    if s.k_cache_dtype not in ("auto", None):
        out["kv_cache_dtype"] = s.k_cache_dtype
    if s.enforce_eager:
        out["enforce_eager"] = True
    else:
        compilation = {} if s.torch_compile else {"mode": 0}
        if s.cudagraph_mode is not None:
            compilation["cudagraph_mode"] = s.cudagraph_mode
        if compilation:
            out["compilation_config"] = compilation
    if s.language_model_only:
        out["language_model_only"] = True
    return out


def bundled_gpu(name: str, nvml_mib: int) -> str:
    """The bundled GPU profile nvidia-smi describes (its name and its total in MiB)."""
    from sizing.profiles import matching_gpus

    found = matching_gpus(name=name, nvml_mib=nvml_mib)
    if found:
        return found[0]
    raise KvsizeError(f"this GPU ({name}, {nvml_mib} MiB) matches no bundled GPU profile (kvsize gpus)")


def run_verify(scenario, config: dict, out: Path, usage_context: str = "serve", vllm_path: str | None = None,
               timeout_s: float = 420) -> int:
    from measure.vllm_start import StartSpec, gpu_inventory, run_starts

    if shutil.which("nvidia-smi") is None:
        raise KvsizeError("kvsize verify starts vLLM on an NVIDIA GPU: nvidia-smi is not on this machine")
    if vllm_path is None and importlib.util.find_spec("vllm") is None:
        raise KvsizeError("kvsize verify needs vLLM installed in this Python (pip install vllm), or --vllm-path")
    gpus = gpu_inventory()
    args = engine_args(scenario)
    needed = int(args.get("tensor_parallel_size", 1)) * int(args.get("pipeline_parallel_size", 1))
    if needed > len(gpus):
        raise KvsizeError(f"the settings need {needed} GPUs; this machine has {len(gpus)}")
    gpu = bundled_gpu(gpus[0]["name"], gpus[0]["nvml_total_mib"])
    with tempfile.TemporaryDirectory(prefix="kvsize-verify-") as work:
        config_path = Path(work) / "model.json"
        config_path.write_text(json.dumps(config))
        spec = StartSpec("verify", str(config_path), args, usage_context, "site" if vllm_path else None)
        (result,) = run_starts([spec], Path(work) / "logs", timeout_s + 60, [g["index"] for g in gpus][:needed],
                               {"site": vllm_path} if vllm_path else {}, start_cost_s=0, timeout_s=timeout_s)
        log = scrub_log((Path(work) / "logs" / "verify.log").read_text(errors="replace"),
                        {str(config_path.parent): "<model dir>", **({vllm_path: "<vllm>"} if vllm_path else {})})
    report = {"schema": VERIFY_SCHEMA, "device": {"name": gpus[0]["name"], "nvml_total_mib": gpus[0]["nvml_total_mib"],
                                                  "count": len(gpus)},
              "gpu": gpu, "status": result.status, "usage_context": usage_context, "args": args,
              "model_name": scenario.model_name, "config": config, "log": log}
    if result.status != "sized":
        write_report(out, report)
        raise KvsizeError(f"vLLM did not size its KV cache ({result.status}); its log is in {out}")
    report["checks"] = verify_checks(report)
    write_report(out, report)
    bad = problems(report)
    for line in render(report, bad):
        print(line)
    return 1 if bad else 0


def scrub_log(log: str, known: dict[str, str]) -> str:
    """The log as a report keeps it: this machine's folders (the start's own, vLLM's, the temporary and
    home folders) named by what they are, so a committed report carries no machine's paths. The figures
    and settings kvsize reads are untouched."""
    for path, name in sorted(known.items(), key=lambda kv: -len(kv[0])):
        log = log.replace(path.rstrip("/"), name)
    log = re.sub(re.escape(tempfile.gettempdir().rstrip("/")) + r"/[^\s'\",)\]]*", "<tmp>", log)
    home = str(Path.home())
    return log.replace(home + "/", "~/") if home not in ("/", "") else log


def verify_checks(report: dict) -> list[dict]:
    """Predicted against printed, per term, from the report's log and config alone."""
    from sizing.evidence.logs import compare_log, log_scenario, read_log
    from sizing.profiles import gpu_profile
    from sizing.config import resolve_shape

    from sizing.errors import KvsizeError

    # typed at the door: a report's log is text, its config an object and its GPU an id
    for key, kind, what in (("log", str, "text (the engine's log)"), ("config", dict, "an object (config.json)"),
                            ("gpu", str, "a bundled GPU id")):
        if not isinstance(report.get(key), kind):
            raise KvsizeError(f"the verify report's {key!r} must be {what}, not {type(report.get(key)).__name__}")
    run = read_log(report["log"])
    shape = resolve_shape(report["config"])
    scenario, _ = log_scenario(run, report.get("model_name") or "model", shape, gpu_profile(report["gpu"]))
    result = compare_log(run, scenario)
    return [{"term": t, "predicted": p, "printed": lg} for t, p, lg in result.rows if lg is not None]


def problems(report: dict) -> list[str]:
    """Every failed check of a verify report: recomputed from its log, and held to what it stores."""
    out = []
    fresh = {c["term"]: c for c in verify_checks(report)}
    stored = {c["term"]: c for c in report.get("checks", [])}
    for term, c in fresh.items():
        if term in stored and stored[term]["printed"] != c["printed"]:
            out.append(f"{term}: the report stores {stored[term]['printed']} as printed, its log says {c['printed']}")
        # the predictions are derived from the log and config, so they are held exactly to kvsize's rules
        if term in stored and stored[term]["predicted"] != c["predicted"]:
            out.append(f"{term}: the report stores {stored[term]['predicted']} as predicted, kvsize predicts "
                       f"{c['predicted']} from its log (python scripts/refresh_predictions.py REPORT)")
    for term in ("kv_budget_bytes", "max_tokens"):
        c = fresh.get(term)
        if c is None:
            continue
        error = c["predicted"] / c["printed"] - 1 if c["printed"] else 0
        if abs(error) > TOLERANCE:
            out.append(f"{term}: predicted {c['predicted']:,}, vLLM printed {c['printed']:,} ({100 * error:+.2f}%)")
    return out


def render(report: dict, bad: list[str] | None = None) -> list[str]:
    """The report as the terminal shows it; `bad`, its problems where the caller has them already."""
    lines = [f"vLLM on {report['device']['name']} ({report['gpu']}), settings {report['args']}"]
    for c in report["checks"]:
        fmt = (lambda v: f"{v / GiB:,.2f} GiB") if c["term"].endswith("_bytes") else (lambda v: f"{v:,}")
        error = c["predicted"] / c["printed"] - 1 if c["printed"] else 0
        lines.append(f"  {c['term']:<24}{fmt(c['predicted']):>16}{fmt(c['printed']):>16}{100 * error:>+9.2f}%")
    bad = problems(report) if bad is None else bad
    lines.append("  agrees within 1%" if not bad else "  DISAGREES: " + "; ".join(bad))
    return lines

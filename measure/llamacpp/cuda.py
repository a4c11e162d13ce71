"""Full-size llama.cpp loads on one CUDA GPU with every layer offloaded: the buffers kvsize's `--engine llamacpp`
sizes for a GPU, held to what llama.cpp printed.

    python -m measure.llamacpp.cuda predict           # kvsize's figures, written before the loads run
    python -m measure.llamacpp.cuda run --python PY --work DIR [--out REPORT] [--log FILE] [--deadline EPOCH]
                                        [--only SUBSTRING]
    python -m measure.llamacpp.cuda check [REPORT]    # no report yet: says so and passes

Each load is what kvsize's serve command starts (sizing/engines/serve.py: -c max_model_len x concurrency,
-np concurrency, -kvu, -fa on, and llama-server's defaults: every layer offloaded, the file mapped, -b 2048 -ub 512),
made with llama-cpp-python against a CUDA build of the same llama.cpp (measure/llamacpp/child.py), on a GGUF written
at full size with zero weights (gguf_writer --full TYPE) and deleted after its load. `run` imports nothing of
kvsize's sizing: the GPU machine's Python need not have kvsize's dependencies.

kvsize predicts, from sizing/ as it stands (sizing/engines/llamacpp_quant.py serve_buffers, llamacpp.py
predict_load): the CUDA0 model buffer and the CPU_Mapped one (token_embd), exactly; the CUDA0 KV buffer and the
cache's size line, exactly; the CUDA_Host output buffer, exactly; the CUDA0 compute buffer, as a model (held to the
band of the full-size CPU loads, COMPUTE_BAND). It has no term for the CUDA_Host compute buffer (host
memory) or for the CUDA context, cuBLAS and ggml's CUDA pool outside the printed buffers: the report keeps them,
nothing holds them.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..report_io import write_report
from .logparse import compute_error, memory_lines, parse, printed

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "tests" / "fixtures" / "vllm-starts" / "configs"  # buffers.CONFIGS, without importing sizing
REPORT = ROOT / "measure" / "reports" / "llamacpp-cuda-buffers.json"
PREDICTIONS = ROOT / "measure" / "llamacpp" / "full-cuda-predictions.json"
SCHEMA = "kvsize.llamacpp-buffers/1"  # buffers.SCHEMA: kvsize validate reads a CUDA report by its device kind
GPU = "h200"  # the bundled GPU the predictions are for (kvsize --gpu)
TIMEOUT_S = 600
# common/common.h (llama-server's defaults): n_batch 2048, n_ubatch 512, swa_full false; load_mode auto maps the file
N_BATCH, N_UBATCH = 2048, 512
# the compute-buffer model's band, as on the full-size CPU loads (buffers.FULL_COMPUTE_BAND, which docs/formulas.md
# states): kvsize's figure against the printed CUDA0 one
COMPUTE_BAND = (-0.02, 0.02)
# what a CUDA log says beyond the memory lines: the devices ggml found (ggml-cuda.cu ggml_cuda_init)
DEVICE_LINE = re.compile(r"ggml_cuda_init: |^\s*Device \d+: ")
# src/llama-model.cpp load_tensors: "%s: offloaded %d/%d layers to GPU"
OFFLOADED = re.compile(r"load_tensors: offloaded (\d+)/(\d+) layers to GPU")
# src/llama.cpp: "%s: using device %s (%s) (%s) - %zu MiB free"
USING_DEVICE = re.compile(r"using device (\w+) \((.+?)\) \(")
# ggml/src/ggml-cuda/ggml-cuda.cpp ggml_cuda_init: "  Device %d: %s, compute capability %d.%d, VMM: %s" (the build
# of llama-cpp-python 0.3.36 prints this and no "using device" line)
CUDA_INIT_DEVICE = re.compile(r"^\s*Device (\d+): (.+?), compute capability")
# what kvsize does not predict for these loads, said once in the predictions file
NOT_PREDICTED = (
    "sched_reserve: CUDA_Host compute buffer size (the CPU backend's compute buffer, in pinned host memory: kvsize has "
    "no term for it)",
    "the CUDA context, cuBLAS workspaces and ggml's CUDA memory pool, outside llama.cpp's printed buffers (the "
    "estimate's non_torch term is not a llama.cpp figure; the child records cudaMemGetInfo around the load, "
    "unchecked)",
)


@dataclass(frozen=True)
class CudaLoad:
    id: str
    config: str  # tests/fixtures/vllm-starts/configs/<config>.json
    arch: str
    weight_type: str
    max_model_len: int
    concurrency: int = 1
    cache_type: str = "f16"  # -ctk and -ctv (llama.cpp's names)

    def settings(self) -> dict[str, Any]:
        """The context kvsize's serve command makes, as the child takes it."""
        return {**asdict(self), "model": self.config, "n_gpu_layers": -1, "load_mode": "auto", "use_mmap": True,
                "n_ctx": self.max_model_len * self.concurrency, "n_seq_max": self.concurrency,
                "type_k": self.cache_type, "type_v": self.cache_type, "flash_attn": True, "kv_unified": True,
                "n_batch": N_BATCH, "n_ubatch": N_UBATCH, "swa_full": False, "n_threads": 1}


# each file under 9 GB: Qwen3-8B at q8_0 is 8.7 GB. Llama-3.2-1B ties its output to token_embd (a copy of its own on
# the GPU); Qwen2.5-0.5B's width (896) and FFN (4864) are not multiples of 512, so CUDA pads its q8_0 rows
# (MATRIX_ROW_PADDING); Qwen3-8B has an output matrix, four slots and a q8_0 cache.
CUDA_LOADS = (
    CudaLoad("llama-3.2-1b/q8_0-16k", "llama-3.2-1b-instruct", "llama", "q8_0", 16384),
    CudaLoad("qwen2.5-0.5b/q8_0-16k-np2", "qwen2.5-0.5b", "qwen2", "q8_0", 16384, 2),
    CudaLoad("qwen3-8b/q8_0-8k-np4-ctq8_0", "qwen3-8b", "qwen3", "q8_0", 8192, 4, "q8_0"),
)


def config_path(config: str) -> Path:
    return CONFIGS / f"{config}.json"


def kvsize_figures(s: dict[str, Any]) -> dict[str, Any]:
    """kvsize's buffers for a load's settings, in bytes by the device llama.cpp names, from the functions the estimate
    uses (serve_buffers for the weights, compute and output buffers; predict_load for the cache, as serve_log_lines)."""
    from sizing.engines.llamacpp import KVSIZE_FORMAT, log_lines, predict_load
    from sizing.engines.llamacpp_quant import serve_buffers
    from sizing.profiles import load_model

    _, shape = load_model(str(config_path(s["model"])))
    b = serve_buffers(shape, s["weight_type"], s["max_model_len"], s["concurrency"], KVSIZE_FORMAT[s["type_k"]],
                      KVSIZE_FORMAT[s["type_v"]])
    kv = predict_load(shape, s["max_model_len"] * s["concurrency"], s["concurrency"], s["type_k"], s["type_v"],
                      True, True)
    return {"model": {"CUDA0": b.weights.gpu_bytes, "CPU_Mapped": b.weights.host_bytes},
            "KV": {"CUDA0": kv.kv_bytes}, "kv_log_lines": list(log_lines(kv)),
            "output": {"CUDA_Host": b.output_bytes}, "compute": {"CUDA0": b.compute_bytes},
            "compute_stages": {"logits_bytes": b.compute["logits_bytes"],
                               "attention_bytes": b.compute["attention_bytes"]}, "n_ctx": b.n_ctx}


def kvsize_command(load: CudaLoad) -> list[str]:
    from sizing.engines.llamacpp import KVSIZE_FORMAT

    return ["estimate", "--model", str(config_path(load.config).relative_to(ROOT)), "--gpu", GPU, "--engine",
            "llamacpp", "--weights-dtype", load.weight_type, "--max-model-len", str(load.max_model_len),
            "--concurrency", str(load.concurrency), "--kv-cache-dtype", KVSIZE_FORMAT[load.cache_type]]


def predict(load: CudaLoad) -> dict[str, Any]:
    """`kvsize estimate --engine llamacpp` for the load (its JSON, from the command line itself), and its figures as
    llama.cpp would print them; refused where the estimate's buffers are not kvsize_figures' (the check holds the
    report to the latter)."""
    from sizing.engines.llamacpp_weights import mib_printed

    argv = kvsize_command(load)
    done = subprocess.run([sys.executable, "-m", "app.cli", *argv, "--format", "json"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"{load.id}: kvsize {' '.join(argv)} failed: {done.stderr.strip()}")
    record = json.loads(done.stdout)
    f = kvsize_figures(load.settings())
    b = record["llamacpp_buffers"]
    estimate = {"model": {"CUDA0": b["gpu_model_buffer_bytes"], "CPU_Mapped": b["host_model_buffer_bytes"]},
                "output": {"CUDA_Host": b["output_buffer_bytes"]}, "compute": {"CUDA0": b["compute_buffer_bytes"]},
                "kv_log_lines": record["engine_log_lines"]}
    if any(estimate[k] != f[k] for k in estimate):
        raise SystemExit(f"{load.id}: the estimate's buffers {estimate} are not kvsize_figures' {f}")
    printed = {
        "load_tensors: CUDA0 model buffer size": mib_printed(f["model"]["CUDA0"]),
        "load_tensors: CPU_Mapped model buffer size": mib_printed(f["model"]["CPU_Mapped"]),
        "llama_kv_cache: CUDA0 KV buffer size": mib_printed(f["KV"]["CUDA0"]),
        "llama_context: CUDA_Host output buffer size": mib_printed(f["output"]["CUDA_Host"]),
        "sched_reserve: CUDA0 compute buffer size": mib_printed(f["compute"]["CUDA0"]),
    }
    return {"kvsize_command": "kvsize " + " ".join(argv), "printed_mib": printed, "kv_log_lines": f["kv_log_lines"],
            "bytes": {k: f[k] for k in ("model", "KV", "output", "compute", "compute_stages")}, "n_ctx": f["n_ctx"],
            "exact": ["model", "KV", "output"], "model_of": ["compute"],
            "estimate_breakdown": {k: record["breakdown"][k] for k in ("weights_bytes", "activation_bytes",
                                                                       "non_torch_bytes", "cuda_graph_bytes")},
            "estimate_notes": {k: b[k] for k in ("compute_buffer", "gpu_model_buffer")}}


def write_predictions(out: Path = PREDICTIONS) -> None:
    rows = [{"load": load.settings(), "prediction": predict(load)} for load in CUDA_LOADS]
    write_report(out, {
        "schema": SCHEMA + "-predictions", "gpu": GPU,
        "predicted": "each load's CUDA0 model, CPU_Mapped model, CUDA0 KV and CUDA_Host output buffers exactly, and "
                     "the CUDA0 compute buffer as a model (band: measure/llamacpp/buffers.py FULL_COMPUTE_BAND), from "
                     "sizing/ as it stood when this file was written, before any load ran",
        "not_predicted": list(NOT_PREDICTED), "loads": rows})
    print(f"{len(rows)} CUDA predictions -> {out}")


def _versions(python: str) -> dict[str, Any]:
    code = ("import json, llama_cpp, gguf, importlib.metadata as m; print(json.dumps({'llama_cpp_python': "
            "llama_cpp.__version__, 'gguf': m.version('gguf'), 'system_info': "
            "llama_cpp.llama_print_system_info().decode(), 'gpu_offload': llama_cpp.llama_supports_gpu_offload()}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    if out.returncode != 0 or not out.stdout.strip():
        print(f"llama-cpp-python could not be loaded (exit {out.returncode}):\n{out.stderr[-3000:]}", flush=True)
        return {"error": out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"}
    return json.loads(out.stdout.strip().splitlines()[-1])


def device_of(rows: list[dict[str, Any]]) -> dict[str, str]:
    for row in rows:
        for line in row["lines"]:
            if m := USING_DEVICE.search(line):
                return {"name": m.group(2), "kind": "cuda", "llama_device": m.group(1)}
            if m := CUDA_INIT_DEVICE.search(line):
                return {"name": m.group(2), "kind": "cuda", "llama_device": f"CUDA{m.group(1)}"}
    return {"name": "CUDA GPU (llama.cpp named no device)", "kind": "cuda"}


def _left(deadline: float | None) -> float:
    return float("inf") if deadline is None else deadline - time.time()


def run_load(python: str, gguf_path: Path, s: dict[str, Any], timeout: float, log) -> dict[str, Any]:
    try:
        proc = subprocess.run([python, "-m", "measure.llamacpp.child", str(gguf_path), json.dumps(s)], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
        stderr, stdout, status = proc.stderr, proc.stdout, proc.returncode
    except subprocess.TimeoutExpired as e:
        stderr = e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
        stdout, status = "", None
    log.write(f"===== {s['id']}: exit {status}\n{stderr}\n----- stdout\n{stdout}\n")
    log.flush()
    text = stderr.replace(f"{gguf_path.parent}/", "")
    keep = set(memory_lines(text))
    lines = [line for line in text.splitlines() if line in keep or DEVICE_LINE.search(line)]
    outcome = json.loads(stdout.strip().splitlines()[-1]) if status == 0 and stdout.strip() else {}
    return {"load": s, "gguf_bytes": gguf_path.stat().st_size, "exit_status": status, "timed_out": status is None,
            "model_loaded": outcome.get("model_loaded", False), "context_made": outcome.get("context_made", False),
            "gpu_offload": outcome.get("gpu_offload"), "cuda_memory": outcome.get("cuda_memory"),
            "lines": lines, "figures": parse(lines)}


def run(python: str, work: Path, out: Path, log_path: Path, deadline: float | None, only: str | None = None) -> int:
    """The planned loads in order (those whose id holds `only`), the report rewritten after each (a run cut short
    keeps what it made); a load that cannot finish before the deadline is not started."""
    rows: list[dict[str, Any]] = []
    by_file: dict[tuple[str, str], list[CudaLoad]] = {}
    planned = [load for load in CUDA_LOADS if not only or only in load.id]
    for load in planned:
        by_file.setdefault((load.config, load.weight_type), []).append(load)
    work.mkdir(parents=True, exist_ok=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {"schema": SCHEMA, "device": {"name": "?", "kind": "cuda"}, "engine": _versions(python),
              "predictions": str(PREDICTIONS.relative_to(ROOT)), "loads": rows, "not_run": []}
    with open(log_path, "a") as log:
        for (config, weight_type), loads in by_file.items():
            if _left(deadline) < 60:
                report["not_run"] += [load.id for load in loads]
                continue
            cfg = work / f"{config}.config.json"
            cfg.write_text(config_path(config).read_text())
            gguf_path = work / f"{config}-{weight_type}.gguf"
            t0 = time.time()
            try:
                written = subprocess.run([python, "-m", "measure.llamacpp.gguf_writer", str(cfg), str(gguf_path),
                                          "--arch", loads[0].arch, "--full", weight_type], cwd=ROOT,
                                         capture_output=True, text=True,
                                         timeout=max(1.0, min(TIMEOUT_S, _left(deadline))))
                status, err = written.returncode, written.stderr
            except subprocess.TimeoutExpired:
                status, err = None, "timed out"
            if status != 0 or not gguf_path.exists():
                print(f"{gguf_path.name}: gguf_writer failed (exit {status}):\n{err[-3000:]}", flush=True)
                gguf_path.unlink(missing_ok=True)
                report["not_run"] += [load.id for load in loads]
                continue
            print(f"{gguf_path.name}: {gguf_path.stat().st_size:,} bytes in {time.time() - t0:.0f} s", flush=True)
            try:
                for load in loads:
                    if _left(deadline) < 30:
                        report["not_run"].append(load.id)
                        continue
                    rows.append(run_load(python, gguf_path, load.settings(), min(TIMEOUT_S, _left(deadline)), log))
                    report["device"] = device_of(rows)
                    write_report(out, report)
                    print(f"{load.id}: exit {rows[-1]['exit_status']}, "
                          f"{[(b['device'], b['kind'], b['mib']) for b in rows[-1]['figures']['buffers']]}", flush=True)
            finally:
                gguf_path.unlink(missing_ok=True)
    if not report["not_run"]:
        del report["not_run"]
    write_report(out, report)
    print(f"{len(rows)} loads -> {out}" + (f"; not run: {report['not_run']}" if report.get("not_run") else ""))
    return 0 if len(rows) == len(planned) and all(r["context_made"] for r in rows) else 1


def offloaded(lines: list[str]) -> tuple[int, int] | None:
    for line in lines:
        if m := OFFLOADED.search(line):
            return int(m.group(1)), int(m.group(2))
    return None


def _row_problems(row: dict[str, Any]) -> list[str]:
    from sizing.engines.llamacpp_weights import mib_printed

    s = row["load"]
    figures = parse(row["lines"])
    if figures != row["figures"]:
        return [f"{s['id']}: its figures are not what llama.cpp printed (its raw lines say otherwise)"]
    if not row["context_made"]:
        return [f"{s['id']}: no context was made"]
    out = []
    layers = offloaded(row["lines"])
    if layers is None or layers[0] != layers[1]:
        out.append(f"{s['id']}: not every layer was offloaded (llama.cpp: {layers})")
    want = kvsize_figures(s)
    for kind in ("model", "KV", "output"):
        expected = {device: mib_printed(n) for device, n in want[kind].items()}
        if printed(figures, kind) != expected:
            out.append(f"{s['id']}: {kind} buffers: llama.cpp {printed(figures, kind)}, kvsize {expected}")
    caches = parse(want["kv_log_lines"])["caches"]
    if figures["caches"] != caches:
        out.append(f"{s['id']}: KV cache: llama.cpp {figures['caches']}, kvsize {caches}")
    compute = printed(figures, "compute")
    if "CUDA0" not in compute:
        return [*out, f"{s['id']}: no CUDA0 compute buffer was printed ({compute})"]
    err = compute_error(want["compute"]["CUDA0"], compute["CUDA0"])
    if not COMPUTE_BAND[0] <= err <= COMPUTE_BAND[1]:
        out.append(f"{s['id']}: CUDA0 compute buffer: llama.cpp {compute['CUDA0']} MiB, kvsize "
                   f"{mib_printed(want['compute']['CUDA0'])} MiB ({100 * err:+.1f}%, outside the stated band)")
    return out


def problems(report: dict[str, Any]) -> list[str]:
    """Every failed check of a CUDA buffers report, one line each, named by load: its figures re-read from its raw
    lines, every planned load present with a context and every layer offloaded, the model, KV and output buffers
    exactly kvsize's, the CUDA0 compute buffer within the band."""
    from sizing.errors import KvsizeError

    if report.get("schema") != SCHEMA or report.get("device", {}).get("kind") != "cuda":
        return [f"not a CUDA llama.cpp buffers report (schema {report.get('schema')!r}, device "
                f"{report.get('device')!r})"]
    ids = [row["load"]["id"] for row in report.get("loads") or []]
    out = []
    if report.get("loads") and report["device"] != device_of(report["loads"]):
        out.append(f"the report's device {report['device']} is not the one its loads' lines name "
                   f"{device_of(report['loads'])}")
    if ids != [load.id for load in CUDA_LOADS]:
        out.append(f"the report's loads {ids} are not the planned CUDA loads {[load.id for load in CUDA_LOADS]}")
    for row in report.get("loads") or []:
        try:
            out += _row_problems(row)
        except (KvsizeError, ArithmeticError) as e:
            out.append(f"{row['load'].get('id')}: its settings are not a load kvsize sizes ({e})")
    return out


def check(path: Path) -> int:
    if not path.exists():
        print(f"{path}: no CUDA report yet (it is written on a GPU machine: .llcuda/load.sh); nothing to check")
        return 0
    found = problems(json.loads(path.read_text()))
    for line in found:
        print(line)
    if not found:
        print(f"{path}: {len(CUDA_LOADS)} CUDA loads' buffers agree with kvsize")
    return 1 if found else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure.llamacpp.cuda", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("predict")
    r = sub.add_parser("run")
    r.add_argument("--python", required=True, help="an interpreter with llama-cpp-python (CUDA build) and gguf")
    r.add_argument("--work", type=Path, required=True, help="where the full-size GGUFs go (deleted after)")
    r.add_argument("--out", type=Path, default=REPORT)
    r.add_argument("--log", type=Path, default=None, help="every load's whole llama.cpp log (default: beside --out)")
    r.add_argument("--deadline", type=float, default=None, help="start no load that cannot end by this epoch time")
    r.add_argument("--only", default=None, help="only the loads whose id holds this text (a partial report)")
    c = sub.add_parser("check")
    c.add_argument("report", type=Path, nargs="?", default=REPORT)
    args = ap.parse_args(argv)
    if args.cmd == "predict":
        write_predictions()
        return 0
    if args.cmd == "run":
        log = args.log or args.out.with_suffix(".log")
        return run(args.python, args.work, args.out, log, args.deadline, args.only)
    return check(args.report)


if __name__ == "__main__":
    sys.exit(main())

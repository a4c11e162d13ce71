"""Full-size llama.cpp loads on a CPU: the model, output and compute buffers a planner needs beside the KV cache.

    python -m measure.llamacpp.full predict            # kvsize's figures, written before the loads run
    python -m measure.llamacpp.full run --python PATH/TO/llama-venv/bin/python --work DIR
    python -m measure.llamacpp.full check [REPORT]     # without REPORT: the CPU report, and the CUDA one if kept

Each load writes the model at full size with zero weights (gguf_writer --full TYPE: every matrix of that ggml type,
norms f32), loads it on the CPU (mmap on, as llama.cpp's default, or off), makes one context and keeps every memory
line; the GGUF is deleted after its loads. kvsize itself needs neither llama-cpp-python nor gguf.

The loads on one CUDA GPU (every layer offloaded, as kvsize's serve command starts llama.cpp) are
measure/llamacpp/cuda.py's, predicted and run by its own commands; `check` here holds their report too
(measure/reports/llamacpp-cuda-buffers.json).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from ..report_io import write_report

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "measure" / "reports" / "llamacpp-cpu-buffers.json"
PREDICTIONS = ROOT / "measure" / "llamacpp" / "full-predictions.json"
TIMEOUT_S = 600


@dataclass(frozen=True)
class FullLoad:
    id: str
    config: str  # tests/fixtures/vllm-starts/configs/<config>.json
    arch: str
    weight_type: str
    use_mmap: bool
    n_ctx: int = 4096
    n_seq_max: int = 1
    type_k: str = "f16"
    type_v: str = "f16"
    flash_attn: bool = True
    kv_unified: bool = False
    n_batch: int = 2048
    n_ubatch: int = 512


# each file under 3 GB: Llama-3.2-1B at f16 is 2.5 GB
FULL_LOADS = (
    FullLoad("llama-3.2-1b/q8_0-mmap", "llama-3.2-1b-instruct", "llama", "q8_0", True),
    FullLoad("llama-3.2-1b/q8_0-nommap", "llama-3.2-1b-instruct", "llama", "q8_0", False),
    FullLoad("llama-3.2-1b/f16-mmap", "llama-3.2-1b-instruct", "llama", "f16", True, n_ctx=8192, flash_attn=False),
    FullLoad("qwen2.5-0.5b/q4_0-mmap", "qwen2.5-0.5b", "qwen2", "q4_0", True),
    FullLoad("qwen2.5-0.5b/q4_0-nommap", "qwen2.5-0.5b", "qwen2", "q4_0", False, n_ubatch=256),
    FullLoad("qwen2.5-0.5b/q4_0-mmap-faoff", "qwen2.5-0.5b", "qwen2", "q4_0", True, flash_attn=False,
             type_k="q8_0"),
)


def config_of(load: FullLoad) -> dict:
    from .buffers import CONFIGS

    return json.loads((CONFIGS / f"{load.config}.json").read_text())


def predict(load: FullLoad) -> dict:
    """kvsize's figures for one load, in bytes and as llama.cpp prints them (MiB, 2^20 bytes)."""
    from sizing.config.read import resolve_shape
    from sizing.engines.llamacpp import predict_load
    from sizing.engines.llamacpp_weights import (compute_buffer_model_bytes, compute_shape, mib_printed,
                                                 output_buffer_bytes, weight_buffers)

    shape = resolve_shape(config_of(load))
    model = weight_buffers(shape, load.weight_type, load.use_mmap)
    kv = predict_load(shape, load.n_ctx, load.n_seq_max, load.type_k, load.type_v, load.flash_attn,
                      load.kv_unified, load.n_batch, load.n_ubatch)
    cells = max(c.cells for c in kv.caches)
    compute = compute_buffer_model_bytes(compute_shape(shape), kv.n_ctx, cells, load.n_ubatch, load.flash_attn,
                                         load.type_k, load.type_v)
    output = output_buffer_bytes(shape.vocab_size, load.n_seq_max)
    return {"model_buffers_bytes": model, "model_buffers_mib": {k: mib_printed(v) for k, v in model.items()},
            "output_bytes": output, "output_mib": mib_printed(output), "kv_bytes": kv.kv_bytes,
            **compute, "compute_mib": mib_printed(compute["compute_bytes"])}


def write_predictions(out: Path = PREDICTIONS) -> None:
    from .buffers import SCHEMA

    rows = [{"load": asdict(load), "prediction": predict(load)} for load in FULL_LOADS]
    write_report(out, {"schema": SCHEMA + "-predictions", "loads": rows})
    print(f"{len(rows)} predictions -> {out}")


def run(python: str, work: Path, out: Path) -> int:
    import os
    import platform

    from .buffers import SCHEMA
    from .logparse import memory_lines, parse
    from .run import _versions

    rows = []
    by_file: dict[tuple[str, str], list[FullLoad]] = {}
    for load in FULL_LOADS:
        by_file.setdefault((load.config, load.weight_type), []).append(load)
    work.mkdir(parents=True, exist_ok=True)
    for (config, weight_type), loads in by_file.items():
        cfg = work / f"{config}.config.json"
        cfg.write_text(json.dumps(config_of(loads[0])))
        gguf_path = work / f"{config}-{weight_type}.gguf"
        subprocess.run([python, "-m", "measure.llamacpp.gguf_writer", str(cfg), str(gguf_path), "--arch",
                        loads[0].arch, "--full", weight_type], cwd=ROOT, check=True, capture_output=True)
        size = gguf_path.stat().st_size
        for load in loads:
            settings = {**asdict(load), "model": config, "swa_full": False, "n_threads": 1}
            proc = subprocess.run([python, "-m", "measure.llamacpp.child", str(gguf_path), json.dumps(settings)],
                                  cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
            lines = memory_lines(proc.stderr.replace(f"{gguf_path.parent}/", ""))
            outcome = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
            rows.append({"load": settings, "gguf_bytes": size, "exit_status": proc.returncode,
                         "model_loaded": outcome.get("model_loaded", False),
                         "context_made": outcome.get("context_made", False), "lines": lines,
                         "figures": parse(lines)})
            print(f"{load.id}: {[(b['device'], b['kind'], b['mib']) for b in rows[-1]['figures']['buffers']]}",
                  flush=True)
        gguf_path.unlink()
    report = {"schema": SCHEMA, "device": {"name": f"CPU ({platform.machine()}, {os.cpu_count()} cores)",
                                           "kind": "cpu"},
              "engine": _versions(python), "predictions": "measure/llamacpp/full-predictions.json", "loads": rows}
    write_report(out, report)
    print(f"{len(rows)} loads -> {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure.llamacpp.full", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("predict")
    r = sub.add_parser("run")
    r.add_argument("--python", required=True, help="an interpreter with llama-cpp-python and gguf")
    r.add_argument("--work", type=Path, required=True, help="where the full-size GGUFs go (deleted after)")
    r.add_argument("--out", type=Path, default=REPORT)
    c = sub.add_parser("check")
    c.add_argument("report", type=Path, nargs="?", default=None)
    args = ap.parse_args(argv)
    if args.cmd == "predict":
        write_predictions()
        return 0
    if args.cmd == "run":
        return run(args.python, args.work, args.out)
    from . import cuda
    from .buffers import problems

    reports = [args.report] if args.report else [REPORT, *([cuda.REPORT] if cuda.REPORT.exists() else [])]
    failed = 0
    for path in reports:
        found = problems(json.loads(path.read_text()))
        for line in found:
            print(f"{path.name}: {line}")
        failed += bool(found)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""The panel's loads, each in its own process, into one report (measure/reports/llamacpp-cpu-loads.json).

    python -m measure.llamacpp run --python PATH/TO/llama-venv/bin/python [--work DIR] [--only SUBSTRING]
    python -m measure.llamacpp check [REPORT]     # re-read every raw line and hold kvsize to it

--python is an interpreter with llama-cpp-python 0.3.36 (built from source: `pip install llama-cpp-python==0.3.36`)
and gguf 0.19.0; kvsize itself needs neither. Each load writes (once per model) a miniature GGUF from the model's
config.json as published (profiles/models/), then makes one context with the load's settings and keeps every memory
line llama.cpp printed. swa_full is off, as llama-server and llama-cli leave it (common/common.h), and one thread is
used (threads size no cache).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from sizing.profiles import model_profile

from . import report as report_mod
from .logparse import memory_lines, parse
from .panel import panel

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "measure" / "reports" / "llamacpp-cpu-loads.json"
SWA_FULL = False  # common/common.h: swa_full = false for llama-server and llama-cli
TIMEOUT_S = 300


def _gguf(model: str, arch: str, work: Path, python: str) -> Path:
    out = work / f"{model}.gguf"
    if not out.exists():
        config = work / f"{model}.config.json"
        config.write_text(json.dumps(model_profile(model).config))
        subprocess.run([python, "-m", "measure.llamacpp.gguf_writer", str(config), str(out), "--arch", arch],
                       cwd=ROOT, check=True, capture_output=True)
    return out


def run_load(load, work: Path, python: str) -> dict:
    gguf_path = _gguf(load.model, load.arch, work, python)
    settings = {**load.as_dict(), "swa_full": SWA_FULL, "n_threads": 1}
    proc = subprocess.run([python, "-m", "measure.llamacpp.child", str(gguf_path), json.dumps(settings)],
                          cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT_S)
    # the GGUF's folder is this machine's: the lines keep its file name only (no figure is in the path)
    lines = memory_lines(proc.stderr.replace(f"{gguf_path.parent}/", ""))
    outcome = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 and proc.stdout.strip() \
        else {"model_loaded": False, "context_made": False}
    return {"load": settings, "gguf_bytes": gguf_path.stat().st_size, "exit_status": proc.returncode,
            "model_loaded": outcome["model_loaded"], "context_made": outcome["context_made"],
            "llama_cpp_python": outcome.get("llama_cpp_python"), "lines": lines, "figures": parse(lines)}


def _versions(python: str) -> dict:
    code = ("import json, llama_cpp, gguf, importlib.metadata as m; print(json.dumps({'llama_cpp_python': "
            "llama_cpp.__version__, 'gguf': m.version('gguf'), 'system_info': "
            "llama_cpp.llama_print_system_info().decode()}))")
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(python: str, work: Path, only: str | None, out: Path) -> int:
    loads = [load for load in panel() if not only or only in load.id]
    rows = []
    for i, load in enumerate(loads, 1):
        row = run_load(load, work, python)
        rows.append(row)
        f = row["figures"]
        state = "refused: " + f["refusal"] if f["refusal"] else f"{len(f['caches'])} cache(s)"
        print(f"[{i}/{len(loads)}] {load.id}: {state}", flush=True)
    report = {"schema": report_mod.SCHEMA,
              "device": {"name": f"CPU ({platform.machine()}, {os.cpu_count()} cores)", "kind": "cpu"},
              "engine": _versions(python),
              "predictions": "measure/llamacpp/predictions.json",
              "loads": rows}
    out.write_text(json.dumps(report, indent=1) + "\n")
    problems = report_mod.problems(report)
    print(f"{len(rows)} loads -> {out}; {len(problems)} disagreement(s) with kvsize")
    for line in problems[:40]:
        print("  " + line)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m measure.llamacpp", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--python", required=True, help="an interpreter with llama-cpp-python and gguf")
    r.add_argument("--work", type=Path, default=None, help="where the miniature GGUFs go (default: a temp dir)")
    r.add_argument("--only", default=None, help="only the loads whose id holds this text")
    r.add_argument("--out", type=Path, default=REPORT)
    c = sub.add_parser("check")
    c.add_argument("report", type=Path, nargs="?", default=REPORT)
    args = ap.parse_args(argv)
    if args.cmd == "check":
        problems = report_mod.problems(json.loads(args.report.read_text()))
        for line in problems:
            print(line)
        return 1 if problems else 0
    if args.work is None:
        with tempfile.TemporaryDirectory() as tmp:
            return run(args.python, Path(tmp), args.only, args.out)
    args.work.mkdir(parents=True, exist_ok=True)
    return run(args.python, args.work, args.only, args.out)


if __name__ == "__main__":
    sys.exit(main())

"""The golden file: kvsize's own answers (estimate, compare, plan, check-log) for about 200 scenarios, as the CLI
prints them, so that a change meant to move no behaviour (a restructuring) can be held to them byte for byte.

    python scripts/golden.py            # rewrites tests/fixtures/golden/answers.json
    python scripts/golden.py --check    # exit 1 and name the scenarios whose answer moved

Each scenario is a kvsize command line; its answer is the exit status, stdout, stderr and any file it wrote.
The scenarios cover every bundled model, five GPUs, vLLM 0.20-0.33, SGLang, TensorRT-LLM, LMDeploy, llama.cpp,
bf16/fp8/int4/nvfp4 and TP 1/2/4 and PP 2; a scenario that kvsize refuses is kept with its refusal.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "fixtures" / "golden" / "answers.json"
FIXTURES = "tests/fixtures"

GPUS = ("h100-sxm", "h200", "b200", "l40s", "a100-80gb")
VLLM = ("vllm@0.20.0", "vllm@0.22.0", "vllm@0.25.1", "vllm@0.26.0", "vllm@0.27.1", "vllm@0.30.0", "vllm@0.33.0")
ENGINES = VLLM + ("sglang", "trtllm", "lmdeploy", "llamacpp")
KV = ("auto", "fp8", "int4_per_token_head", "nvfp4", "bf16")
CONTEXTS = ("4k", "32k", "128k")
PARALLEL = (("1", "1"), ("2", "1"), ("4", "1"), ("1", "2"))


def bundled_models() -> list[str]:
    return sorted(p.stem for p in (ROOT / "profiles" / "models").glob("*.json"))


def estimate_lines() -> list[list[str]]:
    """Each model under several settings; the settings walk the grid so every axis value meets many models."""
    lines = []
    models = bundled_models()
    step = 0
    for model in models:
        for turn in range(6):
            gpu = GPUS[(step + turn) % len(GPUS)]
            engine = ENGINES[(step * 5 + turn * 3) % len(ENGINES)]
            kv = KV[(step + 2 * turn) % len(KV)]
            ctx = CONTEXTS[(step + turn) % len(CONTEXTS)]
            tp, pp = PARALLEL[(step + turn * 7) % len(PARALLEL)]
            step += 1
            lines.append(["estimate", "--model", model, "--gpu", gpu, "--engine", engine, "--kv-cache-dtype", kv,
                          "--max-model-len", ctx, "--tensor-parallel-size", tp, "--pipeline-parallel-size", pp,
                          "--concurrency", "8", "--format", "json"])
        # and settings under which most models are served, so the successful path is covered as well as refusals
        for gpu, engine, kv, tp in (("h200", "vllm", "auto", "8"), ("h100-sxm", "sglang", "fp8", "8"),
                                    ("b200", "vllm@0.33.0", "nvfp4", "8"), ("h200", "vllm@0.26.0", "fp8", "2")):
            lines.append(["estimate", "--model", model, "--gpu", gpu, "--engine", engine, "--kv-cache-dtype", kv,
                          "--max-model-len", "8k", "--tensor-parallel-size", tp, "--concurrency", "1",
                          "--format", "json"])
    return lines


def compare_lines() -> list[list[str]]:
    lines = []
    for i, model in enumerate(bundled_models()[::2]):
        gpu = GPUS[i % len(GPUS)]
        engine = ("vllm", "sglang", "vllm@0.26.0", "trtllm", "llamacpp")[i % 5]
        lines.append(["compare", "--model", model, "--gpu", gpu, "--engine", engine, "--max-model-len", "32k",
                      "--concurrency", "16", "--format", "json"])
    return lines


def plan_lines() -> list[list[str]]:
    workloads = ("examples/workload.yaml", "examples/multi-turn-chat.yaml", "examples/shared-prefix.yaml")
    cases = (
        ("llama-3.1-8b", "h100-sxm,h200,l40s", "vllm", "auto,fp8"),
        ("qwen3-8b", "h100-sxm,h200", "sglang", "auto,fp8"),
        ("llama-3.1-70b", "h100-sxm,h200", "vllm", "auto,fp8"),
        ("qwen3-30b-a3b", "h200,b200", "vllm", "auto,fp8,nvfp4"),
        ("deepseek-v2", "h200", "vllm", "auto"),
        ("gpt-oss-20b", "h100-sxm,a100-80gb", "vllm", "auto"),
        ("mistral-7b-v0.1", "l40s,a100-80gb", "vllm@0.26.0", "auto,fp8"),
        ("gemma-3-27b-it", "h200", "vllm", "auto,fp8"),
    )
    lines = []
    for i, (model, gpus, engine, formats) in enumerate(cases):
        lines.append(["plan", "--workload", workloads[i % len(workloads)], "--model", model, "--gpus", gpus,
                      "--engine", engine, "--formats", formats, "--out", "{out}.json"])
    return lines


def check_log_lines() -> list[list[str]]:
    lines = []
    manifest = ROOT / FIXTURES / "vllm-starts" / "manifest.jsonl"
    records = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    for record in records[::8]:
        if record.get("status") != "sized":
            continue
        lines.append(["check-log", f"{FIXTURES}/vllm-starts/{record['log']}", "--model",
                      f"{FIXTURES}/vllm-starts/{record['config']}", "--gpu", record["gpu"], "--format", "json"])
    manifest = ROOT / FIXTURES / "sglang-starts" / "manifest.jsonl"
    records = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    for record in records[::6]:
        config = record.get("config")
        if not config or record.get("status", "sized") != "sized":
            continue
        lines.append(["check-log", f"{FIXTURES}/sglang-starts/{record['log']}", "--model",
                      f"{FIXTURES}/sglang-starts/{config}", "--gpu", record["gpu"], "--format", "json"])
    for log, model, gpu in (("vllm-0.19-llama-3.1-8b-h100.log", "llama-3.1-8b", "h100-sxm"),
                            ("sglang-0.4-llama-3.1-8b-h100.log", "llama-3.1-8b", "h100-sxm"),
                            ("trtllm-0.8-llama-2-7b-a100.log", "llama-2-7b", "a100-80gb")):
        lines.append(["check-log", f"{FIXTURES}/{log}", "--model", model, "--gpu", gpu, "--format", "json"])
    return lines


def scenarios() -> list[list[str]]:
    return estimate_lines() + compare_lines() + plan_lines() + check_log_lines()


def answer(argv: list[str]) -> dict:
    from app.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out_stem = os.path.join(tmp, "answer")
        real = [a.replace("{out}", out_stem) for a in argv]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(real)
        written = {}
        for name in sorted(os.listdir(tmp)):
            written[name] = Path(tmp, name).read_text()
    return {"argv": argv, "exit": code, "stdout": stdout.getvalue().replace(tmp, "{tmp}"),
            "stderr": stderr.getvalue().replace(tmp, "{tmp}"), "files": written}


def answers() -> list[dict]:
    cwd = os.getcwd()
    os.chdir(ROOT)
    try:
        return [answer(argv) for argv in scenarios()]
    finally:
        os.chdir(cwd)


def render(records: list[dict]) -> str:
    return json.dumps(records, indent=1, sort_keys=True) + "\n"


def moved(expected: list[dict], got: list[dict]) -> list[str]:
    """The command lines whose answer differs from the golden file's, or that either side lacks."""
    old = {json.dumps(r["argv"]): r for r in expected}
    new = {json.dumps(r["argv"]): r for r in got}
    return sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k))


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(ROOT))
    records = answers()
    if "--check" in argv:
        expected = json.loads(GOLDEN.read_text())
        changed = moved(expected, records)
        for line in changed:
            print(f"moved: {line}")
        print(f"{len(records) - len(changed)} of {len(records)} answers as in the golden file")
        return 1 if changed else 0
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    tmp = GOLDEN.with_suffix(".json.tmp")
    tmp.write_text(render(records))
    tmp.replace(GOLDEN)
    print(f"wrote {len(records)} answers to {GOLDEN.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

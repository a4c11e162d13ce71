"""Add a batch of real SGLang starts to tests/fixtures/sglang-starts: each log kept whole, one manifest line a start.

usage: python scripts/sglang_corpus_ingest.py PLAN.json LOG_DIR GPU_NAME NVML_TOTAL_MIB
PLAN.json is what scripts/sglang_corpus_plan.py wrote for the batch; LOG_DIR holds one TAG.log a start as the
staging tool's srun.sh wrote them. The manifest line records the ServerArgs the engine received (the plan's, the
tool's defaults, and the mem_fraction_static the tool took from SGLang's own CUDA-graph default where the plan
gave none) and what SGLang printed, read with this script's own patterns (not kvsize's log reader, which the
tests hold against them).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measure.verify import bundled_gpu  # noqa: E402
from sizing.evidence.sglang_starts import CORPUS, load_corpus  # noqa: E402

# srun.py's defaults (the staging tool): dummy weights, no tokenizer, triton attention, CUDA graphs off
TOOL_DEFAULTS = {"load_format": "dummy", "skip_tokenizer_init": True, "attention_backend": "triton",
                 "sampling_backend": "pytorch", "disable_cuda_graph": True}


def _all(pattern: str, text: str, cast=str) -> list:
    return [cast(x) for x in re.findall(pattern, text)]


def printed(text: str) -> dict:
    out = {
        "graphs_default_fraction": _all(r"SRUN-GRAPHS-DEFAULT mem_fraction_static ([\d.]+)", text),
        # ServerArgs(... mem_fraction_static=0.9 ...) up to 0.5.2x; a dict ({... 'mem_fraction_static': 0.9 ...}) in 0.5.23
        "mem_fraction_static": _all(r"server_args=ServerArgs\(.*?mem_fraction_static=([\d.]+)", text)
        or _all(r"server_args=\{.*?'mem_fraction_static': ([\d.]+)", text),
        "max_total_num_tokens": _all(r"max_total_num_tokens=(\d+)", text, int),
        "pool_tokens": _all(r"KV Cache is allocated\..*?#tokens: (\d+)", text, int),
        "avail_begin_gib": _all(r"Load weight begin\. avail mem=([\d.]+) GB", text),
        "weights_gib": _all(r"Load weight end\..*?mem usage=([\d.]+) GB", text),
        "kv_gib": [f"{float(k) + float(v):.2f}" for k, v in re.findall(r"K size: ([\d.]+) GB, V size: ([\d.]+) GB", text)]
        + _all(r"KV Cache is allocated\..*? KV size: ([\d.]+) GB", text),
    }
    return {k: v for k, v in out.items() if v}


def failure(text: str) -> str | None:
    hits = [ln.strip() for ln in text.splitlines() if re.search(r"(Error|Exception):", ln) and "Traceback" not in ln
            and "Ignore import error" not in ln]
    return hits[-1][:400] if hits else None


def main(argv: list[str]) -> int:
    plan, logs, gpu_name, nvml = json.loads(Path(argv[1]).read_text()), Path(argv[2]), argv[3], int(argv[4])
    gpu = bundled_gpu(gpu_name, nvml)
    (CORPUS / "logs").mkdir(parents=True, exist_ok=True)
    manifest = CORPUS / "manifest.jsonl"
    known = {s.id for s in load_corpus()} if manifest.exists() else set()
    added = 0
    with open(manifest, "a") as out:
        for row in plan:
            log = logs / f"{row['id']}.log"
            sid = f"{gpu}-{row['id']}"
            if sid in known or not log.exists():
                continue
            text = log.read_text(errors="replace")
            shutil.copyfile(log, CORPUS / "logs" / f"{sid}.log")
            seen = printed(text)
            args = {**TOOL_DEFAULTS, **row["args"]}
            if "mem_fraction_static" not in row["args"] and seen.get("graphs_default_fraction"):
                args["mem_fraction_static"] = float(seen["graphs_default_fraction"][0])
            entry = {"id": sid, "version": row["version"], "gpu": gpu, "gpu_name": gpu_name, "nvml_total_mib": nvml,
                     "gpus_used": int(row["args"].get("tp_size", 1)), "config": f"../vllm-starts/{row['config'].split('vllm-starts/')[1]}",
                     "args": args, "log": f"logs/{sid}.log",
                     "status": "sized" if seen.get("max_total_num_tokens") or seen.get("pool_tokens") else "failed",
                     "printed": seen}
            if entry["status"] != "sized":
                entry["reason"] = failure(text) or "the log ends before SGLang's max_total_num_tokens line"
            elif not seen.get("max_total_num_tokens"):
                # the scheduler prints the pool's size again once its warm-ups are done; every start that printed
                # both lines printed the same figure
                entry["reason"] = ("the log ends after the KV pool's '#tokens' line, before the scheduler's "
                                   "max_total_num_tokens line: the pool's figure is the one held")
            out.write(json.dumps(entry, sort_keys=True) + "\n")
            added += 1
    print(f"added {added} starts to {manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Add a batch of real vLLM starts to tests/fixtures/vllm-starts: each log kept whole, one manifest line a start.

usage: python scripts/vllm_corpus_ingest.py STARTS.jsonl LOG_DIR
       python scripts/vllm_corpus_ingest.py --refresh-reasons | --refresh-pipeline-printed
STARTS.jsonl and LOG_DIR are what `python -m measure.vllm_start` wrote on the GPU machine. The
manifest line holds the start's settings and what vLLM printed, read with patterns of this script's
own (not kvsize's log reader, which the tests hold against them).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from measure.verify import bundled_gpu  # noqa: E402
from sizing.evidence.starts import CORPUS, load_corpus  # noqa: E402


PP_WORKER = re.compile(r"\(Worker_PP(\d+)(?:_TP\d+)? pid=")


def last_stage(text: str) -> str:
    """A pipeline-parallel log's lines of its last stage's workers and of no stage (the engine's own): that stage
    builds the sampler and its pool is the one vLLM serves. Any other log as it is."""
    stages = {int(s) for s in PP_WORKER.findall(text)}
    if len(stages) < 2:
        return text
    return "\n".join(ln for ln in text.splitlines()
                     if (m := PP_WORKER.search(ln)) is None or int(m.group(1)) == max(stages))


def printed(text: str) -> dict:
    """vLLM's memory lines as printed (numbers kept as the text shows them); one entry per rank where
    each worker prints its own, of the last stage's ranks in a pipeline-parallel log."""
    text = last_stage(text)
    out = {
        "version": (re.findall(r"kvsize-start: vllm (\S+)", text) or [None])[0],
        "runner": "v2" if re.search(r"\[(?:v1/worker/gpu/)?model_runner\.py:", text) else "v1",
        "model_loading_gib": re.findall(r"Model loading took ([\d.]+) GiB", text),
        # the V1 runner's estimate, or (0.29+) the V2 runner's, printed once the graphs are captured
        "cuda_graph_gib": re.findall(r"Estimated CUDA graph memory: ([\d.]+) GiB total", text)
        or re.findall(r"CUDA graph pool memory: [\d.]+ GiB \(actual\), ([\d.]+) GiB \(estimated\)", text),
        "available_kv_gib": re.findall(r"Available KV cache memory: ([\d.]+) GiB", text),
        "kv_cache_tokens": [int(x.replace(",", "")) for x in re.findall(r"GPU KV cache size: ([\d,]+) tokens", text)],
        "max_concurrency": re.findall(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x", text),
        # DEBUG lines (the launcher sets VLLM_LOGGING_LEVEL=DEBUG): the profiling result and CUDA's total
        "torch_peak_gib": re.findall(r"torch peak memory increase: ([\d.]+) ?GiB", text),
        # weights + torch peak + non-torch, where vLLM prints no non-torch line of its own (0.27+)
        "non_kv_gib": re.findall(r"Total non KV cache memory: ([\d.]+) ?GiB", text),
        "non_torch_gib": re.findall(r"non-torch forward increase memory: ([\d.]+) ?GiB", text),
        "cuda_total_gib": re.findall(r"init memory snapshot: .*?total_memory=([\d.]+)GiB", text),
    }
    return {k: v for k, v in out.items() if v not in ([], None)}


def failure(text: str) -> str | None:
    """The error that stopped the start: the last exception line, with the line that explains a
    validation error (pydantic puts the reason on the next line)."""
    lines = text.splitlines()
    hits = [i for i, ln in enumerate(lines) if re.search(r"(Error|Exception):", ln)
            and "Traceback" not in ln and "c10::Error" not in ln and "Engine core initialization failed" not in ln]
    if not hits:
        return None
    i = hits[-1]
    reason = lines[i].strip()
    if "validation error" in reason and i + 1 < len(lines):
        reason += " " + lines[i + 1].strip()
    return reason[:400]


def main(argv: list[str]) -> int:
    starts, logs = Path(argv[1]), Path(argv[2])
    (CORPUS / "logs").mkdir(parents=True, exist_ok=True)
    manifest = CORPUS / "manifest.jsonl"
    known = {start.id for start in load_corpus()} if manifest.exists() else set()
    added = 0
    with open(manifest, "a") as out:
        for line in starts.read_text().splitlines():
            row = json.loads(line)
            if row["status"] == "not started":
                continue
            gpu = bundled_gpu(row["gpu"], row["nvml_total_mib"])
            sid = f"{gpu}-{row['id']}"
            if sid in known:
                continue
            text = (logs / f"{row['id']}.log").read_text(errors="replace")
            shutil.copyfile(logs / f"{row['id']}.log", CORPUS / "logs" / f"{sid}.log")
            entry = {
                "id": sid, "release": row["release"], "gpu": gpu, "gpu_name": row["gpu"],
                "nvml_total_mib": row["nvml_total_mib"], "gpus_used": len(row["gpu_ids"]),
                "config": f"configs/{Path(row['config']).name}", "context": row["context"], "args": row["args"],
                "log": f"logs/{sid}.log", "status": row["status"], "printed": printed(text),
            }
            if row["status"] != "sized":
                entry["reason"] = failure(text) or "the log ends before vLLM's KV lines"
            out.write(json.dumps(entry, sort_keys=True) + "\n")
            added += 1
    print(f"added {added} starts to {manifest}")
    return 0


def refresh_reasons() -> None:
    """Re-read the reason of every start that did not size (after this script's reading improves)."""
    manifest = CORPUS / "manifest.jsonl"
    rows = [json.loads(ln) for ln in manifest.read_text().splitlines() if ln.strip()]
    for row in rows:
        if row["status"] != "sized":
            row["reason"] = failure((CORPUS / row["log"]).read_text(errors="replace")) or row.get("reason")
    manifest.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def refresh_pipeline_printed() -> None:
    """Re-read what the pipeline-parallel starts printed (after printed() learned to keep their last stage)."""
    manifest = CORPUS / "manifest.jsonl"
    rows = [json.loads(ln) for ln in manifest.read_text().splitlines() if ln.strip()]
    for row in rows:
        if row["status"] == "sized" and int(row["args"].get("pipeline_parallel_size", 1)) > 1:
            row["printed"] = printed((CORPUS / row["log"]).read_text(errors="replace"))
    manifest.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


if __name__ == "__main__":
    if sys.argv[1:] == ["--refresh-reasons"]:
        sys.exit(refresh_reasons())
    if sys.argv[1:] == ["--refresh-pipeline-printed"]:
        sys.exit(refresh_pipeline_printed())
    sys.exit(main(sys.argv))

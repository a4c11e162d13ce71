"""The committed step traces (measure/step_trace.py's lines, kept beside a serving batch's points as steps.tsv.gz)
grouped for the simulation's step to be held to them: decode-only steps by the requests decoding, steps with prompt
chunks by their prompt tokens, each group's measured step beside the simulated one (benchmarks/step_trace.py prints
them; scripts/fit_serving_terms.py fits the engine's KV read share of a GPU on them).

A decoding request's cached tokens are taken as its prompt plus half its output (the steady state of fixed lengths),
the only figure the trace does not hold.
"""

from __future__ import annotations

import gzip
import json
import statistics
from dataclasses import replace

from sizing.evidence.serving import point_replica

from .serving import ROOT, SERVING
from .step_trace import read_steps

DECODING_BINS = (1, 16, 32, 64, 96, 128, 160, 192, 256, 320, 512)
PROMPT_BINS = (1, 256, 1024, 2048, 4096, 8193)
LEAST_STEPS = 20  # a group of fewer steps is not shown
LONGEST_S = 0.25  # a longer period is the engine waiting for work, not a step


def traced_servers() -> list[dict]:
    plan = json.loads((SERVING / "plan.json").read_text())
    return [s for s in plan["servers"] if s.get("step_trace") and (SERVING / s["batch"] / s["tag"] / "steps.tsv.gz").exists()]


def point_windows(server: dict) -> list[tuple[float, float, dict]]:
    """(start, end, point) of each point the server ran, from its meta file and the bench's duration."""
    out = []
    folder = SERVING / server["batch"] / server["tag"]
    for p in server["points"]:
        meta = folder / f"{p['id']}.meta.json"
        raw = folder / f"{p['id']}.json.gz"
        if meta.exists() and raw.exists():
            started = json.loads(meta.read_text())["started"]
            duration = json.loads(gzip.decompress(raw.read_bytes()))["duration"]
            out.append((started, started + duration + 5.0, p))
    return out


def _bin(value: int, edges: tuple[int, ...]) -> tuple[int, int] | None:
    for lo, hi in zip(edges, edges[1:]):
        if lo <= value < hi:
            return lo, hi
    return None


def server_settings(server: dict) -> dict:
    """The settings of a traced server as a point of it gives them to the simulation (the GPU from its batch's
    nvidia-smi line)."""
    settings = {**{k: server[k] for k in ("config", "tensor_parallel_size", "kv_cache_dtype", "max_model_len",
                                          "max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization")},
                "vllm_version": json.loads((SERVING / "plan.json").read_text())["vllm_version"],
                "max_cudagraph_capture_size": server.get("max_cudagraph_capture_size"),
                "api_server_count": server.get("api_server_count")}
    env = (SERVING / server["batch"] / "env.txt").read_text()
    settings["gpu_name"] = next(line.split(",")[1].strip() for line in env.splitlines() if line.startswith("0,"))
    return settings


def server_rows(server: dict, terms: dict | None = None) -> tuple[list[dict], list[dict]]:
    """(decode-only groups, prompt-chunk groups) of one traced server, simulated with the fitted terms unless
    `terms` gives trial ones."""
    steps = read_steps(SERVING / server["batch"] / server["tag"] / "steps.tsv.gz")
    windows = point_windows(server)
    model, _ = point_replica(server_settings(server), ROOT, terms=terms)
    gpu_only = replace(model, floor_s=0.0, core_s_per_token=0.0, api_s_per_token=0.0)
    decode, prompt = {}, {}
    for step in steps:
        if step.period_s is None or step.period_s > LONGEST_S:
            continue
        point = next((p for t0, t1, p in windows if t0 <= step.scheduled_at <= t1), None)
        if point is None:
            continue
        cached = point["input_len"] + point["output_len"] // 2
        if step.prompt_requests == 0:
            key = _bin(step.decoding, DECODING_BINS)
            if key:
                decode.setdefault(key, []).append((step, cached))
        else:
            key = _bin(step.prompt_tokens, PROMPT_BINS)
            if key:
                prompt.setdefault(key, []).append((step, cached))
    return ([_decode_row(model, gpu_only, key, group) for key, group in sorted(decode.items())
             if len(group) >= LEAST_STEPS],
            [_prompt_row(model, key, group) for key, group in sorted(prompt.items()) if len(group) >= LEAST_STEPS])


def _decode_row(model, gpu_only, key, group) -> dict:
    g = int(statistics.median(s.decoding for s, _ in group))
    cached = int(statistics.median(c for _, c in group))
    return dict(bin=key, steps=len(group), decoding=g,
                measured_ms=1e3 * statistics.median(s.period_s for s, _ in group),
                simulated_ms=1e3 * model.decode_seconds(g, g * cached),
                gpu_ms=1e3 * gpu_only.decode_seconds(g, g * cached), host_ms=1e3 * model.host_seconds(g),
                schedule_ms=1e3 * statistics.median(s.schedule_s for s, _ in group),
                update_ms=1e3 * statistics.median(s.update_s for s, _ in group))


def _prompt_row(model, key, group) -> dict:
    g = int(statistics.median(s.decoding for s, _ in group))
    tokens = int(statistics.median(s.prompt_tokens for s, _ in group))
    cached = int(statistics.median(c for _, c in group))
    return dict(bin=key, steps=len(group), decoding=g, prompt_tokens=tokens,
                measured_ms=1e3 * statistics.median(s.period_s for s, _ in group),
                simulated_ms=1e3 * model.seconds(g, g * cached, [(0, tokens)]))

"""The engine core's own steps (measure/step_trace.py's trace, kept beside a serving batch's points) against the step
kvsize's serving simulation gives the same step (sizing/planners/step_model.py).

For each traced server: its decode-only steps (no prompt chunk in them) grouped by the requests decoding, the
measured step (the time from one step's update to the next one's, the engine busy) against the simulated one, with
the simulation's GPU and host parts beside it, and the engine core's own scheduling and output update; then its
steps that carry prompt chunks, grouped by the chunk tokens. A decoding request's cached tokens are taken as its
prompt plus half its output (the steady state of fixed lengths), the only figure the trace does not hold.

    python benchmarks/step_trace.py            # the tables
    python benchmarks/step_trace.py --write    # docs/step-trace.md, which a test holds to report()
"""

from __future__ import annotations

import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.serving import SERVING  # noqa: E402
from measure.step_trace import read_steps  # noqa: E402
from sizing.evidence.serving import point_replica  # noqa: E402

DECODING_BINS = (1, 16, 32, 64, 96, 128, 160, 192, 256, 320, 512)
PROMPT_BINS = (1, 256, 1024, 2048, 4096, 8193)
LEAST_STEPS = 20  # a group of fewer steps is not shown
LONGEST_S = 0.25  # a longer period is the engine waiting for work, not a step


def traced_servers() -> list[dict]:
    plan = json.loads((SERVING / "plan.json").read_text())
    return [s for s in plan["servers"] if s.get("step_trace") and (SERVING / s["batch"] / s["tag"] / "steps.tsv.gz").exists()]


def point_windows(server: dict) -> list[tuple[float, float, dict]]:
    """(start, end, point) of each point the server ran, from its meta file and the bench's duration."""
    import gzip

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


def server_rows(server: dict) -> tuple[list[dict], list[dict]]:
    """(decode-only groups, prompt-chunk groups) of one traced server."""
    steps = read_steps(SERVING / server["batch"] / server["tag"] / "steps.tsv.gz")
    windows = point_windows(server)
    settings = {**{k: server[k] for k in ("config", "tensor_parallel_size", "kv_cache_dtype", "max_model_len",
                                          "max_num_batched_tokens", "max_num_seqs", "gpu_memory_utilization")},
                "vllm_version": json.loads((SERVING / "plan.json").read_text())["vllm_version"],
                "gpu_name": "NVIDIA H200", "max_cudagraph_capture_size": server.get("max_cudagraph_capture_size"),
                "api_server_count": server.get("api_server_count")}
    env = (SERVING / server["batch"] / "env.txt").read_text()
    settings["gpu_name"] = next(line.split(",")[1].strip() for line in env.splitlines() if line.startswith("0,"))
    model, _ = point_replica(settings, ROOT)
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


def _err(row: dict) -> str:
    return f"{row['simulated_ms'] / row['measured_ms'] - 1:+.0%}"


def report() -> str:
    out = ["# The engine core's steps, timed",
           "",
           "Written by `python benchmarks/step_trace.py --write` from the step traces kept beside the serving points "
           "(`measure/serving/<batch>/<server>/steps.tsv.gz`, written inside vLLM's engine core by "
           "`measure/step_trace.py`). A step's measured length is the time from one step's output update to the "
           "next one's while the engine is busy; the simulated one is `sizing/planners/step_model.py`'s for the same "
           "requests decoding and prompt tokens, each decoding request taken to hold its prompt and half its output. "
           "GPU and host are the simulation's two parts (the step is the longer); schedule and update are the engine "
           "core's own `schedule()` and `update_from_output()` calls, timed inside it.", ""]
    for server in traced_servers():
        decode, prompt = server_rows(server)
        api = server.get("api_server_count") or 1
        out += [f"## {server['tag']}", "",
                f"{server['model']}, batch {server['batch']}, {api} API server{'s' if api > 1 else ''}: "
                f"{sum(r['steps'] for r in decode):,} decode-only steps and {sum(r['steps'] for r in prompt):,} "
                "with prompt chunks shown.", "",
                "| requests decoding | steps | measured ms | simulated ms | error | GPU ms | host ms | schedule ms "
                "| update ms |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        out += [f"| {r['bin'][0]}-{r['bin'][1] - 1} (median {r['decoding']}) | {r['steps']:,} | {r['measured_ms']:.2f} "
                f"| {r['simulated_ms']:.2f} | {_err(r)} | {r['gpu_ms']:.2f} | {r['host_ms']:.2f} "
                f"| {r['schedule_ms']:.2f} | {r['update_ms']:.2f} |" for r in decode]
        out += ["", "| prompt tokens in the step | steps | requests decoding (median) | prompt tokens (median) "
                "| measured ms | simulated ms | error |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        out += [f"| {r['bin'][0]}-{r['bin'][1] - 1} | {r['steps']:,} | {r['decoding']} | {r['prompt_tokens']:,} "
                f"| {r['measured_ms']:.2f} | {r['simulated_ms']:.2f} | {_err(r)} |" for r in prompt]
        out += ["", _summary(decode, prompt), ""]
    return "\n".join(out)


def _summary(decode: list[dict], prompt: list[dict]) -> str:
    """The step-weighted mean error of each kind of step, and the engine core's own calls per request decoding
    (a least-squares line over the decode-only groups)."""
    def mean_error(rows):
        return sum(r["steps"] * (r["simulated_ms"] / r["measured_ms"] - 1) for r in rows) / sum(r["steps"] for r in rows)

    xs = [r["decoding"] for r in decode]
    ys = [r["schedule_ms"] + r["update_ms"] for r in decode]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return (f"Simulated against measured, weighted by steps: decode-only {mean_error(decode):+.0%}, with prompt chunks "
            f"{mean_error(prompt):+.0%}. The engine core's schedule() and update_from_output() together: "
            f"{1e3 * slope:.1f} us per request decoding (least squares over the decode-only groups, "
            f"{my - slope * mx:+.2f} ms at none).")


def main(argv: list[str]) -> int:
    text = report()
    if "--write" in argv:
        page = ROOT / "docs" / "step-trace.md"
        tmp = page.with_suffix(".md.tmp")
        tmp.write_text(text)
        tmp.replace(page)
        print("wrote docs/step-trace.md")
    else:
        print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

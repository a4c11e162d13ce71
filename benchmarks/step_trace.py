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

import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.steps import (FLASH_KV_CACHE_DTYPES, LEAST_STEPS, climbs, committed_steps,  # noqa: E402
                           launch_rows, first_count_holds, lone_prompt_rows, server_rows, server_settings,
                           traced_servers)
from sizing.planners.serving import FIRST_USE_LIMIT, FIRST_USE_PAD  # noqa: E402


def _err(row: dict) -> str:
    return f"{row['simulated_ms'] / row['measured_ms'] - 1:+.0%}"


def report() -> str:
    out = ["# The engine core's steps, timed",
           "",
           "Written by `python benchmarks/step_trace.py --write` from the step traces kept beside the serving points "
           "(`measure/serving/<batch>/<server>/steps.tsv.gz`, written inside vLLM's engine core by "
           "`measure/step_trace.py`). A step's measured length is the time from one step's output update to the "
           "next one's while the engine is busy; the simulated one is `sizing/planners/step_model.py`'s for the same "
           "requests decoding and prompt tokens, each decoding request taken to hold its prompt and half its output, "
           "the prompt tokens placed where the point's stream of prompts had reached (its prompts end to end, one "
           "finished before the next starts: measure/steps.py prompt_chunks), so a chunk late in its prompt "
           "attends to all the tokens before it. "
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
                "| prompts (median) | measured ms | simulated ms | error |",
                "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        out += [f"| {r['bin'][0]}-{r['bin'][1] - 1} | {r['steps']:,} | {r['decoding']} | {r['prompt_tokens']:,} "
                f"| {r['prompt_requests']} | {r['measured_ms']:.2f} | {r['simulated_ms']:.2f} | {_err(r)} |"
                for r in prompt]
        out += ["", _summary(decode, prompt), ""]
    return "\n".join(out + _ahead() + _holds() + _launches())


def _ahead() -> list[str]:
    """The decode-only steps whose simulated length was committed before their batch ran, each count of requests
    a closed loop's steps passed through (its last requests finish one by one)."""
    out = ["## Decode steps predicted before seen", "",
           "Where a batch's predictions (`measure/serving/<batch>-sim-predictions-h200.json`, `decode_steps`) hold "
           "the simulated decode-only step of every count of requests up to a closed loop's, committed before the "
           "batch ran: each count's measured median step against that figure, and the counts where the committed "
           "step climbs by 5% or more (another round of segment programs, or another program an SM).", "",
           "| server | counts | within 10% | median error | climbs: requests, measured ms, committed ms |",
           "| --- | ---: | ---: | ---: | --- |"]
    found = False
    for server in traced_servers():
        rows = committed_steps(server)
        if not rows:
            continue
        found = True
        errors = [r["committed_ms"] / r["measured_ms"] - 1 for r in rows]
        steps = "; ".join(f"{b['decoding']} -> {a['decoding']}: {b['measured_ms']:.1f} -> {a['measured_ms']:.1f}, "
                          f"{b['committed_ms']:.1f} -> {a['committed_ms']:.1f}" for b, a in climbs(rows))
        out.append(f"| {server['tag']} | {len(rows)} | {sum(abs(e) <= 0.10 for e in errors)} "
                   f"| {statistics.median(errors):+.1%} | {steps or 'none'} |")
    return out + ([""] if found else ["| none yet | | | | |", ""])


def _holds() -> list[str]:
    """Where a step with prompt chunks first ran more requests (in FIRST_USE_PAD) than any such step of its server
    before: how often the step before had its output held back (its update late, the next one soon after)."""
    out = ["## First counts: the output held back", "",
           f"A step with prompt chunks whose requests, counted in {FIRST_USE_PAD}s, outnumber every such step its "
           "server ran before: where the engine core processed the step before's output late and this step's soon "
           "after (its period under 0.6 of the one before), that output was held back a step (measure/steps.py "
           "first_count_holds). The simulation holds it back at first counts under "
           f"{FIRST_USE_LIMIT} requests on one GPU (sizing/planners/serving.py FIRST_USE_PAD).", "",
           f"| server | GPUs | held, under {FIRST_USE_LIMIT} | held, {FIRST_USE_LIMIT} and more |",
           "| --- | ---: | ---: | ---: |"]
    totals = {1: [0, 0, 0, 0], 2: [0, 0, 0, 0]}  # held and first counts below the limit, then from it on
    for server in traced_servers():
        h = first_count_holds(server)
        tp = server["tensor_parallel_size"]
        side = totals[1 if tp == 1 else 2]
        side[:] = [a + b for a, b in zip(side, h["below"] + h["above"])]
        out.append(f"| {server['tag']} | {tp} | {h['below'][0]} of {h['below'][1]} | {h['above'][0]} of "
                   f"{h['above'][1]} |")
    one, more = totals[1], totals[2]
    out += ["", f"One GPU: held at {one[0]} of {one[1]} first counts under {FIRST_USE_LIMIT}, {one[2]} of {one[3]} "
            f"from it on; more than one GPU: {more[0]} of {more[1]} and {more[2]} of {more[3]}.", ""]
    return out


LAUNCH_BOUND = 1.5  # a step this many times its simulated GPU part, or longer, shows the host's launch


def _median_ms(values: list[float]) -> str:
    return f"{1e3 * statistics.median(values):.2f} ({len(values)})" if values else "-"


def _launches() -> list[str]:
    """The host's launch of a step with a prompt chunk, a layer at a time: under load, the period before a chunk past
    the largest graph and under it (measure/steps.py launch_rows); alone on an idle engine, a prompt step's own span
    where it outlasts its simulated GPU part (lone_prompt_rows)."""
    out = ["## The launch of a step with a prompt chunk", "",
           "Under async scheduling the engine core launches a step while the GPU runs the one before, and takes that "
           "step's tokens once the launch is done: under load, the period of a decode-only step before a chunk is "
           "the chunk's launch wherever it lasted more than twice the decode-only step after it (measure/steps.py "
           "launch_rows), past the largest CUDA graph (every kernel) and under it (the graph's pieces, each layer's "
           "attention launched between them); the simulation's `eager_layer_launch_s` and "
           "`piecewise_layer_launch_s` are the median over the dense models in bf16 and fp8 of each model's median "
           "(scripts/fit_serving_handling.py). Alone on an idle engine (the one-request points), a prompt step's "
           "span from "
           "schedule() to its update, where it lasted at least "
           f"{LAUNCH_BOUND:g} times the simulated GPU part (lone_prompt_rows): under the graph, each layer's "
           "attention is launched between the graph's pieces; past it, every kernel. Milliseconds a layer, the median "
           "(steps).", "",
           "| server | layers | under load, past the graph | under load, under the graph | alone, under the graph "
           "| alone, past the graph |",
           "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for server in traced_servers():
        launches = launch_rows(server)
        loaded = [r["launch_s"] / r["layers"] for r in launches if r["eager"]]
        under = [r["launch_s"] / r["layers"] for r in launches if not r["eager"]]
        # the dense models in the formats whose prompt attention runs in FlashAttention's kernels: the others' GPU
        # part is not what the simulation's prefill terms were fitted on alone
        flash = server_settings(server)["kv_cache_dtype"] in FLASH_KV_CACHE_DTYPES
        lone = [r for r in lone_prompt_rows(server) if flash and r["dense"]
                and r["span_s"] >= LAUNCH_BOUND * r["gpu_s"]]
        if len(loaded) < 3 and len(under) < 3 and not lone:
            continue
        layers = (lone or launches)[0]["layers"]
        out.append(f"| {server['tag']} | {layers} | {_median_ms(loaded) if len(loaded) >= 3 else '-'} "
                   f"| {_median_ms(under) if len(under) >= 3 else '-'} "
                   f"| {_median_ms([r['span_s'] / r['layers'] for r in lone if not r['eager']])} "
                   f"| {_median_ms([r['span_s'] / r['layers'] for r in lone if r['eager']])} |")
    return out + [""]


def _summary(decode: list[dict], prompt: list[dict]) -> str:
    """The step-weighted mean error of each kind of step, and the engine core's own calls per request decoding
    (a least-squares line over the decode-only groups)."""
    def mean_error(rows) -> str:
        if not rows:
            return f"none in groups of {LEAST_STEPS} or more"
        mean = sum(r["steps"] * (r["simulated_ms"] / r["measured_ms"] - 1) for r in rows) / sum(r["steps"] for r in rows)
        return f"{mean:+.0%}"

    xs = [r["decoding"] for r in decode]
    ys = [r["schedule_ms"] + r["update_ms"] for r in decode]
    head = (f"Simulated against measured, weighted by steps: decode-only {mean_error(decode)}, with prompt chunks "
            f"{mean_error(prompt)}.")
    if len(set(xs)) < 2:  # one count of requests decoding (a server that ran one point) draws no line
        return head + (" The engine core's schedule() and update_from_output() together: "
                       f"{statistics.fmean(ys):.2f} ms a step at {xs[0]} decoding." if xs else "")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return (head + " The engine core's schedule() and update_from_output() together: "
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

"""kvsize's serving simulation (sizing/planners/serving.py) against every measured point of a real vLLM server
(measure/serving/points.json): TTFT and ITL p50 and p99, output tokens per second, point by point and in summary.

    python benchmarks/serving_accuracy.py            # the table and the summary
    python benchmarks/serving_accuracy.py --summary  # the summary alone
    python benchmarks/serving_accuracy.py --write    # docs/speed-accuracy.md, which a test holds to report()

Points are split as the accuracy page reports them: the ones the simulation's constants were fitted on
(profiles/serving.json names them), and the rest, which the fit never saw but which were measured before the
simulation was written (so out of the fit, not predicted before seen). The predictions committed before each batch
ran came from kvsize's earlier speed model (measure/serving/comparison.md); their errors are printed beside. A batch
that ran after the simulation was written has its simulated figures committed before it ran
(measure/serving/<batch>-sim-predictions-<gpu>.json): the page holds those apart, as predicted before seen.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from sizing.evidence.bench import JOINED_CHUNKS  # noqa: E402
from sizing.evidence.serving import SPEED_BARS, held_to, predict_point, served_figures, served_settings  # noqa: E402
from sizing.evidence.slo_rate import Target, compared, most_held, target  # noqa: E402
from sizing.planners.step_model import step_overhead  # noqa: E402
from speed_misses import MISSES  # noqa: E402

SERVING = ROOT / "measure" / "serving"
POINTS = SERVING / "points.json"
PAGE = ROOT / "docs" / "speed-accuracy.md"
TABLE = ROOT / "measure" / "serving" / "simulated.json"  # the same rows as data, for the app's Validation tab
FIGURES = ("ttft_p50_ms", "itl_p50_ms", "ttft_p99_ms", "itl_p99_ms", "output_tokens_per_s")


def rows() -> list[dict]:
    fitted = set(step_overhead().fitted_on)
    out = []
    for p in json.loads(POINTS.read_text())["points"]:
        served = predict_point(served_settings(p), ROOT)
        st = p["settings"]
        row = dict(id=p["id"], group="fitted on" if p["id"] in fitted else "out of the fit",
                   loop=st["loop"], errors={}, batch=p["batch"],
                   pair=(p["batch"], st["model"], st["input_len"], st["output_len"], st["concurrency"]),
                   kv=st["kv_cache_dtype"], server=p["server"], lengths=(st["input_len"], st["output_len"]),
                   load=st["concurrency"] if st["loop"] == "closed" else st["request_rate"],
                   slo=(dict(p["measured"]), simulated_figures(served)))
        for r in held_to({k: p["measured"][k] for k in FIGURES}, served_figures(served)):
            row[r["figure"]] = (r["measured"], r["kvsize"])
            row["errors"][r["figure"]] = r["error"]
        out.append(row)
    return out


def summary(table: list[dict]) -> list[str]:
    lines = [f"{'group':<16}{'figure':<28}{'points':>7}{'within bar':>12}{'median |error|':>16}{'worst':>9}"]
    for group in ("fitted on", "out of the fit"):
        part = [r for r in table if r["group"] == group]
        for key in FIGURES:
            bar = SPEED_BARS[key]
            errors = [r["errors"][key] for r in part]
            ok = sum(1 for e in errors if abs(e) <= bar)
            worst = max(errors, key=abs)
            lines.append(f"{group:<16}{key + f' (±{bar:.0%})':<28}{len(errors):>7}{ok:>12}"
                         f"{statistics.median(abs(e) for e in errors):>15.1%}{worst:>+9.0%}")
    return lines


def speedups(table: list[dict]) -> list[str]:
    """fp8 over bf16 KV on the same lengths and load: the p50 ITL of bf16 over that of fp8, measured and simulated."""
    fp8 = {r["pair"]: r for r in table if r["kv"] == "fp8" and r["loop"] == "closed"}
    lines = [f"{'fp8 over bf16 (p50 ITL)':<44}{'measured':>10}{'kvsize':>10}{'error':>8}"]
    errors = []
    for r in table:
        other = fp8.get(r["pair"])
        if r["kv"] != "auto" or other is None or r["loop"] != "closed":
            continue
        name = r["id"]
        measured = r["itl_p50_ms"][0] / other["itl_p50_ms"][0]
        simulated = r["itl_p50_ms"][1] / other["itl_p50_ms"][1]
        errors.append(simulated / measured - 1)
        # b1's points by their lengths and load alone; a later batch's with the batch before them
        label = name.split('-', 2)[2] if name.startswith("llama8b-") else f"{r['batch'][:2]} {name.split('-', 3)[3]}"
        lines.append(f"{label[:43]:<44}{measured:>10.2f}{simulated:>10.2f}{errors[-1]:>+8.0%}")
    lines.append(f"{len(errors)} pairs: {sum(abs(e) <= 0.10 for e in errors)} within 10%, median |error| "
                 f"{statistics.median(abs(e) for e in errors):.1%}")
    return lines


def format_ratios(table: list[dict], fmt: str) -> list[str]:
    """`fmt` over bf16 KV on the same model, lengths and closed-loop load, where the two ran in different batches
    (b14's per-token-head servers against the newest bf16 server of the same ladder, under one API server): the p50
    ITL and the p50 TTFT of bf16 over those of `fmt`, measured and simulated (below 1: slower than bf16)."""
    def key(r: dict) -> tuple:
        return (r["pair"][1:], r["server"].endswith("-api4"))

    bf16 = {}
    newest = sorted((r for r in table if r["kv"] == "auto" and r["loop"] == "closed"),
                    key=lambda r: int(r["batch"][1:].split("-", 1)[0]))
    for r in newest:
        bf16[key(r)] = r  # the newest batch's (b1, b2, ... by number)
    lines = [f"{fmt + ' over bf16':<40}{'ITL meas':>9}{'kvsize':>8}{'error':>7}{'TTFT meas':>10}{'kvsize':>8}"
             f"{'error':>7}  bf16 point"]
    errors = []
    for r in table:
        other = bf16.get(key(r))
        if r["kv"] != fmt or r["loop"] != "closed" or other is None:
            continue
        figures = []
        for figure in ("itl_p50_ms", "ttft_p50_ms"):
            measured = other[figure][0] / r[figure][0]
            simulated = other[figure][1] / r[figure][1]
            figures += [measured, simulated, simulated / measured - 1]
        errors.append(figures[2])
        lines.append(f"{r['id'].split('-', 1)[1][:39]:<40}{figures[0]:>9.2f}{figures[1]:>8.2f}{figures[2]:>+7.0%}"
                     f"{figures[3]:>10.2f}{figures[4]:>8.2f}{figures[5]:>+7.0%}  {other['id']}")
    if errors:
        lines.append(f"{len(errors)} pairs: p50 ITL ratio within 10% on {sum(abs(e) <= 0.10 for e in errors)}, median "
                     f"|error| {statistics.median(abs(e) for e in errors):.1%}")
    return lines


GPU_IDS = {"NVIDIA H200": "h200", "NVIDIA H100 80GB HBM3": "h100-sxm"}
AHEAD = (("ttft_p50_ms", "ttft_ms", "50"), ("itl_p50_ms", "itl_ms", "50"), ("ttft_p99_ms", "ttft_ms", "99"),
         ("itl_p99_ms", "itl_ms", "99"), ("output_tokens_per_s", "output_tokens_per_s", None))


def ahead_rows() -> list[dict]:
    """The points whose simulated figures were committed before their batch ran, against what the server did."""
    out, files = [], {}
    for p in json.loads(POINTS.read_text())["points"]:
        gpu = GPU_IDS.get(p["settings"]["gpu_name"])
        path = SERVING / f"{p['batch']}-sim-predictions-{gpu}.json"
        if gpu is None or not path.exists():
            continue
        if path not in files:
            files[path] = {x["id"]: x for x in json.loads(path.read_text())["points"]}
        pred = files[path].get(p["id"])
        if pred is None:
            continue
        row = dict(id=p["id"], file=path.name, errors={},
                   preemptions=(p["metrics"]["preemptions"], pred["preemptions"]))
        for key, name, q in AHEAD:
            measured, kvsize = p["measured"][key], pred[name] if q is None else pred[name][q]
            row[key] = (measured, kvsize)
            row["errors"][key] = kvsize / measured - 1
        out.append(row)
    return out


def _ahead_summary(ahead: list[dict]) -> list[str]:
    lines = [f"{'figure':<28}{'points':>7}{'within bar':>12}{'median |error|':>16}{'worst':>9}"]
    for key, _, _ in AHEAD:
        bar, errors = SPEED_BARS[key], [r["errors"][key] for r in ahead]
        lines.append(f"{key + f' (±{bar:.0%})':<28}{len(errors):>7}{sum(abs(e) <= bar for e in errors):>12}"
                     f"{statistics.median(abs(e) for e in errors):>15.1%}{max(errors, key=abs):>+9.0%}")
    return lines


def ahead_section(ahead: list[dict]) -> list[str]:
    """Per batch, its committed figures against the server's: apart from the fitted and the out-of-fit groups."""
    if not ahead:
        return []
    files = sorted({r["file"] for r in ahead})
    lines = ["## Predicted before seen", "",
             "The simulation's figures for these points were committed before their batch ran (" +
             ", ".join(f"`measure/serving/{f}`" for f in files) + "), from the code and constants of that commit; "
             "they are kept here as they were committed, whatever was fitted since. Preemptions: the server's "
             "`vllm:num_preemptions` over the point against the simulation's.", ""]
    for f in files:
        part = [r for r in ahead if r["file"] == f]
        lines += [f"### {f.split('-sim-predictions')[0]}", "", "```", *_ahead_summary(part), "```", ""]
    ran = {p["batch"] for p in json.loads(POINTS.read_text())["points"]}
    for path in sorted(SERVING.glob("*-sim-predictions-h200.json")):
        batch = path.name.split("-sim-predictions")[0]
        if batch not in ran:
            count = len(json.loads(path.read_text())["points"])
            lines += [f"### {batch}", "", f"Not run yet: the simulated figures of its {count} planned points are "
                      f"committed (`measure/serving/{path.name}`); 'The most a replica holds under a target' reads "
                      "the rates they give.", ""]
    lines += ["| point | TTFT p50 ms | predicted | ITL p50 ms | predicted | ITL p99 ms | predicted | "
              "output tok/s | predicted | preemptions | predicted |",
              "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in ahead:
        cells = " | ".join(f"{r[k][0]:,.1f} | {r[k][1]:,.1f}" for k in ("ttft_p50_ms", "itl_p50_ms", "itl_p99_ms"))
        # a point shorter than the metrics scrape's period has no preemption count ("-")
        pre = " | ".join("-" if v is None else f"{v:,.0f}" for v in r["preemptions"])
        lines.append(f"| {r['id']} | {cells} | {r['output_tokens_per_s'][0]:,.0f} | {r['output_tokens_per_s'][1]:,.0f} "
                     f"| {pre} |")
    return lines + [""]


# The targets the most-held rate is read under (issue 48: "the most requests per second a replica holds under an
# SLO within 10%"): the load generator reports TPOT at p50 only (`median_tpot_ms`), TTFT at p50, p90 and p99
SLO_TARGETS = (target(tpot_p50_ms=10), target(tpot_p50_ms=15), target(tpot_p50_ms=25), target(tpot_p50_ms=50),
               target(ttft_p50_ms=500), target(ttft_p50_ms=1000), target(ttft_p50_ms=2000),
               target(ttft_p50_ms=1000, tpot_p50_ms=25))
MIN_LOADS = 3  # a ladder of fewer loads of one kind brackets too little to read a rate from


def _figures(ttft: dict, itl: dict, tpot: dict, requests_per_s: float) -> dict:
    out = {f"{kind}_p{q}_ms": float(v)
           for kind, d in (("ttft", ttft), ("itl", itl), ("tpot", tpot)) for q, v in d.items()}
    return {**out, "requests_per_s": requests_per_s}


def simulated_figures(served) -> dict:
    """The simulation's percentiles of one point under the load generator's names (tpot_p50_ms, ...)."""
    return _figures(served.ttft_ms, served.itl_ms, served.tpot_ms, served.requests_per_s)


def _committed(batch: str) -> dict[str, dict]:
    """A batch's simulated figures as committed before it ran, by point (its H200 file, where one exists): TTFT and
    ITL percentiles and requests/s; TPOT only in the files written from batch b6 on."""
    path = SERVING / f"{batch}-sim-predictions-h200.json"
    if not path.exists():
        return {}
    return {x["id"]: _figures(x["ttft_ms"], x["itl_ms"], x.get("tpot_ms", {}), x["requests_per_s"])
            for x in json.loads(path.read_text())["points"]}


def ladders(table: list[dict]) -> list[dict]:
    """Every server's points of one length pair and one kind of load, ordered by load, with at least MIN_LOADS."""
    groups: dict[tuple, list[dict]] = {}
    for r in table:
        groups.setdefault((r["batch"], r["server"], r["lengths"], r["loop"]), []).append(r)
    out = []
    for (batch, server, lengths, loop), part in groups.items():
        if len(part) >= MIN_LOADS:
            part = sorted(part, key=lambda r: r["load"])
            out.append(dict(batch=batch, server=server, lengths=lengths, loop=loop, loads=[r["load"] for r in part],
                            ids=[r["id"] for r in part], measured=[{**r["slo"][0], "load": r["load"]} for r in part],
                            kvsize=[{**r["slo"][1], "load": r["load"]} for r in part]))
    return out


def _read(points: list[dict], goal: Target):
    """The most held rate, or None where the points lack a figure the target bounds."""
    return most_held(points, goal) if all(f in pt for pt in points for f in goal.figures) else None


def slo_rows(table: list[dict]) -> list[dict]:
    """Per ladder and target: the most requests/s held, measured, simulated today, and committed before the batch
    ran where that exists for every load of the ladder."""
    out = []
    for lad in ladders(table):
        committed = _committed(lad["batch"])
        ahead = ([{**committed[i], "load": load} for i, load in zip(lad["ids"], lad["loads"])]
                 if all(i in committed for i in lad["ids"]) else None)
        for goal in SLO_TARGETS:
            measured, today = most_held(lad["measured"], goal), most_held(lad["kvsize"], goal)
            before = _read(ahead, goal) if ahead else None
            out.append(dict(ladder=lad, target=goal, measured=measured, today=today, today_vs=compared(measured, today),
                            ahead=before, ahead_vs=compared(measured, before) if before else None,
                            ahead_absent="no file" if ahead is None else "no TPOT" if before is None else None))
    return out


def _load_text(load, loop: str) -> str:
    return f"{load:g}/s" if loop == "open" else f"{load:g}"


def _bracket(held, loop: str) -> str:
    """Where the measured answer was read: between two loads (too coarse to read when their rates are more than
    20% apart), or at the grid's end."""
    unit = "/s" if loop == "open" else " in flight"
    if held.kind == "none":
        return f"misses at {_load_text(held.missed, loop)}{'' if loop == 'open' else unit}: lightest"
    if held.kind == "at least":
        return f"meets at {_load_text(held.met, loop)}{'' if loop == 'open' else unit}: heaviest"
    span = f"{_load_text(held.met, loop)}-{_load_text(held.missed, loop)}{'' if loop == 'open' else unit}"
    return (f"{span}, read" if held.readable() else
            f"{span}: too coarse ({held.low:,.1f}-{held.high:,.1f} req/s)")


def _verdict(pair) -> str:
    error, verdict = pair
    return f"{error:+.0%} | {verdict}" if error is not None else f"— | {verdict}"


def slo_summary(rows_: list[dict]) -> str:
    """One line: how many answers the measured grid brackets, how many closely enough to be read, and how many of
    those kvsize holds within 10%."""
    read = [r for r in rows_ if r["measured"].kind == "interpolated"]
    fine = [r for r in read if r["measured"].readable()]
    ahead = [r for r in read if r["ahead_vs"] is not None and r["ahead_vs"][0] is not None]
    ladders_ = len({id(r["ladder"]) for r in rows_})

    def within(part, key="today_vs"):
        return sum(r[key][1] == "yes" for r in part)

    return (f"most req/s under a target: {len(rows_)} answers ({ladders_} ladders x {len(SLO_TARGETS)} targets), "
            f"{len(read)} bracketed by two measured loads, {len(fine)} of them by loads within 20% of each other; "
            f"kvsize within 10% in {within(fine)} of those {len(fine)} ({within(read)} of all {len(read)} bracketed, "
            f"most by a coarse grid); plainly out in {sum(r['today_vs'][1] == 'no' for r in rows_)} of "
            f"{len(rows_)}; predicted before seen within 10% in {within(ahead, 'ahead_vs')} of {len(ahead)} bracketed")


def _planned() -> list[dict]:
    """The planned ladders of a batch not run yet, with the rates its committed simulated figures give."""
    measured = {p["batch"] for p in json.loads(POINTS.read_text())["points"]}
    out = []
    for server in json.loads((SERVING / "plan.json").read_text())["servers"]:
        if server["batch"] in measured:
            continue
        committed = _committed(server["batch"])
        groups: dict[tuple, list[dict]] = {}
        for pt in server["points"]:
            loop = "closed" if pt["request_rate"] is None else "open"
            groups.setdefault((pt["input_len"], pt["output_len"], loop), []).append(pt)
        for (i, o, loop), part in groups.items():
            if len(part) < MIN_LOADS:
                continue
            loads = sorted(pt["concurrency"] if loop == "closed" else pt["request_rate"] for pt in part)
            ahead = [{**committed[pt["id"]], "load": pt["concurrency"] if loop == "closed" else pt["request_rate"]}
                     for pt in part if pt["id"] in committed]
            out.append(dict(batch=server["batch"], server=server["tag"], lengths=(i, o), loop=loop, loads=loads,
                            answers=[(g, _read(ahead, g) if len(ahead) == len(part) else None) for g in SLO_TARGETS]))
    return out


def slo_section(rows_: list[dict]) -> list[str]:
    lines = ["## The most a replica holds under a target", "",
             "Issue 48's goal: the most requests per second one replica holds under a latency target, within 10%. "
             "For every server's points of one length pair and one kind of load (closed loop: requests in flight; "
             f"open loop: arrivals a second) with at least {MIN_LOADS} loads, `sizing/evidence/slo_rate.py` reads the "
             "answer off the points in load order: the requests/s of the heaviest load that meets the target before "
             "the first that misses, moved linearly toward that miss by the figure that binds; 'none' when the "
             "lightest load already misses, '≥' the heaviest load's rate when it still meets. The same function reads "
             "the server's figures, the simulation's of the same points today, and the figures committed before the "
             "batch ran where a batch has them (b4 and b5 hold no TPOT, so only their TTFT targets are read; "
             "files from b6 on hold it). Where the two loads that bracket the measured answer are more than 20% apart in requests/s, the "
             "grid is too coarse for the answer to be read within 10%: the straight line between them is a guess, "
             "and the column says so with the bracket. 'both none': the lightest load misses, measured and simulated; "
             "'both ≥': the heaviest meets on both sides; 'unread': one answer lies past an end of the grid and the "
             "other within 10% of its range; 'no' there: the two ranges are more than 10% apart.", "",
             "```", slo_summary(rows_), "```", "",
             "| server | lengths, loop | loads | target | measured req/s | where read | kvsize today | error | "
             "within 10% | predicted before seen | error | within 10% |",
             "| --- | --- | --- | --- | ---: | --- | ---: | ---: | --- | ---: | ---: | --- |"]
    for r in rows_:
        lad = r["ladder"]
        before = (f"{r['ahead'].text()} | {_verdict(r['ahead_vs'])}" if r["ahead"] is not None
                  else f"—{' (no TPOT)' if r['ahead_absent'] == 'no TPOT' else ''} | | ")
        lines.append(f"| {lad['server']} | {lad['lengths'][0]:,}/{lad['lengths'][1]:,} {lad['loop']} | "
                     f"{', '.join(_load_text(x, lad['loop']) for x in lad['loads'])} | {r['target'].label()} | "
                     f"{r['measured'].text()} | {_bracket(r['measured'], lad['loop'])} | {r['today'].text()} | "
                     f"{_verdict(r['today_vs'])} | {before} |")
    planned = _planned()
    if planned:
        lines += ["", "Planned, not run yet (`measure/serving/plan.json`), with the answers the simulated figures "
                  "committed before the batch give ('—': the committed file lacks a figure the target bounds):", "",
                  "| batch | server | lengths, loop | loads | " + " | ".join(g.label() for g in SLO_TARGETS) + " |",
                  "| --- | --- | --- | --- |" + " ---: |" * len(SLO_TARGETS)]
        for lad in planned:
            cells = " | ".join(a.text() if a is not None else "—" for g, a in lad["answers"])
            lines.append(f"| {lad['batch']} | {lad['server']} | {lad['lengths'][0]:,}/{lad['lengths'][1]:,} "
                         f"{lad['loop']} | {', '.join(_load_text(x, lad['loop']) for x in lad['loads'])} | {cells} |")
    return lines + [""]


def chunk_section(table: list[dict]) -> list[str]:
    """The points whose streamed chunks carried more than one token on average: there the load generator's ITL (timed
    per chunk) is the API server's pace of chunks and its TPOT the engine's of tokens; kvsize simulates tokens."""
    joined = [r for r in table if (r["slo"][0].get("tokens_per_chunk") or 0) > JOINED_CHUNKS]
    lines = ["## Chunks of more than one token", "",
             "`vllm bench serve` times an ITL per streamed chunk. Where the API server falls behind its streams it joins "
             "the tokens that piled up into one chunk, so the measured ITL is the gap between chunks and TPOT "
             "(a request's time after its first token over its later tokens) is the engine's pace of tokens, the "
             "figure kvsize's ITL simulates. Points whose chunks carried more than "
             f"{JOINED_CHUNKS} tokens on average ({len(joined)} of {len(table)}; `kvsize check-serve` names the same "
             "where a result keeps its gaps):", "",
             "| point | tokens a chunk | ITL p50 ms | TPOT p50 ms | kvsize ITL p50 ms | kvsize TPOT p50 ms |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in joined:
        measured, simulated = r["slo"]
        lines.append(f"| {r['id']} | {measured['tokens_per_chunk']:.2f} | {measured['itl_p50_ms']:,.1f} | "
                     f"{measured['tpot_p50_ms']:,.1f} | {simulated['itl_p50_ms']:,.1f} | {simulated['tpot_p50_ms']:,.1f} |")
    return [*lines, ""]


def table_json(table: list[dict]) -> str:
    """Every point's measured and simulated figures as data (measure/serving/simulated.json)."""
    keys = ("ttft_p50_ms", "itl_p50_ms", "ttft_p99_ms", "itl_p99_ms", "output_tokens_per_s")
    rows = [dict(id=r["id"], group=r["group"], loop=r["loop"],
                 **{f"{k}_measured": round(r[k][0], 4) for k in keys}, **{f"{k}_kvsize": round(r[k][1], 4) for k in keys})
            for r in table]
    return json.dumps(dict(schema="kvsize.serving-simulated/1", source="benchmarks/serving_accuracy.py --write",
                           rows=rows), indent=1) + "\n"


def report(table: list[dict] | None = None) -> str:
    """docs/speed-accuracy.md: the accuracy page's speed section."""
    table = rows() if table is None else table
    fit = step_overhead()
    out = ["# Speed against a real serving engine", "",
           f"Written by `python benchmarks/serving_accuracy.py --write` from `measure/serving/points.json`: {len(table)} "
           "load points of vLLM 0.33.0's OpenAI server on H200s (Llama-3.1-8B with bf16, fp8, int8_per_token_head and "
           "int4_per_token_head KV, Qwen3-30B-A3B (also in int4_per_token_head), "
           "DeepSeek-V2-Lite, Qwen2.5-32B at TP 1 and 2, Mixtral-8x7B, gpt-oss-20b, Llama-3.2-1B, Qwen3-8B, "
           "Mistral-Nemo-12B, Llama-3.1-70B at TP 2 with fp8 KV, and in int8_per_token_head Qwen3-32B, Qwen3-14B, "
           "Qwen2.5-7B, Qwen2.5-3B and Qwen2.5-1.5B; `vllm bench serve`, closed and open loop; "
           "`measure/serving/README.md` says how they ran). kvsize's figures come from its serving simulation "
           "(docs/formulas.md, 'Serving simulation'). Bars: p50 within 10%, p99 within 25%.", "",
           "Two groups, never mixed: the points the simulation's constants were fitted on "
           f"(`profiles/serving.json`: the engine's weights read efficiency {fit.engine_weights_efficiency}, "
           f"{fit.per_layer_step_overhead_s * 1e6:.1f} us a layer a step and {fit.tp_per_layer_step_overhead_s * 1e6:.1f} "
           f"us more a layer at TP 2, {fit.moe_layer_step_overhead_s * 1e6:.1f} us more a MoE layer, a floor of "
           f"{fit.step_floor_s * 1e3:.2f} ms a step, prefill MFU "
           f"{fit.prefill_mfu}, the engine's KV read efficiency "
           + ", ".join(f"{k} {v}" for k, v in fit.engine_kv_efficiency.items())
           + ", and where the engine splits each of a few requests' cache "
           + ", ".join(f"{k} {v}" for k, v in fit.engine_split_kv_efficiency.items())
           + ", the programs an SM runs at once in their waves "
           + ", ".join(f"{k} {v}" for k, v in fit.engine_programs_per_sm.items())
           + ", and where the engine's kernel is compiled for another count of query heads a KV head, "
           + ", ".join(f"{k} at {q}: {w.programs_per_sm} programs an SM, {w.kv_efficiency} a full wave"
                       + (f", {w.whole_programs_per_sm} whole-cache programs an SM at once reading {w.whole_sm / 1e6:g}"
                          " a microsecond across them" if w.whole_sm else "")
                       for k, groups in fit.engine_query_group_waves.items() for q, w in groups.items())
           + ", a program's pace (cached tokens a microsecond, of a request's whole cache and of a split one's segment) "
           + ", ".join(f"{k} {v.whole / 1e6:g} and {v.split / 1e6:g}"
                       + (f", {v.split_programs_per_sm} segment programs an SM at once reading {v.split_sm / 1e6:g} a "
                          "microsecond across them" if v.split_sm else " (its SM rounds not fitted)")
                       + (f", {v.whole_programs_per_sm} whole-cache programs an SM reading {v.whole_sm / 1e6:g}"
                          if v.whole_sm else ", its whole-cache programs sharing an SM not fitted")
                       for k, v in fit.engine_program_pace_tokens_per_s.items())
           + ", the prompt attention's share of the prefill rate at a full tile of query rows "
           + ", ".join(f"{k} {v}" for k, v in fit.engine_prefill_attention_share.items())
           + f", the front end's handling of a request {fit.request_handling_s * 1e3:.1f} ms and "
           f"{fit.prompt_in_s_per_token * 1e6:.2f} us a prompt token on the way in, "
           f"{fit.first_token_s_per_prompt_token * 1e6:.2f} us on the first token's way back, the host's launch "
           f"of a step with a prompt chunk {fit.eager_layer_launch_s * 1e3:.2f} ms a layer past the largest CUDA "
           f"graph and {fit.piecewise_layer_launch_s * 1e3:.2f} ms under it"
           + "; one request in flight on every dense size and on Qwen3-30B-A3B (b2) for the MoE layer, the step "
           "traces of b11 and b12 for the KV read and each request's cost, b14's Llama-3.1-8B traces for the "
           "per-token-head formats' read and waves, b16's Qwen3-30B-A3B and b18's Qwen3-32B traces for the "
           "waves of 8 query heads a KV head and, the split pace fixed, the whole cache's pace and the split "
           "segments' rounds, b22's one request of "
           "8,000 and 32,000 tokens for the split pace, b14's Llama-3.1-8B points of 8,000 tokens and more for the per-token-head formats' prompt attention, the traces of requests alone for the front end's handling (its parts per prompt token on b22, b25 and b28's long prompts, its part the same for every request on b30-b33's short ones), and the dense bf16 and fp8 servers' traces of b11, b12 and b29-b32 for the launches), and "
           "the rest, which the fit never saw: out of the fit. Batches b1-b3 were measured "
           "before the simulation was written, so they are out of the fit but not predicted before seen; what was "
           "predicted before they ran came from kvsize's earlier speed model, the plan's decode step and one prompt's "
           "prefill, and is kept with its errors in `measure/serving/comparison.md` (p50 ITL within 10% on 7 of 53 "
           "closed-loop points of b1-b3, p50 TTFT on 2). A later batch's simulated figures were committed before it "
           "ran (b4, b5): their points count as fitted or out of the fit here, with the code as it is now, and their "
           "committed figures are held apart, batch by batch, under 'Predicted before seen'.", "",
           "## Summary", "", "```", *summary(table), "```", "",
           "## Where it misses, and the mechanism each miss points to", "",
           *MISSES, "",
           "## fp8 over bf16 KV", "", "```", *speedups(table), "```", "",
           "## The per-token-head integer formats over bf16 KV", "",
           "Batch b14's servers against the newest bf16 server of the same model, lengths and load (another batch, "
           "on another day): below 1, the format is slower than bf16.", "",
           "```", *format_ratios(table, "int4_per_token_head"), "", *format_ratios(table, "int8_per_token_head"),
           "```", "", *ahead_section(ahead_rows()),
           *slo_section(slo_rows(table)), *chunk_section(table),
           "## Every point", "", "| point | group | TTFT p50 ms | kvsize | ITL p50 ms | kvsize | ITL p99 ms | kvsize | "
           "output tok/s | kvsize |", "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in table:
        cells = " | ".join(f"{r[k][0]:,.1f} | {r[k][1]:,.1f}" for k in ("ttft_p50_ms", "itl_p50_ms", "itl_p99_ms"))
        out.append(f"| {r['id']} | {r['group']} | {cells} | {r['output_tokens_per_s'][0]:,.0f} | "
                   f"{r['output_tokens_per_s'][1]:,.0f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str]) -> int:
    table = rows()
    if "--write" in argv:
        for path, text in ((PAGE, report(table)), (TABLE, table_json(table))):
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)
            print(f"wrote {path.relative_to(ROOT)}")
        return 0
    if "--summary" not in argv:
        print(f"{'point':<44}{'TTFT p50 ms':>20}{'ITL p50 ms':>18}{'ITL p99 ms':>18}{'tok/s':>16}")
        for r in table:
            cells = "".join(f"{r[k][0]:>9.1f}{r[k][1]:>9.1f}" for k in ("ttft_p50_ms", "itl_p50_ms", "itl_p99_ms"))
            print(f"{r['id'][:43]:<44}{cells}{r['output_tokens_per_s'][0]:>8.0f}{r['output_tokens_per_s'][1]:>8.0f}")
        print()
    print("\n".join(summary(table)))
    print()
    print("\n".join(speedups(table)))
    print()
    held = slo_rows(table)
    if "--summary" not in argv:
        print("\n".join(slo_section(held)))
    print(slo_summary(held))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""docs/step-trace.md is benchmarks/step_trace.py's report of the committed step traces, and the traces are what
measure/step_trace.py reads."""

from __future__ import annotations

import gzip

import pytest
from helpers import load_script

from measure.serving import SERVING
from measure.steps import TraceError, point_steps, prompt_chunks, read_steps, traced_servers

ROOT = SERVING.parents[1]


def test_page_is_the_benchmarks_report():
    bench = load_script("step_trace")
    assert (ROOT / "docs" / "step-trace.md").read_text() == bench.report()


def test_every_traced_server_has_steps_of_both_kinds():
    bench = load_script("step_trace")
    servers = bench.traced_servers()
    assert {s["tag"] for s in servers} >= {"b11-llama8b", "b11-llama1b-api4"}
    for server in servers:
        decode, prompt = bench.server_rows(server)
        # the open loops of b11 give groups of steps with prompt chunks; a short closed loop (b13) may give none.
        # Each point that ran decodes 256 or more tokens a request, so it gives that many steps less those that
        # carried its prompts' chunks (a closed loop's requests in flight × prompt / max_num_batched_tokens) and the
        # ramps shown in groups under 20 steps (b17's Qwen3-8B: 493 over two points; b19's Qwen2.5-3B: 125 at 160
        # requests of 8,000 tokens, whose prompts fill 157 steps); an open loop's prompts come between its decodes
        folder = SERVING / server["batch"] / server["tag"]
        ran = [p for p in server["points"] if (folder / f"{p['id']}.json.gz").exists()]
        least = sum(p["output_len"] // 2 if p["concurrency"] is None else
                    p["output_len"] - -(-p["concurrency"] * p["input_len"] // server["max_num_batched_tokens"]) - 20
                    for p in ran)
        assert ran and sum(r["steps"] for r in decode) > least, (server["tag"], least)
        assert prompt or server["batch"] != "b11-step-trace"
        # a step is never shorter than its own scheduling
        assert all(r["measured_ms"] > r["schedule_ms"] for r in decode)


def test_steps_pair_each_schedule_with_its_update_in_order(tmp_path):
    lines = ["S\t1.000\t1.001\t1\t1000\t0\t1\t0", "S\t1.040\t1.041\t0\t0\t1\t1\t0", "U\t1.045\t1.046\t1",
             "S\t1.046\t1.047\t0\t0\t0\t0\t0", "U\t1.050\t1.051\t1", "U\t1.052\t1.053\t0"]
    path = tmp_path / "steps.tsv.gz"
    path.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    steps = read_steps(path)
    # the empty third schedule() is dropped but its update still ends the period of the step after it
    assert [(s.prompt_tokens, s.decoding) for s in steps] == [(1000, 0), (0, 1)]
    assert steps[0].period_s is None
    assert steps[1].period_s == pytest.approx(0.005)


def test_a_malformed_trace_is_refused_naming_its_line(tmp_path):
    path = tmp_path / "steps.tsv.gz"
    path.write_bytes(gzip.compress(b"S\t1.0\t1.1\t0\t0\t1\t1\t0\nX\t1\n"))
    with pytest.raises(TraceError, match="line 2"):
        read_steps(path)


def test_a_steps_prompt_tokens_are_placed_where_the_points_stream_of_prompts_had_reached():
    # prompts of 8,000 tokens end to end: a step of 8,080 tokens from token 16,000 is the whole of the third prompt
    # and the first 80 of the fourth; one from 7,920 the last 80 of the first and 8,000 of the second
    assert prompt_chunks(16000, 8080, 8000) == [(0, 8000), (0, 80)]
    assert prompt_chunks(7920, 8080, 8000) == [(7920, 8000), (0, 8000)]
    assert prompt_chunks(24100, 8192, 32000) == [(24100, 32000), (0, 292)]
    assert prompt_chunks(0, 0, 1000) == []


def test_the_placed_chunks_match_the_prompts_the_trace_counts_in_nearly_every_step():
    steps = placed = 0
    for server in traced_servers():
        for step, point, _, _ in point_steps(server):
            if step.prompt_tokens:
                steps += 1
                placed += len(prompt_chunks(step.prompt_start, step.prompt_tokens, point["input_len"])) \
                    == step.prompt_requests
    # the rest are steps around a preemption's recompute (batch b4) or a point's edge
    assert steps > 4000 and placed / steps > 0.97

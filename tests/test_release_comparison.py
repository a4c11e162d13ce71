"""`estimate --vs`: what a planner buys on, the requests each release's pool holds, beside the terms that moved."""

import json

from helpers import scenario
from sizing.capacity.estimate import estimate


def test_vs_shows_each_releases_requests_and_what_moved_them(capsys):
    from app.cli import main

    argv = ["estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "32k"]
    assert main([*argv, "--vs", "sglang", "--format", "json"]) == 0
    rows = {r["term"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    counts = {engine: estimate(scenario("llama-3.1-8b", "h100-sxm", max_model_len=32768, engine=engine,
                                        memory_fraction=None)).max_concurrency for engine in ("vllm", "sglang")}
    assert {e: rows["requests_at_max_model_len"][e] for e in counts} == counts
    assert counts["vllm"] != counts["sglang"]
    assert main([*argv, "--vs", "sglang"]) == 0
    text = capsys.readouterr().out
    assert (f"requests of 32,768 tokens the pool holds move from {counts['vllm']} to {counts['sglang']} "
            f"({counts['sglang'] - counts['vllm']:+})") in text

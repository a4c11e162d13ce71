"""The front end's handling of a request for profiles/serving.json (scripts/fit_serving_terms.py takes it before the
MFU): read off the engine core's step traces of requests alone on the engine, apart from the simulation."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.steps import prompt_handling_rows, traced_servers  # noqa: E402
from least_squares import line  # noqa: E402

# the front end's handling of a request, read off the step traces of requests alone on the engine (measure/steps.py
# prompt_handling_rows: the one-request batches b22, b25 and b28, prompts of 2,000 and 8,000 tokens on six dense
# models), apart from the simulation: a part the same for every request and a part per prompt token, on the way in and
# on the first token's way back
HANDLING_BATCHES = ("b22-prompt-tiles", "b25-int4-pace", "b28-int4-judge")
HANDLING_TERM = "request_handling_s"
PROMPT_IN_TERM, FIRST_TOKEN_TERM = "prompt_in_s_per_token", "first_token_s_per_prompt_token"
HANDLING_OFF = {HANDLING_TERM: 0.0, PROMPT_IN_TERM: 0.0, FIRST_TOKEN_TERM: 0.0}


def fit_handling() -> tuple[dict[str, float], list[str]]:
    """The request's handling: the first token's time outside the steps at no prompt (the intercept of its
    least-squares line on the prompt's tokens), the way in's seconds per prompt token (the slope of the time a
    request spends outside its steps, its last token's way out being the same at any length) and the first token's
    way back's (the slope of the first token's time outside the steps, less the way in's); and the points they were
    read from."""
    rows = [r for server in traced_servers() if server["batch"] in HANDLING_BATCHES
            for r in prompt_handling_rows(server)]
    prompts = [r["prompt"] for r in rows]
    way_in = max(line(prompts, [r["outside_s"] for r in rows])[1], 0.0)
    fixed, first = line(prompts, [r["first_token_s"] for r in rows])
    return ({HANDLING_TERM: round(max(fixed, 0.0), 6), PROMPT_IN_TERM: round(way_in, 11),
             FIRST_TOKEN_TERM: round(max(first - way_in, 0.0), 11)}, sorted({r["point"] for r in rows}))

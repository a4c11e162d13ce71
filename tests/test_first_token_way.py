"""measure/first_token.py: requests matched to the steps that prefilled them, and what batch b35's traces say of the
first token's way out; docs/first-token-way.md is benchmarks/first_token_way.py's report."""

from __future__ import annotations

from functools import cache
from types import SimpleNamespace

from helpers import load_script

from measure.first_token import first_token_matches, way_out_rows
from measure.serving import SERVING
from measure.steps import traced_servers
from sizing.planners.step_model import step_overhead

ROOT = SERVING.parents[1]


def _steps(prompt_tokens: list[int]) -> list:
    return [SimpleNamespace(prompt_tokens=n) for n in prompt_tokens]


def test_requests_are_matched_to_their_prompts_steps_in_the_order_sent():
    # three 1,000-token prompts under a budget of 1,500: the first alone, the second split over two steps with the
    # third's whole prompt in the second of them; the client sent request 2 first, then 0, then 1
    steps = _steps([1000, 1500, 500, 0])
    rows = first_token_matches(steps, sent_s=[5.0, 6.0, 4.0], ttfts_s=[0.1, 0.2, 0.3], prompt_len=1000)
    assert [(r["request"], r["first_step"], r["last_step"]) for r in rows] == [(2, 0, 0), (0, 1, 1), (1, 1, 2)]
    assert [r["same_step_firsts"] for r in rows] == [1, 1, 1]
    assert rows[0]["arrival_s"] == 4.3


def test_first_tokens_sampled_together_are_counted_and_a_last_step_without_a_successor_is_left_out():
    rows = first_token_matches(_steps([2000, 0]), sent_s=[1.0, 1.0], ttfts_s=[0.5, 0.5], prompt_len=1000)
    assert [r["same_step_firsts"] for r in rows] == [2, 2]
    # the only step is the one that sampled them: no next step to set them against
    assert first_token_matches(_steps([2000]), [1.0, 1.0], [0.5, 0.5], 1000) == []


def test_a_point_whose_prompt_tokens_are_not_its_prompts_end_to_end_is_left_out():
    # a preempted request prefilled again adds prompt tokens the stream of prompts does not hold
    assert first_token_matches(_steps([1000, 1000, 600]), [1.0, 2.0], [0.1, 0.1], 1000) is None


@cache
def _b35_bursts() -> tuple[dict, ...]:
    fitted = step_overhead()
    out = []
    for server in traced_servers():
        if server["batch"] == "b35-way-out":
            rows = way_out_rows(server, fitted.first_token_s_per_prompt_token, fitted.frontend_api_s_per_token)
            out += [r for r in rows if r["point"].endswith("-i1000-o128-c32")]
    return tuple(out)


def test_b35s_first_tokens_leave_with_their_own_steps_update():
    # b35's bursts of 32 prompts of 1,000 tokens on four models (8 prefilled a step): the first tokens' time past
    # their own step's update spread 5.7-14.0 ms (middle 80%), past the next step's 105.1-786.4 ms
    bursts = _b35_bursts()
    assert len(bursts) == 4
    for r in bursts:
        assert r["own_spread_ms"] * 5 < r["next_spread_ms"], r


def test_b35s_first_tokens_wait_for_the_api_servers_handling_of_their_steps_other_first_outputs():
    # the same bursts: 23.5-25.5 ms later than a request alone, where the fitted first-output handling of the step's
    # seven other 1,000-token prompts (and its decoding requests' tokens) comes to 18.5-18.7 ms
    for r in _b35_bursts():
        assert r["outputs_ms"] <= r["own_extra_ms"] <= 2 * r["outputs_ms"], r


def test_page_is_the_benchmarks_report():
    bench = load_script("first_token_way")
    assert (ROOT / "docs" / "first-token-way.md").read_text() == bench.report()

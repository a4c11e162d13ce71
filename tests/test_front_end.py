"""The API servers' event loops (sizing/planners/front_end.py): a request's parse, its prompt on the tokenizer thread,
its hand-over, and the streaming of each step's tokens, one piece at a time on a loop, the streams ahead of the
requests' pieces unless they alone fill the loop; and the closed loop's waves they keep, as the engine's step traces
show them (measure/serving/b12-step-ladder)."""

import pytest

from sizing.planners.front_end import FrontEnd
from sizing.planners.serving import Load, simulate

PARSE, HAND_OVER, PER_TOKEN = 0.002, 0.001, 2e-6  # seconds: a loop's two parts, the tokenizer's per prompt token


def _front(servers: int = 1, stream: float = 0.0) -> FrontEnd:
    return FrontEnd(servers, PARSE, HAND_OVER, PER_TOKEN, stream)


def test_a_request_alone_takes_its_parse_its_tokens_and_its_hand_over_in_turn():
    front = _front()
    front.send(1.0, 0, 1000)
    assert front.advance(0.9) == []  # not sent yet
    (at, request, sent), = front.advance(2.0)
    assert request == 0 and sent == 1.0 and at == pytest.approx(1.0 + PARSE + 1000 * PER_TOKEN + HAND_OVER)


def test_a_burst_is_read_whole_before_its_first_request_is_handed_over():
    front = _front()
    for k in range(8):
        front.send(0.0, k, 1000)
    handed = front.advance(0.0)
    handed += front.advance(1.0)
    at = {request: t for t, request, _ in handed}
    # the eight parses (16 ms) come before the first hand-over, whose prompt was tokenized long before
    assert at[0] == pytest.approx(8 * PARSE + HAND_OVER)
    # their prompts were tokenized meanwhile (2 ms each, one after another): the rest follow one hand-over apart
    assert [at[k] - at[k - 1] for k in range(1, 8)] == [pytest.approx(HAND_OVER)] * 7


def test_more_servers_read_a_burst_side_by_side():
    one, four = _front(1), _front(4)
    for front in (one, four):
        for k in range(8):
            front.send(0.0, k, 100)
    last_one = max(t for t, _, _ in one.advance(0.0) + one.advance(1.0))
    last_four = max(t for t, _, _ in four.advance(0.0) + four.advance(1.0))
    assert last_four < last_one / 2


def test_streaming_delays_a_parse_and_tokens_join_a_stream_not_yet_begun():
    front = _front(stream=1e-4)  # 0.1 ms a token
    front.stream(0.0, 100)  # 10 ms of streaming
    front.stream(0.005, 100)  # reaches the loop while it streams the first: queued behind it, 10 ms more
    front.stream(0.006, 100)  # joins the queued one, which has not begun: no more work
    front.send(0.007, 0, 0)
    (at, _, _), = front.advance(1.0)
    assert at == pytest.approx(0.020 + PARSE + HAND_OVER)


def test_a_closed_loops_next_request_is_sent_once_its_last_token_is_streamed():
    front = _front(stream=1e-4)
    front.stream(0.0, 50)  # 5 ms of streaming the step's tokens
    front.send(0.0, 0, 0, on_last_token=True)
    (at, _, sent), = front.advance(1.0)
    assert sent == pytest.approx(0.005) and at == pytest.approx(0.005 + PARSE + HAND_OVER)


def test_the_engine_decoded_alone_while_the_replacements_were_still_in_the_api_server():
    # b12's Llama-3.1-8B at 64 in flight of 1,000-token prompts: after the first wave's last requests finished the
    # engine ran decode-only steps of the one replacement it had, while the clients had sent the rest; they came
    # together and were prefilled nine a step
    from measure.steps import point_windows, server_trace, traced_servers

    server = next(s for s in traced_servers() if s["tag"] == "b12-llama8b-bf16")
    steps = server_trace(server)
    t0, t1, point = next(w for w in point_windows(server) if w[2]["id"].endswith("p03-i1000-o256-c64"))
    window = [s for s in steps if t0 <= s.scheduled_at <= t1]
    second = next(i for i, s in enumerate(window) if i > 20 and s.prompt_requests >= 8)  # the second wave's first
    before = window[second - 12:second]
    assert all(s.running <= 2 and s.prompt_requests == 0 for s in before[:-1]), [(s.running, s.prompt_requests)
                                                                                 for s in before]
    # none was waiting before that step; after it took nine, more than the token budget held were (together)
    assert window[second - 1].waiting == 0 and window[second].waiting > 0


def test_a_closed_loop_of_fixed_lengths_keeps_its_waves():
    from helpers import scenario
    from sizing.planners.serving import serving_replica
    from sizing.profiles import gpu_profile, measured_efficiency

    g = gpu_profile("h200")
    s = scenario("llama-3.1-8b", "h200", max_model_len=32768, memory_fraction=0.9, max_num_batched_tokens=8192,
                 max_num_seqs=1024)
    model, engine = serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors,
                                    measured_efficiency())
    waves = simulate(model, engine, Load(1000, 256, 128, concurrency=64, measured=(64, 128)))
    # the second wave is a burst again: its median request waits four of its eight prefill steps and more (b12:
    # 1,039 ms measured over both waves; one request alone about 45 ms)
    assert waves.ttft_ms[50] > 700


def test_a_request_waits_behind_the_streams_that_come_while_it_waits():
    # 0.1 ms a token: a step of 100 tokens streams for 10 ms, one step every 12 ms; a request sent 1 ms into the first
    # stream waits for the loop, its parse runs in the 2 ms the streams leave idle, and its hand-over, ready at the
    # second step's end, waits behind that step's stream
    front = _front(stream=1e-4)
    front.stream(0.0, 100)
    front.send(0.001, 0, 0)
    front.stream(0.012, 100)
    (at, _, sent), = front.advance(1.0)
    assert sent == pytest.approx(0.001)
    assert at == pytest.approx(0.022 + HAND_OVER)


def test_where_the_streams_fill_the_loop_a_request_takes_its_turn():
    # 100 tokens a step every 5 ms, each step's stream 10 ms: the streams alone would hold the loop for ever, so the
    # request's pieces run in the order they became ready
    front = _front(stream=1e-4)
    for k in range(4):
        front.stream(0.005 * k, 100)
    front.send(0.001, 0, 0)
    (at, _, _), = front.advance(1.0)
    # the first stream (0-10 ms), then the parse (it became ready before the second step's stream), the queued streams
    # joined into one (10 ms), then the hand-over
    assert at == pytest.approx(0.010 + PARSE + 0.010 + HAND_OVER)


@pytest.mark.parametrize("point, measured_ms", [("b12-llama8b-fp8-p05-i1000-o256-c256", 3339.0),
                                                ("b6-llama8b-bf16-p07-i1000-o256-c192", 2488.0)])
def test_the_second_wave_climbs_like_the_first(point, measured_ms):
    # Llama-3.1-8B's closed loops of 1,000-token prompts at 192-256 in flight: the replacements wait behind the
    # streams and the second wave's TTFT climbs like the first's; median TTFT within 10% of the server's (it was 56%
    # and 67% short while the pieces ran in the order they became ready)
    import json
    from pathlib import Path

    from sizing.evidence.serving import predict_point, served_settings

    root = Path(__file__).resolve().parent.parent
    p = next(x for x in json.loads((root / "measure" / "serving" / "points.json").read_text())["points"]
             if x["id"] == point)
    assert p["measured"]["ttft_p50_ms"] == pytest.approx(measured_ms, abs=1.0)
    simulated = predict_point(served_settings(p), root).ttft_ms[50]
    assert abs(simulated / p["measured"]["ttft_p50_ms"] - 1) <= 0.10

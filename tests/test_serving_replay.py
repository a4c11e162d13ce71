"""A measured open loop held to the simulation with its own send times (docs/formulas.md, 'Serving simulation'):
the load generator's Poisson draws replayed, not another draw of the same rate, on the accuracy page and in
`kvsize check-serve`."""

import gzip
import json

import pytest

from app.cli import main
from conftest import ROOT
from sizing.errors import KvsizeError
from sizing.evidence.serving import point_replica, predict_point, served_settings
from sizing.planners.serving import Load, simulate

SERVING = ROOT / "measure" / "serving"
OPEN = "b6-llama8b-bf16-p14-i1000-o256-r28"  # near the replica's limit, where the draws matter most


def _point(pid: str) -> dict:
    return next(p for p in json.loads((SERVING / "points.json").read_text())["points"] if p["id"] == pid)


def test_an_open_loops_send_times_are_the_ones_the_load_generator_recorded():
    point = _point(OPEN)
    raw = json.loads(gzip.open(SERVING / point["raw"]).read())
    sent = sorted(t for t, err in zip(raw["start_times"], raw["errors"]) if not err)
    kept = point["measured"]["sent_s"]
    assert len(kept) == point["measured"]["completed"] == len(sent)
    assert kept[0] == 0 and kept == sorted(kept)
    assert kept[-1] == pytest.approx(sent[-1] - sent[0], abs=1e-6)
    assert served_settings(point)["sent_s"] == kept
    # a closed loop's sends follow its completions: none kept
    closed = next(p for p in json.loads((SERVING / "points.json").read_text())["points"]
                  if p["settings"]["loop"] == "closed")
    assert closed["measured"]["sent_s"] is None and "sent_s" not in served_settings(closed)


def test_the_simulation_replays_them_and_a_seeded_draw_differs():
    point = _point(OPEN)
    settings = served_settings(point)
    model, engine = point_replica(settings, ROOT)
    replayed = predict_point(settings, ROOT)
    drawn = simulate(model, engine, Load(settings["input_len"], settings["output_len"], settings["num_prompts"],
                                         None, settings["request_rate"], settings["seed"]))
    assert replayed.ttft_ms[50] != drawn.ttft_ms[50]
    # the replayed run sends its last request when the server's client did
    sent = settings["sent_s"]
    assert replayed.duration_s >= sent[-1]
    # sends all at once are a burst: the first tokens wait for each other's prefill
    burst = simulate(model, engine, Load(1000, 64, 32, None, 28.0, 0, sent_at=(0.0,) * 32))
    spread = simulate(model, engine, Load(1000, 64, 32, None, 28.0, 0, sent_at=tuple(i * 0.5 for i in range(32))))
    assert burst.ttft_ms[50] > 3 * spread.ttft_ms[50]


@pytest.mark.parametrize("kw, needle", [
    (dict(sent_at=(0.0, 1.0)), "3 times in order"),
    (dict(sent_at=(0.0, 2.0, 1.0)), "3 times in order"),
    (dict(sent_at=(-1.0, 0.0, 1.0)), "of at least 0 s"),
    (dict(sent_at=(0.0, 1.0, float("nan"))), "3 times in order"),
    (dict(sent_at=(0.0, 1.0, 2.0), request_rate=None, concurrency=3), "only for an open loop"),
])
def test_send_times_that_are_not_a_loads_are_refused(kw, needle):
    args = dict(input_tokens=100, output_tokens=10, num_prompts=3, concurrency=None, request_rate=1.0)
    args.update(kw)
    with pytest.raises(KvsizeError, match=needle):
        Load(**args)


def test_check_serve_replays_a_detailed_results_send_times(capsys):
    point = _point(OPEN)
    server = ["--model", str(SERVING / "models" / "llama-3.1-8b" / "config.json"), "--gpu", "h200",
              "--engine", "vllm@0.33.0", "--max-model-len", "65536", "--gpu-memory-utilization", "0.9",
              "--max-num-batched-tokens", "8192", "--max-num-seqs", "1024"]
    main(["check-serve", str(SERVING / point["raw"]), *server, "--format", "json"])
    shown = {r["figure"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    # the same figures as the accuracy page's replay of this point
    # points.json keeps the send times to the microsecond, the result file in full
    assert shown["ttft_p50_ms"]["kvsize"] == pytest.approx(predict_point(served_settings(point), ROOT).ttft_ms[50],
                                                           rel=1e-5)
    main(["check-serve", str(SERVING / point["raw"]), *server])
    assert "(its own send times replayed)" in capsys.readouterr().out


def test_check_serve_refuses_send_times_that_do_not_match_its_requests(tmp_path, capsys):
    raw = json.loads(gzip.open(SERVING / _point(OPEN)["raw"]).read())
    raw["start_times"] = raw["start_times"][:-1]
    bad = tmp_path / "result.json"
    bad.write_text(json.dumps(raw))
    code = main(["check-serve", str(bad), "--model", "llama-3.1-8b", "--gpu", "h200"])
    out = capsys.readouterr()
    assert code == 2 and "field start_times: must be one finite send time a request" in out.err + out.out

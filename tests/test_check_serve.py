"""`kvsize check-serve`: a committed `vllm bench serve` result held to kvsize's serving simulation, and bad result
files refused in one line."""

import gzip
import json

import pytest

from app.cli import main
from conftest import ROOT

SERVING = ROOT / "measure" / "serving"
POINT = "b1-llama8b/llama8b-fp8/llama8b-fp8-p03-i1000-o256-c32.json.gz"
SERVER = ["--model", str(SERVING / "models" / "llama-3.1-8b" / "config.json"), "--gpu", "h200",
          "--engine", "vllm@0.33.0", "--kv-cache-dtype", "fp8", "--max-model-len", "65536",
          "--gpu-memory-utilization", "0.9", "--max-num-batched-tokens", "8192", "--max-num-seqs", "1024"]


def test_a_real_result_is_shown_beside_kvsizes_figures(capsys):
    code = main(["check-serve", str(SERVING / POINT), *SERVER, "--format", "json"])
    shown = json.loads(capsys.readouterr().out)
    raw = json.loads(gzip.open(SERVING / POINT).read())
    rows = {r["figure"]: r for r in shown["rows"]}
    # the measured side is the load generator's own figures, as it wrote them
    assert rows["ttft_p50_ms"]["measured"] == raw["median_ttft_ms"]
    assert rows["itl_p99_ms"]["measured"] == raw["p99_itl_ms"]
    assert shown["load"] == dict(input_tokens=1000, output_tokens=256, prompts=64, concurrency=32, request_rate=None)
    # the same figures the accuracy page gives this point
    from sizing.evidence.serving import predict_point

    point = next(p for p in json.loads((SERVING / "points.json").read_text())["points"] if p["raw"] == POINT)
    served = predict_point(point["settings"], ROOT)
    assert rows["itl_p50_ms"]["kvsize"] == pytest.approx(served.itl_ms[50])
    assert code == (0 if shown["within"] == len(rows) else 1)


def test_the_table_ends_with_a_verdict(capsys):
    main(["check-serve", str(SERVING / POINT), *SERVER])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("kvsize's serving simulation is within its bars on ")


@pytest.mark.parametrize("content, needle", [
    (b"not json", "not JSON"),
    (b"[1, 2]", "a JSON list"),
    (json.dumps({"completed": 4}).encode(), "field request_rate: Field required"),
    (b"\x1f\x8b broken", "not a readable gzip file"),
])
def test_a_file_that_is_not_a_result_is_refused_in_one_line(tmp_path, capsys, content, needle):
    path = tmp_path / "r.json"
    path.write_bytes(content)
    assert main(["check-serve", str(path), *SERVER]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1


def test_a_rate_and_a_concurrency_limit_together_are_named(tmp_path, capsys):
    raw = json.loads(gzip.open(SERVING / POINT).read())
    raw["request_rate"] = 4.0
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    assert main(["check-serve", str(path), *SERVER]) == 2
    assert "a request rate (4/s) and a concurrency limit (32) together" in capsys.readouterr().err


def test_an_open_loop_result_is_simulated_at_its_rate(capsys):
    point = "b1-llama8b/llama8b-bf16/llama8b-bf16-p15-i1000-o256-r4.json.gz"
    bf16 = [a if a != "fp8" else "auto" for a in SERVER]
    main(["check-serve", str(SERVING / point), *bf16, "--format", "json"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["load"] == dict(input_tokens=1000, output_tokens=256, prompts=40, concurrency=None, request_rate=4.0)
    # at 4 requests a second a 1,000-token prompt waits for little: kvsize's TTFT is about one prefill
    rows = {r["figure"]: r for r in shown["rows"]}
    assert rows["ttft_p50_ms"]["kvsize"] < 100


def test_the_servers_api_server_count_sets_the_front_ends_pace(capsys):
    # b8-frontend's Llama-3.2-1B at 512 in flight under four API servers: a token every 9.3 ms measured, 29.4 ms under
    # one; kvsize simulates the server it is told of, as the accuracy page does with the point's settings
    from sizing.evidence.serving import predict_point

    point = next(p for p in json.loads((SERVING / "points.json").read_text())["points"]
                 if p["id"] == "b8-llama1b-api4-p04-i128-o256-c512")
    st = point["settings"]
    server = ["--model", str(ROOT / st["config"]), "--gpu", "h200", "--engine", f"vllm@{st['vllm_version']}",
              "--max-model-len", str(st["max_model_len"]), "--gpu-memory-utilization", str(st["gpu_memory_utilization"]),
              "--max-num-batched-tokens", str(st["max_num_batched_tokens"]), "--max-num-seqs", str(st["max_num_seqs"])]
    gaps, shares = {}, {}
    for count in (1, 4):
        main(["check-serve", str(SERVING / point["raw"]), *server, "--api-server-count", str(count), "--format", "json"])
        shown = json.loads(capsys.readouterr().out)
        assert shown["api_server_count"] == count
        gaps[count] = {r["figure"]: r for r in shown["rows"]}["itl_p50_ms"]["kvsize"]
        shares[count] = shown["host_paced_share"]
    assert gaps[4] == pytest.approx(predict_point({**st, "num_prompts": point["measured"]["completed"]}, ROOT).itl_ms[50])
    assert gaps[1] > 2 * gaps[4]
    # under one API server its streaming sets those steps (29.4 ms measured, the GPU's about 4), and the text says a
    # miss may be the planner's host's; four API servers take most of that away
    assert shares[1] >= 0.5 and shares[1] > shares[4]
    main(["check-serve", str(SERVING / point["raw"]), *server, "--api-server-count", "1"])
    note = capsys.readouterr().out.strip().splitlines()[-1]
    assert note.startswith("  note: the host sets ") and "2.3x apart on two H200 hosts" in note


def test_a_gpu_bound_server_gets_no_host_note(capsys):
    main(["check-serve", str(SERVING / POINT), *SERVER, "--format", "json"])
    assert json.loads(capsys.readouterr().out)["host_paced_share"] < 0.5


@pytest.mark.parametrize("count, needle", [("0", "greater than zero"), ("65", "at most 64"), ("four", "whole number")])
def test_an_api_server_count_out_of_range_is_refused(capsys, count, needle):
    assert main(["check-serve", str(SERVING / POINT), *SERVER, "--api-server-count", count]) == 2
    err = capsys.readouterr().err.strip()
    assert "--api-server-count" in err and needle in err and len(err.splitlines()) == 1


def _server_of(point: dict) -> list[str]:
    st = point["settings"]
    return ["--model", str(ROOT / st["config"]), "--gpu", "h200", "--engine", f"vllm@{st['vllm_version']}",
            "--max-model-len", str(st["max_model_len"]), "--gpu-memory-utilization", str(st["gpu_memory_utilization"]),
            "--max-num-batched-tokens", str(st["max_num_batched_tokens"]), "--max-num-seqs", str(st["max_num_seqs"])]


def test_chunks_that_carry_several_tokens_are_named(capsys):
    # b8-frontend's Llama-3.2-1B at 128 in flight under one API server: the server fell behind and streamed about two
    # tokens a chunk, and vllm bench serve times an ITL per chunk
    point = next(p for p in json.loads((SERVING / "points.json").read_text())["points"]
                 if p["id"] == "b8-llama1b-p02-i128-o256-c128")
    raw = json.loads(gzip.open(SERVING / point["raw"]).read())
    per_chunk = (sum(o - 1 for o in raw["output_lens"] if o > 0)
                 / sum(len(g) for g, o in zip(raw["itls"], raw["output_lens"]) if o > 0))
    assert per_chunk > 2
    main(["check-serve", str(SERVING / point["raw"]), *_server_of(point), "--format", "json"])
    assert json.loads(capsys.readouterr().out)["tokens_per_chunk"] == pytest.approx(per_chunk, abs=1e-3)
    main(["check-serve", str(SERVING / point["raw"]), *_server_of(point)])
    out = capsys.readouterr().out
    assert f"a streamed chunk carried {per_chunk:.2f} tokens on average" in out


def test_one_token_a_chunk_gets_no_chunk_note(capsys):
    main(["check-serve", str(SERVING / POINT), *SERVER, "--format", "json"])
    assert json.loads(capsys.readouterr().out)["tokens_per_chunk"] <= 1.1
    main(["check-serve", str(SERVING / POINT), *SERVER])
    assert "a streamed chunk carried" not in capsys.readouterr().out


@pytest.mark.parametrize("change, needle", [
    (lambda gaps: gaps[:-1], "one of each per request"),
    (lambda gaps: [5, *gaps[1:]], "field itls: must be a list of each request's list of gaps"),
])
def test_gaps_that_are_not_one_list_a_request_are_refused(tmp_path, capsys, change, needle):
    raw = json.loads(gzip.open(SERVING / POINT).read())
    raw["itls"] = change(raw["itls"])
    path = tmp_path / "r.json"
    path.write_text(json.dumps(raw))
    assert main(["check-serve", str(path), *SERVER]) == 2
    err = capsys.readouterr().err.strip()
    assert needle in err and len(err.splitlines()) == 1

"""kvsize watch: a vLLM server's /metrics held against the plan, from a saved text and from a live
local HTTP server. The text is constructed from vLLM 0.26's metric definitions with the block count
of a real start (tests/fixtures/metrics/vllm-0.26-constructed.txt says how)."""

import json

import pytest

from app.cli import main
from sizing.errors import KvsizeError
from sizing.evidence.metrics import read_metrics
from conftest import ROOT, serve_scrapes

TEXT = (ROOT / "tests" / "fixtures" / "metrics" / "vllm-0.26-constructed.txt").read_text()
CONFIG = str(ROOT / "tests" / "fixtures" / "vllm-starts" / "configs" / "llama-3.1-8b.json")
PLAN = ["--model", CONFIG, "--gpu", "h200", "--engine", "vllm@0.26.0", "--max-model-len", "8192",
        "--concurrency", "16"]


def test_reads_vllms_figures():
    m = read_metrics(TEXT)
    assert (m.num_gpu_blocks, m.block_size, m.cache_dtype, m.gpu_memory_utilization) == (57489, 16, "auto", 0.92)
    assert (m.running, m.waiting, m.preemptions, m.engines) == (12, 0, 0.0, 1)
    assert m.kv_cache_usage == pytest.approx(0.4187) and m.prefix_hit_rate == pytest.approx(40960 / 98304)


def test_a_deployment_inside_the_plan(tmp_path, capsys):
    path = tmp_path / "metrics.txt"
    path.write_text(TEXT)
    assert main(["watch", str(path), *PLAN, "--format", "json"]) == 0
    figures = {f["figure"]: f for f in json.loads(capsys.readouterr().out)["figures"]}
    # the start printed 919,824 tokens (57,489 blocks); kvsize plans the pool within 0.01% of it
    assert figures["KV blocks"]["inside"] and figures["KV dtype"]["inside"]


@pytest.mark.parametrize("old, new, figure", [
    ("vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 0.0",
     "vllm:num_requests_waiting{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 7.0", "requests waiting"),
    ('cache_dtype="auto"', 'cache_dtype="fp8_e5m2"', None),  # fp8 where the plan has bf16
    ('num_gpu_blocks="57489"', 'num_gpu_blocks="41000"', "KV blocks"),
    ("vllm:num_preemptions_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 0.0",
     "vllm:num_preemptions_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 3.0", "preemptions"),
])
def test_a_deployment_outside_the_plan_says_what_to_change(tmp_path, capsys, old, new, figure):
    path = tmp_path / "metrics.txt"
    assert old in TEXT
    path.write_text(TEXT.replace(old, new))
    assert main(["watch", str(path), *PLAN]) == 1
    out = capsys.readouterr().out
    assert "OUTSIDE the plan" in out and "→" in out
    if figure:
        assert any(figure in line and "OUTSIDE" in line for line in out.splitlines())


@pytest.mark.parametrize("text, needle", [
    ("# nothing\nprocess_cpu_seconds_total 1.0\n", "holds no vllm: metric"),
    ('vllm:num_requests_running{engine="0"} -3\n', "count of zero or more"),
    ('vllm:cache_config_info{num_gpu_blocks="12.5"} 1\n', "not a whole number"),
])
def test_bad_scrapes_are_refused_in_one_line(text, needle):
    with pytest.raises(KvsizeError, match=needle):
        read_metrics(text)


def test_a_live_server_is_scraped_and_counters_read_between_scrapes(capsys):
    scrapes = [TEXT, TEXT.replace("vllm:num_preemptions_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 0.0",
                                  "vllm:num_preemptions_total{engine=\"0\",model_name=\"meta-llama/Llama-3.1-8B\"} 2.0")]

    server = serve_scrapes([t.encode() for t in scrapes])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        code = main(["watch", url, *PLAN, "--count", "2", "--interval", "1", "--format", "json"])
    finally:
        server.shutdown()
    rows = json.loads(capsys.readouterr().out)["figures"]
    preempted = [r for r in rows if r["figure"] == "preemptions"]
    assert code == 1 and [r["inside"] for r in preempted] == [True, False]
    assert preempted[1]["engine"] == "2 since the last scrape"


def test_an_unreachable_server_is_one_line(capsys):
    assert main(["watch", "http://127.0.0.1:9/metrics", *PLAN]) == 2
    assert "cannot read http://127.0.0.1:9/metrics" in capsys.readouterr().err


@pytest.mark.parametrize("text, needle", [
    ('vllm:num_requests_running{engine="0"} +Inf\n', "finite"),
    ('vllm:kv_cache_usage_perc{engine="0"} 3.5\n', "fraction from 0 to 1"),
    ('vllm:prefix_cache_queries_total{engine="0"} 10\nvllm:prefix_cache_hits_total{engine="0"} 20\n', "exceeds"),
    ('vllm:num_requests_running{engine="0"} 3\nvllm:num_requests_running{engine="0"} 3\n', "twice"),
    ('vllm:num_requests_running{engine="0"} \x1b[31mred\n', "not a number"),
])
def test_scrape_values_are_checked(text, needle):
    with pytest.raises(KvsizeError, match=needle) as caught:
        read_metrics(text)
    assert "\x1b" not in str(caught.value)  # a terminal escape never reaches the terminal


def test_a_counter_reset_is_read_as_a_restart_not_negative_preemptions():
    from sizing.evidence.metrics import PlannedPool, watch
    from sizing.capacity.estimate import estimate
    from sizing.profiles import load_model
    from sizing.capacity.scenario import Scenario

    before = read_metrics(TEXT.replace('num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.0',
                                       'num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B"} 9.0'))
    after = read_metrics(TEXT.replace('num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B"} 0.0',
                                      'num_preemptions_total{engine="0",model_name="meta-llama/Llama-3.1-8B"} 2.0'))
    name, shape = load_model(CONFIG)
    e = estimate(Scenario(name, shape, "H200", 150_109_880_320, engine="vllm@0.26.0", max_model_len=8192))
    line = next(x for x in watch(after, PlannedPool.of(e), 16, previous=before) if x.figure == "preemptions")
    assert line.engine == "2 since the server restarted" and line.engine_value == 2


def _raw_server(answer: bytes, trickle: bool = False):
    """A TCP server that sends `answer` as it is (a malformed HTTP answer), or one byte at a time."""
    import socket
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)

    def serve():
        conn, _ = listener.accept()
        try:
            conn.recv(65536)
            for i in range(len(answer)) if trickle else [None]:
                conn.sendall(answer if i is None else answer[i:i + 1])
                if trickle:
                    import time

                    time.sleep(0.2)
        except OSError:
            pass
        finally:
            conn.close()
            listener.close()

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"


@pytest.mark.parametrize("answer, needle", [
    (b"NOT-HTTP\r\n\r\n", "cannot read"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n" + TEXT[:100].encode(), "ended after"),
])
def test_a_malformed_http_answer_is_one_line(answer, needle, capsys):
    url = _raw_server(answer)
    assert main(["watch", url, *PLAN]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and err.count("\n") == 1


def test_a_trickling_server_is_cut_off_by_the_scrape_deadline():
    from app.commands.watch import _http_scrape

    url = _raw_server(b"HTTP/1.1 200 OK\r\nContent-Length: 400\r\n\r\n" + TEXT[:400].encode(), trickle=True)
    with pytest.raises(KvsizeError, match="the scrape took over"):
        _http_scrape(url, 1 << 20, deadline_s=2.0)


@pytest.mark.parametrize("url", ["http://127.0.0.1:notaport/metrics", "http://127.0.0.1:80/met rics",
                                 "http://127.0.0.1/x\nHost: y"])
def test_a_malformed_url_is_one_line(url, capsys):
    assert main(["watch", url, *PLAN]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1

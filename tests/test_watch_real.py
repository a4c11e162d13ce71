"""kvsize watch against a real vLLM 0.26.0 server: `/metrics` scraped from `vllm serve` with dummy weights on
one H200 under a load that fills its KV cache (tests/fixtures/metrics/README.md gives the settings and the
load), read from the saved texts and from a live local HTTP server serving them."""

import io
import json
import re
import shlex
import tarfile

import pytest

from app.cli import main
from sizing.evidence.metrics import read_metrics
from conftest import ROOT, serve_scrapes

FIXTURES = ROOT / "tests" / "fixtures" / "metrics"
CONFIGS = ROOT / "tests" / "fixtures" / "vllm-starts" / "configs"

# The settings of each start, as its server log's "non-default args" (line 7) prints them; the Llama server
# loaded its compiled graph from vLLM's compile cache (-serve.log line 26), so it compiled nothing.
LLAMA = "vllm-0.26.0-h200-llama-3.1-8b"
QWEN = "vllm-0.26.0-h200-qwen3-8b-fp8"
START = {
    LLAMA: ["--model", str(CONFIGS / "llama-3.1-8b.json"), "--gpu", "h200", "--engine", "vllm@0.26.0",
            "--max-model-len", "4096", "--gpu-memory-utilization", "0.16", "--max-num-seqs", "64",
            "--compile-cache", "warm"],
    QWEN: ["--model", str(CONFIGS / "qwen3-8b.json"), "--gpu", "h200", "--engine", "vllm@0.26.0",
           "--max-model-len", "8192", "--gpu-memory-utilization", "0.16", "--max-num-seqs", "128",
           "--kv-cache-dtype", "fp8"],
}
ARGS_LINE = {  # -serve.log line 7
    LLAMA: "'max_model_len': 4096, 'served_model_name': ['m'], 'load_format': 'dummy', "
           "'gpu_memory_utilization': 0.16, 'max_num_seqs': 64}",
    QWEN: "'max_model_len': 8192, 'served_model_name': ['m'], 'load_format': 'dummy', "
          "'gpu_memory_utilization': 0.16, 'kv_cache_dtype': 'fp8', 'max_num_seqs': 128}",
}
# What each scrape says: (num_gpu_blocks, block_size, cache_dtype, gpu_memory_utilization) from
# vllm:cache_config_info (LLAMA line 517, QWEN line 522 of every scrape); running (line 57), waiting
# (line 60), kv_cache_usage_perc (line 72), num_preemptions_total (line 111),
# prefix_cache_queries_total (line 75), prefix_cache_hits_total (line 81).
SCRAPES = {
    (LLAMA, "idle"): ((3207, 16, "auto", 0.16), 0, 0, 0.0, 0.0, 0.0, 0.0),
    (LLAMA, "busy"): ((3207, 16, "auto", 0.16), 26, 6, 0.9990642545227698, 18.0, 411000.0, 0.0),
    (LLAMA, "after"): ((3207, 16, "auto", 0.16), 0, 0, 0.0, 20.0, 507000.0, 0.0),
    (QWEN, "idle"): ((5088, 16, "fp8", 0.16), 0, 0, 0.0, 0.0, 0.0, 0.0),
    (QWEN, "busy"): ((5088, 16, "fp8", 0.16), 45, 4, 0.9946923530568115, 20.0, 300000.0, 0.0),
    (QWEN, "after"): ((5088, 16, "fp8", 0.16), 0, 0, 0.0, 26.0, 478500.0, 0.0),
}
# "GPU KV cache size: N tokens" in the server log (LLAMA line 31, QWEN line 33).
LOGGED_TOKENS = {LLAMA: (31, 51312), QWEN: (33, 81408)}


def text(start: str, kind: str) -> str:
    return (FIXTURES / f"{start}-{kind}.txt").read_text()


def predicted(start: str, capsys, concurrency: int = 1) -> dict:
    """kvsize's estimate of the start, as `kvsize estimate --format json` prints it."""
    assert main(["estimate", *START[start], "--concurrency", str(concurrency), "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def watch_json(capsys, source: str, start: str, concurrency: int, *more: str) -> tuple[int, dict]:
    code = main(["watch", source, *START[start], "--concurrency", str(concurrency), *more, "--format", "json"])
    return code, json.loads(capsys.readouterr().out)


def by_figure(rows: list[dict], scrape: int = 1) -> dict:
    return {r["figure"]: r for r in rows if r["scrape"] == scrape}


@pytest.mark.parametrize("start", [LLAMA, QWEN])
def test_the_saved_log_is_the_start_the_tests_plan(start):
    log = (FIXTURES / f"{start}-serve.log").read_text().splitlines()
    assert "version 0.26.0" in log[2] and "non-default args" in log[6] and ARGS_LINE[start] in log[6]
    # the log's pool is the scrape's: num_gpu_blocks × block_size tokens
    line, tokens = LOGGED_TOKENS[start]
    assert f"GPU KV cache size: {tokens:,} tokens" in log[line - 1]
    blocks, block_size = SCRAPES[start, "busy"][0][:2]
    assert blocks * block_size == tokens


@pytest.mark.parametrize("start, kind", list(SCRAPES))
def test_watch_reads_every_figure_of_a_real_scrape(start, kind):
    m = read_metrics(text(start, kind))
    info, running, waiting, usage, preemptions, queries, hits = SCRAPES[start, kind]
    assert (m.num_gpu_blocks, m.block_size, m.cache_dtype, m.gpu_memory_utilization) == info
    assert (m.running, m.waiting, m.preemptions, m.prefix_queries, m.prefix_hits) == (
        running, waiting, preemptions, queries, hits)
    assert m.kv_cache_usage == pytest.approx(usage, abs=1e-12)
    # one engine (engine="0"); num_requests_waiting_by_reason is not added to the waiting requests
    assert m.engines == 1 and "vllm:num_requests_waiting_by_reason" in m.names


@pytest.mark.parametrize("start", [LLAMA, QWEN])
def test_the_busy_scrape_is_the_fullest_of_the_run(start):
    with tarfile.open(FIXTURES / f"{start}-scrapes.tgz") as tar:
        members = sorted((m for m in tar.getmembers() if m.isfile()), key=lambda m: m.name)
        scrapes = [tar.extractfile(m).read().decode() for m in members]
    assert len(scrapes) == 8
    usage = [read_metrics(s).kv_cache_usage for s in scrapes]
    assert scrapes[usage.index(max(usage))] == text(start, "busy")
    preempted = [read_metrics(s).preemptions for s in scrapes]
    assert preempted == sorted(preempted) and preempted[-1] == SCRAPES[start, "after"][4]


@pytest.mark.parametrize("start", [LLAMA, QWEN])
def test_watch_on_the_busy_scrape_reports_the_engines_pool_and_a_full_cache(start, capsys):
    e = predicted(start, capsys)
    (blocks, block_size, dtype, _), running, waiting, usage, preemptions, _, _ = SCRAPES[start, "busy"]
    path = str(FIXTURES / f"{start}-busy.txt")
    code, out = watch_json(capsys, path, start, e["max_concurrency"])
    assert out["plan"]["num_blocks"] == e["num_blocks"] and out["plan"]["block_size"] == block_size
    f = by_figure(out["figures"])
    error = blocks / e["num_blocks"] - 1
    assert f["KV blocks"]["engine"] == f"{blocks:,} of {block_size} tokens"
    assert f["KV blocks"]["planned"] == f"{e['num_blocks']:,} of {block_size} tokens ({100 * error:+.1f}%)"
    # watch's rule: the deployment is inside while the engine holds at least 99% of the planned blocks
    assert f["KV blocks"]["inside"] is (blocks >= 0.99 * e["num_blocks"])
    assert f["KV dtype"]["engine"] == dtype and f["KV dtype"]["inside"] is True
    assert f["KV cache usage"]["engine"] == f"{100 * usage:.1f}%" and usage > 0.99
    assert f["KV cache usage"]["inside"] is False
    assert f["requests waiting"]["engine"] == str(waiting) and waiting > 0 and f["requests waiting"]["inside"] is False
    assert f["preemptions"]["engine"] == f"{preemptions:.0f} since start" and preemptions > 0
    assert f["preemptions"]["inside"] is False
    # planned for what the pool holds at max_model_len: more requests run (shorter ones), beyond the plan
    assert running > e["max_concurrency"]
    assert f["requests running"]["engine"] == str(running) and f["requests running"]["inside"] is False
    assert code == 1


@pytest.mark.parametrize("start, load", [(LLAMA, 64), (QWEN, 96)])
def test_a_plan_that_cannot_hold_its_own_peak_vouches_for_no_running_request(start, load, capsys):
    # planned for every request of the load at once (64 and 96: tests/fixtures/metrics/README.md), more than the
    # pool holds at max_model_len: the running requests are not inside such a plan (it said so of its own peak),
    # and neither are the queue, the full cache and the preemptions
    e = predicted(start, capsys)
    assert load > e["max_concurrency"]
    code, out = watch_json(capsys, str(FIXTURES / f"{start}-busy.txt"), start, load)
    f = by_figure(out["figures"])
    running = f["requests running"]
    assert running["inside"] is False and running["planned"].startswith(f"up to {load} at")
    assert "the plan cannot hold its own peak" in running["advice"]
    assert f"{load} requests planned, its pool holds {e['max_concurrency']}" in running["advice"]
    assert [f[k]["inside"] for k in ("requests waiting", "KV cache usage", "preemptions")] == [False, False, False]
    assert code == 1


def test_an_idle_server_is_inside_the_plan_but_for_the_pool(capsys):
    # before the load (-idle.txt): nothing runs, waits or was preempted, and no prefix was queried
    for start in (LLAMA, QWEN):
        e = predicted(start, capsys)
        code, out = watch_json(capsys, str(FIXTURES / f"{start}-idle.txt"), start, e["max_concurrency"])
        f = by_figure(out["figures"])
        assert "prefix-cache hit rate" not in f
        assert all(r["inside"] for k, r in f.items() if k != "KV blocks"), f
        assert code == (0 if f["KV blocks"]["inside"] else 1)


@pytest.mark.parametrize("start", [LLAMA, QWEN])
def test_kvsize_predicts_the_engines_pool_within_1_percent(start, capsys):
    blocks = SCRAPES[start, "busy"][0][0]
    assert abs(blocks / predicted(start, capsys)["num_blocks"] - 1) <= 0.01


def test_a_live_server_through_a_load_counters_read_between_scrapes(capsys):
    # idle, busy and after, served in turn as the real server answered them
    server = serve_scrapes([(FIXTURES / f"{LLAMA}-{k}.txt").read_bytes() for k in ("idle", "busy", "after")])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        code, out = watch_json(capsys, url, LLAMA, 12, "--count", "3", "--interval", "1")
    finally:
        server.shutdown()
        server.server_close()
    assert out["source"] == url and code == 1
    scrapes = [by_figure(out["figures"], n) for n in (1, 2, 3)]
    # running (line 57): 0, 26, 0; preemptions (line 111): 0, then 18 - 0, then 20 - 18
    assert [s["requests running"]["engine"] for s in scrapes] == ["0", "26", "0"]
    assert [s["preemptions"]["engine"] for s in scrapes] == [
        "0 since start", "18 since the last scrape", "2 since the last scrape"]
    assert [s["preemptions"]["inside"] for s in scrapes] == [True, False, False]
    # prefix hits (line 81) stay 0 while the queries (line 75) grow 0 -> 411,000 -> 507,000
    assert "prefix-cache hit rate" not in scrapes[0]
    assert [s["prefix-cache hit rate"]["engine"] for s in scrapes[1:]] == ["0.0%", "0.0%"]
    assert [s["KV cache usage"]["engine"] for s in scrapes] == ["0.0%", "99.9%", "0.0%"]
    assert {s["KV blocks"]["engine"] for s in scrapes} == {"3,207 of 16 tokens"}


def test_a_live_fp8_server_in_the_table_form(capsys):
    server = serve_scrapes([(FIXTURES / f"{QWEN}-busy.txt").read_bytes()])
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        code = main(["watch", url, *START[QWEN], "--concurrency", "96"])
    finally:
        server.shutdown()
        server.server_close()
    out = capsys.readouterr().out.splitlines()
    assert code == 1 and out[0].startswith(f"{url} against the plan (vllm@0.26 rules")
    line = {re.split(r"\s{2,}", s.split("] ", 1)[1])[0]: s for s in out if s.startswith("  [1] ")}
    assert "fp8 " in line["KV dtype"] and "planned fp8 (fp8_e4m3)" in line["KV dtype"]
    assert line["KV dtype"].endswith("inside the plan")
    # 96 planned where the pool holds 9 of full length: a plan that cannot hold its own peak vouches for nothing
    assert " 45 " in line["requests running"] and line["requests running"].endswith("OUTSIDE the plan")
    assert " 4 " in line["requests waiting"] and line["requests waiting"].endswith("OUTSIDE the plan")
    assert "99.5%" in line["KV cache usage"] and "20 since start" in line["preemptions"]


def _readme_block(readme: str, first: str) -> tuple[list[str], list[str], str]:
    """README's code block starting `first`: its command (continuation lines joined), the lines after the
    command, and the README after the block."""
    block, rest = readme.split("\n" + first, 1)[1].split("\n```\n", 1)
    lines = block.splitlines()
    n = 1
    while lines[n - 1].endswith("\\"):
        n += 1
    command = first + " ".join(line.rstrip("\\") for line in lines[:n])
    return shlex.split(command), lines[n:], rest


def test_the_readme_shows_what_watch_prints_on_the_real_scrape(capsys, monkeypatch):
    # README's "Plan → deploy → watch" example: watch run on the saved busy scrape, and its output
    readme = (ROOT / "README.md").read_text()
    command, shown, _ = _readme_block(readme, "$ kvsize watch tests/fixtures/metrics/")
    assert command[:3] == ["$", "kvsize", "watch"] and command[3] == f"tests/fixtures/metrics/{LLAMA}-busy.txt"
    monkeypatch.chdir(ROOT)
    assert main(command[2:]) == 1
    assert capsys.readouterr().out.splitlines() == shown
    # the plan's lines shown beside it (the next code block) are what estimate prints for those settings
    plan, _, rest = _readme_block(readme, "kvsize estimate --model llama-3.1-8b --gpu h200 --engine vllm@0.26.0 ")
    assert main(plan[1:]) == 0
    printed = capsys.readouterr().out.splitlines()
    excerpt = rest.split("```\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert len(excerpt) == 2 and all(line in printed for line in excerpt)
    # the Qwen3-8B fp8 sentence: the engine's blocks (-busy.txt line 522) against kvsize's plan
    e = predicted(QWEN, capsys)
    error = f"{5088 / e['num_blocks'] - 1:+.1%}".replace("-", "\N{MINUS SIGN}")
    assert f"engine holds 5,088 blocks where kvsize plans {e['num_blocks']:,} ({error}" in readme


def test_watch_takes_the_servers_own_cache_config_and_never_advises_the_format_in_use(capsys):
    # the fp8 server's busy scrape, with no --kv-cache-dtype or utilization on the command line: the plan takes
    # fp8, 0.16 and block 16 from vllm:cache_config_info, so the dtype and blocks are inside it; advice for a full
    # pool points past fp8, not at it; every figure is a number in JSON, and a figure inside the plan has no advice
    path = FIXTURES / f"{QWEN}-busy.txt"
    code = main(["watch", str(path), "--model", str(CONFIGS / "qwen3-8b.json"), "--gpu", "h200", "--engine",
                 "vllm@0.26.0", "--max-model-len", "8192", "--max-num-seqs", "128", "--concurrency", "96",
                 "--format", "json"])
    out, err = capsys.readouterr()
    assert "takes k_cache_dtype=fp8, memory_fraction=0.16, block_size=16 from the server's" in err
    figures = {f["figure"]: f for f in json.loads(out)["figures"]}
    assert figures["KV dtype"]["inside"] and figures["KV blocks"]["inside"]
    assert isinstance(figures["KV blocks"]["engine_value"], int) and figures["KV blocks"]["engine_value"] == 5088
    for f in figures.values():
        assert (f["advice"] == "") == (f["inside"] is not False)
        assert "(fp8" not in f["advice"] and "fp8, half" not in f["advice"]
    assert code in (0, 1)


@pytest.mark.parametrize("start", [LLAMA, QWEN])
def test_watch_from_the_estimates_own_json_holds_the_scrape_to_the_same_figures(start, capsys, tmp_path):
    """`watch --plan` on the JSON `estimate` wrote gives what the same options give to watch itself."""
    concurrency = 8
    plan = tmp_path / "estimate.json"
    assert main(["estimate", *START[start], "--concurrency", str(concurrency), "--format", "json",
                 "--out", str(plan)]) == 0
    capsys.readouterr()
    written = json.loads(plan.read_text())["deployment"]
    assert written["engine"] == "vllm@0.26.0" and written["num_blocks"] == json.loads(plan.read_text())["num_blocks"]
    code_options, by_options = watch_json(capsys, str(FIXTURES / f"{start}-busy.txt"), start, concurrency)
    code = main(["watch", str(FIXTURES / f"{start}-busy.txt"), "--plan", str(plan), "--format", "json"])
    by_plan = json.loads(capsys.readouterr().out)
    assert code == code_options == 1  # the busy scrape runs more requests than 8
    assert by_plan["plan"] == by_options["plan"] and by_plan["figures"] == by_options["figures"]


def test_watch_from_a_fleet_plan_holds_one_replica_to_the_plans_pool(capsys, tmp_path):
    """A plan's JSON names one decode replica of the fleet that serves the workload; watch holds a scrape to
    that pool."""
    workload = tmp_path / "w.yaml"
    workload.write_text("name: chat\npeak_concurrency: 40\nbuckets:\n  - {name: chat, max_context_tokens: 4096, "
                        "share_percent: 100, output_tokens: 300}\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--workload", str(workload), "--model", str(CONFIGS / "llama-3.1-8b.json"), "--gpus", "h200",
                 "--engine", "vllm@0.26.0", "--tp", "1", "--out", str(out)]) == 0
    capsys.readouterr()
    record = json.loads(out.read_text())
    deployment, cheapest = record["deployment"], record["cheapest"]
    assert (deployment["gpu"], deployment["kv_format"], deployment["tensor_parallel_size"]) == \
        (cheapest["decode_gpu"], cheapest["kv_format"], cheapest["decode_tp"])
    # the peak shared by the design's decode replicas
    assert deployment["concurrency"] == -(-40 // cheapest["decode_replicas"])
    code = main(["watch", str(FIXTURES / f"{LLAMA}-busy.txt"), "--plan", str(out), "--format", "json"])
    shown = json.loads(capsys.readouterr().out)
    assert shown["plan"]["num_blocks"] == deployment["num_blocks"]
    blocks = by_figure(shown["figures"])["KV blocks"]
    # the scrape's server ran at 0.16 of the GPU: far below the plan's pool, which watch says
    assert code == 1 and blocks["inside"] is False and blocks["planned_value"] == deployment["num_blocks"]


@pytest.mark.parametrize("content, named", [
    ('{"schema": "kvsize.plan/1", "deployment": {"model": "m"}}', "deployment.gpu"),
    ('{"schema": "kvsize.sweep/1"}', "schema 'kvsize.sweep/1'"),
    ('[1, 2]', "schema 'list'"),
    ('{"schema": "kvsize.plan/1", "deployment": null}', "deploys nothing"),
    ('not json', "not JSON"),
])
def test_a_plan_file_that_is_not_one_is_refused_in_one_line(content, named, capsys, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(content)
    assert main(["watch", str(FIXTURES / f"{LLAMA}-busy.txt"), "--plan", str(plan)]) == 2
    err = capsys.readouterr().err.strip()
    assert named in err and len(err.splitlines()) == 1


def test_an_option_the_plan_gives_is_not_taken_twice(capsys, tmp_path):
    plan = tmp_path / "estimate.json"
    assert main(["estimate", *START[LLAMA], "--format", "json", "--out", str(plan)]) == 0
    capsys.readouterr()
    # --gpu at its default value is still refused: the plan's GPU would silently win otherwise
    assert main(["watch", str(FIXTURES / f"{LLAMA}-busy.txt"), "--plan", str(plan), "--gpu", "h100-sxm"]) == 2
    assert "drop --gpu" in capsys.readouterr().err

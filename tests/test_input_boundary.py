"""One bounded reader for every input file, YAML read as plain data, outputs that name the path given:
each bad input is one line naming what was wrong, exit 2, nothing written."""

import json
import os
from pathlib import Path

import pytest

from app.cli import main
from conftest import ROOT

WORKLOAD = (ROOT / "examples" / "workload.yaml").read_text()


def test_devices_and_pipes_are_refused_before_reading(tmp_path, capsys):
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)  # reading it would block forever
    for path in ("/dev/zero", str(fifo), str(tmp_path)):
        assert main(["check-log", path, "--model", "llama-3.1-8b"]) == 2
        assert "is not a regular file" in capsys.readouterr().err


def test_a_yaml_alias_bomb_is_refused_at_once(tmp_path, capsys):
    rows = ['a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    rows += [f"{b}: &{b} [{', '.join([f'*{a}'] * 9)}]" for a, b in zip("abcdefgh", "bcdefghi")]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(rows) + "\npeak_concurrency: 4\nbuckets: *i\n")
    assert main(["plan", "--workload", str(path), "--model", "llama-3.1-8b"]) == 2
    assert "YAML aliases" in capsys.readouterr().err


def test_yaml_values_stay_json_values(tmp_path, capsys):
    dated = tmp_path / "dated.yaml"
    dated.write_text(WORKLOAD.replace("name: chat + RAG mix", "name: 2024-01-01"))
    out = tmp_path / "plan.json"
    assert main(["plan", "--workload", str(dated), "--model", "llama-3.1-8b", "--gpus", "h100-sxm",
                 "--out", str(out)]) == 0
    assert '"name": "2024-01-01"' in out.read_text()  # a date-like name stays text
    for tag in ("!!binary aGVsbG8=", "!!set {a, b}", "!!timestamp 2024-01-01"):
        bad = tmp_path / "tagged.yaml"
        bad.write_text(WORKLOAD.replace("name: chat + RAG mix", f"name: {tag}"))
        assert main(["plan", "--workload", str(bad), "--model", "llama-3.1-8b"]) == 2
        assert "makes a value a workload cannot hold" in capsys.readouterr().err


def test_an_unwritable_out_names_the_path_given(capsys):
    assert main(["estimate", "--model", "llama-3.1-8b", "--format", "json", "--out", "/proc/x.json"]) == 2
    err = capsys.readouterr().err
    assert "--out /proc/x.json" in err and ".part" not in err


LOG = ROOT / "tests" / "fixtures" / "vllm-starts" / "logs" / "h200-0.22.1-llama-2-7b.log"
CONFIG = ROOT / "tests" / "fixtures" / "vllm-starts" / "configs" / "llama-2-7b.json"


@pytest.mark.parametrize("old, new, needle", [
    ("Available KV cache memory: 55.84 GiB", "Available KV cache memory: 1.2.3 GiB", "'1.2.3', which is not a number"),
    ("GPU KV cache size: 114,352 tokens", "GPU KV cache size: ,,, tokens", "not a whole number"),
    ("Available KV cache memory: 55.84", "Available KV cache memory: -55.84", "holds no figure"),
    ("Available KV cache memory: 55.84 GiB", "Available KV cache memory: nan GiB", "holds no figure"),
    ("Available KV cache memory: 55.84 GiB", "Available KV cache memory: ", "holds no figure"),
    ("GPU KV cache size: 114,352", "GPU KV cache size: " + "9" * 400, "not a whole number"),
    ("'gpu_memory_utilization': 0.5", "'gpu_memory_utilization': None", "the log's gpu_memory_utilization"),
    ("'gpu_memory_utilization': 0.5", "'gpu_memory_utilization': {1, 2}", "the log's gpu_memory_utilization"),
    ("'max_model_len': 4096", "'max_model_len': " + "9" * 5000, "not a readable dict"),
])
def test_a_misread_log_figure_is_refused_not_guessed(tmp_path, capsys, old, new, needle):
    # a real start's log (vLLM 0.22.1 on an H200, tests/fixtures/vllm-starts) with one figure broken
    text = LOG.read_text()
    assert old in text
    path = tmp_path / "broken.log"
    path.write_text(text.replace(old, new, 1))
    assert main(["check-log", str(path), "--model", str(CONFIG), "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and err.count("\n") == 1


def test_a_megabyte_line_does_not_slow_the_reading(tmp_path, capsys):
    # patterns stop at 64 KiB a line: a hostile 1.1 MB line is read in linear time (the benchmark of
    # this case took over 20 s before); the figures of the real lines still come out
    path = tmp_path / "long.log"
    path.write_text(LOG.read_text() + "\n" + "x" * 1_100_000 + "Load weight end. " * 1000 + "\n")
    assert main(["check-log", str(path), "--model", str(CONFIG), "--gpu", "h200", "--format", "json"]) == 0


@pytest.mark.parametrize("engine, needle", [
    ("vllm@", "give a version after '@'"),
    ("vllm@" + "9" * 5000, "must look like 0.19"),
])
def test_engine_versions_are_checked_by_meaning(capsys, engine, needle):
    assert main(["estimate", "--model", "llama-3.1-8b", "--engine", engine]) == 2
    assert needle in capsys.readouterr().err


def test_a_log_of_a_release_without_rules_is_not_predicted_with_another(capsys):
    assert main(["check-log", str(LOG), "--model", str(CONFIG), "--gpu", "h200", "--engine-version", "0.0.0"]) == 2
    assert "give --engine-version" in capsys.readouterr().err


@pytest.mark.parametrize("old, new", [("peak_concurrency: 400", "peak_concurrency: " + "9" * 5000),
                                      ("peak_concurrency: 400", "peak_concurrency: " + "1" + "0" * 30),
                                      ("peak_concurrency: 400", "peak_concurrency: 20000000"),
                                      ("max_context_tokens: 8192", "max_context_tokens: 99999999")])
def test_counts_beyond_what_kvsize_plans_are_refused(tmp_path, capsys, old, new):
    path = tmp_path / "big.yaml"
    path.write_text(WORKLOAD.replace(old, new, 1))
    assert main(["plan", "--workload", str(path), "--model", "llama-3.1-8b"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsize: error:") and "Traceback" not in err


def test_a_peak_of_millions_with_latency_targets_is_planned_by_bisection(tmp_path):
    # the prefill replica count was searched one by one up to the peak: 10 million never finished
    path = tmp_path / "huge.yaml"
    path.write_text("peak_concurrency: 10000000\nitl_target_ms: 50\nttft_target_ms: 2000\nbuckets:\n"
                    "  - {max_context_tokens: 4096, share_percent: 100, output_tokens: 100}\n")
    out = tmp_path / "plan.json"
    assert main(["plan", "--workload", str(path), "--model", "llama-3.1-8b", "--gpus", "h100-sxm", "--formats",
                 "auto", "--tp", "1", "--out", str(out)]) == 0


def test_validate_refuses_malformed_reports_with_exit_2(tmp_path, capsys):
    deep = tmp_path / "deep.json"
    deep.write_text('{"schema": "kvsize.measure/1", "device": {"name": "x"}, "capacity": ' + "[" * 960 + "]" * 960 + "}")
    assert main(["validate", str(deep)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvsize: error:") and ("nests more than" in err or "recursion" in err)


def test_outputs_never_overwrite_an_input(tmp_path, capsys):
    import yaml

    workload = tmp_path / "w.json"
    workload.write_text(__import__("json").dumps(yaml.safe_load(WORKLOAD)))
    before = workload.read_text()
    assert main(["plan", "--workload", str(workload), "--model", "llama-3.1-8b", "--out", str(workload)]) == 2
    assert "is one of this run's inputs" in capsys.readouterr().err and workload.read_text() == before


@pytest.mark.parametrize("option, link, needle", [("--host-link", "nvlink4-peer", "is a peer link"),
                                                  ("--disk-link", "pcie5-x16", "is a host link")])
def test_tier_links_are_checked_by_kind(capsys, option, link, needle):
    extra = ["--disk", "1TB"] if option == "--disk-link" else ["--host-memory", "100GiB"]
    assert main(["tiers", "--workload", str(ROOT / "examples" / "multi-turn-chat.yaml"), "--model", "llama-3.1-8b",
                 *extra, option, link]) == 2
    assert needle in capsys.readouterr().err


def test_a_sweep_too_large_to_write_is_refused_before_it_runs(capsys, tmp_path):
    contexts = ",".join(str(1000 + i) for i in range(20000))
    assert main(["sweep", "--models", "llama-3.1-8b,qwen3-8b", "--contexts", contexts, "--tp", "1,2,4,8",
                 "--formats", "auto,fp8,nvfp4,int8", "--gpus", "h100-sxm,h200,l40s", "--out", str(tmp_path / "s.xlsx")]) == 2
    assert "at most 1,048,575 rows to an .xlsx sheet" in capsys.readouterr().err


def test_validate_names_what_is_wrong_in_a_report(tmp_path, capsys):
    import json

    report = json.loads((ROOT / "measure" / "reports" / "h100-capacity.json").read_text())
    report["capacity"][0]["kv_cache_dtype"] = None
    null = tmp_path / "null.json"
    null.write_text(json.dumps(report))
    assert main(["validate", str(null)]) == 2
    assert "capacity[0].kv_cache_dtype is null" in capsys.readouterr().err
    huge = tmp_path / "huge.json"
    huge.write_text('{"schema": "kvsize.measure/1", "total": ' + "9" * 5000 + "}")
    assert main(["validate", str(huge)]) == 2
    assert "a number too long" in capsys.readouterr().err


def test_several_outputs_are_written_all_or_none(tmp_path, capsys):
    # the second output cannot be written: the first must not be left behind either
    first = tmp_path / "tiers.json"
    assert main(["tiers", "--workload", str(ROOT / "examples" / "multi-turn-chat.yaml"), "--model", "llama-3.1-8b",
                 "--out", str(first), "--out", "/proc/tiers.xlsx"]) == 2
    assert not first.exists() and not list(tmp_path.glob(".*.part"))
    assert "--out /proc/tiers.xlsx" in capsys.readouterr().err


def test_a_decode_time_changed_alone_is_caught(tmp_path, capsys):
    # one kernel point's median time raised 10%: the achieved bandwidth stored beside it no longer follows
    import json

    report = json.loads((ROOT / "measure" / "reports" / "h200-decode-kernels.json").read_text())
    report["kernels"][0]["median_ms"] *= 1.1
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert main(["validate", str(path)]) == 1
    assert "does not follow from" in capsys.readouterr().err


@pytest.mark.parametrize("command", [
    ["estimate", "--model", "{config}", "--gpu", "h200"],
    ["compare", "--model", "{config}", "--gpu", "h200"],
    ["sweep", "--models", "{config}", "--gpus", "h200", "--no-progress"],
])
def test_out_never_replaces_an_input_even_through_a_link(tmp_path, command, capsys):
    from app.cli import main

    config = tmp_path / "config.json"
    original = (ROOT / "tests" / "fixtures" / "configs" / "Llama-3.1-8B.json").read_text()
    config.write_text(original)
    link = tmp_path / "link.csv"
    link.symlink_to(config)
    for out in (config, link):
        args = [a.replace("{config}", str(config)) for a in command] + ["--out", str(out)]
        assert main(args) == 2
        assert "is one of this run's inputs" in capsys.readouterr().err
    assert config.read_text() == original


def test_out_is_a_regular_file_never_a_device_or_fifo(tmp_path, capsys):
    import os

    from app.cli import main

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for out in (fifo, Path("/dev/null")):
        assert main(["estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--out", str(out)]) == 2
        assert "not a regular file" in capsys.readouterr().err
    assert fifo.exists() and not fifo.is_file()


@pytest.mark.parametrize("patch, field", [
    ({"tie_word_embeddings": "false"}, "tie_word_embeddings"),  # a string is not read as its truthiness
    ({"quantization_config": "fp8"}, "quantization_config"),  # not an object: never sized as bf16 in silence
    ({"torch_dtype": "float7"}, "torch_dtype"),  # an unknown dtype is not taken for bf16
])
def test_config_values_of_the_wrong_kind_are_refused_by_name(tmp_path, patch, field, capsys):
    from app.cli import main

    config = json.loads((ROOT / "tests" / "fixtures" / "configs" / "Llama-3.1-8B.json").read_text())
    config.update(patch)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert main(["estimate", "--model", str(path), "--gpu", "h200"]) == 2
    err = capsys.readouterr().err
    assert field in err and err.count("\n") == 1 and "Traceback" not in err


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(mantissa=st.integers(min_value=-9, max_value=9), exponent=st.integers(min_value=-10**12, max_value=10**12),
       unit=st.sampled_from(["", "B", "KiB", "MiB", "GiB", "TiB", "GB", "TB"]))
def test_sizes_at_the_edges_are_a_size_or_one_line(mantissa, exponent, unit):
    # past Decimal's exponent range, underflowing to nothing, or above 1 PiB: refused by name, never a crash
    # and never a silent 0 (which would mean the whole card)
    from sizing.errors import KvsizeError
    from sizing.units import MAX_SIZE_BYTES, parse_size

    try:
        size, _ = parse_size(f"{mantissa}e{exponent}{unit}", "--gpu-memory")
    except KvsizeError as e:
        assert "--gpu-memory" in str(e) and "\n" not in str(e)
    else:
        assert 1 <= size <= MAX_SIZE_BYTES


@pytest.mark.parametrize("args, needle", [
    (["plan", "--workload", "examples/workload.yaml", "--model", "llama-3.1-8b", "--gpus", "h100-sxm",
      "--price", "h100-sxm=1e308"], "at most 1,000 USD"),
    (["plan", "--workload", "examples/workload.yaml", "--model", "llama-3.1-8b", "--gpus", "h100-sxm",
      "--kv-efficiency", "bf16=1e-320"], "from 0.001 to 1"),
    (["tiers", "--workload", "examples/multi-turn-chat.yaml", "--model", "llama-3.1-8b", "--mfu", "1e-320"],
     "from 0.001 to 1"),
])
def test_numbers_that_only_overflow_the_tables_are_refused(args, needle, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main([*args, "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and not (tmp_path / "out.json").exists()


def test_a_hangup_ends_a_run_like_sigterm(tmp_path):
    # the terminal closing (SIGHUP) leaves no .part file and no half-written output
    import signal
    import subprocess
    import sys

    from helpers import wait_until_catching

    out = tmp_path / "grid.csv"
    proc = subprocess.Popen([sys.executable, "-m", "app.cli", "sweep", "--models", "llama-3.1-8b,qwen3-8b,gpt-oss-20b",
                             "--gpus", "h100-sxm,h200,l40s,a100-80gb,b200", "--formats", "auto,fp8,nvfp4,q4_0",
                             "--contexts", "1k,2k,4k,8k,16k,32k,64k,128k", "--tp", "1,2,4,8", "--out", str(out),
                             "--no-progress"], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    wait_until_catching(proc, signal.SIGHUP)
    proc.send_signal(signal.SIGHUP)
    err = proc.communicate(timeout=120)[1]
    assert "Traceback" not in err and not list(tmp_path.glob("*.part"))
    assert (proc.returncode == 143 and not out.exists()) or (proc.returncode == 0 and out.exists())


def test_yaml_numbers_are_read_as_json_reads_them(tmp_path):
    # YAML 1.1 reads 010 as octal 8 and 1:30 as the sexagesimal 90; a workload reads them as JSON would
    import yaml

    from sizing.planners.workload import _UniqueKeyLoader

    loaded = yaml.load("a: 010\nb: 1:30\nc: no\nd: 1e3\ne: true\n", Loader=_UniqueKeyLoader.get())
    assert loaded == {"a": 10, "b": "1:30", "c": "no", "d": 1000.0, "e": True}


@pytest.mark.parametrize("value", ["=bf16", "first:2=", " , =fp8"])
def test_a_layer_override_that_changes_nothing_is_refused(value, capsys):
    assert main(["estimate", "--model", "llama-3.1-8b", "--layer-kv-dtype", value]) == 2
    assert "--layer-kv-dtype" in capsys.readouterr().err


def test_check_log_does_not_take_nccls_version_for_vllms():
    from sizing.evidence.logs import read_log

    text = (ROOT / "tests" / "fixtures" / "vllm-starts" / "logs" / "h200-0.26.0-llama-3.1-8b.log").read_text()
    # a log whose engine line is cut: NCCL's version stands before any of vLLM's
    cut = "\n".join(ln for ln in text.splitlines() if "LLM engine (v" not in ln and "kvsize-start" not in ln)
    run = read_log("INFO NCCL version 2.27.3+cuda12.9\n" + cut)
    assert run.version != "2.27.3"


def test_a_verify_report_whose_log_is_not_text_is_one_line(tmp_path, capsys):
    report = json.loads((ROOT / "measure" / "reports" / "h200-verify-qwen3-8b-fp8.json").read_text())
    report["log"] = 5
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert main(["validate", str(path)]) != 0
    err_out = "".join(capsys.readouterr())
    assert "'log' must be text" in err_out and "Traceback" not in err_out and "internal error" not in err_out


@pytest.mark.parametrize("repeated", ["Load weight end. ", "server_args=ServerArgs(", "MemorySnapshot(",
                                      "non-default args: {"])
def test_log_reading_is_bounded_by_the_input_not_its_square(repeated):
    # a few MB of one line that each lazy pattern starts on: a quadratic reader takes minutes here
    import time

    from sizing.errors import KvsizeError
    from sizing.evidence.logs import read_log

    text = (repeated + "a" * 50) * 40000 + ("\nKV Cache is allocated. #tokens: 1000, K size: 1.00 GB, V size: 1.00 GB"
                                            "\nmax_total_num_tokens=1000\n")
    start = time.monotonic()
    try:
        read_log(text)
    except KvsizeError:
        pass
    assert time.monotonic() - start < 30

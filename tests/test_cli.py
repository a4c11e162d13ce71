"""The kvsize CLI: outputs, exit codes, one-line errors, no partial files."""

import csv
import json
import re
import subprocess
import sys

import pytest

from app.cli import main
from sizing.cache.formats import FORMAT_NAMES
from conftest import ROOT

CONFIGS = ROOT / "profiles" / "models"


def run(*argv):
    return main(list(argv))


def test_estimate_json_schema(capsys):
    assert run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "32k",
               "--format", "json") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["schema"] == "kvsize.estimate/1"
    assert record["kv_bytes_per_token"] == 131_072  # 2 x 32 x 8 x 128 x 2
    assert record["kv_payload_bytes_per_token"] + record["kv_metadata_bytes_per_token"] == 131_072
    assert record["kv_bytes_per_sequence"] == 32768 * 131_072
    for key in ("num_blocks", "max_tokens", "max_concurrency"):
        assert isinstance(record[key], int) and record[key] > 0
    assert sum(v for k, v in record["breakdown"].items() if k != "total_bytes") == record["breakdown"]["total_bytes"]


def test_estimate_from_raw_config_file(capsys, tmp_path):
    config = json.loads((CONFIGS / "qwen3-8b.json").read_text())["config"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert run("estimate", "--model", str(tmp_path), "--format", "json", "--max-model-len", "8192") == 0
    assert json.loads(capsys.readouterr().out)["kv_bytes_per_token"] == 2 * 36 * 8 * 128 * 2


def test_csv_output_file(tmp_path):
    out = tmp_path / "one.csv"
    assert run("estimate", "--model", "qwen3-8b", "--max-model-len", "8192", "--format", "csv", "--out", str(out)) == 0
    rows = list(csv.DictReader(out.open()))
    assert rows[0]["kv_bytes_per_token"] == "147456"


@pytest.mark.parametrize("argv, needle", [
    (["estimate", "--model", "llama-3.1-8", "--max-model-len", "8k"], "did you mean llama-3.1-8b"),
    (["estimate", "--model", "llama-3.1-8b", "--gpu", "h1000"], "unknown GPU"),
    (["estimate", "--model", "llama-3.1-8b", "--engine", "vllmm"], "unknown engine"),
    (["estimate", "--model", "llama-3.1-8b", "--kv-cache-dtype", "fp9"], "unknown KV cache format"),
    (["estimate", "--model", "llama-3.1-8b", "--max-model-len", "-5"], "greater than zero"),
    (["estimate", "--model", "llama-3.1-8b", "--max-model-len", "abc"], "whole number of tokens"),
    (["estimate", "--model", "llama-3.1-8b", "--kv-cache-memory", "ten"], "size such as 10GiB"),
    (["estimate", "--model", "llama-3.1-8b", "-tp", "3"], "does not divide num_attention_heads 32"),
    (["estimate", "--model", "llama-3.1-8b", "--kv-cache-dtype", "q4_0"], "not a KV cache format of vllm"),
    (["estimate", "--model", "llama-3.1-70b", "--gpu", "l4"], "the model does not fit"),
    (["estimate", "--model", "llama-3.1-8b", "--gpu", "l4", "--max-model-len", "128k"], "longest that fits"),
    (["estimate", "--model", "llama-3.1-8b", "--max-model-len", "32k", "--concurrency", "500"],
     "500 concurrent requests"),
    (["estimate", "--model", "llama-3.1-8b", "--mem-fraction-static", "0.8"], "belongs to --engine sglang"),
])
def test_bad_input_one_line_exit_2(capsys, argv, needle):
    assert run(*argv) == 2
    err = capsys.readouterr().err
    assert needle in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize("content, needle", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must hold a JSON object"),
    ('{"model_type": "llama", "num_hidden_layers": "many"}', "rejected by its transformers config class"),
    ('{"model_type": "mystery", "hidden_size": 64}', "missing 'num_hidden_layers'"),
    ('{"model_type": "mystery", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,'
     ' "vocab_size": 10, "num_key_value_heads": 8}', "exceeds num_attention_heads"),
    # bad or hostile inputs a planner's config.json can carry: one line each, never a traceback
    # a value kvsize uses is checked where it is used: the field and what is allowed
    ('{"model_type": "mystery", "num_hidden_layers": NaN, "hidden_size": 64, "num_attention_heads": 4,'
     ' "vocab_size": 10}', "'num_hidden_layers' must be a finite integer, got nan"),
    ("[" * 100_000 + "]" * 100_000, "nests arrays or objects too deeply"),
    ('{"model_type": "mystery", "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 10}',
     "missing 'hidden_size'"),
    ('{"model_type": "mystery", "num_hidden_layers": 1000000000000, "hidden_size": 64, "num_attention_heads": 4,'
     ' "vocab_size": 10}', "accepts at most 4,096"),
    ('{"model_type": "mystery", "num_hidden_layers": 2, "hidden_size": 4096, "num_attention_heads": 32,'
     ' "vocab_size": 10, "num_key_value_heads": 5}', "not a multiple of num_key_value_heads 5"),
])
def test_malformed_configs(capsys, tmp_path, content, needle):
    path = tmp_path / "config.json"
    path.write_text(content)
    assert run("estimate", "--model", str(path)) == 2
    assert needle in capsys.readouterr().err


def test_values_kvsize_does_not_use_never_block_a_config(capsys, tmp_path):
    # NVIDIA's Mamba hybrids publish "time_step_limit": [0.0, Infinity] (Nemotron-H-56B-Base-8K), which
    # Python's json writes and transformers and vLLM read; kvsize does not use it
    config = json.loads((CONFIGS / "nemotron-h-8b-base-8k.json").read_text())["config"]
    text = json.dumps(config)[:-1] + ', "time_step_limit": [0.0, Infinity], "rope_theta": NaN}'
    path = tmp_path / "config.json"
    path.write_text(text)
    assert run("estimate", "--model", str(path), "--format", "json") == 0


def test_nested_configs_take_their_class_defaults(capsys, tmp_path):
    # llava-1.5-7b-hf's text_config names llama and leaves layers, width and heads to LlamaConfig's
    # defaults (32 layers, 4096 hidden, 32 heads), as transformers and vLLM build it
    llava = {"architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "torch_dtype": "float16",
             "text_config": {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
                             "model_type": "llama", "rms_norm_eps": 1e-05, "torch_dtype": "float16",
                             "vocab_size": 32064},
             "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                               "model_type": "clip_vision_model", "num_attention_heads": 16,
                               "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(llava))
    assert run("estimate", "--model", str(path), "--max-model-len", "4096", "--format", "json") == 0
    record = json.loads(capsys.readouterr().out)
    assert record["kv_bytes_per_token"] == 2 * 32 * 32 * 128 * 2


def test_option_abbreviations_are_refused(capsys):
    # `plan --format json` was read as `--formats json`; a prefix is now an unknown option
    assert run("estimate", "--model", "llama-3.1-8b", "--max-model", "4096") == 2
    assert "unrecognized arguments: --max-model" in capsys.readouterr().err


def test_oversized_config(capsys, tmp_path):
    path = tmp_path / "config.json"
    path.write_text('{"pad": "' + "x" * (5 * 1024 * 1024) + '"}')
    assert run("estimate", "--model", str(path)) == 2
    assert "must be at most 4,194,304 bytes (4 MiB)" in capsys.readouterr().err


def test_context_beyond_max_position_warns(capsys):
    # no published rope-scaling recipe extends Llama-2-7B: the length is refused (issue 50, item 2), once on stderr;
    # the JSON is written whole with fits false
    assert run("estimate", "--model", "llama-2-7b", "--max-model-len", "8192", "--engine", "ideal") == 2
    out, err = capsys.readouterr()
    assert err.count("exceeds the model's max_position_embeddings 4,096") == 1 and "fits:" not in out
    assert run("estimate", "--model", "llama-2-7b", "--max-model-len", "8192", "--engine", "ideal",
               "--format", "json") == 2
    out, err = capsys.readouterr()
    assert json.loads(out)["fits"] is False and "exceeds the model's max_position_embeddings 4,096" in err


def test_traceback_flag_shows_the_error():
    with pytest.raises(Exception, match="unknown model"):
        run("--traceback", "estimate", "--model", "nope")


def test_compare_lists_every_format(capsys):
    assert run("compare", "--model", "llama-3.1-8b", "--max-model-len", "8k", "--format", "json") == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["format"]: r for r in rows}
    assert by_name["fp8_e4m3"]["ratio_to_bf16"] == 0.5
    assert by_name["q8_0"]["ratio_to_bf16"] == 34 / 64  # 34 bytes per 32 values vs 64
    assert len(rows) == len(FORMAT_NAMES) == 36  # every format a user can choose (sizing/cache/formats.py)


def test_sweep_csv_and_xlsx(tmp_path):
    out = tmp_path / "grid.csv"
    assert run("sweep", "--models", "llama-3.1-8b,gpt-oss-20b", "--gpus", "h100-sxm,l40s", "--formats",
               "auto,fp8", "--contexts", "8k,32k", "--tp", "1,2", "--out", str(out), "--no-progress") == 0
    rows = list(csv.DictReader(out.open()))
    assert len(rows) == 2 * 2 * 2 * 2 * 2
    assert "max_model_len_tokens" in rows[0] and "weights_gib_per_gpu" in rows[0]
    xlsx = tmp_path / "grid.xlsx"
    assert run("sweep", "--models", "llama-3.1-8b", "--formats", "auto,fp8,q4_0", "--out", str(xlsx),
               "--no-progress") == 0
    import openpyxl

    book = openpyxl.load_workbook(xlsx)
    sheet = book["scenarios"]
    assert sheet.freeze_panes == "A2" and sheet["A1"].font.bold
    # q4_0 is not a vLLM format: its 3 rows are on the "not sized" sheet with the reason, the rest sized
    assert sheet.max_row == 1 + 2 * 3 and book["not sized"].max_row == 1 + 3


def test_sweep_bad_input_writes_nothing(tmp_path, capsys):
    out = tmp_path / "grid.xlsx"
    assert run("sweep", "--models", "llama-3.1-8b", "--contexts", "8k,zero", "--out", str(out)) == 2
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_listings(capsys):
    for command in ("models", "gpus", "formats"):
        assert run(command, "--format", "json") == 0
    assert run("gpus") == 0 and "81559 MiB" in capsys.readouterr().out


def test_startup_imports_neither_torch_nor_streamlit():
    code = ("import sys, sizing, sizing.capacity.estimate, sizing.profiles, app.cli; "
            "bad = [m for m in ('torch', 'streamlit', 'plotly', 'pandas', 'transformers', 'measure') if m in sys.modules]; "
            "print(bad)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_estimate_on_bundled_profile_imports_no_torch():
    code = ("import sys; from app.cli import main; main(['estimate','--model','gemma-2-9b','--format','json']); "
            "print('TORCH' if 'torch' in sys.modules else 'CLEAN', file=sys.stderr)")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.stderr.strip().endswith("CLEAN")


@pytest.mark.parametrize("args, needle", [
    (["estimate", "--model", "llama-3.1-8b", "--kv-cache-memory", "100GiB"], "exceeds the GPU's 85,017,493,504 bytes"),
    (["estimate", "--model", "llama-3.1-8b", "--gpu-memory", "0.1"], "'0.1' is not a whole number of bytes"),
    (["estimate", "--model", "llama-3.1-8b", "--kv-cache-memory", "0.5"], "'0.5' is not a whole number of bytes"),
    (["estimate", "--model", "llama-3.1-8b", "--gpu-memory", "1e30"], "above 1 PiB"),
    (["compare", "--model", "llama-3.1-8b", "--tensor-parallel-size", "3"], "does not divide num_attention_heads 32"),
    (["sweep", "--models", "llama-3.1-8b", "--gpus", "h100-sxm", "--formats", "fp9", "--out", "OUT/x.csv"],
     "unknown KV cache format 'fp9' (--formats)"),
    (["estimate", "--model", "llama-3.1-8b", "--out", "OUT"], "is a folder; give a file name"),
])
def test_bad_sizes_and_grids_are_refused_in_one_line(tmp_path, capsys, args, needle):
    args = [a.replace("OUT", str(tmp_path)) for a in args]
    assert run(*args) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1
    assert not any(tmp_path.iterdir())  # nothing written


def test_sizes_are_exact_integers():
    from sizing.units import parse_bytes

    assert parse_bytes("1125899906842623", "--kv-cache-memory") == 2**50 - 1  # no float rounding
    assert parse_bytes("0.5GiB", "--kv-cache-memory") == 2**29


@pytest.mark.parametrize("content", ["[1, 2]", "null"])
def test_validate_refuses_a_report_that_is_not_an_object(tmp_path, capsys, content):
    path = tmp_path / "r.json"
    path.write_text(content)
    assert run("validate", str(path)) == 2  # malformed input is a usage error (exit 2), one line naming why
    assert "not a kvsize measurement report" in capsys.readouterr().err


def test_no_pytorch_notice_in_cli_output():
    # kvsize reads configs with transformers while hiding torch on purpose; its advisory is not for users.
    # A fresh process: in this one transformers may already be imported.
    done = subprocess.run([sys.executable, "-m", "app.cli", "estimate", "--model",
                           "tests/fixtures/configs/Llama-3.1-8B.json", "--max-model-len", "8k"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "PyTorch" not in done.stderr


def test_sigterm_during_a_sweep_leaves_no_part_file(tmp_path):
    import signal

    from helpers import wait_until_catching

    args = [sys.executable, "-m", "app.cli", "sweep", "--models", "llama-3.1-8b,qwen3-8b,gemma-2-9b,gpt-oss-20b,"
            "llama-3.1-70b,mixtral-8x7b-v0.1", "--gpus", "h100-sxm,h200,l40s,a100-80gb,b200,mi300x", "--formats",
            "auto,fp8,q4_0,kivi2,nvfp4,lmdeploy_int4", "--contexts", "1k,2k,4k,8k,16k,32k,64k,128k", "--tp",
            "1,2,4,8", "--engines", "vllm,ideal", "--out", str(tmp_path / "grid.xlsx"), "--no-progress"]
    proc = subprocess.Popen(args, cwd=ROOT, stderr=subprocess.PIPE, text=True)
    wait_until_catching(proc, signal.SIGTERM)  # signal once kvsize catches it, not after a fixed time
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    assert "Traceback" not in err
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".part"] == []
    if "terminated" in err:
        assert proc.returncode == 143 and not (tmp_path / "grid.xlsx").exists()
    else:  # the sweep finished before the signal
        assert proc.returncode == 0 and (tmp_path / "grid.xlsx").exists(), err[-600:]


def test_an_error_raised_while_sigterm_unwinds_is_the_termination_not_a_bug(monkeypatch, capsys):
    # a library's clean-up that raises on the way out of SIGTERM (a zip file closed half-written) is still
    # SIGTERM: exit 143 and "terminated", not exit 3 and "internal error"
    import app.cli as cli

    def run(args):
        try:
            raise cli._Terminated
        finally:
            raise ValueError("I/O operation on closed file")

    monkeypatch.setattr(cli, "build_parser", lambda: type("P", (), {"parse_args": lambda self, a: type(
        "A", (), {"run": staticmethod(run), "out": None})()})())
    assert cli.main(["estimate"]) == 143
    assert "terminated; nothing was written" in capsys.readouterr().err


def test_contexts_beyond_the_models_positions_warn_in_compare_and_sweep(tmp_path, capsys):
    # Llama-2-7B: max_position_embeddings 4096 (tests/fixtures/configs/Llama-2-7b-hf.json)
    assert run("compare", "--model", "llama-2-7b", "--max-model-len", "8192") == 0
    assert "context 8,192 exceeds the model's max_position_embeddings 4,096" in capsys.readouterr().err
    assert run("sweep", "--models", "llama-2-7b", "--gpus", "h100-sxm", "--contexts", "4k,8k",
               "--out", str(tmp_path / "s.csv")) == 0
    assert "context 8,192 exceeds" in capsys.readouterr().err


def _capacity_report():
    return json.loads((ROOT / "measure" / "reports" / "h100-capacity.json").read_text())


@pytest.mark.parametrize("change, needle", [
    (lambda r: r["capacity"][0]["measured"].update(weights_bytes=float("nan")), "non-finite number at capacity[0]"),
    (lambda r: [r.pop(k) for k in ("allocation", "capacity")], "the report holds no points"),
    (lambda r: r.pop("device"), "the report has no device"),
    (lambda r: r["capacity"][0].pop("measured"), "a point lacks the field 'measured'"),
    (lambda r: r["capacity"][0]["measured"].update(weights_bytes="16 GB"), "wrong kind"),
    (lambda r: r["allocation"][0].update(kv_cache_dtype="fp9"), "unknown KV cache format 'fp9'"),
    (lambda r: r["capacity"][0]["predicted"].update(num_blocks=1), "stored prediction num_blocks"),
    (lambda r: r["capacity"][0]["derived"].update(block_bytes=r["capacity"][0]["derived"]["block_bytes"] * 11 // 10),
     "derived block_bytes"),
    (lambda r: r["capacity"][0]["derived"].update(
        kv_cache_tokens=r["capacity"][0]["derived"]["kv_cache_tokens"] * 11 // 10), "derived kv_cache_tokens"),
])
def test_validate_rejects_malformed_reports_in_one_line(tmp_path, capsys, change, needle):
    report = _capacity_report()
    change(report)
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    code = run("validate", str(path))
    err = capsys.readouterr().err
    if needle is None:  # kvsize ignores stored predictions: the report still agrees
        assert code == 0
        return
    assert code in (1, 2) and needle in err and "Traceback" not in err


@pytest.mark.parametrize("tolerance", ["nan", "-1", "inf"])
def test_validate_refuses_a_tolerance_that_is_not_a_fraction(tolerance, capsys):
    assert run("validate", str(ROOT / "measure" / "reports" / "h100-capacity.json"), "--tolerance", tolerance) == 2
    assert "--tolerance must be a finite fraction" in capsys.readouterr().err


def test_validate_runs_on_the_base_install_without_torch():
    code = ("import sys, glob; sys.modules['torch'] = None; from measure.validate import validate_files; "
            "raise SystemExit(validate_files(sorted(glob.glob('measure/reports/*.json'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_output_files_get_the_umask_mode_and_plan_writes_all_or_nothing(tmp_path, capsys):
    import os
    import stat

    out = tmp_path / "e.json"
    old = os.umask(0o022)
    try:
        assert run("estimate", "--model", "llama-3.1-8b", "--format", "json", "--out", str(out)) == 0
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644
    assert run("estimate", "--model", "llama-3.1-8b", "--format", "json", "--out", str(tmp_path / "e.xlsx")) == 2
    assert "does not match --format json" in capsys.readouterr().err
    wl = tmp_path / "w.yaml"
    wl.write_text("peak_concurrency: 8\nbuckets:\n  - {max_context_tokens: 4096, share_percent: 100, output_tokens: 256}\n")
    assert run("plan", "--workload", str(wl), "--model", "llama-3.1-8b", "--gpus", "h100-sxm", "--out",
               str(tmp_path / "a.json"), "--out", str(tmp_path / "missing" / "b.json")) == 2
    assert not (tmp_path / "a.json").exists()


def test_version_and_a_closed_pipe():
    assert subprocess.run([sys.executable, "-m", "app.cli", "--version"], cwd=ROOT, capture_output=True,
                          text=True).stdout.startswith("kvsize ")
    done = subprocess.run(f"{sys.executable} -m app.cli formats | head -1", shell=True, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert "Broken pipe" not in done.stderr and "Traceback" not in done.stderr


def test_measure_refuses_an_unknown_model_before_asking_for_a_gpu(tmp_path, capsys):
    assert run("measure", "--model", "lama", "--out", str(tmp_path / "r.json")) == 2
    assert "unknown model 'lama'" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["estimate", "sweep", "plan"])
def test_every_option_has_help(command, capsys):
    from app.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, __import__("argparse")._SubParsersAction))
    missing = [a.option_strings[0] for a in sub.choices[command]._actions
               if a.option_strings and not a.help and a.dest != "help"]
    assert missing == []


def test_a_format_with_an_unconfirmed_layout_says_so(capsys):
    assert run("estimate", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "ideal",
               "--kv-cache-dtype", "kvarn_k4v2_g128") == 0
    assert "kvarn_k4v2_g128: layout unconfirmed" in capsys.readouterr().out
    assert run("formats", "--format", "json") == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["kvarn_k4v2_g64"]["layout_confirmed"] is False and rows["fp8_e4m3"]["layout_confirmed"] is True


def test_deepseek_v4_estimate_names_vllm_record(capsys):
    args = ("estimate", "--model", "deepseek-v4-flash", "--gpu", "h200", "--tensor-parallel-size", "8",
            "--weights-dtype", "fp8", "--max-model-len", "131072", "--format", "json")
    # 0.26 does not build DeepSeek-V4: it says which release does; the default follows the newest started
    # release (0.33.0), which does
    assert run(*args, "--engine", "vllm@0.26.0") == 2
    err = capsys.readouterr().err
    assert "--engine vllm@0.33" in err
    assert run(*args) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["k_cache_dtype"] == "fp8_ds_mla_v4" and out["block_size"] == 256


def test_one_set_of_exit_statuses(tmp_path, capsys, monkeypatch):
    # 0 done; 1 a check or target not met; 2 bad input or usage; 3 an exception kvsize did not turn into
    # a one-line error (a bug: said so, never a silent success)
    import app.commands.estimate as estimate_command

    assert run("estimate", "--model", "llama-3.1-8b") == 0
    report = _capacity_report()
    report["capacity"][0]["derived"]["num_blocks"] += 5000
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert run("validate", str(path)) == 1
    assert run("estimate", "--model", "no-such-model") == 2
    capsys.readouterr()

    def broken(args):
        raise RuntimeError("boom")

    monkeypatch.setattr(estimate_command, "run", broken)
    assert run("estimate", "--model", "llama-3.1-8b") == 3
    err = capsys.readouterr().err
    assert err.startswith("kvsize: internal error: RuntimeError: boom") and err.count("\n") == 1


@pytest.mark.parametrize("typed", ["llama-3.1-8b", "meta-llama/Llama-3.1-8B", "meta-llama/Llama-3.1-8B-Instruct",
                                   "Llama-3.1-8B-Instruct", "LLAMA-3.1-8B-INSTRUCT"])
def test_the_names_planners_type_resolve(typed, capsys):
    # a bundled id, its Hugging Face id, and the chat/instruct variants (same config.json architecture)
    assert run("estimate", "--model", typed, "--gpu", "h200", "--max-model-len", "8192", "--format", "json") == 0
    assert json.loads(capsys.readouterr().out)["model"] == "Llama-3.1-8B"


def test_a_vllm_launch_naming_a_hugging_face_id_resolves(capsys):
    assert run("estimate", "--gpu", "h200", "--", "vllm", "serve", "meta-llama/Llama-3.1-70B-Instruct",
               "--max-model-len", "32768", "-tp", "2") == 0
    assert "Llama-3.1-70B" in capsys.readouterr().out


def test_check_log_reads_standard_input_and_the_logged_hugging_face_id(monkeypatch, capsys):
    import io

    corpus = ROOT / "tests" / "fixtures" / "vllm-starts"
    text = (corpus / "logs" / "h200-0.26.0-llama-3.1-8b.log").read_text()
    # the launcher's model folder, as a planner's log names the checkpoint instead
    text = re.sub(r"/tmp/kvsize-models-[^/\s']+/llama-3\.1-8b", "meta-llama/Llama-3.1-8B-Instruct", text)
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert run("check-log", "-", "--gpu", "h200", "--format", "json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    rows = {r["term"]: r for r in out["rows"]}
    assert abs(rows["kv_budget_bytes"]["difference_percent"]) < 1


def test_compare_fits_only_what_the_engine_runs_and_names_a_recommendation(capsys):
    # on an H100 (sm90) vLLM runs no NVFP4 KV (no FP4 tensor cores) and no ultraquant_4bit (0.33's backend
    # selector): never a green "fits"; the recommendation is near-lossless and runs here
    assert run("compare", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "32768",
               "--format", "json") == 0
    rows = {r["format"]: r for r in json.loads(capsys.readouterr().out)}
    for name in ("nvfp4", "ultraquant_4bit"):
        assert rows[name]["runs"] == "unsupported" and rows[name]["status"].startswith("does not run here")
    # a release before 0.32 has no ultraquant_4bit at all (vllm/config/cache.py CacheDType): it says which has
    assert run("compare", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "32768",
               "--engine", "vllm@0.26.0", "--format", "json") == 0
    earlier = {r["format"]: r for r in json.loads(capsys.readouterr().out)}
    assert earlier["ultraquant_4bit"]["runs"] == "n/a"
    assert "it came in vllm 0.32.0" in earlier["ultraquant_4bit"]["status"]
    best = [r for r in rows.values() if r["recommended"]]
    assert [r["format"] for r in best] == ["fp8_e4m3"] and best[0]["runs"] == "supported"
    assert run("compare", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "32768") == 0
    assert "recommended: fp8_e4m3" in capsys.readouterr().out


def test_plan_prints_a_serve_command_for_every_vllm_format_it_can_pick():
    from sizing.cache.formats import get_format
    from sizing.engines.serve import _VLLM

    for name in ("int4_per_token_head", "turboquant_k8v4", "ultraquant_4bit", "nvfp4_4over6"):
        assert "vllm" in get_format(name, "bf16").engines and _VLLM[name] == name


def test_sweep_spreadsheet_keeps_counts_as_integers_and_says_what_it_assumes(tmp_path, capsys):
    import openpyxl

    out = tmp_path / "s.xlsx"
    assert run("sweep", "--models", "llama-3.1-8b", "--gpus", "h100-sxm,b200", "--formats", "auto,nvfp4",
               "--contexts", "8k,32k", "--engines", "vllm,vllm@0.19.1", "--out", str(out), "--no-progress") == 0
    err = capsys.readouterr().err
    assert "vllm 0.19.1 was never started" in err and "was started" in err  # as estimate says it
    book = openpyxl.load_workbook(out)
    assert book.sheetnames == ["scenarios", "not sized", "assumptions", "provenance"]
    rows = list(book["scenarios"].iter_rows(values_only=True))
    head = rows[0]
    for name in ("max_tokens", "max_concurrency", "num_blocks", "max_context_at_concurrency_tokens"):
        assert all(isinstance(r[head.index(name)], int) for r in rows[1:]), name
    # the longest request the pool holds is capped at what the engine serves
    assert all(r[head.index("max_context_at_concurrency_tokens")] <= r[head.index("max_model_len_tokens")]
               for r in rows[1:])
    not_sized = list(book["not sized"].iter_rows(values_only=True))
    assert not_sized[0][-1] == "reason" and all("nvfp4" in r[-1] for r in not_sized[1:])
    assumptions = {r[0]: r for r in book["assumptions"].iter_rows(values_only=True)}
    assert assumptions["engine vllm"][1] == "vllm@0.33" and "price date" in assumptions["price usd per GPU hour (b200)"][2]


def test_estimate_names_the_format_compare_recommends(capsys):
    # estimate names what compare would recommend for the same scenario, and says when it sized another
    args = ("--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--max-model-len", "32768")
    assert run("compare", *args, "--format", "json") == 0
    recommended = next(r for r in json.loads(capsys.readouterr().out) if r["recommended"])
    assert run("estimate", *args, "--format", "json") == 0
    named = json.loads(capsys.readouterr().out)["recommended_format"]
    assert (named["format"], named["max_concurrency"]) == (recommended["format"], recommended["max_concurrency"])
    assert run("estimate", *args) == 0
    out = capsys.readouterr().out
    assert f"recommended format here: {named['format']}" in out and "this estimate sized bf16" in out


def test_control_characters_from_a_config_reach_the_terminal_as_escapes(tmp_path, capsys):
    # an escape sequence in a config's architecture name is shown, never obeyed (it would recolour or rewrite
    # the planner's terminal); the same for a lone surrogate, which no encoding could write
    config = json.loads((ROOT / "tests" / "fixtures" / "vllm-starts" / "configs" / "llama-3.1-8b.json").read_text())
    config["architectures"] = ["Llama\x1b[2J\x07Evil\ud800"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert run("estimate", "--model", str(path), "--max-model-len", "8192") == 0
    both = "".join(capsys.readouterr())
    assert "\x1b" not in both and "\x07" not in both and "\ud800" not in both
    assert "Llama\\x1b[2J\\x07Evil\\ud800" in both


def test_a_smaller_format_that_holds_no_more_requests_is_not_recommended(capsys):
    # SGLang's Mamba state slots cap Nemotron-H's running requests whatever the KV format: fp8 would hold the same
    # requests at lower accuracy, so the model's own bf16 is named; under vLLM (no such cap) fp8 holds more
    args = ("--model", "nemotron-h-8b-base-8k", "--gpu", "h200", "--max-model-len", "8192", "--format", "json")
    assert run("estimate", *args, "--engine", "sglang") == 0
    capped = json.loads(capsys.readouterr().out)
    assert capped["recommended_format"]["format"] == "bf16"
    assert capped["recommended_format"]["max_concurrency"] == capped["max_concurrency"]
    # the record names the slots and the cap they set (a program need not read the warning)
    assert capped["recurrent_state_capped_requests"] == capped["max_concurrency"] > 0
    assert capped["recurrent_state_slots"] >= 5 * capped["max_concurrency"]
    assert run("compare", *args[:-2], "--engine", "sglang", "--format", "json") == 0
    sglang_rows = [r for r in json.loads(capsys.readouterr().out) if r["engine"] == "sglang" and r["fits"]]
    assert sglang_rows and all(r["max_concurrency"] == capped["max_concurrency"] and "the engine's state slots, not "
                               "the KV cache" in r["status"] for r in sglang_rows if r["runs"] == "supported")
    assert run("estimate", *args, "--engine", "vllm") == 0
    paged = json.loads(capsys.readouterr().out)
    assert paged["recommended_format"]["format"] == "fp8_e4m3" and paged["recurrent_state_slots"] is None


def test_vllms_mamba_ssm_cache_dtype_moves_the_state(capsys):
    # vLLM's --mamba-ssm-cache-dtype halves a Mamba layer's SSM state in bf16 (more requests fit); it is read, never
    # passed over as "no memory effect"; a dtype vLLM does not take is refused naming the flag
    base = ("estimate", "--model", "nemotron-h-8b-base-8k", "--gpu", "h200", "--max-model-len", "8192")

    def served(dtype: str) -> dict:
        assert run(*base, "--format", "json", "--", "vllm", "serve", "nvidia/Nemotron-H-8B-Base-8K",
                   "--mamba-ssm-cache-dtype", dtype) == 0
        captured = capsys.readouterr()
        assert ("no memory effect: mamba_ssm_cache_dtype" in captured.err) == (dtype == "auto")  # auto: the default
        return json.loads(captured.out)

    fp32, bf16 = served("float32"), served("bfloat16")
    assert bf16["max_concurrency"] > 1.3 * fp32["max_concurrency"]
    assert served("auto")["max_concurrency"] == fp32["max_concurrency"]  # Nemotron-H's own rule: fp32
    assert run(*base, "--", "vllm", "serve", "x", "--mamba-ssm-cache-dtype", "int8") != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--mamba-ssm-cache-dtype must be one of" in err[0]

"""vLLM's own settings under vLLM's names (a serve command, an LLM() call, a log's non-default args),
the release comparison, and kvsize verify's harness (with a stand-in vLLM and nvidia-smi: CPU only)."""

import json
import os
import stat

import pytest

from app.cli import main
from sizing.errors import KvsizeError
from sizing.evidence.starts import CORPUS, load_corpus
from sizing.units import GiB, parse_size
from sizing.engines.vllm_args import for_layers, human_int, read_command, read_engine_args, read_llm_call

LLAMA = str(CORPUS / "configs" / "llama-3.1-8b.json")


def test_serve_command_reads_the_settings_that_move_memory():
    s = read_command("vllm serve meta-llama/Llama-3.1-8B --max-model-len 32k --gpu-memory-utilization=0.95 "
                     "-tp 2 --kv-cache-dtype fp8 --enforce-eager --port 8000 --enable-prefix-caching".split())
    assert s.model == "meta-llama/Llama-3.1-8B" and s.usage_context == "serve"
    # vLLM's human_readable_int: lower-case k is 1000, upper-case K is 1024
    assert s.fields == {"max_model_len": 32000, "memory_fraction": 0.95, "tensor_parallel_size": 2,
                        "k_cache_dtype": "fp8", "v_cache_dtype": "fp8", "cudagraph_mode": "NONE",
                        "torch_compile": False}  # --enforce-eager: no torch.compile either (vllm/config/vllm.py)
    assert set(s.ignored) == {"port", "enable_prefix_caching"}


def test_llm_call_is_read_as_literals_only():
    s = read_llm_call('LLM(model="org/m", max_model_len=32768, kv_cache_memory_bytes="8G", '
                      'compilation_config={"cudagraph_mode": "piecewise", "max_cudagraph_capture_size": 256})')
    assert s.usage_context == "llm"
    assert s.fields["kv_cache_memory_bytes"] == 8 * 2**30  # upper-case G is binary in vLLM
    assert s.fields["cudagraph_mode"] == "PIECEWISE" and s.fields["max_cudagraph_capture_size"] == 256
    with pytest.raises(KvsizeError, match="literal"):
        read_llm_call("LLM(model=open('x').read())")
    with pytest.raises(KvsizeError, match="by name"):
        read_llm_call("LLM(**cfg)")


@pytest.mark.parametrize("args, message", [
    ({"gpu_memory_utilization": 1.5}, "--gpu-memory-utilization must be a fraction"),
    ({"max_model_len": "32.5K"}, "--max-model-len must be a whole number"),
    ({"compilation_config": {"cudagraph_mode": "SOMETIMES"}}, "cudagraph_mode must be one of"),
    ({"tensor_parallel_size": 0}, "--tensor-parallel-size must be greater than zero"),
])
def test_bad_engine_args_name_the_field(args, message):
    with pytest.raises(KvsizeError, match=message):
        read_engine_args(args)


def test_settings_kvsize_does_not_model_are_named_not_guessed():
    s = read_engine_args({"cpu_offload_gb": 10, "speculative_config": {"method": "ngram"}, "seed": 1})
    assert set(s.not_modelled) == {"cpu_offload_gb", "speculative_config"} and s.ignored == ("seed",)


def test_human_int_follows_vllm():
    assert human_int("25.6k", "x") == 25600 and human_int("2K", "x") == 2048 and human_int(-1, "x") == -1


def test_sizes_as_engines_print_them_round_down_with_a_note():
    value, note = parse_size("23.47GiB", "--gpu-memory")
    assert value == int(23.47 * GiB) // 1 and value < 23.47 * GiB < value + 1
    assert "rounded down" in note
    with pytest.raises(KvsizeError, match="give e.g. 0.1GiB"):
        parse_size("0.1", "--gpu-memory")  # a fraction of a byte without a unit is a typo, not a size


def test_estimate_takes_a_vllm_command_and_matches_its_start(capsys):
    # the H200 start of 0.22.1 with LLM() defaults (tests/fixtures/vllm-starts: 110.94 GiB, 908,768 tokens)
    start = next(s for s in load_corpus() if s.id == "h200-0.22.1-llama-3.1-8b-llm")
    code = main(["estimate", "--gpu", "h200", "--engine", "vllm@0.22.1", "--format", "json", "--",
                 f"LLM(model='{LLAMA}', max_model_len=8192)"])
    record = json.loads(capsys.readouterr().out)
    assert code == 0
    assert abs(record["max_tokens"] / start.printed.kv_cache_tokens[0] - 1) < 0.01
    assert record["model_runner"] == "v1"


def test_enforce_eager_plans_no_cuda_graphs(capsys):
    assert main(["estimate", "--model", LLAMA, "--gpu", "h200", "--engine", "vllm@0.22.1", "--enforce-eager",
                 "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["breakdown"]["cuda_graph_bytes"] == 0
    assert main(["estimate", "--model", LLAMA, "--cuda-graph-memory", "0", "--format", "json"]) == 0


def test_release_comparison_names_the_mechanisms(capsys):
    mistral = str(CORPUS / "configs" / "mistral-7b-v0.1.json")
    assert main(["estimate", "--model", mistral, "--gpu", "h200", "--engine", "vllm@0.22.1", "--vs", "vllm@0.26.0",
                 "--max-model-len", "32768", "--format", "json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["term"]: r for r in out["rows"]}
    # the real starts printed 2,475,283 (0.22.1) and 1,492,542 (0.26.0) tokens: the drop is the in-flight batch
    assert rows["gpu_kv_cache_size_tokens"]["vllm@0.22.1"] > 1.6 * rows["gpu_kv_cache_size_tokens"]["vllm@0.26.0"]
    assert any("2 batches in flight" in c for c in out["changes"])
    assert any("model runner changes from V1 to V2" in c for c in out["changes"])


@pytest.fixture
def fake_gpu(tmp_path, monkeypatch):
    """A stand-in nvidia-smi and a stand-in vLLM that print an H200 start's lines (copied from its log)."""
    start = next(s for s in load_corpus() if s.id == "h200-0.26.0-llama-3.1-8b")
    log = (CORPUS / start.log).read_text()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text('#!/bin/sh\ncase "$*" in *memory.used*) echo "0, 0";; *) echo "0, GPU-5e1c6a2f-0d3b-4c44-9a51-1f0e3d2b7a10, NVIDIA H200, 143771";; esac\n')
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)  # the stand-in has one GPU, index 0
    pkg = tmp_path / "site" / "vllm"
    for sub in ("engine", "usage", "v1/engine"):
        (pkg / sub).mkdir(parents=True, exist_ok=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "v1" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("__version__ = '0.26.0'\n")
    (pkg / "engine" / "arg_utils.py").write_text("class EngineArgs:\n    def __init__(self, **kw): pass\n")
    (pkg / "usage" / "usage_lib.py").write_text("class UsageContext:\n    OPENAI_API_SERVER = 1\n")
    (pkg / "v1" / "engine" / "llm_engine.py").write_text(
        "import sys\nclass LLMEngine:\n    @classmethod\n    def from_engine_args(cls, a, usage_context=None):\n"
        f"        sys.stdout.write({log!r})\n        sys.stdout.flush()\n")
    return tmp_path / "site"


def test_verify_starts_vllm_and_writes_a_report_validate_rechecks(fake_gpu, tmp_path, capsys):
    out = tmp_path / "verify.json"
    code = main(["verify", "--model", LLAMA, "--engine", "vllm@0.26.0", "--max-model-len", "8192",
                 "--vllm-path", str(fake_gpu), "--out", str(out)])
    assert code == 0, capsys.readouterr()
    report = json.loads(out.read_text())
    assert report["gpu"] == "h200" and "Available KV cache memory" in report["log"]
    # the report keeps no machine's folders: the stand-in log names temporary model folders, the vLLM
    # folder is this test's own
    import tempfile

    assert tempfile.gettempdir().rstrip("/") + "/" not in report["log"] and str(fake_gpu) not in report["log"]
    assert "<tmp>" in report["log"]
    assert main(["validate", str(out)]) == 0
    # a stored figure that is not what the log says is caught
    for check in report["checks"]:
        if check["term"] == "max_tokens":
            check["printed"] = int(check["printed"] * 1.1)
    out.write_text(json.dumps(report))
    assert main(["validate", str(out)]) == 1


def test_verify_refuses_without_a_gpu(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert main(["verify", "--model", LLAMA, "--out", str(tmp_path / "v.json")]) == 2
    assert "nvidia-smi" in capsys.readouterr().err


def test_the_readme_shows_the_committed_verify_report():
    # the README's kvsize verify output is the render of measure/reports/h200-verify-qwen3-8b-fp8.json
    from measure.verify import render

    root = CORPUS.parents[2]
    report = json.loads((root / "measure" / "reports" / "h200-verify-qwen3-8b-fp8.json").read_text())
    block = "\n".join(render(report))
    assert block in (root / "README.md").read_text()


@pytest.mark.parametrize("field", ["printed", "predicted"])
def test_a_verify_report_with_a_figure_raised_10_percent_is_rejected(field):
    # the committed verify report: what vLLM printed is re-read from its log, kvsize's prediction recomputed
    from measure.verify import problems

    root = CORPUS.parents[2]
    report = json.loads((root / "measure" / "reports" / "h200-verify-qwen3-8b-fp8.json").read_text())
    assert problems(report) == []
    for check in report["checks"]:
        bad = json.loads(json.dumps(report))
        term = next(c for c in bad["checks"] if c["term"] == check["term"])
        term[field] = type(term[field])(term[field] * 1.1)
        assert any(check["term"] in p for p in problems(bad)), check["term"]


def test_text_only_and_compilation_settings_are_read_and_passed_back():
    # vLLM 0.26: --language-model-only, or every modality's --limit-mm-per-prompt at 0, builds no tower
    # (interfaces.py _mark_tower_model); compilation mode 0 compiles nothing and captures no piecewise graphs
    from measure.verify import engine_args
    from sizing.capacity.scenario import Scenario

    assert read_engine_args({"language_model_only": True}).fields == {"language_model_only": True}
    assert read_engine_args({"limit_mm_per_prompt": {"image": 0, "video": {"count": 0}}}).fields == {
        "language_model_only": True}
    some = read_engine_args({"limit_mm_per_prompt": '{"image": 2}'})
    assert some.fields == {} and some.not_modelled == ("limit_mm_per_prompt",)
    assert read_engine_args({"compilation_config": {"mode": 0}}).fields == {"torch_compile": False,
                                                                           "cudagraph_mode": "NONE"}
    assert read_engine_args({"compilation_config": '{"mode": "NONE", "cudagraph_mode": "FULL"}'}).fields == {
        "torch_compile": False, "cudagraph_mode": "FULL"}
    with pytest.raises(KvsizeError, match="limit-mm-per-prompt.image must be a whole number"):
        read_engine_args({"limit_mm_per_prompt": {"image": -1}})
    with pytest.raises(KvsizeError, match="mode must be 0-3"):
        read_engine_args({"compilation_config": {"mode": "fast"}})
    from sizing.profiles import load_model

    dotted = read_command("vllm serve m --limit-mm-per-prompt.image 0 --limit-mm-per-prompt.video=0".split())
    assert dotted.fields == {"language_model_only": True}
    name, shape = load_model("gemma-3-27b-it")
    scenario = Scenario(name, shape, "H200", 150_109_880_320, language_model_only=True)
    assert engine_args(scenario)["language_model_only"] is True


def test_every_flag_of_vllm_serve_is_read_classified_or_named_unknown():
    # profiles/engines/vllm-flags/0.33.0.json holds vLLM 0.33.0's `vllm serve` parser destinations: each is read by
    # kvsize, named as moving memory kvsize does not model, or classified from vLLM's source, and never two of these
    from sizing.engines.vllm_args import NOT_MODELLED, READ_FLAGS
    from sizing.engines.vllm_flags import flag_table

    table = flag_table()
    classified = set(table.flags)
    assert not classified & READ_FLAGS and not classified & NOT_MODELLED and not READ_FLAGS & NOT_MODELLED
    assert set(table.parser_dests) <= classified | READ_FLAGS | NOT_MODELLED
    assert classified <= set(table.parser_dests)
    effects = {f.effect for f in table.flags.values()}
    assert effects == {"none", "memory"} and all(f.reason and f.source.startswith("vllm/") for f in table.flags.values())
    # the flags 0.20-0.32 take and 0.33 dropped are classified apart, from their own releases' source
    older = set(table.older_flags)
    assert older and not older & set(table.parser_dests) and not older & (READ_FLAGS | NOT_MODELLED)
    assert all(f.source.startswith("vllm/") and " in 0." in f.source for f in table.older_flags.values())


def test_flags_are_sorted_by_what_they_do_to_memory(capsys):
    s = read_command("vllm serve m --port 8000 --disable-custom-all-reduce --frobnicate-cache 3 --no-enable-prefix-caching"
                     .split())
    assert s.ignored == ("port",)
    # custom all-reduce's buffers (TP > 1) and prefix caching off (a hybrid model's state pages) move memory
    assert set(s.not_modelled) == {"disable_custom_all_reduce", "enable_prefix_caching"}
    assert s.unknown == ("frobnicate_cache",)  # no flag of vLLM 0.20-0.33: named, not taken as harmless
    # a flag only older releases take is classified from their source (0.20-0.26: refused unless at its default)
    assert read_command("vllm serve m --max-num-partial-prefills 1".split()).ignored == ("max_num_partial_prefills",)
    assert main(["estimate", "--gpu", "h200", "--format", "json", "--", "vllm", "serve", LLAMA,
                 "--frobnicate-cache", "3"]) == 0
    err = capsys.readouterr().err
    assert "frobnicate_cache, which kvsize does not know" in err


def test_prefix_caching_off_moves_memory_only_for_a_hybrid_model():
    s = read_command("vllm serve m --no-enable-prefix-caching --disable-custom-all-reduce".split())
    dense = for_layers(s, ("full", "sliding"))
    assert dense.not_modelled == ("disable_custom_all_reduce",) and "enable_prefix_caching" in dense.ignored
    assert for_layers(s, ("full", "recurrent")) == s  # a Mamba hybrid's state pages: still named
    # check-log of a dense model's server started with it off names no unmodelled setting
    from conftest import ROOT
    from sizing.evidence.logs import log_scenario, read_log
    from sizing.profiles import gpu_profile, load_model

    log = ROOT / "measure" / "serving" / "b17-unsplit-check" / "b17-qwen3-8b-fp8pth" / "server.log"
    text = log.read_text(encoding="utf-8", errors="replace")
    assert "'enable_prefix_caching': False" in text  # the server was started with it off
    run = read_log(text)
    name, shape = load_model(str(ROOT / "measure" / "serving" / "models" / "qwen3-8b" / "config.json"))
    _, settings = log_scenario(run, name, shape, gpu_profile("h200"))
    assert "enable_prefix_caching" not in settings.not_modelled and "enable_prefix_caching" in settings.ignored


def test_cuda_graph_flags_of_their_own_are_read_like_the_compilation_configs():
    s = read_command(f"vllm serve {LLAMA} --max-cudagraph-capture-size 256 --cudagraph-capture-sizes 1 2 4 8 "
                     "--max-model-len 8192".split())
    assert s.fields == {"max_cudagraph_capture_size": 256, "cudagraph_capture_sizes": (1, 2, 4, 8),
                        "max_model_len": 8192}
    assert s.model == LLAMA and not s.unknown
    with pytest.raises(KvsizeError, match="cudagraph_capture_sizes"):
        read_engine_args({"cudagraph_capture_sizes": "[1, 0]"})

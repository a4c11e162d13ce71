"""kvsize against what real engines printed at startup (tests/fixtures/README.md names every source)."""

import json
from pathlib import Path

import pytest

from sizing.evidence.logcheck import check_rows, row_scenario
from sizing.evidence.logs import read_log
from sizing.capacity.estimate import estimate
from sizing.capacity.record import engine_log_lines
from sizing.units import GiB

FIXTURES = Path(__file__).parent / "fixtures"
LOGS = FIXTURES / "engine-logs" / "vllm-0.19-h100.jsonl"
ROWS = [json.loads(line) for line in LOGS.read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("row", ROWS, ids=[r["id"] for r in ROWS])
def test_vllm_019_h100_log_within_one_percent(row, tmp_path):
    # The goal of the engine-fidelity work: KV GiB and tokens within 1% of what vLLM 0.19 printed.
    one = tmp_path / "row.jsonl"
    one.write_text(json.dumps(row) + "\n")
    (check,) = check_rows(one, FIXTURES / "configs")
    assert abs(check.kv_error) < 0.01, f"KV {check.predicted_kv_bytes / GiB:.2f} GiB vs logged {row['available_kv_gib']}"
    assert abs(check.tokens_error) < 0.01, f"tokens {check.predicted_tokens} vs logged {row['kv_cache_tokens']}"


def test_profiling_terms_match_the_log_per_term():
    # Llama-3.1-8B, TP 1 (log: weights 14.99, activation 1.89, non-torch 0.25 GiB): each term, not only the sum
    row = next(r for r in ROWS if r["id"].endswith("tp1pp1dp1--8192") and "llama-3-1-8b" in r["id"])
    b = estimate(row_scenario(row, FIXTURES / "configs")).breakdown
    assert abs(b.weights_bytes / GiB - row["weights_gib"]) < 0.01
    assert abs(b.activation_bytes / GiB - row["activation_gib"]) < 0.02
    assert abs(b.non_torch_bytes / GiB - row["non_torch_gib"]) < 0.01


def test_vllm_019_does_not_subtract_cuda_graphs_but_021_does():
    # a TP 1 dense row: apart from the graphs, the two releases differ only in their measured activation
    # and non-torch terms, which the budgets' difference is checked against term by term
    row = next(r for r in ROWS if r["tp"] == 1 and r["pp"] == 1 and "llama-3-1-8b" in r["id"])
    s = row_scenario(row, FIXTURES / "configs")
    from dataclasses import replace
    old, new = estimate(s), estimate(replace(s, engine="vllm@0.21"))
    assert "not subtracted" in old.budget_formula and "cuda_graphs" in new.budget_formula
    a, b = old.breakdown, new.breakdown
    assert a.weights_bytes == b.weights_bytes
    assert old.kv_budget_bytes - new.kv_budget_bytes == (b.cuda_graph_bytes + b.activation_bytes - a.activation_bytes
                                                          + b.non_torch_bytes - a.non_torch_bytes)


def test_check_log_reads_a_real_vllm_log():
    run = read_log((FIXTURES / "vllm-0.19-llama-3.1-8b-h100.log").read_text())
    assert (run.engine, run.version, run.model) == ("vllm", "0.19.0", "meta-llama/Llama-3.1-8B-Instruct")
    assert run.settings["max_model_len"] == 16384 and run.settings["gpu_memory_utilization"] == 0.95
    assert run.figures["max_tokens"] == 476_016 and run.figures["kv_budget_bytes"] == round(58.11 * GiB)


def test_check_log_cli_on_a_real_log(capsys):
    from app.cli import main

    args = ["check-log", str(FIXTURES / "vllm-0.19-llama-3.1-8b-h100.log"),
            "--model", str(FIXTURES / "configs" / "Llama-3.1-8B-Instruct.json"), "--format", "json"]
    # its total, 79.18 GiB, is an A100 80GB's and both H100s' within what the log prints: check-log asks, naming them
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "a100-80gb" in err and "h100-sxm" in err and "--gpu" in err
    code = main([*args, "--gpu", "h100-sxm"])  # the log's source: one H100 80GB HBM3 (fixtures/README.md)
    rows = {r["term"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert code == 0
    assert abs(rows["kv_budget_bytes"]["difference_percent"]) < 0.5
    assert abs(rows["max_tokens"]["difference_percent"]) < 0.5


def test_check_log_refuses_a_log_without_kv_lines(tmp_path, capsys):
    from app.cli import main

    log = tmp_path / "x.log"
    log.write_text("INFO starting server\n")
    assert main(["check-log", str(log), "--model", "llama-3.1-8b"]) == 2
    assert "no KV cache line" in capsys.readouterr().err


def test_reads_sglang_and_trtllm_kv_lines():
    # SGLang, Qwen3-235B-A22B-FP8 on 4xH100 (vllm-project/vllm issue #21348):
    sg = read_log("KV Cache is allocated. #tokens: 367404, K size: 8.23 GB, V size: 8.23 GB")
    assert sg.engine == "sglang" and sg.figures["max_tokens"] == 367404
    assert sg.figures["kv_budget_bytes"] == round(16.46 * GiB)
    # TensorRT-LLM's line as its resource manager words it; the figures are arbitrary, this checks the parse only
    trt = read_log("[MemUsageChange] Allocated 21.37 GiB for max tokens in paged KV cache (175040).")
    assert trt.engine == "trtllm" and trt.figures["max_tokens"] == 175040


def test_estimate_prints_the_engine_lines():
    row = next(r for r in ROWS if r["id"].endswith("tp1pp1dp1--8192") and "llama-3-1-8b" in r["id"])
    lines = engine_log_lines(estimate(row_scenario(row, FIXTURES / "configs")))
    assert lines[0].startswith("Available KV cache memory: 58.1") and lines[0].endswith(" GiB")
    assert lines[1].startswith("GPU KV cache size: ") and "tokens" in lines[1]


def test_engine_version_picks_the_release():
    from sizing.engines import get_engine
    from sizing.errors import KvsizeError

    assert get_engine("vllm@0.19.1").release.name == "vllm@0.19"
    assert get_engine("vllm").release.memory_fraction_default == 0.92  # >= 0.21 (vllm/config/cache.py)
    assert get_engine("vllm@0.10").release.name == "vllm@0.16"
    with pytest.raises(KvsizeError, match="no rules for that version"):
        get_engine("vllm@0.1")


def test_per_tensor_fp8_scales_are_layer_parameters_not_pool_memory():
    # vLLM keeps k_scale and v_scale as attention-layer parameters (vllm/attention/layer.py), so
    # --kv-cache-memory 10GiB with fp8 KV on Llama-3.1-8B gives 10 GiB / 1 MiB pages = 10,240 blocks
    # (32 layers x 8 KV heads x 128 x 2 sides x 16 tokens x 1 byte = 1 MiB, configs/Llama-3.1-8B.json).
    from tests.helpers import scenario

    e = estimate(scenario("llama-3.1-8b", "h100-sxm", k_cache_dtype="fp8", v_cache_dtype="fp8",
                          kv_cache_memory_bytes=10 * GiB, max_model_len=8192))
    assert e.num_blocks == 10_240
    assert e.kv_layer_fixed_bytes == 0
    bf16 = estimate(scenario("llama-3.1-8b", "h100-sxm", max_model_len=8192))
    assert e.breakdown.weights_bytes - bf16.breakdown.weights_bytes == 32 * 2 * 4  # fp32 k_scale + v_scale


SGLANG_LOGS = [
    # (fixture, version of its date, GPU, logged max_total_num_tokens) -- tests/fixtures/README.md
    ("sglang-0.4.4-llama-3.1-8b-fa3.log", "0.4.4", "h100-sxm", 442_750),
    ("sglang-0.4-llama-3.1-8b-h100.log", "0.4.1", "h100-sxm", 444_500),
    ("sglang-0.4.9-llama-3.1-8b-24gb.log", "0.4.9", "rtx-4090", 38_141),
]


@pytest.mark.parametrize("log, version, gpu, tokens", SGLANG_LOGS, ids=[r[0] for r in SGLANG_LOGS])
def test_check_log_on_real_sglang_logs_within_one_percent(log, version, gpu, tokens, capsys):
    # The release's default mem_fraction_static (0.88 by TP x PP up to 0.4.7; 0.879 from the 24 GB
    # reserve in 0.4.8+) and f x free-at-start - weights reproduce the logged token count.
    from app.cli import main

    code = main(["check-log", str(FIXTURES / log), "--model", str(FIXTURES / "configs" / "Llama-3.1-8B-Instruct.json"),
                 "--engine-version", version, "--gpu", gpu, "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    rows = {r["term"]: r for r in out["rows"]}
    assert code == 0 and out["engine"] == "sglang"
    assert rows["max_tokens"]["logged"] == tokens
    assert abs(rows["max_tokens"]["difference_percent"]) < 1.0


def test_trtllm_08_log_bytes_per_token_match_llama_2_7b(tmp_path):
    # NVIDIA/TensorRT-LLM issue #1400 (A100, TensorRT-LLM 0.8): 69,524,783,104 B for 132,608 tokens =
    # 524,288 B a token, Llama-2-7B's 32 layers x 32 KV heads x 128 x 2 x 2 B in fp16 (configs/Llama-2-7b-hf.json).
    from sizing.profiles import load_model
    from sizing.capacity.scenario import Scenario

    run = read_log((FIXTURES / "trtllm-0.8-llama-2-7b-a100.log").read_text())
    assert run.engine == "trtllm"
    assert (run.figures["kv_budget_bytes"], run.figures["max_tokens"]) == (69_524_783_104, 132_608)
    name, shape = load_model(str(FIXTURES / "configs" / "Llama-2-7b-hf.json"))
    e = estimate(Scenario(name, shape, "A100", 85_899_345_920, engine="trtllm", max_model_len=4096,
                          kv_cache_memory_bytes=run.figures["kv_budget_bytes"]))
    assert e.kv_payload_bytes_per_token == 524_288
    assert e.max_tokens == 132_608


@pytest.mark.parametrize("fixture, config", [
    ("vllm-0.33-nemotron-h-8b.json", "Nemotron-H-8B-Base-8K.json"),  # Mamba-2, fp32 SSM state
    ("vllm-0.33-qwen3-next-80b.json", "Qwen3-Next-80B-A3B-Thinking.json"),  # gated delta net, 64-token checkpoints
])
def test_hybrid_mamba_pool_matches_vllm_033(fixture, config):
    # vLLM keeps the conv state in the model dtype and the SSM state in mamba_ssm_cache_dtype (fp32 for
    # Nemotron-H), raises the attention block until a page covers a state page, pads the state page,
    # and keeps 3 state pages per Mamba group per request in prefix-caching "align" mode.
    from sizing.capacity.scenario import Scenario
    from sizing.profiles import load_model

    ref = json.loads((FIXTURES / fixture).read_text())
    name, shape = load_model(str(FIXTURES / "configs" / config))
    e = estimate(Scenario(name, shape, "H200", 150_109_880_320, engine="vllm@0.33",
                          kv_cache_memory_bytes=10 * GiB, max_model_len=ref["max_model_len"]))
    (conv, ssm) = ref["mamba_state_shapes"]
    assert e.recurrent_state_bytes_per_sequence == 0  # held in the pool
    assert e.block_size == ref["block_size"]
    assert e.num_blocks == ref["num_blocks"]
    assert e.block_bytes == ref["pool_bytes_per_block"]
    assert abs(e.max_concurrency_ratio - ref["max_concurrency"]) < 1e-9
    assert e.max_tokens == ref["kv_cache_size_tokens"]
    ssm_bytes = 4 if ref["mamba_state_dtypes"].endswith("float32)") else 2
    layout_state = (shape.recurrent_conv_elements * 2
                    + (shape.recurrent_state_elements - shape.recurrent_conv_elements) * ssm_bytes)
    assert layout_state == conv[0] * conv[1] * 2 + ssm[0] * ssm[1] * ssm[2] * ssm_bytes


def test_vllm_builds_mistral_7b_v01_with_full_attention():
    # vLLM 0.33.0 (tests/fixtures/vllm-0.33-mistral-7b-v0.1.json): no window without layer_types.
    from sizing.capacity.scenario import Scenario
    from sizing.profiles import load_model

    ref = json.loads((FIXTURES / "vllm-0.33-mistral-7b-v0.1.json").read_text())
    name, shape = load_model(str(FIXTURES / "configs" / "Mistral-7B-v0.1.json"))
    assert ref["layer_kinds"] == ["FullAttentionSpec"]
    e = estimate(Scenario(name, shape, "H200", 150_109_880_320, engine="vllm@0.33", kv_cache_memory_bytes=10 * GiB))
    assert (e.max_model_len, e.num_blocks, e.max_tokens) == (ref["max_model_len"], ref["num_blocks"],
                                                              ref["kv_cache_size_tokens"])
    assert abs(e.max_concurrency_ratio - ref["max_concurrency"]) < 1e-9
    ideal = estimate(Scenario(name, shape, "H200", 150_109_880_320, engine="ideal", kv_cache_memory_bytes=10 * GiB))
    assert ideal.kv_bytes_per_sequence < e.kv_bytes_per_sequence  # the windowed cache, as transformers masks it


def test_a_logged_gpu_is_matched_by_its_name_and_total_never_guessed():
    from sizing.errors import KvsizeError
    from sizing.evidence.logcheck import _row_gpu

    row = dict(ROWS[0])
    assert _row_gpu(row).name == "NVIDIA H100 80GB HBM3 (SXM)"  # not the PCIe part, which has the same total
    row["total_memory_gib"] = 93.1  # an H100 NVL's total: not the 80 GB part
    with pytest.raises(KvsizeError, match="matches no bundled GPU"):
        _row_gpu(row)


def test_sglang_server_args_read_in_both_forms():
    """SGLang 0.5.23 prints its server_args line as a dict where earlier releases print ServerArgs(...): the
    memory-moving fields read the same from either, and a field outside the list is not read."""
    from sizing.evidence.logs import sglang_server_args

    fields = dict(tp_size=2, mem_fraction_static=0.88, kv_cache_dtype="fp8_e4m3", context_length=8192, page_size=1,
                  disable_cuda_graph=True)
    old = "server_args=ServerArgs(model_path='m', " + ", ".join(f"{k}={v!r}" for k, v in fields.items()) + ", seed=3)"
    new = "server_args={'model_path': 'm', " + ", ".join(f"{k!r}: {v!r}" for k, v in fields.items()) + ", 'seed': 3}"
    assert sglang_server_args(new) == sglang_server_args(old)
    assert sglang_server_args(new)["kv_cache_dtype"] == "fp8_e4m3" and "seed" not in sglang_server_args(new)


def test_a_pipeline_parallel_log_is_read_at_its_last_stage():
    # vLLM 0.33.0, PP 2 (tests/fixtures/vllm-starts/logs/h200-0.33.0-qwen3-30b-a3b-pp2.log): Worker_PP0 printed a
    # torch peak of 0.84 GiB, Worker_PP1 (the sampler's stage, whose pool binds) 1.49
    log = (Path(__file__).parent / "fixtures" / "vllm-starts" / "logs" / "h200-0.33.0-qwen3-30b-a3b-pp2.log")
    run = read_log(log.read_text())
    assert abs(run.figures["activation_bytes"] / GiB - 1.49) < 1e-9
    assert run.figures["max_tokens"] == 2_104_432  # the engine's own line, which names no stage
    # a one-stage log keeps every line
    one = "(Worker_TP0 pid=1) DEBUG x torch peak memory increase: 1.1GiB\n"
    from sizing.evidence.logs import _last_stage_lines

    assert _last_stage_lines(one) == one
    two = ("(Worker_PP0 pid=1) torch peak memory increase: 0.5GiB\n(Worker_PP1_TP0 pid=2) torch peak memory "
           "increase: 0.7GiB\n(EngineCore pid=3) GPU KV cache size: 10 tokens")
    assert _last_stage_lines(two).splitlines() == two.splitlines()[1:]

"""kvsize estimate --engine llamacpp as llama.cpp allocates: the GGUF's weight types, its buffers on the GPU and in host
memory, the compute and output buffers in the budget, and one-line refusals."""

import json
import subprocess
import sys

import pytest

from app.cli import main
from conftest import ROOT
from sizing.config.read import resolve_shape
from sizing.engines.llamacpp_quant import offloaded_weights, quantized_tensors
from sizing.engines.llamacpp_weights import mib_printed

CONFIG = ROOT / "tests" / "fixtures" / "vllm-starts" / "configs" / "llama-3.2-1b-instruct.json"
REPORT = ROOT / "measure" / "reports" / "llamacpp-cpu-buffers.json"


def _estimate(capsys, *extra):
    assert main(["estimate", "--model", str(CONFIG), "--gpu", "rtx-4090", "--engine", "llamacpp",
                 "--max-model-len", "8k", "--format", "json", *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _printed_model_buffer(load_id: str) -> str:
    row = next(r for r in json.loads(REPORT.read_text())["loads"] if r["load"]["id"] == load_id)
    return next(b["mib"] for b in row["figures"]["buffers"] if b["kind"] == "model")


def test_q8_0_model_buffer_is_the_reports_printed_figure(capsys):
    record = _estimate(capsys, "--weights-dtype", "q8_0")
    buffers = record["llamacpp_buffers"]
    cpu = buffers["cpu_load_model_buffers_bytes"]
    assert list(cpu) == ["CPU_Mapped"]
    assert mib_printed(cpu["CPU_Mapped"]) == _printed_model_buffer("llama-3.2-1b/q8_0-mmap") == "1252.41"
    # on the GPU: every tensor but token_embd (host memory), plus the tied output matrix as a copy of its own
    assert record["breakdown"]["weights_bytes"] == buffers["gpu_model_buffer_bytes"]
    assert buffers["host_model_buffer_bytes"] == 128256 * 2048 // 32 * 34
    assert record["breakdown"]["activation_bytes"] == buffers["compute_buffer_bytes"]
    assert buffers["output_buffer_bytes"] == 128256 * 4  # one sequence's logits, in pinned host memory
    assert record["weights_dtype"] == "q8_0"


def test_f16_model_buffer_is_the_reports_printed_figure(capsys):
    cpu = _estimate(capsys, "--weights-dtype", "f16")["llamacpp_buffers"]["cpu_load_model_buffers_bytes"]
    assert mib_printed(cpu["CPU_Mapped"]) == _printed_model_buffer("llama-3.2-1b/f16-mmap")


def test_table_says_what_is_a_model_and_unmeasured(capsys):
    assert main(["estimate", "--model", str(CONFIG), "--gpu", "rtx-4090", "--engine", "llamacpp",
                 "--weights-dtype", "q4_0", "--max-model-len", "8k"]) == 0
    out = capsys.readouterr().out
    assert "CUDA0" in out and "not measured on a CUDA build" in out and "a model" in out
    assert "token_embd stays on the CPU" in out


def test_smaller_weights_leave_more_kv(capsys):
    q8 = _estimate(capsys, "--weights-dtype", "q8_0")
    q4 = _estimate(capsys, "--weights-dtype", "q4_0")
    assert q4["breakdown"]["weights_bytes"] < q8["breakdown"]["weights_bytes"]
    assert q4["kv_budget_bytes"] > q8["kv_budget_bytes"]


def test_q4_k_m_follows_llama_quantize_rules():
    shape = resolve_shape(json.loads(CONFIG.read_text()))
    types = {t.name: t.type for t in quantized_tensors(shape, "q4_K_M")}
    assert types["token_embd.weight"] == "q6_K"  # tied: the output matrix's rule
    # use_more_bits over 16 layers: 0, 1, 4, 7, 10, 13, 14, 15
    more = [i for i in range(16) if types[f"blk.{i}.attn_v.weight"] == "q6_K"]
    assert more == [0, 1, 4, 7, 10, 13, 14, 15]
    assert [i for i in range(16) if types[f"blk.{i}.ffn_down.weight"] == "q6_K"] == more
    assert types["blk.2.attn_q.weight"] == "q4_K" and types["blk.0.attn_norm.weight"] == "f32"
    assert offloaded_weights(shape, "q4_K_M").weight_type == "q4_K_M"


def test_q4_k_is_llama_quantizes_alias_of_q4_k_m(capsys):
    assert _estimate(capsys, "--weights-dtype", "Q4_K")["weights_dtype"] == "q4_K_M"


def test_fallback_type_where_rows_are_not_whole_k_blocks():
    shape = resolve_shape(json.loads((ROOT / "tests" / "fixtures" / "vllm-starts" / "configs"
                                      / "qwen2.5-0.5b.json").read_text()))
    types = {t.name: t.type for t in quantized_tensors(shape, "q4_K_M")}
    assert types["blk.2.attn_q.weight"] == "q5_0"  # 896 values a row: q4_K falls back (tensor_type_fallback)
    assert types["token_embd.weight"] == "q8_0"  # the output rule: 896 is not whole blocks of 256


@pytest.mark.parametrize("dtype", ["q3_k_xs", "iq2_xxs", "fp8", "tq1_0"])
def test_bad_weight_type_is_one_line(dtype):
    proc = subprocess.run([sys.executable, "-m", "app.cli", "estimate", "--model", str(CONFIG), "--gpu", "rtx-4090",
                           "--engine", "llamacpp", "--weights-dtype", dtype], capture_output=True, text=True,
                          cwd=ROOT, timeout=300)
    assert proc.returncode != 0 and proc.stdout == ""
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--weights-dtype" in lines[0] and "q4_K_M" in lines[0] and "q8_0" in lines[0]


def test_architecture_without_tensor_list(capsys):
    """Without llama.cpp's tensor list for the architecture, a GGUF weight type is refused in one line naming --model
    and the architectures that have one; with no type named, the answer keeps the parameter count and says so."""
    assert main(["estimate", "--model", "phi-3-mini-128k-instruct", "--gpu", "h200", "--engine", "llamacpp",
                 "--weights-dtype", "q4_0", "--max-model-len", "4k"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--model" in err[0] and "qwen3" in err[0]
    assert main(["estimate", "--model", "phi-3-mini-128k-instruct", "--gpu", "h200", "--engine", "llamacpp",
                 "--max-model-len", "4k"]) == 0
    out = capsys.readouterr().out
    assert "llama.cpp's own buffers are not sized here" in out and "parameter count" in out
    assert "model buffer, GPU" not in out

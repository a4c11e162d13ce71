"""llama.cpp's buffers beside the KV cache held to real loads on a CPU: the model buffers exact (full-size GGUFs of
measure/reports/llamacpp-cpu-buffers.json and every miniature of llamacpp-cpu-loads.json), the output buffer exact,
the compute buffer a model within its stated band; a report whose figures llama.cpp did not print fails."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from measure.llamacpp import buffers
from measure.llamacpp.full import FULL_LOADS, PREDICTIONS
from sizing.engines.llamacpp_weights import (GgufTensor, gguf_tensors, mib_printed, model_buffers,
                                             output_buffer_bytes, tensor_bytes)
from sizing.errors import KvsizeError
from sizing.profiles import bundled_shape

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "measure" / "reports" / "llamacpp-cpu-buffers.json"
LOADS = ROOT / "measure" / "reports" / "llamacpp-cpu-loads.json"


@pytest.fixture(scope="module")
def report():
    return json.loads(REPORT.read_text())


def test_the_report_is_the_planned_full_size_loads(report):
    assert [r["load"]["id"] for r in report["loads"]] == [load.id for load in FULL_LOADS]
    assert report["engine"]["llama_cpp_python"] == "0.3.36" and report["device"]["kind"] == "cpu"
    assert all(r["context_made"] and r["gguf_bytes"] < 3 * 10**9 for r in report["loads"])


def test_every_full_size_buffer_is_predicted(report):
    assert buffers.problems(report) == []


def test_a_figure_llama_cpp_did_not_print_fails(report):
    tampered = copy.deepcopy(report)
    b = next(b for b in tampered["loads"][0]["figures"]["buffers"] if b["kind"] == "model")
    b["mib"] = f"{float(b['mib']) + 0.01:.2f}"
    assert buffers.problems(tampered) == [f"{tampered['loads'][0]['load']['id']}: its figures are not what "
                                          "llama.cpp printed (its raw lines say otherwise)"]


def test_a_load_asked_not_to_map_is_held_to_the_load_mode_llama_cpp_printed(report):
    # llama-cpp-python 0.3.36's model params have load_mode and no use_mmap: a load that set use_mmap=False was
    # mapped all the same (its log said "load_mode = mmap"); the check now fails such a load
    unmapped = [r for r in report["loads"] if not r["load"]["use_mmap"]]
    assert len(unmapped) == 2
    assert all(not buffers.mapped(r["lines"]) and any("(load_mode = none)" in line for line in r["lines"])
               for r in unmapped)
    tampered = copy.deepcopy(report)
    row = next(r for r in tampered["loads"] if not r["load"]["use_mmap"])
    row["lines"] = [line.replace("(load_mode = none)", "(load_mode = mmap)") for line in row["lines"]]
    assert buffers.problems(tampered) == [f"{row['load']['id']}: the load asked for use_mmap=False but llama.cpp's "
                                          "load mode was mmap"]


def test_the_child_asks_for_the_load_mode_through_the_field_the_struct_has(monkeypatch):
    import ctypes
    import sys
    import types

    from measure.llamacpp import child

    class Params(ctypes.Structure):  # 0.3.36's llama_model_params, as far as loading goes
        _fields_ = [("n_gpu_layers", ctypes.c_int32), ("load_mode", ctypes.c_int32)]

    seen = {}

    def load_from_file(path, params):
        seen.update(load_mode=params.load_mode, n_gpu_layers=params.n_gpu_layers)
        return None  # no model: the child stops there

    fake = types.SimpleNamespace(llama_backend_init=lambda: None, llama_model_default_params=Params,
                                 llama_model_load_from_file=load_from_file)
    monkeypatch.setitem(sys.modules, "llama_cpp", fake)
    assert child.load("m.gguf", {"use_mmap": False}) == {"model_loaded": False, "context_made": False}
    assert seen == {"load_mode": child.LOAD_MODE["none"], "n_gpu_layers": 0}
    child.load("m.gguf", {"use_mmap": True})
    assert seen["load_mode"] == child.LOAD_MODE["auto"]


def test_a_changed_raw_line_is_held_to_kvsize(report):
    tampered = copy.deepcopy(report)
    row = tampered["loads"][3]  # the q4_0 load: a mapped and a repacked buffer
    i = next(i for i, line in enumerate(row["lines"]) if "CPU_REPACK model buffer size" in line)
    row["lines"][i] = row["lines"][i].replace("264.98", "265.98")
    row["figures"] = buffers.parse(row["lines"])
    problems = buffers.problems(tampered)
    assert len(problems) == 1 and "model buffers" in problems[0] and row["load"]["id"] in problems[0]
    # and a compute buffer outside the stated band
    tampered = copy.deepcopy(report)
    row = tampered["loads"][0]
    i = next(i for i, line in enumerate(row["lines"]) if "compute buffer size =" in line)
    row["lines"][i] = row["lines"][i].replace("258.50", "300.50")
    row["figures"] = buffers.parse(row["lines"])
    assert "outside the stated band" in buffers.problems(tampered)[0]


def test_every_miniature_model_buffer_is_exact():
    report = json.loads(LOADS.read_text())
    assert buffers.miniature_problems(report) == []
    assert len({r["load"]["model"] for r in report["loads"]}) == 11


def test_repacked_q4_0_is_a_buffer_of_its_own(report):
    row = next(r for r in report["loads"] if r["load"]["weight_type"] == "q4_0")
    assert set(buffers.printed(row["figures"], "model")) == {"CPU_Mapped", "CPU_REPACK"}


def test_the_predictions_came_first_and_are_kept_apart(report):
    before = {r["load"]["id"]: r["prediction"] for r in json.loads(PREDICTIONS.read_text())["loads"]}
    assert set(before) == {r["load"]["id"] for r in report["loads"]}
    for row in report["loads"]:
        p = before[row["load"]["id"]]
        got = buffers.printed(row["figures"], "model")
        # mapped or not (load_mode = none: the tensors read into a CPU buffer, the repacked ones left out of it)
        assert p["model_buffers_mib"] == got, row["load"]["id"]
        assert p["output_mib"] == buffers.printed(row["figures"], "output")["CPU"]


def test_ggml_type_sizes():
    # ggml/src/ggml.c type_traits
    assert tensor_bytes("q8_0", (64, 3)) == 2 * 34 * 3
    assert tensor_bytes("q4_K", (256,)) == 144
    assert tensor_bytes("bf16", (3, 5)) == 30
    with pytest.raises(KvsizeError, match="whole blocks of 32"):
        tensor_bytes("q4_0", (48,))


def test_mapped_and_allocated_layouts():
    a = GgufTensor("token_embd.weight", "f32", (3,), "get_rows")  # 12 bytes, padded to 32 in the file
    b = GgufTensor("blk.0.ffn_up.weight", "q4_0", (32, 8), "mul_mat")  # 144 bytes, repacked
    c = GgufTensor("output_norm.weight", "f32", (5,), "other")  # 20 bytes
    assert model_buffers([a, c], False) == {"CPU_Mapped": 32 + 20}
    assert model_buffers([a, c], False, mmap=False) == {"CPU": 64}
    # the mapped range spans the repacked tensor between them; the repacked one is allocated apart
    assert model_buffers([a, b, c], False) == {"CPU_Mapped": 32 + 160 + 20, "CPU_REPACK": 160}
    assert model_buffers([a, b, c], False, repack=False) == {"CPU_Mapped": 32 + 160 + 20}


def test_estimate_side_tensor_list_and_output():
    tensors = gguf_tensors(bundled_shape("llama-3.1-8b"), "q8_0")
    assert tensors[0].name == "rope_freqs.weight" and tensors[-1].name == "output.weight"
    assert sum(t.nbytes for t in tensors) > 8 * 10**9  # 8.0e9 weights at 8.5 bits
    assert output_buffer_bytes(128256, 1) == 128256 * 4 and mib_printed(128256 * 4) == "0.49"
    with pytest.raises(KvsizeError, match="dense"):
        gguf_tensors(bundled_shape("deepseek-v3"), "q8_0")


def test_kvsize_validate_re_checks_the_buffers_report(report, tmp_path, capsys):
    """CI's `kvsize validate measure/reports/*.json` reads this report through its own schema: agreeing, it says so;
    a compute figure outside the band fails the run (exit 1) naming the load."""
    from measure.validate import validate_files

    path = tmp_path / "buffers.json"
    path.write_text(json.dumps(report))
    assert validate_files([str(path)]) == 0
    assert f"{len(report['loads'])} full-size llama.cpp loads' buffers agree" in capsys.readouterr().out
    tampered = copy.deepcopy(report)
    row = tampered["loads"][0]
    i = next(i for i, line in enumerate(row["lines"]) if "compute buffer size =" in line)
    row["lines"][i] = row["lines"][i].replace("258.50", "300.50")
    row["figures"] = buffers.parse(row["lines"])
    path.write_text(json.dumps(tampered))
    assert validate_files([str(path)]) == 1
    assert row["load"]["id"] in capsys.readouterr().err

"""kvsize's llama.cpp rules held to real llama.cpp loads (measure/reports/llamacpp-cpu-loads.json, made on a CPU by
`python -m measure.llamacpp run`): every figure re-read from the raw lines llama.cpp printed, every load predicted
as printed, and a report whose figures llama.cpp did not print refused."""

from __future__ import annotations

import copy
from dataclasses import replace
import json
import re
from pathlib import Path

import pytest

from measure.llamacpp import report as report_mod
from measure.llamacpp.accuracy import summary
from measure.llamacpp.panel import CACHE_TYPES, panel
from measure.validate import report_problems
from sizing.engines.llamacpp import llamacpp_architecture, llamacpp_type, log_lines, mib_text, predict_load
from sizing.errors import KvsizeError
from sizing.profiles import bundled_shape, model_profile

ROOT = Path(__file__).resolve().parents[1]
REPORT = ROOT / "measure" / "reports" / "llamacpp-cpu-loads.json"
PREDICTIONS = ROOT / "measure" / "llamacpp" / "predictions.json"


@pytest.fixture(scope="module")
def report():
    return json.loads(REPORT.read_text())


def test_the_report_is_the_planned_panel(report):
    planned = {load.id: load.as_dict() for load in panel()}
    kept = {row["load"]["id"]: row["load"] for row in report["loads"]}
    assert set(kept) == set(planned)
    for load_id, settings in kept.items():
        assert {k: settings[k] for k in planned[load_id]} == planned[load_id]
    assert len(kept) >= 150
    loaded = [row for row in report["loads"] if row["context_made"]]
    assert {row["load"]["type_k"] for row in loaded} == {row["load"]["type_v"] for row in loaded} == set(CACHE_TYPES)
    assert report["engine"]["llama_cpp_python"] == "0.3.36" and report["engine"]["gguf"] == "0.19.0"


def test_every_load_is_predicted_as_llama_cpp_printed_it(report):
    assert report_problems(report) == []


def test_a_figure_llama_cpp_did_not_print_fails(report):
    tampered = copy.deepcopy(report)
    row = next(r for r in tampered["loads"] if r["figures"]["caches"])
    cache = row["figures"]["caches"][0]
    cache["k_mib"] = f"{float(cache['k_mib']) + 0.01:.2f}"
    problems = report_problems(tampered)
    assert problems == [f"{row['load']['id']}: its figures are not what llama.cpp printed "
                        "(its raw lines say otherwise)"]


def test_a_changed_raw_line_is_held_to_kvsize(report):
    # the line and its figure changed together: the report is self-consistent, and kvsize disagrees with it
    tampered = copy.deepcopy(report)
    row = next(r for r in tampered["loads"] if r["figures"]["caches"] and r["load"]["type_k"] == "q8_0")
    i = next(i for i, line in enumerate(row["lines"]) if line.startswith("llama_kv_cache: size ="))
    row["lines"][i] = re.sub(r"\(\s*(\d+) cells", lambda m: f"({int(m.group(1)) + 256:6d} cells", row["lines"][i])
    row["figures"] = report_mod.parse(row["lines"])
    problems = report_problems(tampered)
    assert len(problems) == 1 and "cells: llama.cpp" in problems[0] and row["load"]["id"] in problems[0]


def test_a_refusal_is_a_prediction(report):
    refused = [row for row in report["loads"] if row["figures"]["refusal"]]
    assert {row["figures"]["refusal"].split(" (")[0] for row in refused} >= {
        "quantized V cache requires flash_attn to be enabled"}
    for row in refused:
        assert not row["context_made"]
        assert report_mod.predicted(row["load"]).refusal == row["figures"]["refusal"]


def test_prospective_and_today_are_kept_apart(report):
    predictions = json.loads(PREDICTIONS.read_text())
    s = summary(report, predictions)
    assert s["today_exact"] == s["loads"]
    assert s["prospective_total"] == len(predictions["loads"]) == s["loads"]
    assert s["prospective_exact"] < s["prospective_total"]  # the rules as they stood missed some: docs/accuracy.md


def test_mib_as_llama_cpp_prints_it():
    # src/llama-kv-cache.cpp: (float) bytes / (1024.0f * 1024.0f), "%7.2f"
    assert mib_text(3_342_336) == "3.19"  # 3.1875 MiB
    assert mib_text(0) == "0.00"
    assert mib_text((1 << 24) + 1) == "16.00"  # float: 2^24 + 1 is not representable


def test_bad_input_is_one_line_naming_the_refusal():
    with pytest.raises(KvsizeError, match=r"^--cache-type-k q3_k: llama.cpp refuses this cache type \(it accepts: "
                                          r"f32, f16, bf16, q8_0"):
        llamacpp_type("q3_k")
    assert llamacpp_type("fp16") == "f16"  # kvsize's own name for it
    # an architecture llama.cpp's converter takes no model of (profiles/llamacpp_converts.json)
    unknown = replace(bundled_shape("llama-3.1-8b"), architectures=("NoSuchModelForCausalLM",), model_type="nosuch")
    with pytest.raises(KvsizeError, match="^llama.cpp has no architecture for NoSuchModelForCausalLM: its converter"):
        predict_load(unknown, 4096)
    # one llama.cpp converts (FalconForCausalLM) whose cache kvsize does not size load by load
    assert model_profile("falcon-7b").config["architectures"] == ["FalconForCausalLM"]
    with pytest.raises(KvsizeError) as e:
        llamacpp_architecture(bundled_shape("falcon-7b"))
    assert "model_type 'falcon'" in str(e.value) and "\n" not in str(e.value)


MEMORY_LINES = ("llama_kv_cache: size =", "llama_kv_cache_iswa: creating", "llama_memory_recurrent: size =",
                "llama_init_from_model: quantized V", "llama_init_from_model: model does not")


def test_kvsize_writes_the_lines_llama_cpp_printed(report):
    # character for character: every cache's size line (and the SWA headers, the recurrent line, the refusal)
    for row in report["loads"]:
        printed = [line for line in row["lines"] if line.startswith(MEMORY_LINES)]
        assert list(log_lines(report_mod.predicted(row["load"]))) == printed, row["load"]["id"]


def test_estimate_prints_what_llama_server_prints_for_its_serve_command():
    from helpers import scenario
    from sizing.capacity.estimate import estimate
    from sizing.capacity.record import engine_log_lines

    # kvsize's serve command: -c 4 x 8192, -np 4, -kvu, -fa on (sizing/engines/serve.py)
    e = estimate(scenario("gemma-2-9b", engine="llamacpp", k_cache_dtype="q8_0", v_cache_dtype="q8_0",
                          max_model_len=8192, concurrency=4))
    load = predict_load(bundled_shape("gemma-2-9b"), 4 * 8192, 4, "q8_0", "q8_0", True, True)
    assert engine_log_lines(e) == log_lines(load)
    # unified: the SWA cache holds the window for each of the 4 sequences and one ubatch (src/llama-kv-cache-iswa.cpp)
    assert load.caches[1].cells == min(4 * 8192, 4096 * 4 + 512)


def test_the_readme_quotes_the_report(report):
    s = summary(report, json.loads(PREDICTIONS.read_text()))
    readme = (ROOT / "README.md").read_text()
    assert f"holds {s['loads']} real llama.cpp loads" in readme
    assert f"size line as llama.cpp printed it for {s['today_exact']} of {s['loads']} loads ({s['refused']} of them" \
        in readme.replace("\n", " ")
    assert f"{s['prospective_exact']} of {s['prospective_total']} were exact" in readme.replace("\n", " ")


def test_estimate_refuses_what_llama_cpp_refuses_in_one_line():
    from helpers import scenario
    from sizing.capacity.estimate import estimate

    # llama.cpp refused every mixed K/V load of DeepSeek-V3 (MLA) in the report; the estimate says why
    with pytest.raises(KvsizeError) as e:
        estimate(scenario("deepseek-v3", gpu="b200", engine="llamacpp", k_cache_dtype="q8_0", v_cache_dtype="fp16",
                          max_model_len=4096))
    assert str(e.value) == ("llama.cpp refuses -ctk q8_0 -ctv f16 for this model: model does not support different K "
                            "(q8_0) and V (f16) cache types")

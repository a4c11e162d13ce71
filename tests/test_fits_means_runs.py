"""'Fits' means the chosen engine runs it, on every page (issue 50, item 1): a KV format the engine does not
run on the GPU, or does not store at all, is never a green "fits", never "runs": "supported", never the
recommendation, and never an unmarked capacity curve."""

import json

import pytest

from app.cli import main
from helpers import plain, scenario
from sizing.cache.formats import FORMAT_NAMES, get_format
from sizing.planners.compare import compare

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import ROOT  # noqa: E402

APP = str(ROOT / "app" / "streamlit_app.py")


def _app(**widgets):
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    assert not at.exception
    for key, value in widgets.items():
        at.selectbox(key=key).set_value(value)
    at.run()
    assert not at.exception
    return at


def _open(at, page: str) -> None:
    at.session_state["page"] = page
    at.run()
    assert not at.exception


def _chart(at, title: str) -> dict:
    return json.loads(next(c for c in at.get("plotly_chart") if title in c.proto.spec).proto.spec)


@pytest.mark.parametrize("gpu, fmt, why", [
    ("h200", "nvfp4", "no FP4 tensor cores"),  # the GPU lacks the hardware (sizing/engines/support.py runs_on)
    ("h100-sxm", "ultraquant_4bit", "vllm does not run ultraquant_4bit on sm90"),  # profiles/support.json says no
])
def test_plan_page_never_says_fits_for_a_format_the_engine_does_not_run_on_the_gpu(gpu, fmt, why):
    at = _app(gpu=gpu, k_format=fmt, v_format=fmt)
    assert not any("fits" in str(s.value) for s in at.success)
    assert any("does not run here" in plain(e.value) and fmt in plain(e.value) and why in plain(e.value) for e in at.error)
    assert _metric_shown(at)  # the figures stay, under the error


def test_plan_page_still_says_fits_for_a_format_the_engine_runs_there():
    at = _app(gpu="h200", k_format="fp8_e4m3", v_format="fp8_e4m3")
    assert any("fits" in str(s.value) for s in at.success)
    assert not at.error


def _metric_shown(at) -> bool:
    return any(m.label.startswith("Max concurrency") for m in at.metric)


def test_compare_rows_the_engine_does_not_store_are_not_run_here():
    rows = {r["format"]: r for r in compare(scenario(max_model_len=32768, concurrency=8, memory_fraction=0.92),
                                            "vllm", FORMAT_NAMES)}
    lacked = [n for n in FORMAT_NAMES if "vllm" not in get_format(n).engines]
    assert "kivi2" in lacked and "q4_0" in lacked
    for name in lacked:
        r = rows[name]
        if r["runs"] == "n/a":
            continue
        assert r["runs"] == "not this engine", name
        assert r["engine"] == "ideal" and not r["recommended"]
        assert r["status"].startswith("not run by vllm") and "sized as ideal" in r["status"], r["status"]
        assert r["max_concurrency"] > 0  # the ideal engine's figure stays, labelled


def test_compare_json_says_which_rows_the_engine_does_not_run(capsys):
    assert main(["compare", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "vllm",
                 "--max-model-len", "32768", "--format", "json"]) == 0
    rows = {r["format"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["kivi2"]["runs"] == "not this engine" and rows["kivi2"]["engine"] == "ideal"
    assert all(r["runs"] != "supported" for r in rows.values() if r["engine"] != "vllm")
    assert main(["compare", "--model", "llama-3.1-8b", "--gpu", "h100-sxm", "--engine", "vllm",
                 "--max-model-len", "32768"]) == 0
    kivi2 = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("kivi2 "))
    assert "not run by vllm" in kivi2 and "recommended" not in kivi2


def test_compare_page_paints_green_only_what_the_chosen_engine_runs():
    at = _app(gpu="h100-sxm")
    _open(at, "Compare formats")
    bars = {t["name"]: list(t["x"]) for t in _chart(at, "Capacity by KV format")["data"] if t["type"] == "bar"}
    green = bars["fits and runs here"]
    assert "fp8_e4m3" in green
    for name in ("kivi2", "q4_0", "nvfp4"):
        assert name not in green
    assert any("kivi2" in xs for name, xs in bars.items() if "not run by vllm" in name)
    table = next(d.value for d in at.dataframe if "runs" in d.value.columns).set_index("format")
    assert table.loc["kivi2", "runs"] == "not this engine" and not table.loc["kivi2", "recommended"]


def test_capacity_curves_mark_a_format_the_engine_does_not_run_on_the_gpu():
    at = _app(gpu="h100-sxm")
    _open(at, "Capacity curves")
    at.multiselect(key="curve_formats").set_value(["bf16", "nvfp4", "kivi2"])
    at.run()
    assert not at.exception
    traces = {t["name"]: t for t in _chart(at, "Max concurrency vs context")["data"]}
    nvfp4 = next(t for name, t in traces.items() if name.startswith("nvfp4"))
    assert "does not run on h100-sxm" in nvfp4["name"] and nvfp4["line"]["dash"] == "dash"
    kivi2 = next(t for name, t in traces.items() if name.startswith("kivi2"))
    assert "sized as ideal" in kivi2["name"] and kivi2["line"]["dash"] == "dash"
    assert "dash" not in (traces["bf16"].get("line") or {})  # what runs here stays a solid line
    table = next(d.value for d in at.dataframe if "runs" in d.value.columns)
    assert set(table[table["format"] == "nvfp4"]["runs"]) == {"unsupported"}

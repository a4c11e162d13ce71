"""The Validation tab's llama.cpp section, through streamlit's AppTest: its figures are the committed load report's
(measure/reports/llamacpp-cpu-loads.json) as measure/llamacpp/accuracy.py sums them, widgets set by key."""

import json

import pytest

pytest.importorskip("streamlit")
from streamlit.testing.v1 import AppTest  # noqa: E402

from conftest import ROOT  # noqa: E402
from measure.llamacpp.accuracy import PREDICTIONS, REPORT, summary  # noqa: E402

APP = str(ROOT / "app" / "streamlit_app.py")


def _validation():
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.session_state["page"] = "Validation"
    at.run()
    assert not at.exception
    return at


def test_validation_tab_holds_kvsize_to_real_llama_cpp_loads():
    s = summary(json.loads(REPORT.read_text()), json.loads(PREDICTIONS.read_text()))
    at = _validation()
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Loads exactly as printed (today)"] == f"{s['today_exact']} of {s['loads']}"
    assert metrics["Exact before the loads ran"] == f"{s['prospective_exact']} of {s['prospective_total']}"
    at.selectbox(key="llamacpp_arch").set_value("gemma3")
    at.run()
    assert not at.exception
    table = next(d for d in at.dataframe if "prospective" in d.value.columns).value
    assert set(table["arch"]) == {"gemma3"} and (table["today"] == "exact").all()
    # the report can also be chosen as a bundled report: every cache agrees
    at.selectbox(key="report_choice").set_value("llamacpp-cpu-loads.json")
    at.run()
    assert not at.exception and not at.error
    assert any("caches agree with today's kvsize" in x.value for x in at.success)



def test_the_full_size_loads_buffers_report_is_shown_against_kvsize():
    from measure.llamacpp.buffers import problems

    report = json.loads((ROOT / "measure" / "reports" / "llamacpp-cpu-buffers.json").read_text())
    at = _validation()
    at.selectbox(key="report_choice").set_value("llamacpp-cpu-buffers.json")
    at.run()
    assert not at.exception and not at.error
    # one point per buffer llama.cpp printed beside the cache: model buffer(s), output and compute of every load
    expected = sum(sum(1 for b in r["figures"]["buffers"] if b["kind"] in ("model", "output", "compute"))
                   for r in report["loads"])
    assert not problems(report)
    assert any(f"{expected} of {expected} buffers agree" in x.value for x in at.success)

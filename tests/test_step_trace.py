"""measure/step_trace.py: the vLLM plugin that times the engine core's steps in the serving runs. No vLLM here: a
stand-in scheduler with the two methods the plugin wraps, and the plugin's entry point found the way vLLM finds it."""

from __future__ import annotations

import importlib.metadata
import sys
from types import SimpleNamespace

from measure import step_trace


class Scheduler:
    def __init__(self):
        self.running, self.waiting = [1, 2, 3], [4]
        self.calls = []

    def schedule(self, throttle_prefills=False):
        self.calls.append(("schedule", throttle_prefills))
        # two prompt chunks (512 and 40 tokens) and three decoding requests
        return SimpleNamespace(num_scheduled_tokens={"a": 512, "b": 40, "c": 1, "d": 1, "e": 1})

    def update_from_output(self, scheduler_output, model_output):
        self.calls.append(("update", model_output))
        return {0: SimpleNamespace(outputs=[1, 2, 3, 4]), 1: SimpleNamespace(outputs=[5])}


def test_split_counts_prompt_chunks_apart_from_decoding_requests():
    assert step_trace.scheduled_split({"a": 512, "b": 40, "c": 1}) == (2, 552, 1)
    assert step_trace.scheduled_split({}) == (0, 0, 0)


def test_wrapped_scheduler_answers_as_before_and_writes_one_line_per_call(tmp_path):
    s = Scheduler()
    log = step_trace.StepLog(tmp_path / "steps.tsv")
    step_trace.trace_scheduler(s, log)
    out = s.schedule(True)
    assert out.num_scheduled_tokens["a"] == 512
    assert s.update_from_output(out, "tokens")[1].outputs == [5]
    assert s.calls == [("schedule", True), ("update", "tokens")]
    log._file.flush()
    rows = [line.split("\t") for line in (tmp_path / "steps.tsv").read_text().splitlines()]
    assert [r[0] for r in rows] == ["S", "U"]
    assert rows[0][3:] == ["2", "552", "3", "3", "1"]
    assert rows[1][3:] == ["5"]
    for r in rows:
        assert float(r[1]) <= float(r[2])


def test_plugin_is_inert_without_its_variable(monkeypatch):
    monkeypatch.delenv(step_trace.ENV_DIR, raising=False)
    before = dict(sys.modules)
    step_trace.register()
    assert not any(name.startswith("vllm") for name in set(sys.modules) - set(before))


def test_installed_folder_names_the_plugin_where_vllm_looks(tmp_path, monkeypatch):
    folder = step_trace.install_dir(tmp_path / "plugin")
    monkeypatch.syspath_prepend(str(folder))
    found = [ep for ep in importlib.metadata.entry_points(group="vllm.general_plugins")
             if ep.name == "kvsize_step_trace"]
    assert len(found) == 1
    assert found[0].load().__name__ == "register"

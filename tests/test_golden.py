"""kvsize's answers for about 300 command lines (estimate, compare, plan, check-log), held byte for byte to
tests/fixtures/golden/answers.json, written by scripts/golden.py. A change meant to move no behaviour keeps this
file as it is; a change that moves an answer on purpose rewrites it with the script and shows the diff."""

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _golden_module():
    spec = importlib.util.spec_from_file_location("golden", ROOT / "scripts" / "golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_answer_is_as_in_the_golden_file():
    golden = _golden_module()
    expected_text = golden.GOLDEN.read_text()
    records = golden.answers()
    changed = golden.moved(json.loads(expected_text), records)
    assert not changed, f"{len(changed)} answers moved, first: {changed[:3]}"
    assert golden.render(records) == expected_text


def test_the_golden_file_covers_what_it_says():
    records = json.loads((ROOT / "tests" / "fixtures" / "golden" / "answers.json").read_text())
    commands = {r["argv"][0] for r in records}
    assert commands == {"estimate", "compare", "plan", "check-log"}
    engines = {r["argv"][r["argv"].index("--engine") + 1] for r in records if "--engine" in r["argv"]}
    assert {"vllm@0.20.0", "vllm@0.33.0", "sglang", "trtllm", "llamacpp", "lmdeploy"} <= engines
    served = [r for r in records if r["argv"][0] == "estimate" and r["exit"] == 0]
    kv = {r["argv"][r["argv"].index("--kv-cache-dtype") + 1] for r in served}
    assert {"auto", "fp8", "nvfp4", "int4_per_token_head"} <= kv
    assert len(records) >= 200 and len(served) >= 100

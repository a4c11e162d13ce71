"""An answer on a GPU no real start ran on says so (issue 49 section 7): the terms carried from the GPUs kvsize has
started are named as not confirmed there."""

import json

import pytest

from sizing.engines.started import gpu_evidence, started
from sizing.profiles import gpu_profile


def test_the_gpus_the_starts_ran_on_carry_no_such_note():
    ids = {g for row in started("vllm").values() for g in row.gpus}
    assert ids and all(gpu_evidence("vllm", gpu_profile(g).name) is None for g in ids)


@pytest.mark.parametrize("gpu", ["rtx-4090", "l4", "a100-80gb", "b200"])
def test_a_gpu_never_started_is_named_in_the_answer(gpu, capsys):
    from app.cli import main

    assert main(["estimate", "--model", "qwen3-8b", "--gpu", gpu, "--max-model-len", "8k", "--format", "json"]) == 0
    record = json.loads(capsys.readouterr().out)
    notes = [n for n in record["warnings"] if n.startswith("no real vllm start on")]
    assert len(notes) == 1 and gpu_profile(gpu).name in notes[0] and "h200" in notes[0]


def test_engines_kvsize_keeps_no_starts_of_say_nothing_of_gpus():
    assert gpu_evidence("trtllm", gpu_profile("rtx-4090").name) is None

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


def test_the_note_weighs_the_carried_terms_against_the_kv_budget(capsys):
    # Qwen3-8B on an L4 (24 GB) at vLLM 0.29's small-GPU defaults: the terms fitted on H100/H200 starts are several
    # times the KV pool they leave, so the note says how far 10% of them moves it (docs/formulas.md, 'GPUs never
    # started'); the figures are the answer's own breakdown
    import re

    from app.cli import main

    argv = ["estimate", "--model", "qwen3-8b", "--gpu", "l4", "--engine", "vllm@0.29.0", "--max-model-len", "8k",
            "--format", "json"]
    assert main(argv) == 0
    record = json.loads(capsys.readouterr().out)
    note = next(n for n in record["warnings"] if n.startswith("no real vllm start on"))
    b = record["breakdown"]
    carried = b["activation_bytes"] + b["non_torch_bytes"] + b["cuda_graph_bytes"]
    assert f"here they come to {carried / 2**30:.2f} GiB" in note
    moved = float(re.search(r"moves the KV budget \([\d.]+ GiB\) by (\d+)%", note).group(1))
    assert moved == round(100 * 0.1 * carried / record["kv_budget_bytes"])
    assert moved > 10  # on a 24 GB GPU the carried terms outweigh the pool


def test_a_model_that_leaves_no_kv_budget_says_so():
    from sizing.engines.started import CarriedTerms

    assert CarriedTerms(1, 2, 3, 0).kv_share_per_tenth() is None
    note = gpu_evidence("vllm", gpu_profile("rtx-4090").name, CarriedTerms(2**30, 2**30, 2**30, -5))
    assert note.endswith("here they come to 3.00 GiB (profiling peak 1.00, non-torch 1.00, CUDA graphs 1.00), "
                         "and no KV budget is left")

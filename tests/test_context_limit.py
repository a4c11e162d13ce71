"""The model's own context limit (issue 50, item 2): a length past max_position_embeddings is served only with a
published rope-scaling recipe, which the serve command then carries; without one it is refused everywhere."""

import json
import subprocess
import sys

import pytest

from conftest import ROOT
from helpers import plain, scenario
from sizing.capacity.context_limit import RopeRecipe, context_refusal, recipe_for, rope_recipes
from sizing.capacity.estimate import estimate, estimate_lengths
from sizing.engines.serve import ServeSettings, serve_command

# the Qwen3 cards' recipe, with the published config's rope_theta, which vLLM's rope_parameters replaces too
QWEN3_YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1000000.0}


def _kvsize(*args: str):
    return subprocess.run([sys.executable, "-m", "app.cli", *args], cwd=ROOT, capture_output=True, text=True)


def _workload(tmp_path, longest: int) -> str:
    path = tmp_path / "w.yaml"
    path.write_text("name: long\npeak_concurrency: 16\nbuckets:\n"
                    "  - {name: chat, max_context_tokens: 8192, share_percent: 80, output_tokens: 512}\n"
                    f"  - {{name: long, max_context_tokens: {longest}, share_percent: 20, output_tokens: 1024}}\n")
    return str(path)


def test_every_recipe_is_valid_and_names_its_source():
    recipes = rope_recipes()
    assert recipes and all("http" in r.source for r in recipes)
    qwen = next(r for r in recipes if "qwen3_moe" in r.model_types)
    assert qwen.rope_scaling.as_config() == QWEN3_YARN and qwen.max_context == 131072
    with pytest.raises(ValueError):  # a recipe claiming more than original x factor is refused
        RopeRecipe.model_validate({**qwen.model_dump(), "max_context": 262144})


def test_qwen3_at_128k_fits_only_with_the_published_yarn_override():
    e = estimate(scenario("qwen3-30b-a3b", gpu="h200", max_model_len=131072))
    assert e.fits
    assert any("yarn" in w and "--hf-overrides" in w for w in e.warnings)
    assert recipe_for(e.scenario.model_name, e.scenario.shape, 131072) is not None


def test_beyond_the_limit_without_a_recipe_does_not_fit():
    e = estimate(scenario("qwen3-30b-a3b", gpu="h200", max_model_len=262144))
    assert not e.fits and "max_position_embeddings 40,960" in e.fit_message
    llama = estimate(scenario("llama-3.1-8b", gpu="h200", max_model_len=200_000))
    assert not llama.fits and "max_position_embeddings 131,072" in llama.fit_message
    assert "no published rope-scaling recipe" in llama.fit_message
    rows = estimate_lengths(scenario("llama-3.1-8b", gpu="h200"), [32768, 200_000])
    assert [f.fits for _, f in rows] == [True, False]


def test_the_estimate_cli_refuses_a_length_no_recipe_reaches():
    out = _kvsize("estimate", "--model", "llama-3.1-8b", "--gpu", "h200", "--max-model-len", "200000")
    assert out.returncode == 2 and "max_position_embeddings 131,072" in out.stderr


def test_serve_commands_carry_the_override_in_each_engines_spelling():
    base = ServeSettings(model="Qwen/Qwen3-30B-A3B", kv_format="bf16", serving_dtype="bf16", tensor_parallel_size=1,
                         max_model_len=131072, memory_fraction=0.9, block_size=16, max_num_seqs=4, cache_tokens=0,
                         rope_scaling=QWEN3_YARN)
    vllm = serve_command("vllm", base)
    # vLLM: --hf-overrides with rope_parameters, the base included (docs.vllm.ai, features/context_extension)
    assert "--hf-overrides" in vllm.command and '"rope_parameters":{"rope_type":"yarn"' in vllm.command
    assert '"rope_theta":1000000.0' in vllm.command
    assert "rope_scaling yarn" in vllm.note
    sglang = serve_command("sglang", base)
    # SGLang: rope_scaling as the model cards spell it, the config's own rope_theta left alone
    assert "--json-model-override-args" in sglang.command and '"rope_scaling":{"rope_type":"yarn"' in sglang.command
    assert "rope_theta" not in sglang.command
    trtllm = serve_command("trtllm", base)
    assert trtllm.command is None and "rope-scaling override" in trtllm.note


def test_plan_prints_the_override_with_its_serve_command(tmp_path):
    out = _kvsize("plan", "--workload", _workload(tmp_path, 131072), "--model", "qwen3-30b-a3b", "--gpus", "h200")
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "vllm serve" in x)
    assert "--max-model-len 131072" in line and "--hf-overrides" in line
    assert json.loads(line.split("--hf-overrides ")[1].strip("'"))["rope_parameters"] == QWEN3_YARN
    assert "rope_scaling yarn factor 4" in out.stdout  # said, not only written into the command


def test_plan_refuses_a_bucket_past_the_limit_naming_it(tmp_path):
    out = _kvsize("plan", "--workload", _workload(tmp_path, 262144), "--model", "qwen3-30b-a3b", "--gpus", "h200")
    assert out.returncode == 2
    assert "262,144" in out.stderr and "max_position_embeddings 40,960" in out.stderr
    assert "vllm serve" not in out.stdout


def test_the_fleet_planner_refuses_every_candidate_past_the_limit():
    from sizing.planners.fleet import build_candidates, plan_fleet
    from sizing.planners.workload import parse_workload

    w = parse_workload({"name": "x", "peak_concurrency": 4, "buckets": [
        {"max_context_tokens": 262144, "share_percent": 100, "output_tokens": 256}]})
    plan = plan_fleet(scenario("qwen3-30b-a3b", gpu="h200"), build_candidates(["h200"], ["auto"], [1], {}, "vllm"), w)
    assert plan.cheapest is None
    assert all("max_position_embeddings" in p.reason for p in plan.plans)


def test_a_config_that_scales_its_own_rope_keeps_its_derived_limit():
    # Llama-3.1's llama3 scaling is in its config: 131,072 is its own limit, no recipe, no refusal
    s = scenario("llama-3.1-8b", max_model_len=131072)
    assert context_refusal(s.model_name, s.shape, 131072) is None and recipe_for(s.model_name, s.shape, 131072) is None


def test_the_app_refuses_qwen3_past_the_recipe_and_fits_it_within():
    pytest.importorskip("streamlit")
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(ROOT / "app" / "streamlit_app.py"), default_timeout=60)
    at.query_params.update(model="qwen3-30b-a3b", gpu="h200", ctx="262144")
    at.run()
    assert not at.exception
    assert any("max_position_embeddings 40,960" in plain(str(e.value)) for e in at.error)
    at.number_input(key="context").set_value(131072)
    at.run()
    assert not any("max_position_embeddings" in plain(str(e.value)) for e in at.error)
    text = " ".join(str(w.value) for w in at.warning) + " ".join(str(m.value) for m in at.markdown)
    assert "yarn" in text


def test_recipes_are_read_on_first_use_not_at_import():
    code = ("import builtins, pathlib; seen=[]; real=pathlib.Path.read_text\n"
            "def spy(self,*a,**k):\n    seen.append(self.name); return real(self,*a,**k)\n"
            "pathlib.Path.read_text=spy\nimport sizing.capacity.context_limit, sizing.capacity.estimate\n"
            "assert 'rope_recipes.json' not in seen, seen")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


def test_a_recipe_published_for_named_checkpoints_is_not_stretched_to_their_family():
    # Qwen2.5-7B-Instruct's card gives YaRN to 131,072; Qwen2.5-0.5B (same model_type and limit) publishes none
    assert estimate(scenario("qwen2.5-7b-instruct", gpu="h200", max_model_len=131072)).fits
    small = estimate(scenario("qwen2.5-0.5b", gpu="h200", max_model_len=131072))
    assert not small.fits and "max_position_embeddings 32,768" in small.fit_message

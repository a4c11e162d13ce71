"""Which releases were started, and what every answer says of its release's evidence."""

import json

import pytest

from sizing.engines import get_engine
from sizing.errors import KvsizeError
from sizing.engines.started import ENGINES_DIR, newest_started, published, release_evidence
from sizing.evidence.accuracy import compute_started
from sizing.engines.releases import Release, _split, find_release


def test_started_file_is_computed_from_the_corpora():
    # profiles/engines/started.json is what benchmarks/vllm_starts.py --write computes, never written by hand
    assert json.loads((ENGINES_DIR / "started.json").read_text()) == json.loads(json.dumps(compute_started()))


def test_default_follows_the_newest_started_release():
    newest = newest_started("vllm")
    assert newest == max(published("vllm")[:published("vllm").index(newest) + 1], key=lambda v: v)
    assert get_engine("vllm").release.name == find_release("vllm", newest).name
    assert get_engine("sglang").version == newest_started("sglang")


def test_every_started_release_is_published_and_has_its_own_rules():
    for engine in ("vllm", "sglang"):
        rows = json.loads((ENGINES_DIR / "started.json").read_text())[engine]
        for version in rows:
            assert version in published(engine)
            assert find_release(engine, version).covers(version)


def test_started_and_never_started_answers():
    started = release_evidence("vllm", "0.23.0")
    assert started.started and "0.23.0 was started" in started.sentence()
    minor = release_evidence("vllm", "0.23")  # a minor names its started release
    assert minor.started_version == "0.23.0"
    never = release_evidence("vllm", "0.19.1")
    assert not never.started and never.nearest_version == "0.20.0"
    assert "never started" in never.sentence() and never.nearest_version in never.sentence()
    assert release_evidence("vllm", "0.18.0").nearest_version == "0.20.0"
    assert release_evidence("vllm", "0.20.2").started_version == "0.20.2"  # a patch release is its own start
    assert release_evidence("vllm", "0.25.0").started
    assert release_evidence("trtllm", None) is None


def test_an_estimate_says_whether_its_release_was_started():
    from sizing.capacity.scenario import Scenario
    from sizing.capacity.estimate import estimate
    from sizing.profiles import gpu_profile, load_model

    _, shape = load_model("qwen3-8b")
    g = gpu_profile("h100-sxm")
    for engine, words in (("vllm", "was started"), ("vllm@0.19.1", "was never started")):
        e = estimate(Scenario("qwen3-8b", shape, g.name, g.memory_bytes, engine=engine, max_model_len=8192))
        assert any(words in w for w in e.warnings), e.warnings


def test_release_ranges_are_drawn_where_starts_show_the_model_runner_change():
    # 0.21-0.25 is one file whose sub-ranges are releases of their own: the runner that serves Llama changes
    names = {v: get_engine(f"vllm@{v}").release.name for v in ("0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.1")}
    assert len(set(names.values())) == 5
    from sizing.capacity.budget import model_runner
    from sizing.profiles import load_model

    _, llama = load_model("llama-3.1-8b")
    assert [model_runner(get_engine(f"vllm@{v}"), llama) for v in names] == ["v1", "v1", "v2", "v2", "v2"]


def test_0_27_to_0_33_are_drawn_where_the_starts_show_the_runner_and_graph_changes():
    # Qwen3-30B-A3B (MoE) ran V1 on 0.27.1 and V2 on 0.30.0 and 0.33.0; V2 subtracts its graph estimate from 0.29
    from sizing.capacity.record import graphs_subtracted
    from sizing.capacity.budget import model_runner
    from sizing.profiles import load_model

    _, moe = load_model("qwen3-30b-a3b")
    _, llama = load_model("llama-3.1-8b")
    runners = {v: model_runner(get_engine(f"vllm@{v}"), moe) for v in ("0.27.1", "0.30.0", "0.33.0")}
    assert runners == {"0.27.1": "v1", "0.30.0": "v2", "0.33.0": "v2"}
    assert [get_engine(f"vllm@{v}").release.model_runners.v2_profiles_cuda_graphs
            for v in ("0.27.1", "0.28.0", "0.29.0", "0.33.0")] == [False, False, True, True]
    assert model_runner(get_engine("vllm@0.27.1"), llama) == "v2"
    assert len({get_engine(f"vllm@{v}").release.name for v in ("0.27.1", "0.30.0", "0.33.0")}) == 3


def test_sub_ranges_must_tile_their_range():
    raw = json.loads((ENGINES_DIR / "vllm-0.21-0.25.json").read_text())
    raw["sub_ranges"] = raw["sub_ranges"][:2] + raw["sub_ranges"][3:]  # 0.23 missing
    with pytest.raises(KvsizeError, match="not right after"):
        _split(Release.model_validate(raw), "vllm-0.21-0.25.json")


def test_an_architecture_never_started_says_so_with_its_family():
    from sizing.engines.started import architecture_evidence

    said = architecture_evidence("vllm", ("MiniMaxM2ForCausalLM",), "MoE")
    assert said and "no real vllm start of MiniMaxM2ForCausalLM" in said and "its family, MoE" in said
    assert architecture_evidence("vllm", ("LlamaForCausalLM",), "dense GQA/MQA") is None  # started
    # SGLang's hybrid starts are Nemotron-H's (0.5.23): another hybrid architecture says it has none of its own
    assert architecture_evidence("sglang", ("NemotronHForCausalLM",), "hybrid (Mamba/linear)") is None
    hybrid = architecture_evidence("sglang", ("Qwen3NextForCausalLM",), "hybrid (Mamba/linear)")
    assert hybrid is not None and "no real sglang start of Qwen3NextForCausalLM" in hybrid


def _parallel_notes(engine: str, tp: int) -> list[str]:
    from sizing.capacity.scenario import Scenario
    from sizing.capacity.estimate import estimate
    from sizing.profiles import gpu_profile, load_model

    _, shape = load_model("llama-3.1-70b")
    g = gpu_profile("h100-sxm")
    e = estimate(Scenario("llama-3.1-70b", shape, g.name, g.memory_bytes, engine=engine, tensor_parallel_size=tp,
                          k_cache_dtype="fp8", v_cache_dtype="fp8", max_model_len=32768))
    return [m for m in e.warnings if "TP and PP terms" in m]


def test_tp_terms_say_how_far_real_starts_confirm_them():
    """The TP/PP terms a release follows are confirmed by the starts of every started release that shares them
    (0.27-0.32 carry 0.33.0's, fitted on its TP 2 starts): silent up to that many GPUs, said beyond it, and said
    as read from source where no start ran with them."""
    from sizing.engines.started import parallel_evidence, started

    most = max(f.max_gpus_per_start for v, f in started("vllm").items() if v.startswith("0.33"))
    assert parallel_evidence("vllm", "0.31").max_gpus == parallel_evidence("vllm", None).max_gpus == most
    assert _parallel_notes("vllm@0.31", most) == [] and _parallel_notes("vllm", most) == []
    beyond = _parallel_notes("vllm", 2 * most)
    assert len(beyond) == 1 and f"on at most {most} GPU(s)" in beyond[0] and "not confirmed" in beyond[0]
    older = _parallel_notes("vllm@0.19", 2)
    assert len(older) == 1 and "read from source" in older[0]


def _pp_notes(engine: str, stages: int) -> list[str]:
    from sizing.capacity.estimate import estimate
    from sizing.capacity.scenario import Scenario
    from sizing.profiles import gpu_profile, load_model

    _, shape = load_model("qwen3-8b")
    g = gpu_profile("h200")
    e = estimate(Scenario("qwen3-8b", shape, g.name, g.memory_bytes, engine=engine, pipeline_parallel_size=stages,
                          max_model_len=8192))
    return [m for part in e.warnings for m in part.split("; ") if m.startswith("pipeline parallel")]


def test_pp_terms_say_how_many_stages_real_starts_ran():
    """PP is counted apart from the GPUs: a TP 4 start confirms nothing of a pipeline stage's own terms. 0.33.0's
    PP 2 starts (tests/fixtures/vllm-starts) confirm two stages of the releases that share its terms."""
    from sizing.engines.started import parallel_evidence, started

    stages = max(f.max_pipeline_stages for v, f in started("vllm").items())
    evidence = parallel_evidence("vllm", None)
    assert (evidence.max_stages, evidence.stages_version) == (stages, "0.33.0") and stages == 2
    assert _pp_notes("vllm", 2) == []
    beyond = _pp_notes("vllm", 4)
    assert len(beyond) == 1 and "ran at most 2 stages" in beyond[0] and "not confirmed" in beyond[0]
    never = _pp_notes("vllm@0.19", 2)
    assert len(never) == 1 and "no start of vllm ran" in never[0] and "PP > 1" in never[0]

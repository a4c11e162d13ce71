"""Which pipeline stages hold the vocabulary tensors: the scan of vLLM's model classes and its use."""

import json
from pathlib import Path

import pytest

from helpers import load_script
from sizing.capacity.estimate import estimate
from sizing.engines.memory import vocab_tensors
from sizing.engines.pp_vocab import FIRST_AND_LAST, StageVocab, stage_vocab
from sizing.evidence.starts import planned_scenario

ROOT = Path(__file__).resolve().parent.parent
CONFIGS = ROOT / "tests" / "fixtures" / "vllm-starts" / "configs"
GiB = 2**30


def test_the_scanned_releases_place_qwen3_moe_everywhere_and_llama_first_and_last():
    # vLLM 0.33.0 qwen3_moe.py builds embed_tokens and lm_head unconditionally; llama.py under is_first_rank /
    # is_last_rank (read from the source the files were scanned from)
    assert stage_vocab("0.33.0", ("Qwen3MoeForCausalLM",)) == StageVocab(True, True, "0.33.0")
    assert stage_vocab("0.33.0", ("LlamaForCausalLM",)) == StageVocab(False, False, "0.33.0")
    assert stage_vocab("0.30.0", ("MixtralForCausalLM",)).scanned_release == "0.29.0"
    assert stage_vocab("0.22.1", ("MixtralForCausalLM",)).scanned_release == "0.27.0"
    assert stage_vocab("0.33.0", ()) == FIRST_AND_LAST


def test_a_tied_head_reads_the_embedding_where_the_stage_holds_one():
    from sizing.profiles import load_model

    _, gemma = load_model(str(CONFIGS / "gemma-2-9b.json"))
    assert not gemma.lm_head_params  # tied
    every = StageVocab(embedding_every_stage=True)
    assert vocab_tensors(gemma, False, True, every) == (True, False)
    assert vocab_tensors(gemma, False, True) == (False, True)  # a copy of its own on a last stage without it
    assert vocab_tensors(gemma, False, False) == (False, False)


def test_qwen3_moe_at_pp2_holds_the_vocabulary_on_both_stages():
    # the start printed "Model loading took 29.03 GiB" on both stages (tests/fixtures/vllm-starts/logs/
    # h200-0.33.0-qwen3-30b-a3b-pp2.log); half the layers alone would be 28.45
    e = estimate(planned_scenario(CONFIGS / "qwen3-30b-a3b.json", "h200", "0.33.0",
                                  {"pipeline_parallel_size": 2, "max_model_len": 32768}, "serve"))
    assert abs(e.breakdown.weights_bytes / GiB - 29.03) < 0.02


def test_an_older_release_names_the_scan_it_borrows():
    e = estimate(planned_scenario(CONFIGS / "qwen3-8b.json", "h200", "0.22.1",
                                  {"pipeline_parallel_size": 2, "max_model_len": 8192}, "serve"))
    assert any("0.27.0's model classes" in n and "not from 0.22.1" in n for n in e.warnings)
    one = estimate(planned_scenario(CONFIGS / "qwen3-8b.json", "h200", "0.33.0",
                                    {"pipeline_parallel_size": 2, "max_model_len": 8192}, "serve"))
    assert not any("model classes" in n for n in one.warnings)


def test_the_scan_reads_the_if_tests_around_each_assignment(tmp_path, monkeypatch):
    models = tmp_path / "vllm" / "model_executor" / "models"
    models.mkdir(parents=True)
    (models / "registry.py").write_text(
        '_TEXT_GENERATION_MODELS = {"AForCausalLM": ("a", "AForCausalLM"), "BForCausalLM": ("b", "BForCausalLM")}\n')
    (models / "a.py").write_text(
        "class AModel:\n"
        "    def __init__(self):\n"
        "        self.embed_tokens = VocabParallelEmbedding(1, 2)\n"
        "class AForCausalLM:\n"
        "    def __init__(self):\n"
        "        self.model = AModel()\n"
        "        if get_pp_group().is_last_rank:\n"
        "            self.lm_head = ParallelLMHead(1, 2)\n"
        "        else:\n"
        "            self.lm_head = PPMissingLayer()\n")
    (models / "b.py").write_text(
        "from .a import AModel\n"
        "class BModel:\n"
        "    def __init__(self):\n"
        "        if get_pp_group().is_first_rank:\n"
        "            self.embed_tokens = VocabParallelEmbedding(1, 2)\n"
        "class BForCausalLM:\n"
        "    def __init__(self):\n"
        "        self.model = BModel()\n"
        "        self.lm_head = ParallelLMHead(1, 2)\n"
        "        if self.config.tie_word_embeddings:\n"
        "            self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)\n")
    scan = load_script("scan_vllm_pp_vocab")
    assert scan.scan(tmp_path / "vllm") == {
        "AForCausalLM": {"embedding_every_stage": True, "lm_head_every_stage": False},
        "BForCausalLM": {"embedding_every_stage": False, "lm_head_every_stage": True}}


@pytest.mark.parametrize("path", sorted((ROOT / "profiles" / "engines" / "vllm-pp-vocab").glob("*.json")),
                         ids=lambda p: p.stem)
def test_each_scan_names_its_release(path):
    data = json.loads(path.read_text())
    assert data["source"].startswith(f"vLLM {path.stem}, ")
    assert data["architectures"]["Qwen3MoeForCausalLM"] == {"embedding_every_stage": True,
                                                            "lm_head_every_stage": True}


def test_a_malformed_scan_file_is_refused_in_one_line(tmp_path, monkeypatch):
    from sizing.engines import pp_vocab
    from sizing.errors import KvsizeError

    (tmp_path / "0.33.0.json").write_text('{"source": "vLLM 0.33.0, x", "architectures": {"A": {"embedding": 1}}}')
    monkeypatch.setattr(pp_vocab, "FOLDER", tmp_path)
    pp_vocab._scans.cache_clear()
    try:
        with pytest.raises(KvsizeError, match=r"vllm-pp-vocab/0\.33\.0\.json is invalid"):
            stage_vocab("0.33.0", ("A",))
    finally:
        pp_vocab._scans.cache_clear()

"""Every published config.json in tests/fixtures/config-corpus (sources in its SOURCES.md) is sized,
or refused in one line naming a real limit of kvsize; never a traceback."""

import json
from pathlib import Path

import pytest

from sizing.errors import KvsizeError
from sizing.capacity.scenario import Scenario
from sizing.capacity.estimate import estimate
from sizing.profiles import load_model

CORPUS = Path(__file__).parent / "fixtures" / "config-corpus"
CONFIGS = sorted(CORPUS.glob("*.json"))
H200_CUDA_BYTES = 150_109_880_320  # torch.cuda.mem_get_info on an H200 (profiles/gpus/h200.json)

# Refused, and why: the file lacks what sizing needs (abridged by the repository it was copied
# from), or names a layer kind or a model class kvsize does not model.
REFUSED = {
    "bigscience--bloom-560m.json": "missing 'hidden_size'",  # abridged: no n_embed
    "bigscience--bloom.json": "missing 'hidden_size'",  # abridged: no n_embed
    "replit--replit-code-v1_5-3b.json": "missing 'num_hidden_layers'",  # abridged: no n_layers
    "moonshotai--Kimi-K3.json": "recurrent layers but no",  # its linear-attention fields are not in the file
    "nvidia--MiniMax-M3-NVFP4.json": "unknown layer type 'minimax_m3_sparse'",
    "sgl-project--DeepSeek-V4-Flash-FP8.json": "deepseek_ref",  # SGLang's reference class, not vLLM's
    "sgl-project--DeepSeek-V4-Pro-FP8.json": "deepseek_ref",
}


def test_the_corpus_is_large_and_every_file_has_a_source():
    sources = (CORPUS / "SOURCES.md").read_text()
    assert len(CONFIGS) >= 150
    assert all(f"| {path.name} |" in sources for path in CONFIGS)


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_every_published_config_is_sized_or_refused_in_one_line(path):
    try:
        name, shape = load_model(str(path))
        # the newest rules read from source (vLLM 0.33) build the widest set of architectures
        e = estimate(Scenario(name, shape, "H200", H200_CUDA_BYTES, max_model_len=4096, engine="vllm@0.33",
                              kv_cache_memory_bytes=10 * 2**30))
    except KvsizeError as error:
        message = str(error)
        assert path.name in REFUSED, f"refused: {message}"
        assert REFUSED[path.name] in message and "\n" not in message
        return
    assert path.name not in REFUSED, "sized now: drop it from REFUSED"
    assert e.kv_bytes_per_token > 0 or shape.layer_kinds.count("recurrent") == shape.num_layers



@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_no_memory_relevant_field_is_passed_over_in_silence(path):
    # every field of a published config that changes memory in vLLM's or SGLang's model code (expert top-k
    # under any spelling, shared experts, per-layer types, sinks, indexers, MTP layers, ...) is looked up by
    # kvsize's reader for this architecture, or named in a note of the shape it builds
    from sizing.config import MEMORY_RELEVANT_FIELDS, resolve_shape

    raw = json.loads(path.read_text())
    try:
        shape = resolve_shape(raw)
    except KvsizeError:
        return  # refused in one line (the test above)
    notes = " ".join(shape.notes)
    blocks = [raw, *(raw[k] for k in ("text_config", "llm_config", "language_config") if isinstance(raw.get(k), dict))]
    present = {name for block in blocks for name in MEMORY_RELEVANT_FIELDS & set(block)
               if block[name] not in (None, 0, False, [], {})}
    silent = sorted(name for name in present if name not in shape.fields_read and name not in notes)
    assert not silent, f"set in the config, neither read nor named: {silent}"


def test_an_unread_memory_field_is_named():
    # MiniMax-M2.7's attn_type_list (which layers are linear attention) is not read by kvsize: said by name
    from sizing.config import resolve_shape

    shape = resolve_shape(json.loads((CORPUS / "MiniMaxAI--MiniMax-M2.7.json").read_text()))
    assert any("attn_type_list" in n and "not read" in n.replace("does not read", "not read") for n in shape.notes)
    # Gemma 4's top_k_experts is read (its MoE workspace is sized by it)
    gemma = resolve_shape(json.loads((CORPUS / "google--gemma-4-26B-A4B.json").read_text()))
    assert gemma.num_experts_per_tok == 8

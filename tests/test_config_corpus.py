"""Every published config.json in tests/fixtures/config-corpus (sources in its SOURCES.md) is sized,
or refused in one line naming a real limit of kvsize; never a traceback."""

from pathlib import Path

import pytest

from sizing.errors import KvsizeError
from sizing.plan import Scenario, estimate
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

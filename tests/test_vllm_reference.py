"""kvsize against vLLM's own code, for every bundled model profile and every config in fixtures/configs.

Each file in fixtures/vllm-reference/ is what vLLM 0.33.0 built for one config on the meta device
(per-layer KV specs, page sizes, groups, block size, num_blocks, max concurrency and the "GPU KV cache
size" tokens) at TP 1 and TP 8, in the model's dtype and with fp8 KV, for 10 GiB of KV memory.
scripts/vllm_reference.py regenerates them; vLLM is not needed to run these tests.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from sizing.engines import vllm_caches
from sizing.errors import KvsizeError
from sizing.capacity.scenario import Scenario
from sizing.capacity.estimate import estimate
from sizing.profiles import load_model

FIXTURES = Path(__file__).parent / "fixtures"
# the fixtures are vLLM 0.33.0's own construction (scripts/vllm_reference.py): held to the rules of that release
REFERENCE_RULES = "vllm@0.33"
REFERENCE = sorted(p for p in (FIXTURES / "vllm-reference").glob("*.json") if not p.stem.startswith("formats-"))
FORMATS = FIXTURES / "vllm-reference" / "formats-Llama-3.1-8B.json"
H200_CUDA_BYTES = 150_109_880_320  # torch.cuda.mem_get_info on an H200 (the oracle's fake platform is an H200)
KIND = {"FullAttentionSpec": "full", "MLAAttentionSpec": "full", "SlidingWindowSpec": "sliding",
        "SlidingWindowMLASpec": "sliding", "ChunkedLocalAttentionSpec": "chunked"}


def _load(path: Path) -> dict:
    return json.loads(path.read_text())


def _model(fixture: dict):
    origin = fixture["config"]
    if origin.startswith("tests/fixtures/configs/"):
        return load_model(str(FIXTURES / "configs" / Path(origin).name))
    return load_model(origin.split()[3])  # "kvsize model profile ID (hf id)"


def _variants(built: bool):
    for path in REFERENCE:
        fixture = _load(path)
        for v in fixture.get("variants", []):
            if ("error" not in v) == built:
                yield pytest.param(fixture, v, id=f"{path.stem}-tp{v['tp']}-{v['kv_cache_dtype']}")


def _estimate(fixture: dict, v: dict):
    name, shape = _model(fixture)
    return estimate(Scenario(name, shape, "H200", H200_CUDA_BYTES, engine=REFERENCE_RULES, tensor_parallel_size=v["tp"],
                             k_cache_dtype=v["kv_cache_dtype"], v_cache_dtype=v["kv_cache_dtype"],
                             kv_cache_memory_bytes=v.get("available_bytes", 10 * 2**30),
                             max_model_len=v.get("max_model_len")))


def test_reference_covers_every_bundled_profile_and_config():
    stems = {p.stem for p in REFERENCE}
    profiles = {f"profile-{p.stem}" for p in (Path(__file__).parent.parent / "profiles" / "models").glob("*.json")}
    configs = {f"config-{p.stem}" for p in (FIXTURES / "configs").glob("*.json")}
    assert profiles | configs <= stems
    built = sum(1 for _ in _variants(True))
    assert built >= 140  # 4 variants of 40 configs, less those vLLM refuses or the oracle cannot build (README)


@pytest.mark.parametrize("fixture, v", list(_variants(True)))
def test_pool_matches_vllm(fixture, v):
    e = _estimate(fixture, v)
    assert e.block_size == v["block_size_effective"]
    assert e.block_bytes == v["pool_bytes_per_block"]
    assert e.num_blocks == v["num_blocks"]
    assert e.max_tokens == v["kv_cache_size_tokens"]
    assert e.max_concurrency_ratio == pytest.approx(v["max_concurrency"], rel=1e-12)


@pytest.mark.parametrize("fixture, v", list(_variants(True)))
def test_default_max_model_len_matches_vllm(fixture, v):
    # The oracle ran without --max-model-len: vLLM derived it (Phi-3-mini-128k's LongRoPE: 4,096).
    name, shape = _model(fixture)
    assert estimate(Scenario(name, shape, "H200", H200_CUDA_BYTES, engine=REFERENCE_RULES, tensor_parallel_size=v["tp"],
                             k_cache_dtype=v["kv_cache_dtype"], v_cache_dtype=v["kv_cache_dtype"],
                             kv_cache_memory_bytes=v.get("available_bytes", 10 * 2**30))).max_model_len \
        == v["max_model_len"]


@pytest.mark.parametrize("fixture, v", list(_variants(True)))
def test_layer_specs_match_vllm(fixture, v):
    # Every cache tensor vLLM builds, by kind, window, tokens a block and page bytes: DSA's indexer keys and
    # DeepSeek-V4's window, compressed latents, compressor states and indexer are caches of their own.
    e = _estimate(fixture, v)
    want: Counter = Counter()
    recurrent = 0
    for spec in v["layer_specs"]:
        if spec["kind"] == "MambaSpec":
            recurrent += spec["num_layers"]
            continue
        window = spec.get("sliding_window") or spec.get("attention_chunk_size") or 0
        want[(KIND[spec["kind"]], window, spec["block_size"], spec["page_size_bytes"])] += spec["num_layers"]
    got = Counter((c.kind, c.window, c.block_size, c.page_bytes) for c in vllm_caches(e.layout, e.block_size))
    assert got == want
    assert len(e.layout.recurrent) == recurrent
    if not any(s.kind == "compressed" for s in e.layout.kv.values()):
        # The oracle's figure is each cache's page over its block, floored: a byte count per token only
        # where every cache holds one entry per token.
        assert e.kv_bytes_per_token == v["kv_bytes_per_token"]


@pytest.mark.parametrize("fixture, v", [p for p in _variants(True) if "Packed" in str(p.values[1].get("kv_cache_groups"))
                                        or "V4" in p.values[0]["config"]])
def test_packed_groups_match_vllm(fixture, v):
    # DeepSeek-V4's block-outermost packing: the groups' layer counts, pages and block sizes, as vLLM 0.33 forms them.
    e = _estimate(fixture, v)
    got = sorted((len(g.caches), g.page_bytes(e.block_size), g.caches[0].block_size) for g in e.pool.groups)
    want = sorted((g["num_layers"], g["page_size_bytes"], g["block_size"]) for g in v["kv_cache_groups"])
    assert got == want


@pytest.mark.parametrize("fixture, v", [p for p in _variants(False) if p.values[1]["error"].strip() == "AssertionError:"])
def test_kvsize_refuses_what_vllm_refuses(fixture, v):
    # vLLM asserts that TP divides the attention heads (Falcon-7B's 71, Qwen2.5's 14 and 28 at TP 8).
    name, shape = _model(fixture)
    assert shape.num_attention_heads % v["tp"]
    with pytest.raises(KvsizeError, match="tensor-parallel"):
        _estimate(fixture, v)


def _format_variants(built: bool):
    for v in _load(FORMATS)["variants"]:
        if ("error" not in v) == built:
            yield pytest.param(v, id=v["kv_cache_dtype"])


@pytest.mark.parametrize("v", list(_format_variants(True)))
def test_format_pages_match_vllm(v):
    # Every vLLM cache dtype the oracle could build on Llama-3.1-8B (8 KV heads of 128): the page of one
    # layer and num_blocks for 10 GiB, without vllm serve's boundary layers (the oracle builds VllmConfig directly).
    from sizing.cache.layers import build_layout

    _, shape = load_model(str(FIXTURES / "configs" / "Llama-3.1-8B.json"))
    name = v["kv_cache_dtype"]
    layout = build_layout(shape, name, name)
    (spec,) = v["layer_specs"]
    pages = {s.page_bytes(16) for s in layout.kv.values()}
    assert pages == {spec["page_size_bytes"]}
    assert v["num_blocks"] == v["available_bytes"] // (spec["page_size_bytes"] * spec["num_layers"])


def test_turboquant_keeps_boundary_layers_in_bf16():
    # vllm serve (engine/arg_utils.py, 0.33) keeps layers 0, 1, 30, 31 of a dense model in bf16 under
    # turboquant_k8v4: 28 pages of 25,088 B (fixtures/vllm-reference/formats-Llama-3.1-8B.json) and 4 of
    # 65,536 B (16 tokens x 8 heads x 128 x 2 x 2) in every block.
    _, shape = load_model(str(FIXTURES / "configs" / "Llama-3.1-8B.json"))
    e = estimate(Scenario("llama", shape, "H200", H200_CUDA_BYTES, engine=REFERENCE_RULES, k_cache_dtype="turboquant_k8v4",
                          v_cache_dtype="turboquant_k8v4", kv_cache_memory_bytes=10 * 2**30))
    assert e.block_bytes == 28 * 25_088 + 4 * 65_536
    assert e.num_blocks == 10 * 2**30 // e.block_bytes
    assert sorted({s.k_format for s in e.layout.kv.values()}) == ["bf16", "turboquant_k8v4"]

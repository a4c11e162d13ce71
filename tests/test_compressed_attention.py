"""DeepSeek-V4's compressed attention: the shape read from its config, the bytes each layer keeps, and
how vLLM 0.33 pages them. The pool figures themselves are held to vLLM's own code in
test_vllm_reference.py (fixtures/vllm-reference/config-DeepSeek-V4-Flash.json)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from conftest import ROOT
from sizing.config import read as read_module
from sizing.engines.vllm import VllmCache, _approximate_gcd, packed_groups, vllm_caches
from sizing.errors import KvsizeError
from sizing.cache.formats import get_format
from sizing.cache.layers import build_layout
from sizing.capacity.scenario import Scenario
from sizing.capacity.estimate import estimate
from sizing.profiles import load_model
from sizing.config import resolve_shape, with_mtp_layers

CONFIG = ROOT / "tests" / "fixtures" / "configs" / "DeepSeek-V4-Flash.json"
H200_CUDA_BYTES = 150_109_880_320  # torch.cuda.mem_get_info on an H200


def _shape():
    return load_model(str(CONFIG))[1]


def test_ratios_come_from_the_config_with_or_without_transformers(monkeypatch):
    # config.json: compress_ratios [0, 0, 4, 128, 4, ..., 4, 128, 4, 0] for 43 layers plus one MTP layer;
    # transformers' DeepseekV4Config turns them into layer_types and compress_rates {4, 128}.
    shape = _shape()
    raw = json.loads(CONFIG.read_text())
    assert shape.layer_compress_ratios == tuple(max(1, r) for r in raw["compress_ratios"][:43])
    assert Counter(shape.layer_compress_ratios) == {1: 2, 4: 21, 128: 20}
    assert shape.mla_latent_dim == 512 and shape.index_head_dim == 128 and shape.sliding_window == 128
    monkeypatch.setattr(read_module, "transformers_config", lambda raw: None)
    plain = resolve_shape(raw)
    for field in ("layer_kinds", "layer_compress_ratios", "mla_latent_dim", "index_head_dim", "sliding_window"):
        assert getattr(plain, field) == getattr(shape, field)


def test_bad_ratios_are_refused(monkeypatch):
    raw = json.loads(CONFIG.read_text())
    with pytest.raises(KvsizeError, match="rejected by its transformers config class"):
        resolve_shape({**raw, "compress_ratios": raw["compress_ratios"][:10]})
    monkeypatch.setattr(read_module, "transformers_config", lambda raw: None)
    with pytest.raises(KvsizeError, match="compress_ratios needs one entry per layer"):
        resolve_shape({**raw, "compress_ratios": raw["compress_ratios"][:10]})
    with pytest.raises(KvsizeError, match="compress_ratios entries must be one of 0, 4, 128"):
        resolve_shape({**raw, "compress_ratios": [8] * 44})


def test_bytes_per_sequence_by_hand():
    # fp8_ds_mla_v4: 448 fp8 + 128 B of bf16 RoPE + 7 UE8M0 scales + 1 pad = 584 B a latent
    # (vllm/models/deepseek_v4/attention.py); the indexer key 128 fp8 + one fp32 scale = 132 B.
    assert sum(get_format("fp8_ds_mla_v4").k.bytes_for(1, 512, 1)) == 584
    layout = build_layout(_shape(), "fp8_ds_mla_v4", "fp8_ds_mla_v4")
    by_ratio = {spec.ratio: spec for spec in layout.kv.values()}
    tokens = 1000
    window = 128 * 584
    # ratio 1: the window only
    assert sum(by_ratio[1].bytes_for(tokens)) == window
    # ratio 4: 250 compressed latents and indexer keys, an fp32 state of 2 x 2 x 512 (KV) and
    # 2 x 2 x 128 (indexer) values for each of the last 8 tokens
    assert sum(by_ratio[4].bytes_for(tokens)) == window + 250 * 584 + 250 * 132 + 8 * (2048 + 512) * 4
    # ratio 128: 7 compressed latents and a state of 2 x 512 values for each of the last 128 tokens
    assert sum(by_ratio[128].bytes_for(tokens)) == window + 7 * 584 + 128 * 1024 * 4
    # Past the windows each token adds a quarter of a latent and key per ratio-4 layer, 1/128 per ratio-128 one.
    payload, metadata = layout.token_bytes()
    assert payload + metadata == 21 * (584 + 132) / 4 + 20 * 584 / 128


def test_vllm_pages_by_hand():
    # Pages round up to 576 B under fp8_ds_mla (v1/attention/backends/mla/sparse_swa.py, attention.py):
    # window 64 x 584 = 37,376 -> 37,440; compressed 256 / 4 x 584 -> 37,440, 256 / 128 x 584 = 1,168 -> 1,728;
    # indexer 64 x 132 = 8,448 -> 8,640; states 4 x 2,048 x 4 = 32,768 -> 32,832, 4 x 512 x 4 -> 8,640,
    # 8 x 1,024 x 4 -> 32,832.
    layout = build_layout(_shape(), "fp8_ds_mla_v4", "fp8_ds_mla_v4")
    got = Counter((c.name, c.block_size, c.page_bytes) for c in vllm_caches(layout, 256))
    assert got == {("window", 64, 37_440): 43, ("compressed", 256, 37_440): 21, ("compressed", 256, 1_728): 20,
                   ("indexer", 256, 8_640): 21, ("compressor state", 4, 32_832): 21,
                   ("indexer state", 4, 8_640): 21, ("compressor state", 8, 32_832): 20}


def test_repeats_per_group_pad_least():
    # Buckets of 43, 21 and 20 caches with at least 21 repeats: 22 pads 1 + 1 + 2, 21 pads 20 + 0 + 1.
    assert _approximate_gcd([43, 21, 20], 21) == 22
    assert _approximate_gcd([8, 8], 4) == 8


def test_a_sliding_bucket_without_a_pattern_fills_the_widest_block():
    # No bucket mixes page sizes, so there is no pattern: the 6 state caches of 1,000 B go 4 to a block
    # of the 4,000-B full group, in 2 groups.
    caches = [VllmCache("compressed", "full", 256, 1_000) for _ in range(4)]
    caches += [VllmCache("state", "sliding", 8, 1_000, 128) for _ in range(6)]
    groups = packed_groups(caches)
    assert sorted(len(g.caches) for g in groups) == [3, 3, 4]


def test_mtp_layer_keeps_only_the_window():
    # vLLM gives layers past num_hidden_layers compress ratio 1 (vllm/models/deepseek_v4/attention.py).
    shape = with_mtp_layers(_shape(), 1)
    assert shape.layer_compress_ratios[-1] == 1 and shape.layer_kinds[-1] == "compressed"
    layout = build_layout(shape, "fp8_ds_mla_v4", "fp8_ds_mla_v4")
    assert sum(c.name == "window" for c in vllm_caches(layout, 256)) == 44


def _scenario(**kw):
    name, shape = load_model(str(CONFIG))
    base = dict(engine="vllm@0.33", tensor_parallel_size=8, kv_cache_memory_bytes=10 * 2**30, max_model_len=131_072)
    return Scenario(name, shape, "H200", H200_CUDA_BYTES, **{**base, **kw})


@pytest.mark.parametrize("dtype", ["auto", "bf16", "fp8", "fp8_e5m2"])
def test_vllm_stores_fp8_ds_mla_whatever_16_bit_or_fp8_dtype_is_asked(dtype):
    e = estimate(_scenario(k_cache_dtype=dtype, v_cache_dtype=dtype))
    assert {s.k_format for s in e.layout.kv.values()} == {"fp8_ds_mla_v4"}
    assert e.block_size == 256


def test_formats_and_engines_vllm_does_not_build_are_refused():
    with pytest.raises(KvsizeError, match="fp8_ds_mla record"):
        estimate(_scenario(k_cache_dtype="int8_per_token_head", v_cache_dtype="int8_per_token_head"))
    with pytest.raises(KvsizeError, match="DeepSeek-V4's compressed caches"):
        estimate(_scenario(engine="sglang"))
    with pytest.raises(KvsizeError, match="model class kvsize does not model"):
        name, shape = load_model(str(CONFIG))
        estimate(Scenario(name, shape.__class__(**{**shape.__dict__, "model_type": "deepseek_v41"}), "H200",
                          H200_CUDA_BYTES, engine="vllm@0.33", kv_cache_memory_bytes=10 * 2**30))


def test_ideal_engine_holds_exactly_the_sequence_bytes():
    e = estimate(_scenario(engine="ideal", k_cache_dtype="bf16", v_cache_dtype="bf16"))
    assert e.kv_reserved_bytes_per_sequence == sum(e.layout.sequence_bytes(131_072))


def test_older_vllm_rules_are_not_applied_to_deepseek_v4():
    # 0.26 groups these caches with an older function (vllm/v1/core/kv_cache_utils.py), not modelled.
    with pytest.raises(KvsizeError, match="as vLLM 0.33 builds it"):
        estimate(_scenario(engine="vllm@0.22"))
    # DSA models page 64 tokens under 0.22 too (flashmla_sparse.py get_supported_kernel_block_sizes [64]).
    name, shape = load_model(str(ROOT / "tests" / "fixtures" / "configs" / "DeepSeek-V3.2-style.json"))
    assert estimate(Scenario(name, shape, "H200", H200_CUDA_BYTES, engine="vllm@0.22",
                             kv_cache_memory_bytes=10 * 2**30)).block_size == 64

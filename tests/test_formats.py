"""Each format's bytes against its published layout (head_dim 128, one head, one token)."""

from fractions import Fraction

import pytest

from sizing.errors import KvsizeError
from sizing.cache.formats import FORMAT_NAMES, FormatOptions, get_format


def row_bytes(name, side="k", tokens=1, head_dim=128, **opts):
    fmt = get_format(name, options=FormatOptions(**opts))
    p, m = getattr(fmt, side).bytes_for(tokens, head_dim, 1)
    return p, m


@pytest.mark.parametrize("name, payload, metadata", [
    ("fp16", 256, 0), ("bf16", 256, 0), ("fp32", 512, 0),
    ("fp8_e4m3", 128, 0), ("fp8_e5m2", 128, 0),              # the fp32 scale is per layer, not per token
    ("fp8_per_token_head", 128, 4), ("int8_per_token_head", 128, 4),   # + one fp32 scale
    ("nvfp4", 64, 8),                                       # 128 x 4 bits + 8 e4m3 scales (one per 16)
    ("q8_0", 128, 8), ("q4_0", 64, 8), ("iq4_nl", 64, 8),   # 4 blocks of 34 / 18 / 18 bytes
    ("q4_1", 64, 16), ("q5_0", 80, 8), ("q5_1", 80, 16),    # 4 blocks of 20 / 22 / 24 bytes
    ("lmdeploy_int8", 128, 4), ("lmdeploy_int4", 64, 4),    # fp16 scale + fp16 zero point
])
def test_bytes_per_token_per_head(name, payload, metadata):
    assert row_bytes(name) == (payload, metadata)


@pytest.mark.parametrize("name, block_bytes", [("q8_0", 34), ("q4_0", 18), ("q4_1", 20), ("q5_0", 22),
                                                ("q5_1", 24), ("iq4_nl", 18)])
def test_llamacpp_block_sizes(name, block_bytes):
    # ggml-common.h: one block = 32 values
    assert sum(row_bytes(name, head_dim=32)) == block_bytes


def test_per_tensor_scales_are_per_layer():
    fmt = get_format("fp8")
    assert fmt.name == "fp8_e4m3"
    assert fmt.k.layer_bytes(128) == 4 and fmt.v.layer_bytes(128) == 4


def test_kivi_groups_and_residual():
    # KIVI-2, G=32, R=128, head_dim 128, 256 tokens: 128 recent tokens stay fp16 (128 x 256 B);
    # 128 quantized: keys 128 x 128 x 2 bits = 4096 B, scale+min per channel per 32 tokens:
    # 4 groups x 128 channels x 4 B = 2048 B.
    p, m = row_bytes("kivi2", "k", tokens=256)
    assert p == 128 * 256 + 4096 and m == 2048
    # values: per token, 128/32 = 4 groups x (2+2) B = 16 B per token
    p, m = row_bytes("kivi2", "v", tokens=256)
    assert p == 128 * 256 + 4096 and m == 128 * 16


def test_kivi_options_change_the_layout():
    p, m = row_bytes("kivi4", "k", tokens=64, kivi_group=64, kivi_residual=0)
    assert (p, m) == (64 * 128 * 4 // 8, 1 * 128 * 4)


def test_kvquant_outliers_and_row_pointers():
    # 3 bits x 128 = 48 B; 1% of 128 -> 2 outlier slots x (fp16 + int32) = 12 B; int32 row pointer 4 B
    assert row_bytes("kvquant3") == (48, 16)
    p, m = row_bytes("kvquant3", kvquant_outlier_fraction=Fraction(5, 100))
    assert m == 7 * 6 + 4  # ceil(6.4) = 7 outliers


def test_grouped_formats_reject_ragged_head_dims():
    fmt = get_format("q4_0")
    with pytest.raises(KvsizeError, match="multiple of 32"):
        fmt.k.check(80, fmt.name)


def test_unknown_format_suggests_close_names():
    with pytest.raises(KvsizeError, match="did you mean.*fp8_e4m3"):
        get_format("fp8_e4m4")


def test_every_row_cites_a_source():
    for name in FORMAT_NAMES:
        assert len(get_format(name).source) > 10


def test_support_table_agrees_with_vllms_backend_selector():
    # fixtures/vllm-reference/formats-Llama-3.1-8B.json: vLLM 0.33's attention backend selector on an sm90
    # platform. Each cache dtype it built is "supported" on sm90 in profiles/support.json, each it found no
    # backend for (and kvsize knows) is "unsupported" there.
    import json
    from pathlib import Path

    from sizing.cache.formats import FORMAT_NAMES
    from sizing.engines.support import support

    fixture = json.loads((Path(__file__).parent / "fixtures" / "vllm-reference" / "formats-Llama-3.1-8B.json").read_text())
    checked = 0
    for v in fixture["variants"]:
        name = v["kv_cache_dtype"]
        if name not in FORMAT_NAMES:
            continue  # vLLM formats kvsize has no row for (fp8_inc: Intel Gaudi; octave_*: ROCm)
        expected = "unsupported" if "No valid attention backend" in v.get("error", "") else "supported"
        assert support("vllm", name, "sm90").status == expected, name
        checked += 1
    assert checked >= 12


def test_every_gpu_profile_has_an_architecture_the_table_can_name():
    from sizing.profiles import gpu_ids, gpu_profile
    from sizing.engines.support import support_table

    named = {a for row in support_table().rows for a in row.architectures}
    assert {gpu_profile(g).architecture for g in gpu_ids()} <= named


def test_estimate_warns_when_the_engine_cannot_run_the_format_on_the_gpu():
    from helpers import scenario

    from sizing.capacity.estimate import estimate

    e = estimate(scenario("llama-3.1-8b", "h100-sxm", gpu_architecture="sm90", k_cache_dtype="nvfp4",
                          v_cache_dtype="nvfp4", max_model_len=8192))
    assert any("does not run nvfp4 KV on sm90" in w for w in e.warnings)
    ok = estimate(scenario("llama-3.1-8b", "h100-sxm", gpu_architecture="sm90", k_cache_dtype="fp8",
                           v_cache_dtype="fp8", max_model_len=8192))
    assert not any("KV on sm90" in w for w in ok.warnings)


def test_plan_leaves_out_what_the_support_table_rules_out():
    # TensorRT-LLM has no FP8 on Ampere (profiles/support.json): an A100 gets no fp8 candidate with trtllm.
    from sizing.planners.fleet import build_candidates, unsupported_pairs

    candidates = build_candidates(["a100-80gb", "h100-sxm"], ["bf16", "fp8_e4m3"], [1], engine="trtllm")
    assert {(c.gpu.id, c.kv_format) for c in candidates} == {("a100-80gb", "bf16"), ("h100-sxm", "bf16"),
                                                             ("h100-sxm", "fp8_e4m3")}
    (refused,) = unsupported_pairs(["a100-80gb"], ["fp8_e4m3"], "trtllm@1.0")
    assert "no FP8 on Ampere" in refused[2]


@pytest.mark.parametrize("name, per_token_head", [
    # lmdeploy/pytorch/engine/cache_engine/engine.py: quant_policy 16/17 store one fp8 byte per value and
    # no per-token scales (the scales are the attention layer's scalars); 42 packs K at 4 bits with two
    # 2-byte norms and V at 2 bits with one: 64 + 4 + 32 + 2 = 102 B per token per head at head size 128.
    ("lmdeploy_fp8", 2 * 128), ("lmdeploy_fp8_e5m2", 2 * 128), ("lmdeploy_turboquant", 64 + 4 + 32 + 2)])
def test_lmdeploy_quant_policies(name, per_token_head):
    from sizing.cache.layers import build_layout
    from sizing.profiles import load_model

    _, shape = load_model("llama-3.1-8b")  # 32 layers, 8 KV heads of 128
    layout = build_layout(shape, name, name)
    assert sum(layout.token_bytes()) == 32 * 8 * per_token_head


@pytest.mark.parametrize("tile, key_bytes", [(128, 64 + 4), (64, 64 + 8)])
def test_kvarn_bytes_and_unconfirmed_layout(tile, key_bytes):
    # huawei-csl/KVarN README: 4-bit keys with a scale and zero point per channel per tile of `tile` tokens
    # (128 channels x 2 fp16 values / tile tokens), 2-bit values with a scale and zero point per token:
    # 32 + 4 B. The scale dtypes are kvsize's reading, so the row says its layout is unconfirmed.
    fmt = get_format(f"kvarn_k4v2_g{tile}")
    assert sum(fmt.k.token_bytes(128)) == key_bytes
    assert sum(fmt.v.token_bytes(128)) == 32 + 4
    assert fmt.unconfirmed and "unconfirmed" in fmt.summary
    assert all(not get_format(name).unconfirmed for name in ("fp8_e4m3", "turboquant_k8v4", "q4_0", "kivi2"))

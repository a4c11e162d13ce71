"""Reference KV sizes from the real configs in profiles/models, with the arithmetic shown."""

from pathlib import Path

import pytest

from helpers import scenario
from sizing.capacity.estimate import estimate
from sizing.units import GiB

FIXTURES = Path(__file__).parent / "fixtures"


def per_token(model, fmt="auto", **kw):
    return estimate(scenario(model, k_cache_dtype=fmt, v_cache_dtype=fmt, engine="ideal",
                             max_model_len=4096, **kw)).kv_bytes_per_token


@pytest.mark.parametrize("model, expected", [
    # Llama-3.1-8B config: 32 layers, 8 KV heads, head_dim 4096/32 = 128, bf16: 2 x 32 x 8 x 128 x 2
    ("llama-3.1-8b", 2 * 32 * 8 * 128 * 2),          # 131,072
    # Llama-2-7b: MHA, 32 KV heads, fp16: 2 x 32 x 32 x 128 x 2
    ("llama-2-7b", 2 * 32 * 32 * 128 * 2),           # 524,288
    # Qwen3-8B: explicit head_dim 128, 36 layers, 8 KV heads
    ("qwen3-8b", 2 * 36 * 8 * 128 * 2),              # 147,456
    # Falcon-7B: multi_query true -> one KV head of 4544/71 = 64
    ("falcon-7b", 2 * 32 * 1 * 64 * 2),              # 8,192
    # DeepSeek-V3 MLA: one latent of kv_lora_rank 512 + qk_rope_head_dim 64 per layer, 61 layers
    ("deepseek-v3", 61 * (512 + 64) * 2),            # 70,272
    # MiniCPM3-4B MLA: 62 layers x (256 + 32)
    ("minicpm3-4b", 62 * (256 + 32) * 2),
    # gpt-oss-120b: 36 layers (18 sliding, 18 full, all count below the window), 8 KV heads, head_dim 64
    ("gpt-oss-120b", 2 * 36 * 8 * 64 * 2),           # 73,728
    # gemma-2-9b: fp32 config served in bf16 (vLLM rule), 42 layers, 8 KV heads, head_dim 256
    ("gemma-2-9b", 2 * 42 * 8 * 256 * 2),            # 344,064
    # Gemma 3 27B (text_config nested): 62 layers, 16 KV heads, head_dim 128
    ("gemma-3-27b-it", 2 * 62 * 16 * 128 * 2),
    # Qwen3-Next: only the 12 full-attention layers of 48 hold KV: 2 KV heads x head_dim 256
    ("qwen3-next-80b-a3b-thinking", 2 * 12 * 2 * 256 * 2),  # 24,576
    # Nemotron-H-8B: hybrid_override_pattern has 4 '*' attention layers, 8 KV heads, head_dim 128
    ("nemotron-h-8b-base-8k", 2 * 4 * 8 * 128 * 2),  # 16,384
])
def test_bf16_bytes_per_token(model, expected):
    assert per_token(model) == expected


def test_gqa_is_not_ignored():
    # A formula that uses num_attention_heads instead of num_key_value_heads would give
    # 2 x 32 x 32 x 128 x 2 = 524,288 for Llama-3.1-8B; ours gives a quarter of it.
    assert per_token("llama-3.1-8b") == 131_072 != 524_288


def test_mistral_sliding_window_caps_the_sequence():
    # Mistral-7B-v0.1: sliding_window 4096 on every layer; at 32768 tokens each layer keeps 4096.
    e = estimate(scenario("mistral-7b-v0.1", engine="ideal", max_model_len=32768))
    assert e.kv_bytes_per_sequence == 4096 * 131_072


def test_disabled_window_is_full_attention():
    # Qwen2.5-7B-Instruct: sliding_window 131072 but use_sliding_window false -> every layer full.
    e = estimate(scenario("qwen2.5-7b-instruct", engine="ideal", max_model_len=32768))
    assert e.kv_bytes_per_sequence == 32768 * 2 * 28 * 4 * 128 * 2


def test_gpt_oss_window_layers_hold_128_tokens():
    # 18 full layers hold 8192 tokens; 18 sliding layers hold 128 (sliding_window 128).
    e = estimate(scenario("gpt-oss-120b", engine="ideal", max_model_len=8192))
    per_layer_token = 2 * 8 * 64 * 2
    assert e.kv_bytes_per_sequence == 18 * 8192 * per_layer_token + 18 * 128 * per_layer_token


def test_llama4_chunked_layers_hold_one_chunk():
    # Llama 4 Scout: 36 chunked layers (attention_chunk_size 8192) and 12 full layers.
    e = estimate(scenario("llama-4-scout-17b-16e-instruct", engine="ideal", max_model_len=65536))
    per_layer_token = 2 * 8 * 128 * 2
    assert e.kv_bytes_per_sequence == 12 * 65536 * per_layer_token + 36 * 8192 * per_layer_token


def test_recurrent_state_is_reported_apart():
    # Qwen3-Next gated delta net: conv state (2*16*128 + 32*128) * (4-1) + recurrent 32*128*128, bf16
    e = estimate(scenario("qwen3-next-80b-a3b-thinking", engine="ideal", max_model_len=4096))
    state = ((2 * 16 * 128 + 32 * 128) * 3 + 32 * 128 * 128) * 2
    assert e.recurrent_state_bytes_per_sequence == 36 * state


def test_tensor_parallel_splits_and_replicates_kv_heads():
    # Llama-3.1-70B: 8 KV heads; TP 4 -> 2 per GPU; TP 16 exceeds them -> 1 replicated head per GPU
    assert per_token("llama-3.1-70b", tensor_parallel_size=4) == 2 * 80 * 2 * 128 * 2
    assert per_token("llama-3.1-70b", tensor_parallel_size=16) == 2 * 80 * 1 * 128 * 2


def test_mla_latent_is_replicated_on_every_rank():
    assert per_token("deepseek-v3", tensor_parallel_size=8) == 61 * 576 * 2


def test_pipeline_parallel_splits_layers():
    # 32 layers over PP 2 -> 16 per stage
    assert per_token("llama-3.1-8b", pipeline_parallel_size=2) == 2 * 16 * 8 * 128 * 2


def test_layer_override_keeps_edges_in_bf16():
    # fp8 everywhere but layers 0,1,30,31 in bf16: 28 x 128 x 2 x 8 + 4 x 256 x 2 x 8 (bytes per head-dim row)
    got = per_token("llama-3.1-8b", fmt="fp8", layer_kv_dtype="first:2,last:2=bf16")
    assert got == 28 * 2 * 8 * 128 * 1 + 4 * 2 * 8 * 128 * 2


def test_weights_match_published_parameter_counts():
    # Llama-3.1-8B has 8.03e9 parameters (model card); bf16 -> about 14.96 GiB
    e = estimate(scenario("llama-3.1-8b", engine="ideal", max_model_len=4096))
    assert 8.0e9 * 2 < e.breakdown.weights_bytes < 8.1e9 * 2
    # vLLM 0.19 on an H100: "Model loading took 14.99 GiB" (../shared engine-logs, llm-d-planner logs):
    # the parameters (14.96 GiB) and the 32 MiB rotary cos/sin cache
    assert abs(e.breakdown.weights_bytes / GiB - 14.99) < 0.005


def test_dsa_indexer_and_fp8_ds_mla_bytes_per_token():
    # vLLM (model_executor/models/deepseek_v2.py, Indexer): a 128 + 128 // 128 x 4 = 132-byte indexer key per
    # token per layer beside the MLA latent (512 + 64 values); with fp8 KV the latent is fp8_ds_mla:
    # 512 fp8 + 4 fp32 scales + 64 bf16 = 656 B. 61 layers (configs/DeepSeek-V3.2-style.json).
    from pathlib import Path

    from sizing.capacity.scenario import Scenario

    from sizing.capacity.estimate import estimate
    from sizing.profiles import load_model

    name, shape = load_model(str(Path(__file__).parent / "fixtures" / "configs" / "DeepSeek-V3.2-style.json"))
    assert shape.index_head_dim == 128
    kw = dict(engine="vllm", tensor_parallel_size=8, max_model_len=4096, kv_cache_memory_bytes=1 << 30)
    bf16 = estimate(Scenario(name, shape, "H200", 150_109_880_320, **kw))
    fp8 = estimate(Scenario(name, shape, "H200", 150_109_880_320, k_cache_dtype="fp8", v_cache_dtype="fp8", **kw))
    assert bf16.kv_payload_bytes_per_token + bf16.kv_metadata_bytes_per_token == 61 * (576 * 2 + 132)
    assert fp8.k_format == "fp8_ds_mla"
    assert fp8.kv_payload_bytes_per_token + fp8.kv_metadata_bytes_per_token == 61 * (656 + 132)


def test_nas_block_configs_size_each_layer():
    # fixtures/configs/Nemotron-NAS-style.json: Llama-3.3-Nemotron-Super-49B's form (block_configs,
    # num_key_value_heads null), 49 attention layers with n_heads_in_group 8 and 31 no-op attention layers.
    # vllm/model_executor/models/nemotron_nas.py: KV heads = 64 // 8; a no-op layer holds no cache.
    from sizing.cache.layers import build_layout
    from sizing.profiles import load_model

    _, shape = load_model(str(FIXTURES / "configs" / "Nemotron-NAS-style.json"))
    assert shape.layer_kinds.count("none") == 31
    layout = build_layout(shape, "bf16", "bf16")
    assert sum(layout.token_bytes()) == 49 * 8 * 128 * 2 * 2 == 200_704
    assert sum(build_layout(shape, "bf16", "bf16", tp=8).token_bytes()) == 49 * 1 * 128 * 2 * 2


def test_mimo_sliding_layers_have_their_own_heads_and_v_is_narrower():
    # fixtures/configs/MiMo-V2-style.json: full layers 4 KV heads, sliding layers swa_num_key_value_heads 8,
    # K 192 and V 128 values (v_head_dim); vLLM 0.33 builds the same pages (fixtures/vllm-reference).
    from sizing.cache.layers import build_layout
    from sizing.capacity.scenario import Scenario
    from sizing.capacity.estimate import estimate
    from sizing.profiles import load_model

    _, shape = load_model(str(FIXTURES / "configs" / "MiMo-V2-style.json"))
    layout = build_layout(shape, "bf16", "bf16")
    pages = {(spec.kind, spec.page_bytes(16)) for spec in layout.kv.values()}
    assert pages == {("full", 16 * 4 * (192 + 128) * 2), ("sliding", 16 * 8 * (192 + 128) * 2)}
    # transformers attends sliding_window_size previous tokens plus the query; vLLM's model passes 128
    assert shape.sliding_window == 129 and shape.sliding_window_size == 128
    vllm = estimate(Scenario("m", shape, "H200", 150_109_880_320, engine="vllm", kv_cache_memory_bytes=GiB))
    assert {getattr(s, "window", None) for s in vllm.layout.kv.values()} == {None, 128}


def test_hybrid_layer_pattern_in_the_file_beats_the_class_default():
    # transformers' MiMoV2FlashConfig synthesizes layer_types (full at 0 and every 6th) when the file has
    # none; vLLM's model reads the file's hybrid_layer_pattern.
    import json

    from sizing.config import resolve_shape

    config = json.loads((FIXTURES / "configs" / "MiMo-V2-style.json").read_text())
    config.update(num_hidden_layers=4, hybrid_layer_pattern=[1, 0, 1, 0], moe_layer_freq=[0, 1, 1, 1])
    assert resolve_shape(config).layer_kinds == ("sliding", "full", "sliding", "full")



def test_glm5_dsa_cache_from_an_abridged_config_and_transformers_defaults():
    # GLM-5-FP8's config.json as ai-dynamo/aiconfigurator keeps it (no indexer fields): transformers'
    # GlmMoeDsaConfig supplies index_head_dim 128. vLLM keeps per layer the 576-value MLA latent
    # (kv_lora_rank 512 + qk_rope_head_dim 64) and a 132 B indexer key (128 fp8 + one fp32 scale);
    # under fp8 the latent is fp8_ds_mla, 656 B (512 fp8 + 4 fp32 scales + 64 bf16 rope).
    from sizing.capacity.scenario import Scenario
    from sizing.profiles import load_model

    name, shape = load_model(str(FIXTURES / "configs" / "GLM-5-FP8-abridged.json"))
    assert shape.num_layers == 78 and shape.index_head_dim == 128
    for kv, per_layer in (("auto", 576 * 2 + 132), ("fp8", 656 + 132)):
        e = estimate(Scenario(name, shape, "H200", 150_109_880_320, tensor_parallel_size=8, k_cache_dtype=kv,
                              v_cache_dtype=kv, weights_dtype="fp8", kv_cache_memory_bytes=10 * 2**30))
        assert e.kv_bytes_per_token == 78 * per_layer


def test_gemma4_shares_kv_in_its_last_layers_and_widens_full_attention_heads():
    # gemma-4-E2B config.json: 35 layers, num_kv_shared_layers 20, sliding window 512, one KV head;
    # transformers' per-layer configs give full-attention layers head_dim 512, sliding ones 256.
    # vLLM 0.33 (fixtures/vllm-reference/config-gemma-4-E2B.json): 13 sliding + 2 full layers hold a
    # cache, 17,408 B per token in bf16 = 13 x 256 x 2 x 2 + 2 x 512 x 2 x 2.
    from sizing.cache.layers import build_layout
    from sizing.profiles import load_model

    _, shape = load_model(str(FIXTURES / "configs" / "gemma-4-E2B.json"))
    assert shape.layer_kinds.count("shared") == 20
    layout = build_layout(shape, "bf16", "bf16")
    assert sorted({(s.kind, s.head_dim) for s in layout.kv.values()}) == [("full", 512), ("sliding", 256)]
    assert len(layout.kv) == 15
    assert sum(layout.token_bytes()) == 17_408


def test_mtp_layers_add_their_kv_and_weights():
    # DeepSeek-V3 config.json: num_nextn_predict_layers 1. vLLM's deepseek_mtp.py builds it as layer 61 with
    # its own MLA attention, whose KV joins the target's pool (v1/worker/gpu/attn_utils.py marks it is_draft,
    # which kv_cache_interface.py leaves out of spec equality): 62 x (512 + 64) x 2 B = 71,424 B per token.
    from sizing.errors import KvsizeError

    plain = estimate(scenario("deepseek-v3", gpu="h200", tensor_parallel_size=8, weights_dtype="fp8",
                              max_model_len=32768))
    mtp = estimate(scenario("deepseek-v3", gpu="h200", tensor_parallel_size=8, weights_dtype="fp8",
                            max_model_len=32768, mtp_layers=1))
    assert (plain.kv_bytes_per_token, mtp.kv_bytes_per_token) == (61 * 1152, 62 * 1152)
    assert mtp.breakdown.weights_bytes > plain.breakdown.weights_bytes  # one more MoE decoder layer + eh_proj
    with pytest.raises(KvsizeError, match="no MTP layers"):
        estimate(scenario("llama-3.1-8b", mtp_layers=1))
    with pytest.raises(KvsizeError, match="use 1 to 1"):
        estimate(scenario("deepseek-v3", gpu="h200", tensor_parallel_size=8, mtp_layers=2))

"""Fields whose meaning depends on the architecture (issue 49, sections 5 and 6): use_sliding_window false
(Qwen1.5-MoE), kv_lora_rank on an architecture vLLM does not build with MLA, Llama 4's attention_chunk_size
where transformers' class has not named the chunked layers, and Gemma 4's global layers' own head size and KV
heads where the file is read alone."""

import json
from pathlib import Path

import pytest

from helpers import scenario
from sizing.capacity.estimate import estimate
from sizing.config import read as config_read
from sizing.config import resolve_shape
from sizing.errors import KvsizeError

CORPUS = Path(__file__).parent / "fixtures" / "config-corpus"

# Qwen/Qwen1.5-MoE-A2.7B config.json as published (Hugging Face): sliding_window set, use_sliding_window false
QWEN15_MOE = {
    "architectures": ["Qwen2MoeForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643,
    "eos_token_id": 151643, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 8192, "max_window_layers": 21, "model_type": "qwen2_moe",
    "num_attention_heads": 16, "num_hidden_layers": 24, "num_key_value_heads": 16, "rms_norm_eps": 1e-06,
    "rope_theta": 1000000.0, "sliding_window": 32768, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.39.0.dev0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
    "decoder_sparse_step": 1, "moe_intermediate_size": 1408, "shared_expert_intermediate_size": 5632,
    "num_experts_per_tok": 4, "num_experts": 60, "norm_topk_prob": False, "output_router_logits": False,
    "router_aux_loss_coef": 0.001}


def corpus(name: str) -> dict:
    return json.loads((CORPUS / f"{name}.json").read_text())


def per_token(config: dict, tmp_path, engine="vllm") -> int:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return estimate(scenario(str(path), engine=engine, max_model_len=4096)).kv_bytes_per_token


@pytest.fixture
def file_alone(monkeypatch):
    """Read configs as kvsize does where the installed transformers has no class for their model_type."""
    monkeypatch.setattr(config_read, "transformers_config", lambda raw: None)


@pytest.mark.parametrize("via_transformers", [True, False])
def test_use_sliding_window_false_is_full_attention(via_transformers, monkeypatch):
    if not via_transformers:
        monkeypatch.setattr(config_read, "transformers_config", lambda raw: None)
    shape = resolve_shape(QWEN15_MOE)
    assert set(shape.layer_kinds) == {"full"} and shape.sliding_window is None
    assert shape.num_experts == 60 and shape.num_experts_per_tok == 4


def test_qwen15_moe_kv_bytes(tmp_path):
    # 24 layers x 16 KV heads x head_dim 2048/16 = 128 x K and V x bf16
    assert per_token(QWEN15_MOE, tmp_path) == 24 * 16 * 128 * 2 * 2 == 196_608


def test_use_sliding_window_must_be_true_or_false():
    with pytest.raises(KvsizeError, match="use_sliding_window"):
        resolve_shape({**QWEN15_MOE, "model_type": "qwen2_moe_custom", "use_sliding_window": "false"})


def test_stray_kv_lora_rank_on_llama_is_not_mla(tmp_path):
    llama = corpus("meta-llama--Llama-3.1-8B-Instruct")
    stray = {**llama, "kv_lora_rank": 512, "qk_rope_head_dim": 64}
    shape = resolve_shape(stray)
    assert shape.mla_latent_dim is None and not shape.is_mla
    assert any("kv_lora_rank" in note and "LlamaForCausalLM does not read" in note for note in shape.notes)
    # vLLM's LlamaForCausalLM: 32 layers x 8 KV heads x 128 x K and V x bf16
    assert per_token(stray, tmp_path) == per_token(llama, tmp_path) == 131_072
    assert shape.layer_params == resolve_shape(llama).layer_params


@pytest.mark.parametrize("name", ["deepseek-ai--DeepSeek-V3", "deepseek-ai--DeepSeek-V2-Lite", "openbmb--MiniCPM3-4B",
                                  "moonshotai--Kimi-K2-Instruct", "moonshotai--Kimi-K2.5", "zai-org--GLM-5",
                                  "deepseek-ai--DeepSeek-V3.2"])
def test_mla_architectures_still_read_kv_lora_rank(name):
    shape = resolve_shape(corpus(name))
    assert shape.is_mla and not any("kv_lora_rank" in note for note in shape.notes)


def test_mla_architecture_known_by_its_class_name_alone(file_alone):
    config = {**corpus("deepseek-ai--DeepSeek-V3"), "model_type": "deepseek_custom"}
    assert resolve_shape(config).mla_latent_dim == 512 + 64


def test_llama4_chunked_layers_read_from_the_file_alone(file_alone):
    # transformers' Llama4TextConfig: no_rope_layers empty -> a NoPE (full) layer every 4th, the rest chunked
    shape = resolve_shape(corpus("meta-llama--Llama-4-Scout-17B-16E-Instruct"))
    assert shape.layer_kinds.count("chunked") == 36 and shape.layer_kinds.count("full") == 12
    assert shape.layer_kinds[3] == "full" and shape.attention_chunk_size == 8192


def test_llama4_chunked_layers_match_transformers():
    with_class = resolve_shape(corpus("meta-llama--Llama-4-Scout-17B-16E-Instruct"))
    explicit = {**corpus("meta-llama--Llama-4-Scout-17B-16E-Instruct")}
    explicit["text_config"] = {**explicit["text_config"], "no_rope_layers": [0 if (i + 1) % 4 == 0 else 1
                                                                             for i in range(48)]}
    config_read_alone = config_read._resolve(explicit, explicit["text_config"], None, None)
    assert with_class.layer_kinds == config_read_alone.layer_kinds


def test_stray_attention_chunk_size_is_named():
    shape = resolve_shape({**corpus("meta-llama--Llama-3.1-8B-Instruct"), "attention_chunk_size": 8192})
    assert "chunked" not in shape.layer_kinds
    assert any("attention_chunk_size 8192" in note for note in shape.notes)


@pytest.mark.parametrize("name, kv_heads, global_heads", [("google--gemma-4-26B-A4B", 8, 2),
                                                          ("nvidia--Gemma-4-31B-IT-NVFP4", 16, 4)])
def test_gemma4_global_layers_read_from_the_file_alone(name, kv_heads, global_heads, monkeypatch):
    with_class = resolve_shape(corpus(name))
    monkeypatch.setattr(config_read, "transformers_config", lambda raw: None)
    alone = resolve_shape(corpus(name))
    for shape in (with_class, alone):
        full = [i for i, kind in enumerate(shape.layer_kinds) if kind == "full"]
        sliding = [i for i, kind in enumerate(shape.layer_kinds) if kind == "sliding"]
        assert {shape.layer_head_dims[i] for i in full} == {512} and {shape.layer_head_dims[i] for i in sliding} == {256}
        assert {shape.layer_kv_heads[i] for i in full} == {global_heads}
        assert {shape.layer_kv_heads[i] for i in sliding} == {kv_heads}
    assert alone.layer_head_dims == with_class.layer_head_dims and alone.layer_kv_heads == with_class.layer_kv_heads


def test_gemma4_global_kv_heads_are_gated_by_attention_k_eq_v(file_alone):
    config = corpus("google--gemma-4-26B-A4B")
    config["text_config"] = {**config["text_config"], "attention_k_eq_v": False}
    shape = resolve_shape(config)
    assert shape.layer_head_dims[5] == 512 and (not shape.layer_kv_heads or shape.layer_kv_heads[5] == 8)


def test_global_head_dim_must_be_a_positive_integer(file_alone):
    config = corpus("google--gemma-4-26B-A4B")
    config["text_config"] = {**config["text_config"], "global_head_dim": "512"}
    with pytest.raises(KvsizeError, match="global_head_dim"):
        resolve_shape(config)

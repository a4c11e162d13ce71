"""DBRX keeps its attention and expert fields in nested configs (issue 49, section 6): attn_config (kv_n_heads,
clip_qkv, rope_theta) and ffn_config (moe_num_experts, moe_top_k, ffn_hidden_size) are read, so DBRX is sized as
the grouped-query MoE it is. tests/fixtures/configs/dbrx-instruct.json holds databricks/dbrx-instruct's published
values (d_model 6144, n_heads 48, n_layers 40, max_seq_len 32768, vocab_size 100352; attn_config kv_n_heads 8,
rope_theta 500000, clip_qkv 8; ffn_config ffn_hidden_size 10752, moe_num_experts 16, moe_top_k 4)."""

import json
from pathlib import Path

from helpers import scenario
from sizing.capacity.estimate import estimate
from sizing.config import resolve_shape
from sizing.engines.memory import resolve_weights_dtype, weight_bytes

FIXTURES = Path(__file__).resolve().parent / "fixtures"
INSTRUCT = FIXTURES / "configs" / "dbrx-instruct.json"


def instruct():
    return resolve_shape(json.loads(INSTRUCT.read_text()))


def test_the_nested_fields_are_read():
    shape = instruct()
    assert (shape.num_layers, shape.hidden_size, shape.num_attention_heads, shape.num_kv_heads, shape.head_dim) \
        == (40, 6144, 48, 8, 128)
    assert (shape.num_experts, shape.num_experts_per_tok, shape.moe_intermediate_size) == (16, 4, 10752)
    assert shape.gated_mlp  # each expert a GLU of w1, v1 and w2 (vLLM's dbrx.py DbrxExperts)
    assert shape.max_position_embeddings == 32768  # max_seq_len
    assert all(p.experts and not p.mlp for p in shape.layer_params)  # every layer MoE, no dense MLP
    assert shape.notes == ()  # nothing named unread or unknown


def test_kv_bytes_per_token():
    # 2 (K and V) x 40 layers x 8 KV heads x (6144 / 48 = 128) x 2 bytes (bf16)
    e = estimate(scenario(str(INSTRUCT), "h200", engine="vllm", max_model_len=4096, tensor_parallel_size=8))
    assert e.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2 // 8 == 20_480  # one KV head a rank at TP 8
    ideal = estimate(scenario(str(INSTRUCT), "h200", engine="ideal", max_model_len=4096))
    assert ideal.kv_bytes_per_token == 2 * 40 * 8 * 128 * 2 == 163_840


def test_weights_are_the_moes():
    shape = instruct()
    # per layer: Wqkv (48 + 2 x 8) x 128 x 6144 and out_proj 6144 x 6144 = 88,080,384; 16 experts x 3 x 6144 x
    # 10752 = 3,170,893,824; router 6144 x 16; norm_1 and norm_2 (bias-free LayerNorms) 2 x 6144.
    # wte and lm_head (untied) 100352 x 6144 each.
    layer = 88_080_384 + 3_170_893_824 + 6144 * 16 + 2 * 6144
    params = 40 * layer + 2 * 100352 * 6144
    assert shape.total_params == params == 131_596_517_376  # 132B total parameters, as published
    w = weight_bytes(shape, resolve_weights_dtype("bf16", shape), 1, range(40), True, True)
    # vLLM 0.33.0's DbrxForCausalLM built on the meta device: 263,193,047,040 bytes of bf16 parameters, the
    # same less transformer.norm_f (6144 x 2 bytes), which kvsize leaves out for every model
    assert w.total_bytes - w.buffers_bytes == 2 * params == 263_193_047_040 - 6144 * 2
    # the rotary cos/sin cache: max_seq_len x head_dim in bf16 (rotary_emb.cos_sin_cache [32768, 128])
    assert w.buffers_bytes == 32768 * 128 * 2


def test_the_file_alone_is_read_the_same_way():
    # databricks/dbrx-base as the corpus keeps it: ffn_act_fn "silu" is refused by transformers' DbrxConfig, so
    # kvsize reads the file alone; its attn_config gives 12 KV heads
    shape = resolve_shape(json.loads((FIXTURES / "config-corpus" / "databricks--dbrx-base.json").read_text()))
    assert shape.parsed_with == "raw JSON"
    assert (shape.num_kv_heads, shape.num_experts, shape.num_experts_per_tok, shape.moe_intermediate_size,
            shape.max_position_embeddings) == (12, 16, 4, 10752, 32768)

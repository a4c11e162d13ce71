"""Quantized checkpoints read from their published quantization_config (tests/fixtures/config-corpus, each
file cited in its SOURCES.md): the weight format and the modules left in the model dtype."""

import json

import pytest

from sizing.errors import KvsizeError
from sizing.engines.memory import resolve_weights_dtype, weight_bytes
from sizing.profiles import load_model
from sizing.units import GiB

CORPUS = "tests/fixtures/config-corpus"


def shape_of(name):
    return load_model(f"{CORPUS}/{name}.json")[1]


def test_compressed_tensors_fp8_per_channel_keeps_attention_in_bf16():
    # RedHatAI's Llama 4 Scout FP8-dynamic: weights float 8-bit strategy "channel"; ignore names every layer's
    # q/k/v/o projections, the routers and lm_head. vLLM 0.26.0 printed "Model loading took 107.68 GiB"
    # (tests/fixtures/vllm-starts, h200-0.26.0-llama-4-scout-17b-16e-instruct-fp8-dynamic-text).
    shape = shape_of("RedHatAI--Llama-4-Scout-17B-16E-Instruct-FP8-dynamic")
    assert (shape.weights_quantization_format, shape.attention_unquantized) == ("fp8_channel", True)
    fmt = resolve_weights_dtype("auto", shape)
    assert fmt.attention_in_model_dtype and not fmt.experts_only


def test_compressed_tensors_int4_in_groups_of_32_keeps_dense_mlps_in_bf16():
    # Kimi-K2.5: int 4-bit, group_size 32, symmetric; ignore "re:.*self_attn.*", "re:.*shared_experts.*" and the
    # dense MLPs by pattern: only the routed experts are int4, at 4 + 16/32 bits a weight
    shape = shape_of("moonshotai--Kimi-K2.5")
    assert shape.weights_quantization_format == "int4_g32_sym"
    assert shape.attention_unquantized and shape.dense_mlp_unquantized
    fmt = resolve_weights_dtype("auto", shape)
    assert (fmt.bits, fmt.scale_bits, fmt.group, fmt.experts_only) == (4, 16, 32, True)
    experts = sum(p.experts for p in shape.layer_params)
    total = weight_bytes(shape, fmt, 1, range(shape.num_layers), True, True).total_bytes
    assert total > experts * 4.5 / 8  # the experts' 4.5 bits, and everything else in bf16 on top
    assert total / GiB < 600


def test_modelopt_nvfp4():
    # NVIDIA's NVFP4 exports: quant_method modelopt, quant_algo NVFP4 (4-bit values, an fp8 scale per 16)
    shape = shape_of("nvidia--Kimi-K2.5-NVFP4")
    assert shape.weights_quantization_format == "nvfp4" and shape.attention_unquantized
    fmt = resolve_weights_dtype("auto", shape)
    assert (fmt.bits, fmt.scale_bits, fmt.group) == (4, 8, 16)


@pytest.mark.parametrize("quant", [
    {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": 7, "weights": {"num_bits": 8}}}},
    {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"],
                                                                   "weights": {"num_bits": 8, "type": "float"}}},
     "ignore": 5},
    {"quant_method": "compressed-tensors", "config_groups": [1, 2]},
    {"quant_method": "modelopt", "quant_algo": ["NVFP4"], "exclude_modules": "lm_head"},
    {"quant_method": "compressed-tensors", "config_groups": {"g": {"targets": ["Linear"],
                                                                   "weights": {"num_bits": 4, "type": "int",
                                                                               "group_size": True}}}},
])
def test_odd_quantization_configs_are_sized_without_a_crash(tmp_path, quant):
    # a value kvsize cannot read as a scheme leaves the checkpoint in its dtype (--weights-dtype overrides)
    config = json.loads(open("profiles/models/llama-3.1-8b.json").read())["config"]
    config["quantization_config"] = quant
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    try:
        shape = load_model(str(path))[1]
    except KvsizeError:
        return
    resolve_weights_dtype("auto", shape)


def test_modelopt_mixed_precision_reads_each_kind_of_module():
    # Qwen3.6-35B-A3B-NVFP4: quant_algo MIXED_PRECISION; quantized_layers names the experts and shared experts
    # W4A16_NVFP4 (group 16) and the attention projections (linear_attn, self_attn) FP8
    shape = shape_of("nvidia--Qwen3.6-35B-A3B-NVFP4")
    assert (shape.weights_quantization_format, shape.attention_quantization_format) == ("nvfp4", "fp8_tensor")
    fmt = resolve_weights_dtype("auto", shape)
    assert fmt.name == "nvfp4" and fmt.attention_format == "fp8_tensor"
    layers = range(shape.num_layers)
    mixed = weight_bytes(shape, fmt, 1, layers, True, True).layers_bytes
    # attention at 8 bits rather than 4.5: the layers weigh more than all-NVFP4 and less than all-FP8
    assert weight_bytes(shape, resolve_weights_dtype("nvfp4", shape), 1, layers, True, True).layers_bytes < mixed
    assert mixed < weight_bytes(shape, resolve_weights_dtype("fp8", shape), 1, layers, True, True).layers_bytes


def _with_quantization(tmp_path, quant, base="tests/fixtures/vllm-starts/configs/qwen3-8b.json"):
    config = json.loads(open(base).read())
    config["quantization_config"] = quant
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return load_model(str(path))[1]


@pytest.mark.parametrize("quant, name, bits, scale_bits, group", [
    # Qwen's AWQ releases: bits 4, group_size 128, zero_point true (a 4-bit zero beside the fp16 scale)
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True, "version": "gemm"},
     "int4_g128", 4, 20, 128),
    # GPTQ int8, symmetric: vLLM's Marlin/Machete kernels keep no zeros (auto_gptq.py TYPE_MAP uint8b128)
    ({"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": True, "desc_act": False},
     "int8_g128_sym", 8, 16, 128),
    ({"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False}, "int4_g32", 4, 20, 32),
    # group_size -1: one scale per output channel (4,096 in_features taken)
    ({"quant_method": "gptq", "bits": 4, "group_size": -1, "sym": True}, "int4_gchannel_sym", 4, 16, 4096),
    # AutoAWQ's older keys
    ({"quant_method": "awq", "w_bit": 4, "q_group_size": 64, "zero_point": True}, "int4_g64", 4, 20, 64),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "bnb4", 4, 32, 64),
    # double-quantized: vLLM's loader turns the nested absmax back into fp32 (BitsAndBytesModelLoader._dequantize_dq)
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True}, "bnb4", 4, 32, 64),
    # transformers' BitsAndBytesConfig saved without its quant_method
    ({"load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, "bnb4", 4, 32, 64),
    # AutoRound's exports name their method intel/auto-round
    ({"quant_method": "intel/auto-round", "bits": 4, "group_size": 128, "sym": True, "data_type": "int"},
     "int4_g128_sym", 4, 16, 128),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, "bnb8", 8, 32, 4096),
])
def test_integer_checkpoints_are_read_from_their_settings(tmp_path, quant, name, bits, scale_bits, group):
    shape = _with_quantization(tmp_path, quant)
    assert shape.weights_quantization_format == name and not shape.notes
    fmt = resolve_weights_dtype("auto", shape)
    assert (fmt.bits, fmt.scale_bits, fmt.group) == (bits, scale_bits, group)


def test_a_gptq_int8_checkpoint_is_twice_an_int4_one(tmp_path):
    # before kvsize read `bits`, every GPTQ checkpoint was sized as int4
    int8 = _with_quantization(tmp_path, {"quant_method": "gptq", "bits": 8, "group_size": 128, "sym": True})
    int4 = _with_quantization(tmp_path, {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True})
    linear = sum(p.attention + p.mlp for p in int8.layer_params)

    def total(shape):
        return weight_bytes(shape, resolve_weights_dtype("auto", shape), 1, range(shape.num_layers), True, True).total_bytes

    assert total(int8) - total(int4) == pytest.approx(linear / 2, rel=0.001)


@pytest.mark.parametrize("quant", [
    {"quant_method": "hqq", "nbits": 4},
    {"quant_method": "gptq", "bits": 5, "group_size": 128},
    {"quant_method": "gptq", "bits": 4, "group_size": "128"},
    {"quant_method": "bitsandbytes"},
])
def test_a_scheme_kvsize_does_not_read_is_said_not_guessed(tmp_path, quant):
    # the weights stay in the model dtype, and the estimate says so and which setting gives the format
    shape = _with_quantization(tmp_path, quant)
    assert shape.weights_quantization_format is None
    assert any(repr(quant["quant_method"]) in n and "--weights-dtype" in n for n in shape.notes)
    assert resolve_weights_dtype("auto", shape).name == "bf16"


def test_a_setting_kvsize_cannot_read_is_named_and_kept_short(tmp_path):
    # the warning names the setting as found and what kvsize takes; a huge value is cut, not echoed whole
    shape = _with_quantization(tmp_path, {"quant_method": "gptq", "bits": "8" * 10_000, "group_size": 128})
    note = next(n for n in shape.notes if "quantization_config" in n)
    assert "bits '888" in note and "bits 2, 3, 4 or 8" in note and len(note) < 400
    shape = _with_quantization(tmp_path, {"quant_method": "awq", "bits": 4, "zero_point": "false"})
    assert any("zero_point 'false'" in n for n in shape.notes)  # a string is not a yes or no


@pytest.mark.parametrize("ignore, mlp_in_model_dtype", [
    (["lm_head", "re:.*mlp.gate$"], False),  # the routers: the MoE's dense parts stay quantized
    (["lm_head", "mlp.shared_expert_gate", "router"], False),
    (["lm_head", "re:.*shared_experts.*"], True),  # Kimi-K2.5's shared experts
    (["lm_head", "re:.*mlp.*"], True),
])
def test_a_router_in_the_ignore_list_is_not_a_dense_mlp(tmp_path, ignore, mlp_in_model_dtype):
    # compressed-tensors' usual FP8-dynamic MoE recipe ignores "re:.*mlp.gate$": the routers, which vLLM keeps
    # in the model dtype anyway; before, any entry with "mlp" in it made every dense MLP and the attention bf16
    quant = {"quant_method": "compressed-tensors", "ignore": ignore, "config_groups": {"group_0": {
        "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
    shape = _with_quantization(tmp_path, quant, "tests/fixtures/vllm-starts/configs/qwen3-30b-a3b.json")
    assert shape.dense_mlp_unquantized is mlp_in_model_dtype
    fmt = resolve_weights_dtype("auto", shape)
    assert fmt.attention_format in (None, "fp8_channel")  # the attention stays fp8 either way


def test_gptq_modules_in_block_to_quantize_leave_the_rest_unquantized(tmp_path):
    # vLLM quantizes only the modules GPTQ lists (auto_gptq.py get_linear_quant_method); routed experts always
    gptq = {"quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True,
            "modules_in_block_to_quantize": [["self_attn.k_proj", "self_attn.v_proj", "self_attn.q_proj"],
                                             ["self_attn.o_proj"]]}
    dense = _with_quantization(tmp_path, gptq)
    assert dense.dense_mlp_unquantized and dense.attention_quantization_format is None
    fmt = resolve_weights_dtype("auto", dense)
    assert fmt.experts_only and fmt.attention_format == "int4_g128_sym"
    listed = _with_quantization(tmp_path, dict(gptq, modules_in_block_to_quantize=["mlp.down_proj", "mlp.up_proj"]))
    assert not listed.dense_mlp_unquantized and listed.attention_unquantized


@pytest.mark.parametrize("quant", [
    {"quant_method": "compressed-tensors", "kv_cache_scheme": {"num_bits": 8, "type": "float"}},
    {"quant_method": "modelopt", "quant_algo": None, "kv_cache_quant_algo": "FP8"},
])
def test_a_kv_only_quantization_config_is_not_warned_of(tmp_path, quant):
    shape = _with_quantization(tmp_path, quant)
    assert not shape.notes and resolve_weights_dtype("auto", shape).name == "bf16"


def test_a_quantization_config_without_a_method_is_warned_of(tmp_path):
    shape = _with_quantization(tmp_path, {"bits": 4, "group_size": 128})
    assert any("names no quant_method" in n for n in shape.notes)


def test_an_ignore_list_that_names_every_layer_keeps_those_modules_in_bf16():
    # NVIDIA's Qwen3.5-122B-A10B-NVFP4 ignores layers.N.linear_attn* / self_attn* and mlp.shared_expert* in each
    # of its 48 layers, by name: attention (mixers too) and shared experts stay bf16, the routed experts NVFP4
    shape = shape_of("nvidia--Qwen3.5-122B-A10B-NVFP4")
    assert shape.attention_unquantized and shape.dense_mlp_unquantized
    fmt = resolve_weights_dtype("auto", shape)
    total = weight_bytes(shape, fmt, 1, range(shape.num_layers), True, True).total_bytes
    experts = sum(p.experts for p in shape.layer_params)
    rest = sum(p.attention + p.mlp + p.other for p in shape.layer_params)
    assert total > fmt.bytes_for(experts) + 2 * rest  # bf16 beside the NVFP4 experts


def test_a_multimodal_towers_modules_in_an_ignore_list_leave_the_language_model_quantized(tmp_path):
    # llm-compressor writes ignore lists as module names: the vision tower's MLPs (visual.blocks.N.mlp.*,
    # visual.merger.mlp.0) are not the language model's
    quant = {"quant_method": "compressed-tensors", "ignore": ["lm_head", "visual.blocks.0.mlp.gate_proj",
                                                              "visual.merger.mlp.0", "visual.blocks.0.attn.qkv"],
             "config_groups": {"group_0": {"targets": ["Linear"],
                                           "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
    shape = _with_quantization(tmp_path, quant, "tests/fixtures/config-corpus/Qwen--Qwen2.5-VL-7B-Instruct.json")
    assert not shape.dense_mlp_unquantized and not shape.attention_unquantized


def test_routers_and_shared_experts_move_the_bytes_as_vllm_loads_them(tmp_path):
    # DeepSeek-V2-Lite: a dense first layer, shared experts, routers. Ignoring the routers changes nothing
    # (vLLM keeps them bf16 anyway); ignoring the shared experts keeps them, and the dense MLP, in bf16
    def total(ignore):
        quant = {"quant_method": "compressed-tensors", "ignore": ignore, "config_groups": {"group_0": {
            "targets": ["Linear"], "weights": {"num_bits": 8, "type": "float", "strategy": "channel"}}}}
        shape = _with_quantization(tmp_path, quant, "tests/fixtures/config-corpus/deepseek-ai--DeepSeek-V2-Lite.json")
        fmt = resolve_weights_dtype("auto", shape)
        return weight_bytes(shape, fmt, 1, range(shape.num_layers), True, True).total_bytes

    plain = total(["lm_head"])
    assert total(["lm_head", "re:.*mlp.gate$"]) == plain
    assert total(["lm_head", "re:.*shared_experts.*"]) > plain


def test_an_output_gate_doubles_the_query_projection():
    # Qwen3.5's full-attention layers (attn_output_gate): vLLM's qkv_proj holds a gate beside each query, 16 x
    # 256 x 2,048 more parameters a layer; without it kvsize's weights were 0.16 GiB below vLLM's 0.26.0 start
    shape = load_model("tests/fixtures/vllm-starts/configs/qwen3.5-35b-a3b.json")[1]
    assert shape.attention_output_gate
    full = next(i for i, k in enumerate(shape.layer_kinds) if k == "full")
    heads, kv, hd, h = shape.num_attention_heads, shape.kv_heads_of(full), shape.head_dim_of(full), shape.hidden_size
    assert shape.layer_params[full].attention >= (3 * heads + 2 * kv) * hd * h

"""Per-layer input embeddings (issue 49, section 6): Gemma-4 E2B's hidden_size_per_layer_input is read, and its
weights carry the per-layer embedding table, the projection into it and each layer's gate and projection back.

The figures are vLLM 0.33.0's own: Gemma4ForCausalLM built from the bundled gemma-4-e2b text config on the meta
device (the model class vLLM's Gemma4ForConditionalGeneration builds for its language model), each parameter's
shape and dtype summed by name, at TP 1 and as rank 0 of TP 2."""

import json
from dataclasses import replace
from pathlib import Path

from helpers import scenario
from sizing.capacity.estimate import estimate
from sizing.config import resolve_shape
from sizing.engines.memory import (SGLANG_PER_LAYER_INPUTS, per_layer_input_buffer_bytes, per_layer_input_bytes,
                                   resolve_weights_dtype, weight_bytes)
from sizing.profiles import bundled_shape

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "tests" / "fixtures" / "config-corpus"

# vLLM 0.33.0, Gemma4ForCausalLM on the meta device, TP 1 (bf16, 2 bytes a parameter):
TABLE = 4_697_620_480  # model.embed_tokens_per_layer.weight [262144, 8960]: 262,144 x 35 x 256 x 2
PROJECTION = 27_525_120  # model.per_layer_model_projection.weight [8960, 1536]: 8,960 x 1,536 x 2
GATES = 27_525_120  # layers.*.per_layer_input_gate.weight [256, 1536], 35 layers: 35 x 256 x 1,536 x 2
PROJECTIONS_BACK = 27_525_120  # layers.*.per_layer_projection.weight [1536, 256], 35 layers
NORMS = 107_520  # layers.*.post_per_layer_input_norm.weight [1536], 35 layers: 35 x 1,536 x 2
PROJECTION_NORM = 512  # model.per_layer_projection_norm.weight [256]
# the sum of all of vLLM's parameters of that build, TP 1
VLLM_PARAMETER_BYTES = 8_110_519_808


def e2b():
    return bundled_shape("gemma-4-e2b")


def test_the_field_is_read():
    shape = e2b()
    assert (shape.per_layer_input_size, shape.per_layer_input_vocab) == (256, 262_144)
    assert not any("hidden_size_per_layer_input" in note for note in shape.notes)
    # the stored shape is what the bundled config resolves to
    assert resolve_shape(json.loads((ROOT / "profiles/models/gemma-4-e2b.json").read_text())["config"]) == shape


def test_per_layer_inputs_weigh_what_vllm_allocates_at_tp_1():
    shape = e2b()
    bf16 = resolve_weights_dtype("bf16", shape)
    got = per_layer_input_bytes(shape, bf16, 1, range(shape.num_layers), True)
    assert got == TABLE + PROJECTION + GATES + PROJECTIONS_BACK + NORMS + PROJECTION_NORM == 4_780_303_872
    assert round(got / 2**30, 2) == 4.45


def test_tp_splits_the_table_and_projection_but_not_the_gates():
    # vLLM 0.33.0 rank 0 of TP 2: embed_tokens_per_layer [131072, 8960] (the vocabulary, padded to 64, halved),
    # per_layer_model_projection [4480, 1536]; per_layer_input_gate [256, 1536] and per_layer_projection
    # [1536, 256] whole on every rank (ReplicatedLinear), the norms whole too
    shape = e2b()
    got = per_layer_input_bytes(shape, resolve_weights_dtype("bf16", shape), 2, range(shape.num_layers), True)
    assert got == 2_348_810_240 + 13_762_560 + 512 + 35 * (786_432 + 786_432 + 3_072)


def test_sglang_keeps_the_table_whole_on_every_rank():
    # SGLang 0.5.23's gemma4_causal.py (Gemma4TextModel): embed_tokens_per_layer a Gemma3TextScaledWordEmbedding,
    # a plain nn.Embedding, and per_layer_model_projection a ReplicatedLinear: at TP 2 each rank holds what TP 1
    # holds
    shape = e2b()
    bf16 = resolve_weights_dtype("bf16", shape)
    whole = per_layer_input_bytes(shape, bf16, 1, range(shape.num_layers), True)
    assert per_layer_input_bytes(shape, bf16, 2, range(shape.num_layers), True, SGLANG_PER_LAYER_INPUTS) == whole


def test_pipeline_stages():
    shape = e2b()
    bf16 = resolve_weights_dtype("bf16", shape)
    gates = 17 * (786_432 + 786_432 + 3_072)  # layers 18-34: gate, projection back and norm each
    # vLLM 0.33's Gemma4Model builds embed_tokens_per_layer and per_layer_model_projection with no pipeline
    # check (gemma4.py, Gemma4Model.__init__), so a later stage holds them too
    assert per_layer_input_bytes(shape, bf16, 1, range(18, 35), False) == TABLE + PROJECTION + PROJECTION_NORM + gates
    # SGLang 0.5.23 builds them on the first pipeline rank only (PPMissingLayer elsewhere)
    assert per_layer_input_bytes(shape, bf16, 1, range(18, 35), False, SGLANG_PER_LAYER_INPUTS) == gates


def test_the_model_weighs_within_half_a_percent_of_vllms_parameters():
    # kvsize 3.48 GiB before (the table missing), 8.1 GiB of parameters now; what is left above vLLM's
    # (37.5 MB) is the KV-shared layers' K and V projections, which vLLM's Gemma4Attention does not build
    shape = e2b()
    w = weight_bytes(shape, resolve_weights_dtype("bf16", shape), 1, range(shape.num_layers), True, True,
                     vision=False)
    parameters = w.total_bytes - w.buffers_bytes
    assert w.per_layer_input_bytes == 4_780_303_872
    assert 0 <= parameters - VLLM_PARAMETER_BYTES < 0.005 * VLLM_PARAMETER_BYTES


def test_vllm_counts_the_wrappers_staging_buffer_with_the_weights():
    # gemma4_mm.py: per_layer_embeddings = zeros(max_num_batched_tokens, 35, 256) in bf16, allocated with the model
    shape = e2b()
    assert per_layer_input_buffer_bytes(shape, 8192) == 8192 * 35 * 256 * 2 == 146_800_640
    assert per_layer_input_buffer_bytes(replace(shape, architectures=("Gemma4ForCausalLM",)), 8192) == 0
    vllm = estimate(scenario("gemma-4-e2b", "h200", engine="vllm@0.33.0", max_model_len=4096,
                             max_num_batched_tokens=8192)).breakdown.weights_bytes
    ideal = estimate(scenario("gemma-4-e2b", "h200", engine="ideal", max_model_len=4096)).breakdown.weights_bytes
    assert vllm - ideal >= 146_800_640
    assert vllm > 8 * 2**30  # 3.48 GiB before the table was read


def test_a_gemma_4_without_per_layer_inputs_has_none():
    shape = resolve_shape(json.loads((CORPUS / "google--gemma-4-26B-A4B.json").read_text()))
    assert shape.per_layer_input_size == 0 and shape.per_layer_input_params == 0


def test_the_field_on_an_architecture_that_does_not_build_it_is_named_not_read():
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
              "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
              "intermediate_size": 14336, "max_position_embeddings": 8192, "hidden_size_per_layer_input": 256}
    shape = resolve_shape(config)
    assert shape.per_layer_input_size == 0
    assert any("hidden_size_per_layer_input" in note and "does not read" in note for note in shape.notes)


def test_a_double_wide_mlp_doubles_the_kv_sharing_layers_mlp():
    # vLLM 0.33.0 models/gemma4.py (Gemma4DecoderLayer): intermediate_size x 2 for the layers from
    # num_hidden_layers - num_kv_shared_layers on, where use_double_wide_mlp is set. E2B: 20 such layers, each a
    # gated MLP of 3 x 1,536 x 6,144 parameters more, in bf16
    config = json.loads((ROOT / "profiles/models/gemma-4-e2b.json").read_text())["config"]
    plain = resolve_shape(config)
    config["text_config"]["use_double_wide_mlp"] = True
    wide = resolve_shape(config)
    fmt = resolve_weights_dtype("auto", plain)
    layers = range(plain.num_layers)
    grown = (weight_bytes(wide, fmt, 1, layers, True, True).total_bytes
             - weight_bytes(plain, fmt, 1, layers, True, True).total_bytes)
    assert grown == 20 * 3 * 1536 * 6144 * 2
    assert [lp.mlp for lp in wide.layer_params][:15] == [lp.mlp for lp in plain.layer_params][:15]

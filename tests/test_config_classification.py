"""Every top-level key of a config.json and of the language model it nests is classified (issue 49, section 6):
read by a family reader (its FIELDS, or the field transformers makes of it), known not to change memory (the
table in sizing/config/irrelevant.py, a reason for each), known to change memory but read by none (NOT_READ), or
unknown; each unknown key a config sets is named in the shape's notes."""

import json
from pathlib import Path

import pytest

from sizing.config import resolve_shape
from sizing.config.irrelevant import IRRELEVANT
from sizing.config.multimodal import language_config
from sizing.config.unread import NOT_READ, READ_FIELDS, SUBSUMED_BY, classify, unknown_keys
from sizing.errors import KvsizeError

FIXTURES = Path(__file__).parent / "fixtures"
CORPUS = sorted((FIXTURES / "config-corpus").glob("*.json"))

# The keys of the corpus kvsize does not know, pinned: a key joins this list only once someone has judged that it
# may change memory and kvsize does not read it (else it is read, or goes into irrelevant.py with its reason).
EXPECTED_UNKNOWN = {
    "activation_situ_beta", "activation_situ_linear_beta", "add_full_attention_sink_bias",
    "add_swa_attention_sink_bias", "aligner_config", "attention_output_gate",
    "attn_res_block_size", "audio_config", "blocksparse_block_size", "blocksparse_homo_head_pattern",
    "blocksparse_num_local_blocks", "blocksparse_triton_kernel_block_size", "blocksparse_vert_stride",
    "cross_attention_hidden_size", "dense_attention_every_n_layers", "dense_intermediate_size",
    "embd_layer", "enable_moe_block", "expert_dtype", "expert_intermediate_size", "ff_dim_multiplier",
    "ff_intermediate_size", "gegelu_pad_to_256", "gen_aligner_config", "gen_head_config",
    "gen_vision_config", "hc_mult", "img_processor",
    "index_share_for_mtp_iteration", "index_skip_topk_offset", "index_topk_freq", "index_topk_pattern",
    "indexer_types", "is_causal", "language_model_only", "latent_moe_use_norm", "linear_attn_config", "lm_head",
    "mla_use_nope", "mla_use_output_gate", "mlp_layer_types", "mm_hidden_size",
    "mm_projector_type", "mm_resampler_type", "mm_vision_tower", "moe_latent_size",
    "mtp_hybrid_override_pattern", "mtp_layers_block_type", "mtp_transformer_layers",
    "mtp_use_dedicated_embeddings", "multi_query_attention", "nope_layer_interval", "num_mtp_modules",
    "num_reward_heads", "output_gate_type", "pad_sequence_to_multiple_of_64", "projector_config",
    "projector_hidden_size", "rm_head", "rotary_pct", "routed_expert_hidden_size", "share_expert_dim",
    "shared_intermediate_size", "sparse_attention_config", "swa_num_attention_heads", "time_step_rank",
    "use_mm_proj", "use_mtp",
}


def keys_of(config: dict) -> set[str]:
    return set(config) | set(language_config(config))


def test_the_irrelevant_table_gives_a_reason_for_each_key():
    for key, reason in IRRELEVANT.items():
        assert isinstance(reason, str) and len(reason) > 20, key
    assert not set(IRRELEVANT) & READ_FIELDS, "a key read by a family is not irrelevant"
    assert not set(IRRELEVANT) & set(NOT_READ), "a key known to change memory is not irrelevant"
    assert not set(IRRELEVANT) & set(SUBSUMED_BY)


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_every_key_is_classified_and_each_unknown_one_named(path):
    config = json.loads(path.read_text())
    for key in keys_of(config):
        assert classify(key) in ("read", "irrelevant", "not read", "unknown"), key
    unknown = unknown_keys(language_config(config), config)
    assert all(classify(key) == "unknown" for key in unknown)
    try:
        shape = resolve_shape(config)
    except KvsizeError:
        return
    if unknown:
        named = [note for note in shape.notes if "neither reads nor knows" in note]
        assert len(named) == 1 and all(key in named[0] for key in unknown)
    else:
        assert not any("neither reads nor knows" in note for note in shape.notes)


def test_the_corpus_unknown_keys_are_the_pinned_ones():
    found = {key for path in CORPUS for key in keys_of(json.loads(path.read_text())) if classify(key) == "unknown"}
    assert found == EXPECTED_UNKNOWN, f"classify these keys: read, irrelevant (with a reason) or pinned unknown: " \
                                      f"{sorted(found ^ EXPECTED_UNKNOWN)}"


def test_an_unknown_key_is_named_and_a_known_one_is_not():
    config = json.loads((FIXTURES / "config-corpus" / "meta-llama--Llama-3.1-8B-Instruct.json").read_text())
    shape = resolve_shape({**config, "frobnicate_layers": 4, "bos_token_id": 7, "unset_thing": None})
    named = [note for note in shape.notes if "neither reads nor knows" in note]
    assert len(named) == 1 and "frobnicate_layers" in named[0]
    assert "bos_token_id" not in named[0] and "unset_thing" not in named[0]
    assert classify("bos_token_id") == "irrelevant" and "token" in IRRELEVANT["bos_token_id"]
    assert classify("num_key_value_heads") == "read" and classify("cross_attention_layers") == "not read"
    assert classify("frobnicate_layers") == "unknown"


def test_nested_text_config_keys_are_classified_too():
    config = json.loads((FIXTURES / "config-corpus" / "google--gemma-4-26B-A4B.json").read_text())
    config["text_config"] = {**config["text_config"], "frobnicate_layers": 4}
    shape = resolve_shape(config)
    assert any("frobnicate_layers" in note for note in shape.notes)

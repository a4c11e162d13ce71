"""The llama.cpp harness without llama.cpp: the miniature GGUF writer (read back with gguf's own reader) and the
log parser (on lines written with llama.cpp's own format strings)."""

from __future__ import annotations

import pytest

gguf = pytest.importorskip("gguf")

from measure.llamacpp.gguf_writer import SMALL, build, text_config, write  # noqa: E402
from measure.llamacpp.logparse import memory_lines, parse  # noqa: E402
from measure.llamacpp.panel import CACHE_TYPES, MODELS, panel  # noqa: E402
from sizing.profiles import model_profile  # noqa: E402


def _field(reader, key):
    f = reader.fields[key]
    return f.parts[f.data[0]].tolist()[0] if len(f.data) == 1 else [f.parts[i].tolist()[0] for i in f.data]


@pytest.mark.parametrize("model", sorted(MODELS))
def test_miniature_keeps_what_the_cache_is_sized_from(model):
    config = text_config(model_profile(model).config)
    arch = MODELS[model]
    hp, tensors = build(model_profile(model).config, arch)
    assert hp["add_block_count"] == config["num_hidden_layers"]
    if arch == "deepseek2":  # conversion/deepseek.py: one KV head, key = kv_lora_rank + rope, value = kv_lora_rank
        assert hp["add_head_count_kv"] == 1
        assert hp["add_key_length"] == config["kv_lora_rank"] + config["qk_rope_head_dim"]
        assert hp["add_value_length"] == config["kv_lora_rank"]
    else:
        heads = config["num_attention_heads"]
        assert hp["add_head_count"] == heads
        assert hp["add_head_count_kv"] == (config.get("num_key_value_heads") or heads)
        assert hp["add_key_length"] == (config.get("head_dim") or config["hidden_size"] // heads)
    if arch in ("gemma2", "gemma3"):
        assert hp["add_sliding_window"] == config["sliding_window"]
    assert hp["add_context_length"] == config.get("max_position_embeddings", 131072)  # Gemma3TextConfig's default
    # small where nothing is cached: the vocabulary, the FFN and (most) embedding widths
    assert hp["add_vocab_size"] == SMALL and hp["add_feed_forward_length"] == SMALL
    assert hp["add_embedding_length"] <= config["hidden_size"]
    names = [name for name, _, _ in tensors.rows]
    assert len(names) == len(set(names))  # llama.cpp refuses a file with a tensor twice or one it does not use


def test_written_file_reads_back(tmp_path):
    path = write(model_profile("qwen3-next-80b-a3b-thinking").config, "qwen3next", tmp_path / "m.gguf")
    reader = gguf.GGUFReader(str(path))
    assert bytes(reader.fields["general.architecture"].parts[-1]).decode() == "qwen3next"
    assert _field(reader, "qwen3next.block_count") == 48
    assert _field(reader, "qwen3next.attention.head_count_kv") == 2
    assert _field(reader, "qwen3next.ssm.inner_size") == 128 * 32
    assert path.stat().st_size < 100 * 10**6  # megabytes, not the model's 160 GB
    # every recurrent layer has its conv weight, every fourth layer its attention
    names = {t.name for t in reader.tensors}
    assert "blk.0.ssm_conv1d.weight" in names and "blk.3.attn_q.weight" in names
    assert "blk.3.ssm_in.weight" not in names


def test_unknown_architecture_is_refused():
    with pytest.raises(ValueError, match="no miniature writer"):
        build(model_profile("falcon-7b").config, "falcon")


# Lines written with llama.cpp's own format strings (src/llama-kv-cache.cpp, llama-kv-cache-iswa.cpp,
# llama-memory-recurrent.cpp, llama-context.cpp), with figures chosen for the test.
KV = ("llama_kv_cache: size = {:7.2f} MiB ({:6d} cells, {:3d} layers, {:2d}/{:d} seqs), K ({}): {:7.2f} MiB, "
      "V ({}): {:7.2f} MiB")
RS = ("llama_memory_recurrent: size = {:7.2f} MiB ({:6d} cells, {:3d} layers, {:2d} seqs {:2d} rs_seq), R ({}): "
      "{:7.2f} MiB, S ({}): {:7.2f} MiB, P ({}): {:7.2f} MiB")


def test_parser_reads_each_cache_in_its_role():
    lines = [
        "llama_context: n_ctx                 = 8192",
        "llama_context: n_ctx_seq             = 2048",
        "llama_context: kv_unified            = false",
        "llama_kv_cache_iswa: creating non-SWA KV cache, size = 2048 cells",
        "llama_kv_cache:        CPU KV buffer size =    85.00 MiB",
        KV.format(85.0, 2048, 21, 4, 4, "q8_0", 42.5, "q8_0", 42.5),
        "llama_kv_cache_iswa: creating     SWA KV cache, size = 1280 cells",
        KV.format(53.13, 1280, 21, 4, 4, "q4_0", 22.5, "f16", 30.63),
        RS.format(3.0, 4, 36, 4, 0, "f32", 1.0, "f32", 2.0, "f32", 0.0),
        "llama_context:        CPU compute buffer size =   300.01 MiB",
        "some other line: size = 3 MiB",
    ]
    f = parse(lines)
    assert f["context"] == {"n_ctx": 8192, "n_ctx_seq": 2048, "kv_unified": "false"}
    assert [c["role"] for c in f["caches"]] == ["non-SWA", "SWA"]
    swa = f["caches"][1]
    assert (swa["cells"], swa["layers"], swa["seqs"], swa["streams"]) == (1280, 21, 4, 4)
    assert (swa["type_k"], swa["k_mib"], swa["type_v"], swa["v_mib"], swa["size_mib"]) == \
        ("q4_0", "22.50", "f16", "30.63", "53.13")
    assert f["recurrent"][0]["layers"] == 36 and f["recurrent"][0]["s_mib"] == "2.00"
    assert {(b["kind"], b["mib"]) for b in f["buffers"]} == {("KV", "85.00"), ("compute", "300.01")}
    assert f["refusal"] is None
    assert "some other line: size = 3 MiB" not in memory_lines("\n".join(lines))


def test_parser_reads_a_refusal_and_a_header_that_disagrees():
    f = parse(["llama_init_from_model: quantized V cache requires flash_attn to be enabled"])
    assert f["refusal"] == "quantized V cache requires flash_attn to be enabled" and not f["caches"]
    with pytest.raises(ValueError, match="header"):
        parse(["llama_kv_cache_iswa: creating     SWA KV cache, size = 1280 cells",
               KV.format(1.0, 1536, 1, 1, 1, "f16", 0.5, "f16", 0.5)])


def test_panel_covers_the_issue():
    loads = panel()
    assert len(loads) >= 150
    assert {load.type_k for load in loads} == {load.type_v for load in loads} == set(CACHE_TYPES)
    assert any(load.type_k != load.type_v for load in loads)
    assert {load.flash_attn for load in loads} == {True, False}
    assert {load.kv_unified for load in loads} == {True, False}
    assert len({load.n_ctx for load in loads}) >= 4 and len({load.n_seq_max for load in loads}) >= 3
    assert set(MODELS.values()) >= {"llama", "qwen2", "qwen3", "qwen3moe", "gemma2", "gemma3", "phi3", "deepseek2",
                                    "qwen3next"}

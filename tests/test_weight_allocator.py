"""The weights as the engine counts them: PyTorch's caching allocator keeps a segment's end with a large
tensor (vLLM 0.21+ loads under max_split_size 20 MiB), vLLM pads the vocabulary to 64 and keeps a longrope
model's short and long caches. Held against the allocator's own snapshot of a real vLLM load."""

import json

import pytest

from conftest import ROOT
from sizing.engines.memory import (large_weight_tensors, padded_vocab, resolve_weights_dtype, segment_end_bytes,
                           weight_bytes)
from sizing.profiles import load_model
from sizing.engines.releases import find_release
from sizing.units import GiB, MiB

SNAPSHOT = json.loads((ROOT / "tests/fixtures/allocator/vllm-0.26.0-h200-minicpm3-4b-load.json").read_text())
MAX_SPLIT = 20 * MiB  # vllm/v1/worker/gpu_worker.py load_model: _scoped_allocator_max_split(max_split_size_mb=20)


def test_a_large_tensor_keeps_its_segment_end_exactly_as_the_allocator_did():
    # every block of 10 MiB or more in vLLM 0.26.0's MiniCPM3-4B load (62 gate_up of 62.5 MiB, 62 down of
    # 31.25 MiB, the 358.75 MiB embedding, the 12.5 MiB o_proj): what the allocator held beyond the request
    large = [(size, requested) for size, requested in SNAPSHOT["blocks"] if requested >= 10 * MiB]
    assert len(large) >= 62 * 3
    for size, requested in large:
        assert segment_end_bytes(requested, MAX_SPLIT) == size - requested, (size, requested)


def test_below_max_split_an_end_over_1_mib_is_split_off():
    # 12.5 MiB in a 14 MiB segment: the 1.5 MiB end is split off (the load's o_proj blocks are 13,107,200 B)
    assert segment_end_bytes(13_107_200, MAX_SPLIT) == 0
    assert segment_end_bytes(13_107_200, None) == 0
    # at or above max_split nothing is split: 62.5 MiB keeps its 1.5 MiB end; PyTorch's default splits it
    assert segment_end_bytes(65_536_000, MAX_SPLIT) == int(1.5 * MiB)
    assert segment_end_bytes(65_536_000, None) == 0
    # an end of 1 MiB or less always stays with the tensor; below 10 MiB a tensor shares a 20 MiB segment
    assert segment_end_bytes(32_768_000, None) == int(0.75 * MiB)
    assert segment_end_bytes(9 * MiB + 1, MAX_SPLIT) == 0


def test_minicpm3_weights_are_what_vllm_loaded():
    # vLLM 0.26.0 printed "Model loading took 7.73 GiB" (tests/fixtures/vllm-starts h200-0.26.0-minicpm3-4b);
    # the allocator held 8,303,306,240 B of blocks for 8,152,315,876 B of tensors (the snapshot)
    shape = load_model("tests/fixtures/vllm-starts/configs/minicpm3-4b.json")[1]
    fmt = resolve_weights_dtype("auto", shape)
    w = weight_bytes(shape, fmt, 1, range(shape.num_layers), True, True, True,
                     find_release("vllm", "0.26.0").weight_allocator)
    tensors = w.total_bytes - w.allocator_bytes
    requested = sum(r for _, r in SNAPSHOT["blocks"])
    held = sum(s for s, _ in SNAPSHOT["blocks"])
    assert abs(tensors - requested) / requested < 0.001
    assert abs(w.total_bytes - held) / held < 0.001
    assert round(w.total_bytes / GiB, 2) == 7.73
    # the ends kvsize counts are the large blocks' (the rest, 1-10 MiB tensors reusing split-off ends, is
    # what it leaves out: a few MB here)
    large_ends = sum(s - r for s, r in SNAPSHOT["blocks"] if r >= 10 * MiB)
    assert w.allocator_bytes == large_ends
    assert held - requested - large_ends < 4 * MiB


def test_releases_before_the_scoped_max_split_keep_pytorchs_default():
    # PR #41268 is in the 0.22.1 and 0.26.0 sources, not in 0.20.0
    assert find_release("vllm", "0.20.0").weight_allocator.max_split_bytes is None
    assert find_release("vllm", "0.22.1").weight_allocator.max_split_bytes == MAX_SPLIT
    assert find_release("vllm", "0.26.0").weight_allocator.max_split_bytes == MAX_SPLIT


@pytest.mark.parametrize("vocab, padded", [(73448, 73472), (128256, 128256), (151936, 151936), (32001, 32064)])
def test_the_vocabulary_is_padded_to_64(vocab, padded):
    # vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE = 64 (MiniCPM3's 73,448 rows load as 73,472)
    assert padded_vocab(vocab) == padded


def test_large_tensors_follow_vllms_merged_projections():
    # Llama-3.1-8B at TP 1: qkv 6,144 x 4,096 and o 4,096 x 4,096, gate_up 28,672 x 4,096 and down, bf16;
    # all whole multiples of 2 MiB, so no end is kept (its loads print 14.99 GiB, kvsize's parameters + RoPE)
    shape = load_model("tests/fixtures/vllm-starts/configs/llama-3.1-8b.json")[1]
    sizes = large_weight_tensors(shape, resolve_weights_dtype("auto", shape), 1, range(1), True, False)
    values = sorted(s for s in sizes if s)
    assert values == sorted([128256 * 4096 * 2, 6144 * 4096 * 2, 4096 * 4096 * 2, 28672 * 4096 * 2, 14336 * 4096 * 2])
    assert sum(segment_end_bytes(s, MAX_SPLIT) for s in sizes) == 0


def test_machete_keeps_awq_zero_points_in_the_activation_dtype_on_hopper_only():
    # Qwen3-8B with Qwen's AWQ block: vLLM 0.26.0 on an H200 logged "Using MacheteLinearKernel for
    # AutoAWQMarlinLinearMethod" and "Model loading took 5.82 GiB" (h200-0.26.0-qwen3-8b-awq); Machete's
    # transform_w_zp stores -scale x zero in bf16: 16 bits a group of 128 where the checkpoint packs 4
    from dataclasses import replace

    from sizing.capacity.scenario import Scenario

    from sizing.capacity.estimate import estimate

    shape = load_model("tests/fixtures/vllm-starts/configs/qwen3-8b-awq.json")[1]
    fmt = resolve_weights_dtype("auto", shape)
    assert (fmt.name, fmt.zero_bits) == ("int4_g128", 4)
    base = Scenario("qwen3-8b-awq", shape, "h200", 150_109_880_320, engine="vllm@0.26.0", max_model_len=8192,
                    gpu_architecture="sm90")
    hopper = estimate(base).breakdown.weights_bytes
    ampere = estimate(replace(base, gpu_architecture="sm80")).breakdown.weights_bytes
    linear = sum(p.attention + p.mlp for p in shape.layer_params)
    assert hopper - ampere == pytest.approx(linear / 128 * 12 / 8, rel=0.001)
    assert round(hopper / GiB, 2) == pytest.approx(5.82, abs=0.06)
    # symmetric GPTQ: Machete takes no zeros but leaves the checkpoint's packed qzeros (8 bits a group of 128
    # for int8) allocated, where Marlin (sm80) frees them; vLLM 0.26.0 printed 8.97 GiB on the H200
    # (h200-0.26.0-qwen3-8b-gptq-int8)
    gptq = load_model("tests/fixtures/vllm-starts/configs/qwen3-8b-gptq-int8.json")[1]
    sym = replace(base, model_name="qwen3-8b-gptq-int8", shape=gptq)
    kept = estimate(sym).breakdown.weights_bytes
    freed = estimate(replace(sym, gpu_architecture="sm80")).breakdown.weights_bytes
    assert kept - freed == pytest.approx(linear / 128 * 8 / 8, rel=0.001)
    assert round(kept / GiB, 2) == pytest.approx(8.97, abs=0.03)


def test_gptq_moe_experts_keep_the_checkpoints_zeros():
    # vLLM 0.26.0's AutoGPTQMoEMethod never hands its qzeros to the Marlin MoE conversion: a symmetric int4
    # checkpoint's experts weigh 4 + (16 + 4) / 128 bits a weight; the start printed 15.69 GiB
    # (h200-0.26.0-qwen3-30b-a3b-gptq-int4)
    from sizing.capacity.scenario import Scenario
    from sizing.capacity.estimate import estimate

    shape = load_model("tests/fixtures/vllm-starts/configs/qwen3-30b-a3b-gptq-int4.json")[1]
    e = estimate(Scenario("qwen3-30b-a3b-gptq-int4", shape, "h200", 150_109_880_320, engine="vllm@0.26.0",
                          max_model_len=32768, gpu_architecture="sm90"))
    assert round(e.breakdown.weights_bytes / GiB, 2) == pytest.approx(15.69, abs=0.04)
    older = estimate(Scenario("qwen3-30b-a3b-gptq-int4", shape, "h200", 150_109_880_320, engine="vllm@0.22.1",
                              max_model_len=32768, gpu_architecture="sm90"))
    experts = sum(p.experts for p in shape.layer_params)
    assert e.breakdown.weights_bytes - older.breakdown.weights_bytes >= experts / 128 * 4 / 8
    # its dense MLPs are unlisted (none: all MoE), its attention listed: int4 with the packed zeros Machete
    # leaves allocated, as the experts keep theirs
    from sizing.engines.memory import attention_format, engine_weight_format, expert_format

    release = find_release("vllm", "0.26.0")
    fmt = engine_weight_format(resolve_weights_dtype("auto", shape), shape, release.activation_dtype_zero_points,
                               "sm90", release.moe_keeps_checkpoint_zeros)
    assert attention_format(shape, fmt).scale_bits == expert_format(fmt).scale_bits == 16 + 4


def test_kv_heads_fewer_than_ranks_are_replicated_in_the_weights():
    # Qwen2.5-1.5B (12 heads, 2 KV heads of 128, hidden 1,536) at TP 4: each rank holds 3 query heads and one
    # whole K and V head (vLLM's QKVParallelLinear replicates), not half of one; the printed weights per rank
    # were 0.80 GiB (h200-0.26.0-qwen2.5-1.5b-tp4-fp8)
    from sizing.engines.memory import attention_projections

    shape = load_model("tests/fixtures/vllm-starts/configs/qwen2.5-1.5b.json")[1]
    qkv, o = attention_projections(shape, 0, 4)
    assert (qkv, o) == ((3 + 2) * 128 * 1536, 3 * 128 * 1536)
    fmt = resolve_weights_dtype("auto", shape)
    rank = weight_bytes(shape, fmt, 4, range(shape.num_layers), True, True)
    halves = weight_bytes(shape, fmt, 2, range(shape.num_layers), True, True)
    assert rank.layers_bytes > halves.layers_bytes / 2  # K/V do not halve again from TP 2 to TP 4


def test_the_last_stage_holds_a_tied_head_and_experts_only_formats_keep_the_rest_dense():
    from sizing.engines.memory import vocab_bytes

    # Qwen2.5-1.5B ties its head to the embedding: on one GPU one tensor, over two stages a copy on each
    shape = load_model("tests/fixtures/vllm-starts/configs/qwen2.5-1.5b.json")[1]
    assert shape.tie_word_embeddings and not shape.lm_head_params
    fmt = resolve_weights_dtype("auto", shape)
    whole = large_weight_tensors(shape, fmt, 1, range(0, 28), True, True)
    first = large_weight_tensors(shape, fmt, 1, range(0, 14), True, False)
    last = large_weight_tensors(shape, fmt, 1, range(14, 28), False, True)
    assert first[0] == last[0] == vocab_bytes(shape, 1) and whole.count(vocab_bytes(shape, 1)) == 1
    # gpt-oss: mxfp4 experts (4.25 bits a weight), attention in bf16
    oss = load_model("tests/fixtures/vllm-starts/configs/gpt-oss-20b.json")[1]
    mx = resolve_weights_dtype("auto", oss)
    sizes = large_weight_tensors(oss, mx, 1, range(1), False, False)
    qkv = (64 + 2 * 8) * 64 * 2880 * 2
    assert sizes[0] == qkv and sizes[1] == 0  # bf16: no scales beside it
    experts = oss.layer_params[0].experts
    assert sum(sizes[4:]) == mx.bytes_for(experts // 3 * 2) + mx.bytes_for(experts // 3)


def test_an_unrepresentative_start_says_what_it_loaded():
    # the GPTQ-Int8 start without modules_in_block_to_quantize printed "Model loading took 15.27 GiB", which is
    # Qwen3-8B in bf16: kvsize's bf16 figure for it reproduces the number its reason quotes
    from sizing.evidence.starts import load_corpus

    start = next(s for s in load_corpus() if s.id == "h200-0.26.0-qwen3-8b-gptq-int8-unlisted")
    assert start.status == "unrepresentative" and "15.27 GiB" in start.reason
    shape = load_model("tests/fixtures/vllm-starts/configs/qwen3-8b-gptq-int8-unlisted.json")[1]
    bf16 = weight_bytes(shape, resolve_weights_dtype("bf16", shape), 1, range(shape.num_layers), True, True,
                        True, find_release("vllm", "0.26.0").weight_allocator)
    assert f"{bf16.total_bytes / GiB:.2f}" == start.printed.model_loading_gib[0] == "15.27"


def _snapshot(name):
    return json.loads((ROOT / f"tests/fixtures/allocator/vllm-0.26.0-h200-{name}-load.json").read_text())


def test_multimodal_rope_caches_four_times_the_positions():
    # Qwen3-VL-2B served text-only: vLLM's MRotaryEmbedding enlarges its cache to 4 x max_position_embeddings
    # (mrope.py): the snapshot's one rotary block is 4 x 262,144 x 128 x 2 B = 268,435,456 B; kvsize counted one
    # quarter of it before, the 0.19 GiB its weights were low by
    from sizing.engines.memory import rotary_cache_bytes

    snap = _snapshot("qwen3-vl-2b-instruct")
    rope = [r for _, r, where in snap["blocks"] if "rotary_embedding" in where]
    shape = load_model(snap["config"])[1]
    assert shape.mrope and rope == [rotary_cache_bytes(shape)] == [268_435_456]
    w = weight_bytes(shape, resolve_weights_dtype("auto", shape), 1, range(shape.num_layers), True, True, False,
                     find_release("vllm", "0.26.0").weight_allocator)
    held = sum(s for s, _, _ in snap["blocks"])
    assert abs(w.total_bytes - held) / held < 0.001


def test_machete_zero_points_are_the_activation_dtype_to_the_byte():
    # Qwen3-8B-AWQ on an H200: Machete's transform_w_zp (machete.py:118) leaves one bf16 zero per group of 128
    # weights, as many bytes as the scales (auto_awq.py:507); the packed weights are half a byte a weight
    snap = _snapshot("qwen3-8b-awq")
    by_line = {}
    for _, requested, where in snap["blocks"]:
        by_line[where] = by_line.get(where, 0) + requested
    shape = load_model(snap["config"])[1]
    linear = sum(p.attention + p.mlp for p in shape.layer_params)
    assert by_line["model_executor/kernels/linear/mixed_precision/machete.py:96"] == linear // 2
    assert by_line["model_executor/kernels/linear/mixed_precision/machete.py:118"] == linear // 128 * 2
    assert by_line["model_executor/layers/quantization/auto_awq.py:507"] == linear // 128 * 2

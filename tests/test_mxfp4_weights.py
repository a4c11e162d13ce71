"""MXFP4 routed experts as vLLM keeps them on Hopper (sizing/engines/mxfp4.py), against the real starts of
gpt-oss-20b, and the starts whose KV pool is a small share of the GPU, where any unmodelled term is a large
share of the pool."""

import pytest

from sizing.engines.memory import (WEIGHT_FORMATS, engine_weight_format, resolve_weights_dtype, rotary_cache_bytes,
                                   weight_bytes)
from sizing.engines.mxfp4 import expert_tensors, intermediate_per_rank, mxfp4_moe_layout
from sizing.engines.releases import find_release
from sizing.evidence.starts import CORPUS, check_start, check_start_log, load_corpus
from sizing.profiles import gpu_profile, load_model
from sizing.units import GiB

SIZED = [s for s in load_corpus() if s.status == "sized"]
GPT_OSS = [s for s in SIZED if "gpt-oss" in s.config]
SMALL_POOL_SHARE = 0.20


def _layout(version: str, architecture: str = "sm90"):
    release = find_release("vllm", version)
    return mxfp4_moe_layout(release.engine, release.first_version, architecture, "mxfp4")


def test_the_hopper_backend_rounds_the_split_intermediate_size_up_to_64():
    # mxfp4_round_up_hidden_size_and_intermediate_size, TRITON: gpt-oss's 2,880 is 1,440 a rank at TP 2, built 1,472
    layout = _layout("0.33.0")
    assert layout.backend == "TRITON"
    assert [intermediate_per_rank(layout, 2880, tp) for tp in (1, 2, 4, 8)] == [2880, 1472, 768, 384]


def test_the_swizzled_scales_and_fp32_biases_of_one_gpt_oss_20b_layer():
    # 32 experts, hidden 2,880, TP 1: scale rows padded to 256 (5,760 -> 5,888; 2,880 -> 3,072), the 90 scale
    # groups to 0 mod 4 from 0.26 (92) and to an even count before; the biases in fp32
    new, old = _layout("0.33.0"), _layout("0.25.1")
    assert expert_tensors(new, 32, 2880, 2880, 1, True) == [
        32 * 5760 * 1440, 32 * 5888 * 92, 32 * 2880 * 1440, 32 * 3072 * 92, 32 * 5760 * 4, 32 * 2880 * 4]
    assert expert_tensors(old, 32, 2880, 2880, 1, True)[1::2][:2] == [32 * 5888 * 90, 32 * 3072 * 90]
    # TP 2: 46 scale groups of the down projection (1,472 / 32) become 48
    assert expert_tensors(new, 32, 2880, 2880, 2, False)[3] == 32 * 3072 * 48


def test_the_layout_is_only_where_it_was_read_from_source():
    assert _layout("0.33.0", "sm100") is None and _layout("0.26.0", "sm80") is None
    assert _layout("0.33.0", "sm80").backend == "MARLIN"  # tests/test_small_gpu_mechanisms.py
    assert _layout("0.19.1") is None  # 0.10's Marlin and 0.14's kept checkpoint scales differ; not read
    release = find_release("vllm", "0.33.0")
    assert mxfp4_moe_layout(release.engine, release.first_version, "sm90", "fp8") is None
    assert mxfp4_moe_layout("sglang", release.first_version, "sm90", "mxfp4") is None


def test_gpt_oss_builds_its_rotary_cache_in_fp32():
    # gpt_oss.py get_rope(dtype=torch.float32): 4,096 x 32 YaRN positions x 64 x 4 bytes
    _, shape = load_model(str(CORPUS / "configs" / "gpt-oss-20b.json"))
    assert rotary_cache_bytes(shape) == 131072 * 64 * 4


def test_an_unquantized_serving_of_an_mxfp4_checkpoint_keeps_its_own_bytes():
    _, shape = load_model(str(CORPUS / "configs" / "gpt-oss-20b.json"))
    bf16 = engine_weight_format(WEIGHT_FORMATS["bf16"], shape, None, "sm90", False, _layout("0.33.0"))
    assert bf16.moe_layout is None
    mx = engine_weight_format(resolve_weights_dtype("auto", shape), shape, None, "sm90", False, _layout("0.33.0"))
    layers = range(shape.num_layers)
    assert weight_bytes(shape, mx, 2, layers, True, True).layers_bytes > \
        weight_bytes(shape, resolve_weights_dtype("auto", shape), 2, layers, True, True).layers_bytes


# gpt-oss-120b at TP 4 (0.33.0) prints 16.35 GiB where kvsize gives 16.324: 27 MB more on each rank, about 0.75 MB a
# layer (the size of a bf16 router, 2,880 x 128), not found in the TP 4 sharding yet; 0.02% of its KV budget
TP4_WEIGHTS_GAP = "gpt-oss-120b at TP 4: 27 MB a rank above kvsize's weights, the mechanism not found yet"


@pytest.mark.parametrize("start", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=TP4_WEIGHTS_GAP))
                                   if s.id == "h200-0.33.0-gpt-oss-120b-tp4" else s for s in GPT_OSS],
                         ids=[s.id for s in GPT_OSS])
def test_model_loading_of_every_gpt_oss_start_to_the_printed_hundredth(start):
    # vLLM prints "Model loading took" to 0.01 GiB: kvsize within that rounding (0.005) and a little more; before
    # the Hopper layout the TP 2 start was 0.16 GiB under it and the TP 1 starts 0.07
    weights = check_start(start).term("weights")
    assert abs(weights.predicted - weights.printed) < 0.008, (weights.predicted, weights.printed)


def test_the_corpus_holds_gpt_oss_at_tp_1_and_2():
    assert {s.args.get("tensor_parallel_size", 1) for s in GPT_OSS} >= {1, 2}


def _pool_share(start) -> float:
    return min(map(float, start.printed.available_kv_gib)) * GiB / gpu_profile(start.gpu).memory_bytes


SMALL_POOLS = [s for s in SIZED if s.printed.available_kv_gib and _pool_share(s) < SMALL_POOL_SHARE]


def test_the_corpus_holds_small_pools():
    # H100 starts of Qwen3-30B-A3B, OLMo 3.1 32B at 0.6 and Llama 4 Scout on an H200: the bar below must bite
    assert len(SMALL_POOLS) >= 5
    assert {s.gpu for s in SMALL_POOLS} >= {"h100-sxm", "h200"}


# the two small pools found above the engine by small-pool-0.33 (predicted before they ran), open in issue 49 and named
# with their terms in tests/test_vllm_starts.py (SCOUT_V2_PEAK, LLAMA70_FP8W_GRAPHS)
SMALL_POOL_MISSES = {
    "h200-0.33.0-llama-4-scout-17b-16e-instruct-fp8-dynamic-text":
        "Llama-4-Scout FP8 on 0.33.0: torch peak 2.76 GiB printed against kvsize's 2.08; +2.96%",
    "h200-0.33.0-llama-3.1-70b-fp8w-u60":
        "Llama-3.1-70B with fp8 weights on 0.33.0: the allocator's split held FlashAttention 3's accumulators "
        "twice (estimate 2.25 GiB against 2.08), the copy the answer names; +1.90%"}


def _small_pool(s):
    reason = SMALL_POOL_MISSES.get(s.id)
    return pytest.param(s, id=s.id, marks=[pytest.mark.xfail(strict=True, reason=reason)] if reason else [])


@pytest.mark.parametrize("check", [check_start, check_start_log], ids=["estimate", "check-log"])
@pytest.mark.parametrize("start", [_small_pool(s) for s in SMALL_POOLS])
def test_every_small_pool_within_one_percent(start, check):
    # a pool under 20% of the GPU: every term kvsize leaves out is a large share of it. Held to 1% both ways with
    # no known-gap exemption (test_vllm_starts.py's 1% test admits some)
    result = check(start)
    for term in ("kv_budget", "kv_tokens"):
        t = result.term(term)
        assert t is not None and abs(t.error) < 0.01, f"{term}: {t.predicted:,.2f} against {t.printed:,.2f}"

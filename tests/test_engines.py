"""Engine rules against worked examples from each engine's source, and capacity properties."""

from dataclasses import replace

import pytest

from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import scenario
from sizing.errors import KvsizeError
from sizing.engines import get_engine
from sizing.capacity.concurrency import concurrency_fits
from sizing.capacity.estimate import estimate
from sizing.capacity.budget import _layout, _pool
from sizing.units import GiB


def test_vllm_uniform_worked_example():
    # vllm/v1/core/kv_cache_utils.py get_num_blocks: num_blocks = available // page_size // num_layers
    # Llama-3.1-8B: page = 16 tokens x 2 (K,V) x 8 heads x 128 x 2 B = 65,536 B; 10 GiB fixed budget
    e = estimate(scenario(kv_cache_memory_bytes=10 * GiB, max_model_len=8192))
    assert e.num_blocks == 10 * GiB // 65_536 // 32 == 5120
    assert e.max_tokens == 5120 * 16  # "GPU KV cache size: 81,920 tokens"
    # "Maximum concurrency for 8,192 tokens per request": 5120 / cdiv(8192, 16) = 10.00x
    assert e.max_concurrency_ratio == 10.0 and e.max_concurrency == 10


def test_vllm_hybrid_worked_example():
    # gpt-oss-20b: 12 sliding (window 128) + 12 full layers; group_size 12, two groups;
    # page = 16 x 2 x 8 x 64 x 2 = 32,768 B; num_blocks = 10 GiB // (32,768 x 12) = 27,306
    e = estimate(scenario("gpt-oss-20b", engine="vllm@0.19", kv_cache_memory_bytes=10 * GiB, max_model_len=8192))
    assert e.num_blocks == 27_306
    # vLLM 0.19 logs num_blocks // groups x block size (kv_cache_utils.py _report_kv_cache_config)
    assert e.max_tokens == 27_306 // 2 * 16
    # per request: full cdiv(8192,16) = 512 blocks; sliding min(128 - 1 + 8192, 8192) -> 512 + 1 = 513
    assert e.max_concurrency == 27_306 // (512 + 513)


def test_vllm_033_sliding_window_keeps_two_batches_in_flight():
    # vLLM 0.26+ (config/vllm.py max_in_flight_tokens, PR #47728): async scheduling keeps 2 x 8192 tokens
    # in flight; at max_model_len 131,072 a sliding layer holds cdiv(128 - 1 + 16,384, 16) + 1 = 1,033 blocks
    # beside the full layer's 8,192: 27,306 / 9,225 = 2.96x, and the log says int(2.96 x 131,072) tokens
    # (fixtures/vllm-reference/profile-gpt-oss-20b.json: 2.96, 387,973).
    e = estimate(scenario("gpt-oss-20b", engine="vllm@0.33", kv_cache_memory_bytes=10 * GiB, max_model_len=131_072))
    assert e.max_concurrency_ratio == 27_306 / (8192 + 1033)
    assert e.max_tokens == int(27_306 / (8192 + 1033) * 131_072) == 387_973
    older = estimate(scenario("gpt-oss-20b", engine="vllm@0.25", kv_cache_memory_bytes=10 * GiB,
                              max_model_len=131_072))
    assert older.max_concurrency_ratio == 27_306 / (8192 + 521)  # one batch: cdiv(127 + 8192, 16) + 1


def test_sglang_token_pool():
    # sglang profile_max_num_token: max_total_num_tokens = rest_memory // cell_size (cell = 131,072 B)
    e = estimate(scenario(engine="sglang", kv_cache_memory_bytes=10 * GiB, max_model_len=8192))
    assert e.max_tokens == 10 * GiB // 131_072 == 81_920


def test_sglang_budget_rule():
    # profile_max_num_token (sglang model_runner.py): rest = free after weights - free_at_start x (1 - f),
    # free_at_start being total - non_torch (CUDA context, NCCL) = f x free_at_start - weights
    e = estimate(scenario(engine="sglang", max_model_len=8192, memory_fraction=0.85))
    b = e.breakdown
    assert e.kv_budget_bytes == int((b.total_bytes - b.non_torch_bytes) * 0.85) - b.weights_bytes


@pytest.mark.parametrize("version, gpu, tp, expected", [
    # sglang 0.4.7 server_args.py: 0.87 at TP 2 on GPUs up to 81920 MiB (H100: 81559 MiB)
    ("0.4.7", "h100-sxm", 2, 0.87),
    # 0.4.8-0.5.2: round((24564 - (2.8 + 0.1) x 1024) / 24564, 3) on an RTX 4090
    ("0.5.2", "rtx-4090", 1, 0.879),
    # 0.5.3+: reserved = max(512 + 8192 x 1.5 + 256 x 2 + 128, 10240) = 13440 MiB; (81559 - 13440) / 81559
    ("0.5.5", "h100-sxm", 1, 0.835),
    # 0.5.12+: plus 8 MiB x 58 piecewise prefill graphs (sizes 4..8192) = 13904 MiB
    ("0.5.23", "h100-sxm", 1, 0.830),
])
def test_sglang_default_mem_fraction_static_by_release(version, gpu, tp, expected):
    from sizing.profiles import gpu_profile

    g = gpu_profile(gpu)
    assert get_engine(f"sglang@{version}").default_fraction(g.nvml_memory_mib, tp, 1) == expected


def test_trtllm_blocks_of_32_tokens():
    e = estimate(scenario(engine="trtllm", kv_cache_memory_bytes=10 * GiB, max_model_len=8192))
    assert e.block_size == 32
    assert e.num_blocks == 10 * GiB // (32 * 131_072)


def test_lmdeploy_fraction_of_free_memory():
    e = estimate(scenario(engine="lmdeploy", k_cache_dtype="lmdeploy_int8", v_cache_dtype="lmdeploy_int8",
                          max_model_len=8192))
    b = e.breakdown
    assert e.kv_budget_bytes == int((b.total_bytes - b.weights_bytes - b.non_torch_bytes) * 0.8)


def test_llamacpp_pads_context_to_256():
    # llama.cpp keeps n_ctx cells per layer; 1000 tokens are padded to 1024
    e = estimate(scenario(engine="llamacpp", k_cache_dtype="q8_0", v_cache_dtype="q8_0", max_model_len=1000))
    assert e.kv_reserved_bytes_per_sequence == 1024 * e.kv_bytes_per_token


def test_breakdown_adds_up():
    for engine, fmt in [("vllm", "auto"), ("sglang", "fp8_e4m3"), ("trtllm", "nvfp4"), ("lmdeploy", "lmdeploy_int4"),
                        ("llamacpp", "q4_0"), ("ideal", "kivi2")]:
        e = estimate(scenario(engine=engine, k_cache_dtype=fmt, v_cache_dtype=fmt, max_model_len=16384))
        assert sum(e.breakdown.terms().values()) == e.breakdown.total_bytes


contexts = st.integers(min_value=1, max_value=131_072)


@settings(max_examples=40, deadline=None)
@given(a=contexts, b=contexts, engine=st.sampled_from(["vllm", "sglang", "trtllm", "ideal"]),
       model=st.sampled_from(["llama-3.1-8b", "gpt-oss-20b", "mistral-7b-v0.1", "qwen3-next-80b-a3b-thinking"]))
def test_monotone_in_context(a, b, engine, model):
    lo, hi = sorted((a, b))
    e_lo = estimate(scenario(model, engine=engine, max_model_len=lo))
    e_hi = estimate(scenario(model, engine=engine, max_model_len=hi))
    assert e_lo.kv_bytes_per_sequence <= e_hi.kv_bytes_per_sequence
    assert e_lo.max_concurrency >= e_hi.max_concurrency


@settings(max_examples=40, deadline=None)
@given(context=contexts, engine=st.sampled_from(["vllm", "sglang", "ideal", "llamacpp"]),
       model=st.sampled_from(["llama-3.1-8b", "gpt-oss-20b", "gemma-2-9b", "nemotron-h-8b-base-8k"]))
def test_max_concurrency_fits_and_one_more_does_not(context, engine, model):
    s = scenario(model, engine=engine, max_model_len=context)
    e = estimate(s)
    shape = e.engine.build_model(s.shape, e.k_format, e.v_format)[0]  # as the engine builds it (llama.cpp: f32 state)
    layout = _layout(shape, e.k_format, e.v_format, 1, range(shape.num_layers), None, s.format_options)
    pool = _pool(e.engine, layout, e.block_size, e.scenario.max_num_batched_tokens, e.scenario.pipeline_parallel_size)
    state = 0 if pool.holds_recurrent else layout.state_bytes_per_sequence()
    if e.state_pool is not None:
        # SGLang's state slots are set aside whole; the KV pool holds the rest, and the slots cap the requests
        budget = e.kv_budget_bytes - e.state_pool.reserved_bytes
        assert e.state_pool.slot_bytes == state and 0 < e.max_concurrency <= e.state_pool.max_requests
        assert concurrency_fits(pool, budget, context, 0, e.max_concurrency)
        assert (e.max_concurrency == e.state_pool.max_requests
                or not concurrency_fits(pool, budget, context, 0, e.max_concurrency + 1))
        return
    assert concurrency_fits(pool, e.kv_budget_bytes, context, state, e.max_concurrency)
    assert not concurrency_fits(pool, e.kv_budget_bytes, context, state, e.max_concurrency + 1)


@settings(max_examples=30, deadline=None)
@given(concurrency=st.integers(1, 64), model=st.sampled_from(["llama-3.1-8b", "gpt-oss-20b"]))
def test_max_context_fits_at_concurrency(concurrency, model):
    s = scenario(model, engine="vllm", max_model_len=8192, concurrency=concurrency)
    e = estimate(s)
    ctx = e.max_context_at_concurrency
    if ctx:
        assert estimate(replace(s, max_model_len=ctx)).fits
        if ctx < s.shape.max_position_embeddings:
            assert not estimate(replace(s, max_model_len=ctx + 1)).fits


FAMILIES = [["fp16", "fp8_e4m3", "nvfp4"], ["q8_0", "q5_0", "q4_0"], ["q5_1", "q4_1"],
            ["lmdeploy_int8", "lmdeploy_int4"], ["kivi4", "kivi2"], ["fp8_per_token_head", "nvfp4"]]


@settings(max_examples=30, deadline=None)
@given(family=st.sampled_from(FAMILIES), context=st.integers(1, 65536),
       model=st.sampled_from(["llama-3.1-8b", "qwen3-8b", "gpt-oss-20b", "deepseek-v3"]))
def test_fewer_bits_never_more_bytes(family, context, model):
    sizes = [estimate(scenario(model, engine="ideal", k_cache_dtype=f, v_cache_dtype=f, max_model_len=context))
             .kv_bytes_per_sequence for f in family]
    assert sizes == sorted(sizes, reverse=True)


def test_a_scenarios_cached_hash_follows_its_fields():
    # Scenario and ModelShape keep their hash once computed (sizing/hashing.py): a copy with another
    # field must hash anew, and a pickled copy must not carry the stored hash across processes.
    import pickle
    from dataclasses import replace

    from helpers import scenario

    s = scenario("llama-3.1-8b")
    hash(s)
    longer = s.evolve(max_model_len=4096)
    assert longer == replace(s, max_model_len=4096) and hash(longer) == hash(replace(s, max_model_len=4096))
    assert longer != s
    assert "_hash_once" not in pickle.loads(pickle.dumps(s)).__dict__
    assert pickle.loads(pickle.dumps(s)) == s
    with pytest.raises(TypeError, match="no field max_len"):
        s.evolve(max_len=1)


def test_per_gpu_notes_say_what_changes_with_tensor_parallelism():
    from sizing.capacity.scenario import Scenario
    from sizing.capacity.estimate import estimate
    from sizing.capacity.record import tensor_parallel_notes
    from sizing.profiles import gpu_profile, load_model

    g = gpu_profile("h200")

    def notes(model, tp):
        name, shape = load_model(model)
        return " | ".join(tensor_parallel_notes(estimate(Scenario(name, shape, g.name, g.memory_bytes,
                                                                  engine="vllm@0.22", tensor_parallel_size=tp))))

    assert notes("llama-3.1-70b", 1) == ""
    assert "each GPU holds 2 of 8 KV heads" in notes("llama-3.1-70b", 4)
    assert "MLA latent is not split" in notes("deepseek-v2", 8)
    # Qwen3-Next: 16 heads, 2 KV heads (profiles/models/qwen3-next-80b-a3b-thinking.json): replicated at TP 4
    assert "2 KV heads over 4 GPUs: each holds one, replicated" in notes("qwen3-next-80b-a3b-thinking", 4)


def test_an_sglang_answer_does_not_depend_on_the_length_estimated_before_it():
    # SGLang's default --mem-fraction-static reads the context length; a stage's setup cached at one length
    # once answered the next length with the first length's fraction (a sweep's rows and a later estimate).
    from sizing.capacity.budget import _SETUPS

    long = scenario(engine="sglang", max_model_len=131072, concurrency=1)
    _SETUPS.clear()
    fresh = estimate(long)
    _SETUPS.clear()
    estimate(replace(long, max_model_len=4096))
    after_short = estimate(long)
    assert after_short.kv_budget_bytes == fresh.kv_budget_bytes
    assert after_short.max_tokens == fresh.max_tokens


@pytest.mark.parametrize("field", ["gpu_memory_bytes", "kv_cache_memory_bytes", "non_torch_bytes", "cuda_graph_bytes"])
@pytest.mark.parametrize("value", [3.6e182, 85e9, True, 2**60])
def test_bytes_are_whole_and_bounded_or_refused_in_one_line(field, value):
    # A report field fuzzed to 3.6e182 once reached the pool arithmetic as a float, where n + 1 == n and the count
    # of requests never ended: bytes are whole numbers up to 1 PiB, refused by name otherwise.
    with pytest.raises(KvsizeError, match="must be a whole number of bytes of at most"):
        estimate(replace(scenario(), **{field: value}))


def test_sglangs_mamba_slots_follow_each_release_line():
    # SGLang's state pool by release (sources in profiles/engines/sglang-0.5.12-0.5.23.json): 0.5.12-0.5.13 cap the
    # running requests at a third of the slots, 0.5.14 on at a fifth (the radix cache's two tracking slots under the
    # overlap scheduler), and from 0.5.17 the padding slot comes out of the ratio's share; 0.5.7-0.5.11 size it as
    # 0.5.12-0.5.13 do; 0.5.3-0.5.6 (a fixed 512 slots for Nemotron-H) are not modelled and say so
    def run(version):
        return estimate(scenario("nemotron-h-8b-base-8k", "h200", engine=f"sglang@{version}", max_model_len=8192))

    e13, e16, e23, e11, e6 = run("0.5.13"), run("0.5.16"), run("0.5.23"), run("0.5.11"), run("0.5.6")
    assert e13.state_pool.slots == e16.state_pool.slots == e23.state_pool.slots + 1
    assert e11.state_pool.slots_per_request == 3 and e11.state_pool.full_memory_ratio == 0.9
    assert e13.max_concurrency == e13.state_pool.slots // 3 > e16.max_concurrency == e16.state_pool.slots // 5
    assert e23.max_concurrency == e23.state_pool.slots // 5
    # 0.5.23 counts the padding slot inside the ratio's share, so it serves one slot fewer from the same bytes
    assert e16.state_pool.reserved_bytes == e23.state_pool.reserved_bytes and e16.max_tokens == e23.max_tokens
    assert e6.state_pool is None and any("not modelled (SGLang 0.5.7 on is)" in w for w in e6.warnings)
    assert any(f"at most {e23.max_concurrency:,} requests run at once" in w for w in e23.warnings)

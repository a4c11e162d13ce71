"""The program pace of vLLM's TRITON_ATTN decode (sizing/planners/step_model.py, docs/formulas.md 'Serving
simulation'): each program walks its cache one tile after another, so a step's KV read is never shorter than its
longest program's tokens at the pace, layer after layer, however few programs run."""

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError

from helpers import scenario
from sizing.cache.layers import SlidingWindowSpec
from sizing.planners.graph_steps import SPLIT_KV_SEGMENTS
from sizing.planners.serving import serving_replica
from sizing.planners.step_model import (QueryGroupWaves, StepOverhead, program_rounds_seconds, queries_per_kv_head,
                                        query_block_positions, query_tile_fill, step_overhead)
from sizing.planners.step_notes import simulation_source
from sizing.profiles import gpu_profile, load_model, measured_efficiency

ROOT = Path(__file__).resolve().parents[1]


def _replica(model="llama-3.1-8b", fmt="int8_per_token_head"):
    g = gpu_profile("h200")
    s = scenario(model, "h200", max_model_len=32768, memory_fraction=0.9, max_num_batched_tokens=8192,
                 max_num_seqs=1024, k_cache_dtype=fmt, v_cache_dtype=fmt)
    return serving_replica(s, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors, measured_efficiency())[0]


def _kv(model, decoding: int, tokens: int) -> float:
    return model.gpu_seconds(decoding, decoding * tokens, []) - model.gpu_seconds(decoding, 0, [])


def test_one_long_request_reads_at_its_segments_pace_not_the_hbm_rate():
    model = _replica()
    pace = step_overhead().engine_program_pace_tokens_per_s["int8_per_token_head"].split
    assert model.kv_split_pace_tokens_per_s == pace and model.kv_split_segments == SPLIT_KV_SEGMENTS == 16
    unpaced = replace(model, kv_split_pace_tokens_per_s=0.0)
    for tokens in (8000, 32000):
        paced = _kv(model, 1, tokens)
        # 32 layers of one 16th of the cache each, at the pace (the step model rounds a length to 1/64 of itself)
        assert paced == pytest.approx(32 * tokens / 16 / pace, rel=0.02)
        assert paced > 3 * _kv(unpaced, 1, tokens)  # 8 KV heads x 16 segments = 128 programs: far from the HBM rate


def test_the_pace_grows_with_the_programs_tokens_and_not_with_their_count():
    model = _replica()
    # 1 to 16 requests split their caches (the threshold is 128 programs over 8 KV heads); the pace bounds each
    # program's walk, so at a fixed length more requests do not lengthen it while it binds
    assert model.split_kv_requests == 16
    one, two = _kv(model, 1, 32000), _kv(model, 2, 32000)
    assert two == pytest.approx(one, rel=0.01)
    assert _kv(model, 1, 16000) == pytest.approx(one / 2, rel=0.02)


def test_a_whole_request_program_reads_at_the_whole_pace_past_the_split():
    whole = step_overhead().engine_program_pace_tokens_per_s["int8_per_token_head"].whole
    # Qwen2.5-0.5B: 2 KV heads, so 65 requests (one past the split) are 130 programs, a third of a wave: each walks
    # its request's 8,000 tokens in 24 layers, longer than the wave's bytes take at the format's share
    model = _replica("qwen2.5-0.5b")
    assert model.kv_whole_pace_tokens_per_s == whole and model.split_kv_requests == 64
    decoding = 65
    assert decoding * model.kv_heads_per_rank <= model.kv_wave_programs
    assert _kv(model, decoding, 8000) == pytest.approx(24 * 8000 / whole, rel=0.02)
    assert _kv(replace(model, kv_whole_pace_tokens_per_s=0.0), decoding, 8000) < 0.7 * _kv(model, decoding, 8000)
    # Llama-3.1-8B's 8 KV heads fill the wave's bytes first: there the pace does not bind, and never shortens a read
    llama = _replica()
    assert _kv(llama, 24, 8000) == _kv(replace(llama, kv_whole_pace_tokens_per_s=0.0), 24, 8000) >= 32 * 8000 / whole


def test_a_windowed_layer_walks_its_window_only():
    model = _replica("gpt-oss-20b")
    layout = model.layout
    windows = [spec.window for spec in layout.kv.values() if isinstance(spec, SlidingWindowSpec)]
    full = len(layout.kv) - len(windows)
    assert windows and full
    assert layout.read_tokens(32000) == full * 32000 + sum(min(32000, w) for w in windows)
    assert layout.read_tokens(100) == len(layout.kv) * 100


def test_a_format_without_its_kernels_waves_cannot_take_a_pace():
    data = step_overhead().model_dump()
    data["engine_program_pace_tokens_per_s"] = {"bf16": {"whole": 1e7, "split": 1e7}}
    with pytest.raises(ValidationError, match="engine_program_pace_tokens_per_s"):
        StepOverhead.model_validate(data)
    data["engine_program_pace_tokens_per_s"] = {"int8_per_token_head": {"whole": 0.0, "split": 1e7}}
    with pytest.raises(ValidationError):
        StepOverhead.model_validate(data)


def test_a_twin_format_takes_its_kernels_pace():
    # vLLM runs fp8_per_token_head through int8_per_token_head's kernel (engine_kernel_twins)
    assert _replica(fmt="fp8_per_token_head").kv_split_pace_tokens_per_s == _replica().kv_split_pace_tokens_per_s


def test_bf16_decode_has_no_program_pace():
    model = _replica(fmt="auto")
    assert model.kv_split_pace_tokens_per_s == model.kv_whole_pace_tokens_per_s == 0.0


@pytest.mark.parametrize(("model", "queries", "fill"), [
    ("llama-3.1-8b", 4, 1.0),          # BLOCK_Q 4 x 4 = 16 rows
    ("qwen2.5-7b-instruct", 7, 0.875),  # BLOCK_Q 2 x 7 = 14 of 16
    ("qwen2.5-0.5b", 7, 0.875),
    ("qwen3-30b-a3b", 8, 1.0),          # BLOCK_Q 2 x 8
])
def test_a_prompt_fills_the_triton_programs_query_rows_by_its_query_heads_a_kv_head(model, queries, fill):
    shape = load_model(model)[1]
    assert queries_per_kv_head(shape) == queries and query_tile_fill(shape) == fill
    share = step_overhead().engine_prefill_attention_share["int8_per_token_head"]
    assert _replica(model).prefill_attention_share == pytest.approx(share * fill)
    assert _replica(model, fmt="auto").prefill_attention_share == 1.0  # bf16's prompt attention: FlashAttention


def test_more_query_heads_a_kv_head_than_a_tile_take_the_next_power_of_two():
    # 20 query heads a KV head: BLOCK_M 32, one position a program, 20 of 32 rows; 6: BLOCK_Q 2, 12 of 16
    assert query_tile_fill(SimpleNamespace(num_attention_heads=40, num_kv_heads=2)) == 20 / 32
    assert query_tile_fill(SimpleNamespace(num_attention_heads=12, num_kv_heads=2)) == 12 / 16
    assert query_tile_fill(SimpleNamespace(num_attention_heads=32, num_kv_heads=32)) == 1.0


def test_a_pace_carried_to_another_gpu_says_so():
    carried = simulation_source("vllm", "0.33.0", "h100-sxm", "int8_per_token_head")
    assert "int8_per_token_head's program pace unchanged" in carried
    assert "program pace" not in simulation_source("vllm", "0.33.0", "h200", "int8_per_token_head")
    assert "program pace" not in simulation_source("vllm", "0.33.0", "h100-sxm", "bf16")
    assert "fp8_per_token_head's program pace" in simulation_source("vllm", "0.33.0", "h100-sxm", "fp8_per_token_head")


def test_split_segments_run_in_rounds_of_the_programs_an_sm_holds():
    t, alone, sm = 1_000, 8e6, 20e6
    # no more programs than SMs: one each, at the pace alone
    assert program_rounds_seconds(132, 132, 132, 4, t, alone, sm) == pytest.approx(t / alone)
    # two an SM share the SM's rate (10 a microsecond each) but the pace alone (8) is slower still
    assert program_rounds_seconds(264, 264, 132, 4, t, alone, sm) == pytest.approx(t / alone)
    # four an SM: the SM's rate shared, 5 each
    assert program_rounds_seconds(528, 528, 132, 4, t, alone, sm) == pytest.approx(t / 5e6)
    # one program past a full round starts a round of its own, alone on its SM
    assert program_rounds_seconds(529, 529, 132, 4, t, alone, sm) == pytest.approx(t / 5e6 + t / alone)
    assert program_rounds_seconds(1056, 1056, 132, 4, t, alone, sm) == pytest.approx(2 * t / 5e6)


def test_the_fitted_rounds_come_from_the_traces_the_fit_names():
    pace = step_overhead().engine_program_pace_tokens_per_s["int8_per_token_head"]
    # fitted on b14's, b16's and b18's Qwen3-32B traces (scripts/fit_serving_kernels.py): a few programs an SM, and
    # an SM's rate above one program's pace (else co-resident programs would gain nothing)
    assert 2 <= pace.split_programs_per_sm <= 8
    assert pace.split < pace.split_sm < pace.split_programs_per_sm * pace.split
    model = _replica()
    assert (model.kv_split_programs_per_sm, model.kv_split_sm_tokens_per_s) == (pace.split_programs_per_sm,
                                                                                 pace.split_sm)
    assert model.multiprocessors == gpu_profile("h200").multiprocessors


def _trace_steps(tag: str) -> tuple[dict, dict[int, tuple[float, int]]]:
    """(the server, and by requests decoding the median period in seconds of its decode-only steps with the cached
    tokens each request holds in their point) of one traced server; where two of its points passed through a count,
    the one with more steps there."""
    from measure.steps import decode_groups, traced_servers
    server = next(s for s in traced_servers() if s["tag"] == tag)
    out: dict[int, dict] = {}
    for g in decode_groups(server, least=1):
        if g["steps"] > out.get(g["decoding"], {"steps": 0})["steps"]:
            out[g["decoding"]] = g
    return server, {n: (g["measured_s"], g["cached"]) for n, g in out.items()}


@pytest.mark.parametrize(("tag", "below", "above"), [
    # Qwen2.5-3B, 2 KV heads x 16 segments: 33 requests are 1,056 programs (two rounds of 528 on 132 SMs), 34 need a
    # third; 49 -> 50 crosses 1,584. Qwen2.5-7B, 4 KV heads: 24 -> 25 crosses 1,584 (b18 at 8,000 tokens, b23 at
    # 16,000). None of these servers is in the fit.
    ("b23-qwen25-3b-int8", 33, 34),
    ("b23-qwen25-3b-int8", 49, 50),
    ("b23-qwen25-7b-int8", 24, 25),
    ("b18-qwen25-7b-int8", 24, 25),
])
def test_split_decode_steps_climb_where_the_segments_need_another_round(tag, below, above):
    # the simulation runs the rounds one after another, so it climbs 1.5-2.1 times as much there and then holds
    # through the round, where the engine's rounds overlap and it rises through the round
    _assert_climb(tag, below, above, lambda model: model.split_kv_requests >= above, within=0.10)


def _assert_climb(tag: str, below: int, above: int, kernel, within: float) -> None:
    """One request more adds 1/n of the cache read; another round, or another program on an SM, adds far more: the
    step climbs by 5% or more from `below` to `above` requests decoding, in the engine and in the simulation, each
    step simulated `within` its measured median. `kernel(model)`: the steps run the kernel the test is about."""
    from measure.steps import server_settings
    from sizing.evidence.serving import point_replica
    server, measured = _trace_steps(tag)
    model, _ = point_replica(server_settings(server), ROOT)
    assert kernel(model)
    simulated = {n: model.decode_seconds(n, n * measured[n][1]) for n in (below, above)}
    for steps in ({n: measured[n][0] for n in (below, above)}, simulated):
        assert steps[above] - steps[below] > 0.05 * steps[below]
    for n in (below, above):
        assert simulated[n] == pytest.approx(measured[n][0], rel=within)


@pytest.mark.parametrize(("tag", "below", "above"), [
    # whole-cache programs (past the split): Llama-3.1-8B (4 query heads a KV head, BLOCK_Q 4, 8 KV heads) pads 24
    # requests to a graph of 24, launching (24 // 4 + 24) x 8 = 240 blocks, at most 2 an SM of 132; 25 pad to 32:
    # 320 blocks, 3 on some SMs, sharing the SM's rate. Qwen2.5-7B (7, BLOCK_Q 2, 4 KV heads): 40 -> 240 blocks,
    # 41 pad to 48 -> 288. The b18 and b23 servers are out of the fit, and b14's single ramp steps are too (the fit
    # reads groups of 20 steps or more).
    ("b14-llama8b-int8", 24, 25),
    ("b18-qwen25-7b-int8", 40, 41),
    ("b23-qwen25-7b-int8", 40, 41),
])
def test_whole_cache_steps_climb_where_the_launched_grid_puts_a_third_program_on_an_sm(tag, below, above):
    _assert_climb(tag, below, above, lambda model: model.split_kv_requests < below
                  and above * model.kv_heads_per_rank <= model.kv_wave_programs, within=0.06)


@pytest.mark.parametrize(("tag", "below", "above"), [
    # 8 query heads a KV head (BLOCK_Q 2), whose kernel reads its bytes in waves of 2 programs an SM: Qwen2.5-3B (2
    # KV heads) pads 88 requests to a graph of 88, (44 + 88) x 2 = 264 blocks, and 89 to 96: 288, a third on some
    # SMs; Qwen3-30B-A3B (4) 40 -> 240 blocks, 41 pad to 48 -> 288. Both steps stay in one wave of the bytes
    # (178 and 164 programs of 264): the climb is the programs an SM holds, fitted apart from the waves. The
    # Qwen2.5-3B server is out of the fit; Qwen3-30B-A3B's ramp steps are too (groups of 20 steps or more)
    ("b21-qwen25-3b-int8", 88, 89),
    ("b16-qwen3moe-int8", 40, 41),
])
def test_an_sm_holds_more_whole_cache_programs_than_its_kernels_waves_put_there(tag, below, above):
    _assert_climb(tag, below, above, lambda model: model.split_kv_requests < below
                  and above * model.kv_heads_per_rank <= model.kv_wave_programs
                  and model.kv_whole_programs_per_sm * model.multiprocessors > model.kv_wave_programs, within=0.08)


@pytest.mark.parametrize(("tag", "below", "above", "held"), [
    # the build for 8 query heads a KV head holds a fourth: Qwen2.5-3B pads 128 requests to a graph of 128, 384
    # blocks (3 an SM on 132), and 130 to 136: 408, past 396. Out of the fit, at 8,000 and 16,000 tokens
    ("b21-qwen25-3b-int8", 128, 130, 4),
    ("b26-qwen25-3b-int8", 128, 130, 4),
    # int4's packed kernel past the split: Qwen2.5-7B-Instruct 40 -> 41 requests of 8,000 tokens (240 -> 288
    # blocks: a third program on an SM); Llama-3.1-8B 24 -> 25 (240 -> 320), whose whole-cache steps were 13-15%
    # long as batch b27 ran before the pace alone was fitted beside the pair. Both ramps place the count
    ("b26-qwen25-7b-int4", 40, 41, 3),
    ("b27-llama8b-int4", 24, 25, 3),
])
def test_whole_cache_steps_climb_at_the_programs_an_sm_holds(tag, below, above, held):
    _assert_climb(tag, below, above, lambda model: model.split_kv_requests < below
                  and model.kv_whole_programs_per_sm == held, within=0.10)


def test_the_programs_an_sm_holds_are_fitted_apart_from_the_waves():
    fit = step_overhead()
    pace = fit.engine_program_pace_tokens_per_s["int8_per_token_head"]
    waves = fit.engine_query_group_waves["int8_per_token_head"][8]
    # the build for 8 query heads a KV head reads its bytes in waves of 2 an SM yet holds more of them at once, and
    # at a rate of its own (fitted on the Qwen3 traces, the count where their ramps climb)
    assert waves.whole_programs_per_sm > waves.programs_per_sm
    assert waves.whole_programs_per_sm != pace.whole_programs_per_sm and waves.whole_sm != pace.whole_sm
    eight = _replica("qwen3-30b-a3b")
    four = _replica()
    assert queries_per_kv_head(eight.shape) == 8 and queries_per_kv_head(four.shape) == 4
    assert (eight.kv_whole_programs_per_sm, eight.kv_whole_sm_tokens_per_s) == (waves.whole_programs_per_sm,
                                                                                waves.whole_sm)
    assert (four.kv_whole_programs_per_sm, four.kv_whole_sm_tokens_per_s) == (pace.whole_programs_per_sm,
                                                                              pace.whole_sm)
    assert eight.kv_wave_programs == waves.programs_per_sm * eight.multiprocessors
    assert four.kv_wave_programs == fit.engine_programs_per_sm["int8_per_token_head"] * four.multiprocessors
    with pytest.raises(ValidationError, match="whole_programs_per_sm and whole_sm: both or neither"):
        QueryGroupWaves(programs_per_sm=2, kv_efficiency=0.2, whole_sm=2e7)


def test_a_decode_step_launches_its_graphs_batch():
    model = _replica()
    sizes = model.graphs.decode_batches
    assert sizes and 24 in sizes and 32 in sizes and 25 not in sizes
    assert model.graphs.padded_batch(25) == 32 and model.graphs.padded_batch(24) == 24
    assert model.graphs.padded_batch(10 ** 6) == 10 ** 6  # past the largest graph: no padding
    assert query_block_positions(load_model("llama-3.1-8b")[1]) == 4
    assert query_block_positions(load_model("qwen2.5-7b-instruct")[1]) == 2
    # eager: the attention runs with the step's own requests
    g = gpu_profile("h200")
    eager = scenario("llama-3.1-8b", "h200", max_model_len=32768, memory_fraction=0.9, max_num_batched_tokens=8192,
                     max_num_seqs=1024, k_cache_dtype="int8_per_token_head", v_cache_dtype="int8_per_token_head",
                     cudagraph_mode="NONE")
    model = serving_replica(eager, g.hbm_bandwidth_gb_s, g.bf16_dense_tflops, g.multiprocessors,
                            measured_efficiency())[0]
    assert model.graphs.padded_batch(25) == 25


@pytest.mark.parametrize(("tag", "below", "above"), [
    ("b24-qwen3-8b-int8", 24, 25),     # whole: graphs of 24 and 32, 240 and 320 blocks
    ("b24-qwen25-15b-int8", 88, 89),   # whole: graphs of 88 and 96, 264 and 288 blocks (6 query heads a KV head)
    ("b24-qwen25-15b-int8", 49, 50),   # split: 1,568 and 1,600 segment programs, past three rounds of 528
    ("b24-qwen25-32b-int8", 24, 25),   # whole: 256 and 336 blocks (5 query heads a KV head, BLOCK_Q 3)
    ("b24-qwen25-32b-int8", 8, 9),     # split: 1,024 and 1,152, past two rounds
])
def test_steps_committed_before_b24_ran_climb_where_the_engines_did(tag, below, above):
    from measure.steps import climbs, committed_steps, traced_servers
    rows = committed_steps(next(s for s in traced_servers() if s["tag"] == tag))
    # every count the closed loop passed through, within 10% of the figure committed before the batch ran
    assert len(rows) >= 30
    assert sum(abs(r["committed_ms"] / r["measured_ms"] - 1) <= 0.10 for r in rows) >= 0.9 * len(rows)
    step = next((b, a) for b, a in climbs(rows) if (b["decoding"], a["decoding"]) == (below, above))
    assert step[1]["measured_ms"] > 1.05 * step[0]["measured_ms"]


def test_int4_takes_its_own_pace_and_the_segment_rounds_its_ramp_showed():
    fit = step_overhead()
    pace = fit.engine_program_pace_tokens_per_s["int4_per_token_head"]
    # fitted on b25's one request at 8,000 and 32,000 tokens (scripts/fit_serving_kernels.py, PACE_BATCHES)
    assert {p for p in fit.fitted_on if p.startswith("b25-")} == {
        "b25-qwen25-7b-int4-p01-i8000-o32-c1", "b25-qwen25-7b-int4-p02-i32000-o32-c1",
        "b25-llama8b-int4-p01-i8000-o32-c1", "b25-llama8b-int4-p02-i32000-o32-c1"}
    # the segment rounds and the whole-cache pair from b26's and b27's ramps (their climbs place the counts)
    assert {p for p in fit.fitted_on if p.startswith(("b26-", "b27-")) and "int4" in p} == {
        "b26-qwen25-7b-int4-p01-i16000-o128-c24", "b26-qwen25-7b-int4-p02-i8000-o128-c64",
        "b27-llama8b-int4-p01-i16000-o128-c16", "b27-llama8b-int4-p02-i8000-o128-c48"}
    assert pace.split_programs_per_sm == 4 and pace.split < pace.split_sm
    # fitted beside the pair, the pace alone is faster than the SM's rate shared among the programs it holds, and
    # slower than among fewer: else no count of programs an SM could place the ramp's 40 -> 41 climb
    assert pace.whole_programs_per_sm == 3
    assert pace.whole_sm / 3 < pace.whole < pace.whole_sm / 2
    model = _replica(fmt="int4_per_token_head")
    assert model.kv_split_pace_tokens_per_s == pace.split and model.kv_split_programs_per_sm == 4
    assert (model.kv_whole_programs_per_sm, model.kv_whole_sm_tokens_per_s) == (3, pace.whole_sm)
    # one request of 32,000 tokens (128 segment programs, one an SM) reads at the pace, not at the split share
    assert _kv(model, 1, 32000) == pytest.approx(32 * 32000 / 16 / pace.split, rel=0.02)


def test_a_split_read_of_int4_pays_each_layer_once_beside_its_pace():
    # b25's one request at 8,000 and 32,000 tokens: Llama-3.1-8B's gap grows 5.96 ms for 24,000 tokens more (32
    # layers of 1,500 more a segment: 8.0 tokens a microsecond), Qwen2.5-7B's 5.24 for 28 layers (8.0); the pace
    # fitted on the gaps alone (6.2) had taken in a cost each layer pays once a step, which b27's ramp shows: a
    # lone segment program past a full round adds 2.9-3.7 ms where one request's read takes 5.2
    fit = step_overhead()
    int4 = fit.engine_program_pace_tokens_per_s["int4_per_token_head"]
    int8 = fit.engine_program_pace_tokens_per_s["int8_per_token_head"]
    assert int4.split_layer_s and 2e-5 < int4.split_layer_s < 1e-4
    assert int4.split == pytest.approx(8.0e6, rel=0.05)
    assert int8.split_layer_s is None  # its two lengths' gaps are its pace alone
    model = _replica(fmt="int4_per_token_head")
    assert model.kv_split_layer_s == int4.split_layer_s and model.kv_layers == 32
    one = model._kv_read_seconds(1, 32000, False)
    assert one == pytest.approx(32 * int4.split_layer_s + 32 * 32000 / 16 / int4.split, rel=0.02)
    # the split share of a format whose pace is fitted is its whole cache's: fitted before the pace it had taken in
    # the pace's time (0.065), and beside the pace no traced step is bound by it
    assert fit.engine_split_kv_efficiency["int4_per_token_head"] == fit.engine_kv_efficiency["int4_per_token_head"]
    assert model.split_kv_time_ratio == 1.0


@pytest.mark.parametrize(("tag", "below", "above"), [
    # Qwen2.5-7B-Instruct (4 KV heads x 16 segments) at 16,000 tokens: 8 requests are 512 programs, one round of 528
    # on 132 SMs at 4 an SM, 9 are 576; 16 -> 17 crosses 1,056. In the fit (it places the count)
    ("b26-qwen25-7b-int4", 8, 9), ("b26-qwen25-7b-int4", 16, 17),
    # Qwen3-8B (8 KV heads, 36 layers: 128 programs a request), batch b28, committed before it ran: 4 -> 5 (a graph of
    # 8: twice the blocks on an SM), 8 -> 9 (1,152 programs, past 1,056) and 12 -> 13 (1,664, past 1,584)
    ("b28-qwen3-8b-int4", 4, 5), ("b28-qwen3-8b-int4", 8, 9), ("b28-qwen3-8b-int4", 12, 13),
])
def test_int4_split_steps_climb_where_its_segments_need_another_round(tag, below, above):
    _assert_climb(tag, below, above, lambda model: model.split_kv_requests >= above, within=0.10)


@pytest.mark.parametrize(("fmt", "term", "value", "pair"), [
    ("int8_per_token_head", "split_programs_per_sm", None, "split"),
    ("int4_per_token_head", "whole_programs_per_sm", None, "whole"),
])
def test_the_sm_terms_of_a_pace_come_in_pairs(fmt, term, value, pair):
    data = step_overhead().model_dump()
    data["engine_program_pace_tokens_per_s"][fmt][term] = value
    with pytest.raises(ValidationError, match=f"{pair}_programs_per_sm and {pair}_sm: both or neither"):
        StepOverhead.model_validate(data)

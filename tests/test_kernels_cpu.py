"""The fused decode kernels' logic on the CPU: stored layouts, block tables, the split-K
reduction, and the Triton kernels themselves under Triton's interpreter (TRITON_INTERPRET=1,
set by conftest.py when there is no GPU). Timing lives in benchmarks/bench_decode.py."""

import math
import struct

import pytest
import torch

from measure.paged_cache import (FORMATS, KERNEL_TOLERANCE, KIVI_RESIDUAL, add_kivi_residual, dequantize, pack,
                                 reference_decode, relative_error, split_ranges, split_reference_decode, unpack_bits)
from measure.quant import ERROR_BOUNDS, realistic_kv

triton = pytest.importorskip("triton")  # a test dependency (pyproject [test]); skipped only outside it
from measure.kernels import interpreting, paged_decode, resident_programs, wave_splits  # noqa: E402

EXACT = 1e-5  # fp32 in the interpreter: kernel and reference differ only by summation order


def _case(fmt, batch=2, contexts=(37, 70), heads=2, head_dim=64, block_size=16, seed=0, kivi_recent=8):
    g = torch.Generator().manual_seed(seed)
    pages = math.ceil(max(contexts) / block_size)
    nb = batch * pages
    k, v = realistic_kv(nb * block_size, heads, head_dim, g)
    cache = pack(fmt, k, v, block_size)
    lens = torch.tensor(contexts, dtype=torch.int32)
    if FORMATS[fmt].kind == 5:  # KIVI: whole pages quantized, the newest tokens in fp16
        paged = torch.tensor([max(0, (c - kivi_recent) // block_size * block_size) for c in contexts],
                             dtype=torch.int32)
        rest = int((lens - paged).max())
        rk, rv = realistic_kv(batch * rest, heads, head_dim, g)
        add_kivi_residual(cache, rk.reshape(batch, rest, heads, head_dim), rv.reshape(batch, rest, heads, head_dim),
                          paged)
    table = torch.randperm(nb, generator=g).reshape(batch, pages).to(torch.int32)
    return cache, table, lens, (k, v)


def test_every_layout_stores_what_it_claims():
    """Packed rows hold BITS per value plus the format's scales: one head's page row is head_dim *
    bits / 8 bytes (head-major pages), and dequantizing stays within the format's error bound."""
    for fmt, spec in FORMATS.items():
        cache, _, _, (k, v) = _case(fmt, contexts=(64, 64))
        assert cache.k.data.shape[-1] * cache.k.data.element_size() * 8 == 64 * spec.bits, fmt
        assert cache.k.data.shape[1] == 2 and cache.k.data.shape[2] == 16  # [nb, heads, block, row]
        dk, dv = dequantize(cache)
        err_k = relative_error(dk.reshape(-1, 2, 64), k)
        assert err_k <= ERROR_BOUNDS[fmt] * 1.5, (fmt, err_k)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "fp8_per_token_head"])
def test_unused_slots_of_the_last_page_never_reach_the_output(fmt):
    """The unused slots of a sequence's last page may hold anything (here NaN values and NaN
    per-token scales, as never-written memory may); the kernels read row 0 of the head for
    masked tokens, so the output must not change. Triton's interpreter reads an fp8 NaN back as
    a finite number, so on the CPU this checks the scales; bench_decode.py's tail check covers
    the values on a GPU."""
    cache, table, lens, _ = _case(fmt, contexts=(37, 70))
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(5))
    ref = reference_decode(q, cache, table, lens)
    for b, ctx in enumerate(lens.tolist()):
        last = int(table[b, ctx // 16])
        junk = cache.v.data[last, :, ctx % 16:]
        junk.copy_(torch.full(junk.shape, float("nan")).to(junk.dtype))
        if cache.v.scale.dim() == 3:
            cache.v.scale[last, :, ctx % 16:] = float("nan")
    for splits, block_t in ((1, 16), (2, 32)):
        out = paged_decode(q, cache, table, lens, num_splits=splits, block_t=block_t)
        assert torch.isfinite(out).all(), fmt
        assert relative_error(out, ref) < (EXACT * 10 if interpreting() else KERNEL_TOLERANCE), fmt


def test_packed_codes_round_trip():
    codes = torch.randint(0, 16, (3, 8, 64), dtype=torch.int32)
    from measure.paged_cache import _pack_bits

    assert torch.equal(unpack_bits(_pack_bits(codes, 4), 4), codes)
    two = codes & 3
    assert torch.equal(unpack_bits(_pack_bits(two, 2), 2), two)


def test_split_ranges_cover_the_context_once():
    for start, end, splits, tile in [(0, 70, 3, 16), (5, 37, 4, 16), (0, 16, 8, 16), (0, 0, 2, 16)]:
        covered = [t for lo, hi in split_ranges(start, end, splits, tile) for t in range(lo, hi)]
        assert covered == list(range(start, end))


@pytest.mark.parametrize("splits", [1, 3, 7])
def test_split_k_reduction_equals_one_pass_softmax(splits):
    """Empty splits (more splits than tiles) carry m = -inf and l = 0 and drop out."""
    cache, table, lens, _ = _case("bf16")
    q = torch.randn(2, 4, 64)
    ref = reference_decode(q, cache, table, lens)
    assert relative_error(split_reference_decode(q, cache, table, lens, splits, 16), ref) < 1e-6


# H200 SM limits (CUDA device properties): 65,536 registers, 233,472 shared bytes, 2,048 threads.
H200_SM = dict(sm_registers=65536, sm_shared_bytes=233472, sm_threads=2048)


def test_resident_programs_follow_registers_and_shared_memory():
    # Compiled on the H200 (measure/experiments/h200-split-sweep.json): the bf16 kernel uses 72
    # registers and 38,912 shared bytes at 4 warps, so shared memory holds 5 programs; the
    # fp8_e4m3 one uses 168 registers, so registers hold 3 (21,504 per program).
    assert resident_programs(72, 38912, 4, **H200_SM) == 5
    assert resident_programs(168, 40960, 4, **H200_SM) == 3
    assert resident_programs(168, 40960, 4, **dict(H200_SM, sm_registers=2 * 65536)) == 5  # shared memory binds
    assert resident_programs(255, 0, 32, **H200_SM) == 1  # never less than one


def test_wave_splits_fill_whole_waves():
    # The split sweep on the H200 (measure/experiments/h200-split-sweep.json), bf16 with 660
    # resident programs: batch 32 x 8 KV heads x 16K tokens (256 tiles of 64) ran at 82-84% of
    # copy bandwidth with 3 splits (768 programs: a second wave of 108) and 102-104% with 5.
    assert wave_splits(256, 256, 660) == 5
    assert wave_splits(128, 256, 660) == 5  # 640 programs, one wave (6 splits: 768, measured 80%)
    assert wave_splits(128, 128, 396) == 3  # fp8_e4m3, 3 per SM: one wave of 384
    for pairs, tiles, slots in [(8, 16, 660), (660, 10, 660), (1, 1, 16), (3000, 512, 396), (32, 512, 660)]:
        splits = wave_splits(pairs, tiles, slots)
        assert 1 <= splits <= tiles
        if pairs * splits < slots:  # under one wave only when more splits cannot help
            assert splits == tiles or pairs * (splits + 1) > slots or math.ceil(tiles / (splits + 1)) == \
                math.ceil(tiles / splits)


def test_default_splits_give_the_same_attention():
    cache, table, lens, _ = _case("fp8_e4m3")
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(5))
    assert relative_error(paged_decode(q, cache, table, lens, block_t=16), reference_decode(q, cache, table, lens)) \
        < EXACT


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_fused_kernel_matches_fp32_over_the_same_cache(fmt):
    cache, table, lens, _ = _case(fmt)
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(3))  # GQA: 2 query heads per KV head
    ref = reference_decode(q, cache, table, lens)
    for splits, block_t in ((1, 16), (3, 32)):
        out = paged_decode(q, cache, table, lens, num_splits=splits, block_t=block_t)
        assert relative_error(out, ref) < EXACT, (fmt, splits, block_t)


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "int8_per_token_head", "nvfp4", "kivi4"])
def test_sliding_window_reads_only_the_window(fmt):
    """Windows not page aligned: 21 tokens start inside the last tiles; 40 tokens in tiles of 16
    leave a masked head tile, unmasked full tiles and a masked tail tile."""
    cache, table, lens, _ = _case(fmt, contexts=(70, 45))
    q = torch.randn(2, 4, 64)
    for window, block_t in ((21, 32), (40, 16)):
        ref = reference_decode(q, cache, table, lens, window=window)
        out = paged_decode(q, cache, table, lens, window=window, num_splits=2, block_t=block_t)
        assert relative_error(out, ref) < EXACT, (fmt, window)
        assert relative_error(out, reference_decode(q, cache, table, lens)) > 1e-3  # the window matters


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_head_sizes(head_dim):
    cache, table, lens, _ = _case("fp8_per_token_head", head_dim=head_dim, heads=1)
    q = torch.randn(2, 8, head_dim)  # 8 query heads on one KV head (MQA)
    assert relative_error(paged_decode(q, cache, table, lens, num_splits=2), reference_decode(q, cache, table, lens)) \
        < EXACT


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "fp8_per_token_head"])
def test_mla_latent_cache(fmt):
    """One latent row per token (latent 64 + rope 16 here; DeepSeek's is 512 + 64): scores from
    both parts, values from the latent part of the same row."""
    g = torch.Generator().manual_seed(5)
    latent = torch.randn(8 * 16, 1, 80, generator=g)
    cache = pack(fmt, latent, None, 16, v_dim=64)
    table = torch.randperm(8, generator=g).reshape(2, 4).to(torch.int32)
    lens = torch.tensor([50, 33], dtype=torch.int32)
    q = torch.randn(2, 16, 80, generator=g)
    out = paged_decode(q, cache, table, lens, num_splits=2, block_t=16)
    assert out.shape == (2, 16, 64)
    assert relative_error(out, reference_decode(q, cache, table, lens)) < EXACT


def test_kivi_reads_its_fp16_recent_window():
    cache, table, lens, _ = _case("kivi2", contexts=(64 + KIVI_RESIDUAL // 16, 40))
    q = torch.randn(2, 4, 64)
    ref = reference_decode(q, cache, table, lens)
    assert relative_error(paged_decode(q, cache, table, lens, num_splits=2, block_t=32), ref) < EXACT
    cache.residual_k.zero_()  # the kernel must be reading those tokens
    assert relative_error(paged_decode(q, cache, table, lens, num_splits=2, block_t=32), ref) > 1e-3


@pytest.mark.parametrize("fmt", ["bf16", "fp8_per_token_head", "lmdeploy_int4", "kivi2"])
def test_swapped_score_product_gives_the_same_attention(fmt):
    cache, table, lens, _ = _case(fmt)
    q = torch.randn(2, 4, 64)
    ref = reference_decode(q, cache, table, lens)
    assert relative_error(paged_decode(q, cache, table, lens, num_splits=2, block_t=32, swap_qk=True), ref) < EXACT


@pytest.mark.parametrize("fmt", ["bf16", "fp8_e4m3", "fp8_per_token_head", "lmdeploy_int4", "nvfp4", "kivi2"])
def test_prefetching_the_next_tile_gives_the_same_attention(fmt):
    cache, table, lens, _ = _case(fmt, contexts=(70, 45))
    q = torch.randn(2, 4, 64)
    for window in (None, 21):
        ref = reference_decode(q, cache, table, lens, window=window)
        out = paged_decode(q, cache, table, lens, window=window, num_splits=2, block_t=16, prefetch=True)
        assert relative_error(out, ref) < EXACT, (fmt, window)


def test_fp8_dot_is_refused_for_caches_it_cannot_read():
    """The fp8 tensor-core path (q and probabilities in e4m3) runs only on a GPU; its accuracy is
    checked at every benchmark point (measure/reports/h200-decode-kernels.json, `kvsize validate`)."""
    cache, table, lens, _ = _case("nvfp4")
    with pytest.raises(ValueError, match="fp8 dot needs an e4m3 cache"):
        paged_decode(torch.randn(2, 4, 64), cache, table, lens, fp8_dot=True)


def _assert_packed_kernel_matches(fmt, cache, table, lens, **option):
    """The phase-split kernel against fp32 over the same cache: one split, three splits, windows
    (40 tokens in tiles of 16: masked head, unmasked full and masked tail tiles)."""
    q = torch.randn(2, 4, cache.head_dim)
    for window, splits, block_t in ((None, 1, 16), (None, 3, 32), (21, 2, 32), (40, 1, 16)):
        ref = reference_decode(q, cache, table, lens, window=window)
        out = paged_decode(q, cache, table, lens, window=window, num_splits=splits, block_t=block_t, **option)
        assert relative_error(out, ref) < EXACT, (fmt, window, splits, block_t)


@pytest.mark.parametrize("fmt", ["lmdeploy_int4", "nvfp4", "kivi4"])
def test_4bit_kernel_with_split_nibbles_gives_the_same_attention(fmt):
    cache, table, lens, _ = _case(fmt, contexts=(70, 45))
    _assert_packed_kernel_matches(fmt, cache, table, lens, split_nibbles=True)


def _with_every_code(fmt, allowed, seed, head_dim=64):
    """A case whose keys hold codes drawn from `allowed` (stored bytes), so that every one shows up."""
    cache, table, lens, _ = _case(fmt, contexts=(70, 45), head_dim=head_dim)
    codes = allowed[torch.randint(len(allowed), cache.k.data.shape, generator=torch.Generator().manual_seed(seed))]
    cache.k.data.view(torch.uint8).copy_(codes)
    return cache, table, lens


@pytest.mark.parametrize("fmt", ["lmdeploy_int4", "nvfp4", "kivi4"])
def test_4bit_kernel_reading_words_gives_the_same_attention(fmt):
    """split_words: 4-bit rows read as 16-bit words of four values, every code included (all
    16 nibbles in each of the four positions)."""
    cache, table, lens = _with_every_code(fmt, torch.arange(256, dtype=torch.uint8), seed=11)
    _assert_packed_kernel_matches(fmt, cache, table, lens, split_words=True)


def test_2bit_kernel_reading_words_gives_the_same_attention():
    """split_words on KIVI-2: rows as 16-bit words of eight values (bits 2i to 2i + 1 of word j
    are value 8j + i), every byte in every position, so every code sits in each of the eight;
    head size 128, whose phases are 16 values wide."""
    cache, table, lens = _with_every_code("kivi2", torch.arange(256, dtype=torch.uint8), seed=12, head_dim=128)
    _assert_packed_kernel_matches("kivi2", cache, table, lens, split_words=True)


def test_phases_narrower_than_a_dot_are_refused():
    """At head size 64 a 2-bit row read as words has phases of 8 values; tensor-core dots need 16."""
    cache, table, lens, _ = _case("kivi2")
    with pytest.raises(ValueError, match="phases 8 wide, below the 16"):
        paged_decode(torch.randn(2, 4, 64), cache, table, lens, num_splits=1, split_words=True)


@pytest.mark.parametrize("option, formats, match", [
    ("split_words", ("bf16", "fp8_e4m3", "int8_per_token_head"), "split_words reads 4-bit and 2-bit layouts"),
    ("split_bytes", ("bf16", "nvfp4", "kivi2"), "split_bytes")])
def test_phase_readings_are_refused_for_caches_they_cannot_read(option, formats, match):
    for fmt in formats:
        cache, table, lens, _ = _case(fmt)
        with pytest.raises(ValueError, match=match):
            paged_decode(torch.randn(2, 4, 64), cache, table, lens, num_splits=1, **{option: True})


def test_one_phase_reading_at_a_time():
    cache, table, lens, _ = _case("nvfp4")
    with pytest.raises(ValueError, match="choose one"):
        paged_decode(torch.randn(2, 4, 64), cache, table, lens, num_splits=1, split_words=True, split_nibbles=True)


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "fp8_e5m2", "fp8_per_token_head", "int8_per_token_head",
                                 "lmdeploy_int8"])
def test_8bit_read_as_byte_pairs_gives_the_same_attention(fmt):
    """split_bytes: 8-bit rows read as 16-bit words, every code included (fp8 subnormals, both
    signs, the largest; int8 -128 and 127; uint8 0 and 255)."""
    every_code = torch.arange(256, dtype=torch.uint8)
    finite = every_code[torch.isfinite(every_code.view(FORMATS[fmt].value_dtype).float())]
    cache, table, lens = _with_every_code(fmt, finite, seed=9)
    _assert_packed_kernel_matches(fmt, cache, table, lens, split_bytes=True)


@pytest.mark.parametrize("fmt, reading", [("lmdeploy_int4", "split_words"), ("lmdeploy_int8", "split_bytes")])
def test_lmdeploy_codes_left_as_fp16_subnormals_give_the_same_attention(fmt, reading):
    """subnormal_codes: LMDeploy's unsigned codes as code x 2^-24 (odd nibbles x 2^-20), with q's
    even phases, the scores and each phase's output scaled to match; every code in every position."""
    cache, table, lens = _with_every_code(fmt, torch.arange(256, dtype=torch.uint8), seed=13)
    _assert_packed_kernel_matches(fmt, cache, table, lens, **{reading: True, "subnormal_codes": True})


@pytest.mark.parametrize("fmt, option", [("kivi4", "split_words"), ("nvfp4", "split_words"),
                                         ("int8_per_token_head", "split_bytes"), ("lmdeploy_int4", None)])
def test_subnormal_codes_are_refused_where_codes_need_more(fmt, option):
    """Only LMDeploy's codes have nothing but a per-token scale and zero point between them and
    the dot; the option also needs a phase reading."""
    cache, table, lens, _ = _case(fmt)
    with pytest.raises(ValueError, match="subnormal_codes reads LMDeploy's unsigned codes"):
        paged_decode(torch.randn(2, 4, 64), cache, table, lens, num_splits=1, subnormal_codes=True,
                     **({option: True} if option else {}))


def _run_ptx(asm: str, register: int) -> int:
    """The few PTX b32 instructions the subnormal placements use (mov, and, shr, prmt), run on
    one 32-bit input register $1; returns $0."""
    regs = {"$1": register}

    def value(x):
        return regs[x] if x in regs else int(x, 0)

    for ins in asm.strip("{} ").split(";"):
        ins = ins.strip()
        if not ins or ins.startswith(".reg"):
            continue
        op, args = ins.split(None, 1)
        d, *a = [x.strip() for x in args.split(",")]
        if op == "mov.b32":
            regs[d] = value(a[0])
        elif op == "and.b32":
            regs[d] = value(a[0]) & value(a[1])
        elif op == "shr.b32":
            regs[d] = value(a[0]) >> value(a[1])
        elif op == "prmt.b32":  # default mode: selector nibble i picks byte i of the result from {b, a}
            pool = (value(a[1]) << 32) | value(a[0])
            sel = value(a[2])
            regs[d] = sum(((pool >> 8 * ((sel >> 4 * i) & 7)) & 0xFF) << 8 * i for i in range(4))
        else:
            raise AssertionError(f"unexpected PTX {op}")
    return regs["$0"]


def test_subnormal_ptx_leaves_each_code_in_place():
    """The inline PTX that the GPU runs for subnormal_codes, run here instruction by instruction:
    each 16-bit lane of the result, read as fp16, is the phase's code times its unit."""
    from measure.kernels import _PTX_UINT8_SUBNORMAL, _PTX_WORD_UINT4_SUBNORMAL, SUBNORMAL_UNIT

    words = torch.randint(0, 2 ** 32, (2000,), generator=torch.Generator().manual_seed(3), dtype=torch.int64)
    words = torch.cat([words, torch.tensor([0, 0xFFFFFFFF, 0x12345678, 0xF0F0F0F0])]).tolist()
    readings = [(asm, 4, p, SUBNORMAL_UNIT.value * 16 ** (p % 2)) for p, asm in enumerate(_PTX_WORD_UINT4_SUBNORMAL.value)]
    readings += [(asm, 8, p, SUBNORMAL_UNIT.value) for p, asm in enumerate(_PTX_UINT8_SUBNORMAL.value)]
    for asm, bits, phase, unit in readings:
        for w in words:
            out = _run_ptx(asm, w)
            for lane in (0, 1):
                got = struct.unpack("<e", struct.pack("<H", (out >> 16 * lane) & 0xFFFF))[0]
                code = ((w >> 16 * lane) >> bits * phase) & ((1 << bits) - 1)
                assert got == code * unit, (asm, hex(w), lane, got, code)


def test_asm_decode_needs_a_packed_kernel():
    cache, table, lens, _ = _case("lmdeploy_int4")
    with pytest.raises(ValueError, match="asm_decode"):
        paged_decode(torch.randn(2, 4, 64), cache, table, lens, num_splits=1, asm_decode=True)

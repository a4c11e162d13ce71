"""Fused paged decode attention in Triton, one kernel for every stored layout of
measure/paged_cache.py.

Each program takes one (sequence, KV head, split of the context): it walks its tokens in tiles
through the block table, loads the packed rows and their scales, dequantizes in registers,
and runs an online softmax for all query heads of the KV head's group at once (GQA reads each
KV row once). Splits write (max, sum, unnormalised output); a second kernel reduces them, so
small batches still fill the GPU. MLA reads one latent row per token: scores from the latent
and rope parts, values from the latent part of the same row.

With TRITON_INTERPRET=1 the kernels run on the CPU (dots in fp32 there: the interpreter has
no bf16 arithmetic), which is how the tests check them without a GPU.
"""

from __future__ import annotations

import math
import os
import struct

import torch
import triton
import triton.language as tl

from .paged_cache import ASYM, FP8_TENSOR, KIVI, NVFP4, NVFP4_GROUP, PLAIN, TOKEN_HEAD, CacheFormat, PagedCache

LOG2E = 1.4426950408889634
DOT_F32, DOT_BF16, DOT_F16, DOT_FP8 = 0, 1, 2, 3
# the packed kernel's PAIR for split_bytes, by stored dtype
BYTE_PAIRS = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2, torch.int8: 3, torch.uint8: 4}


@triton.jit
def _to_dot(x, DOT: tl.constexpr):
    if DOT == 1:
        return x.to(tl.bfloat16)
    elif DOT == 2:
        return x.to(tl.float16)
    else:
        return x.to(tl.float32)


@triton.jit
def _codes(DATA, rows, STRIDE: tl.constexpr, COL0: tl.constexpr, WIDTH: tl.constexpr, BITS: tl.constexpr,
           DOT: tl.constexpr, RAW: tl.constexpr = False):
    """Values [COL0, COL0 + WIDTH) of `rows` (rows of STRIDE values) as stored, before any scale:
    in the dot dtype for 8/16-bit layouts, as 8-bit codes for packed ones; RAW: as loaded.
    Packed rows are read as whole bytes, split with shifts and interleaved back into element
    order (element i of a byte sits at bits [i*BITS, (i+1)*BITS)). One return: Triton wants
    every return of a function to have one type."""
    if BITS >= 8:
        c = COL0 + tl.arange(0, WIDTH)
        raw = tl.load(DATA + rows[:, None] * STRIDE + c[None, :])
    else:
        PER: tl.constexpr = 8 // BITS
        cb = COL0 // PER + tl.arange(0, WIDTH // PER)
        raw = tl.load(DATA + rows[:, None] * (STRIDE // PER) + cb[None, :])
    if RAW:
        out = raw
    else:
        out = _unraw(raw, BITS, DOT)
    return out


@triton.jit
def _unraw(x, BITS: tl.constexpr, DOT: tl.constexpr):
    """Raw loaded rows to values in the dot dtype (8/16-bit) or to codes (packed)."""
    if BITS >= 8:
        if DOT == 3:
            out = x  # fp8 tensor cores take the stored bytes
        else:
            out = _to_dot(x, DOT)
    elif BITS == 4:
        out = tl.interleave(x & 15, x >> 4)
    else:
        out = tl.interleave(tl.interleave(x & 3, (x >> 4) & 3), tl.interleave((x >> 2) & 3, x >> 6))
    return out


@triton.jit
def _tile(t0, b, kvh, BT, stride_bt, start, hi, paged, HKV: tl.constexpr, BS: tl.constexpr, BLOCK_T: tl.constexpr,
          MASKED: tl.constexpr = True):
    """Tokens of the tile at t0, which are real, which sit in pages, their pages and row indices.
    Not MASKED: the caller knows every token of the tile is real and paged (no compares)."""
    NP: tl.constexpr = BLOCK_T // BS
    t = t0 + tl.arange(0, BLOCK_T)
    pidx = t0 // BS + tl.arange(0, NP)
    if MASKED:
        valid = (t < hi) & (t >= start)
        in_page = valid & (t < paged)
        page_ids = tl.load(BT + b * stride_bt + pidx, mask=(pidx * BS < paged) & (pidx * BS < hi), other=0)
    else:
        valid = tl.full([BLOCK_T], 1, tl.int1)
        in_page = valid
        page_ids = tl.load(BT + b * stride_bt + pidx)
    page = tl.reshape(tl.broadcast_to(page_ids[:, None], [NP, BS]), [BLOCK_T])
    rows = (page * HKV + kvh) * BS + t % BS  # head-major pages
    if MASKED:
        rows = tl.where(in_page, rows, kvh * BS)
    return t, valid, in_page, page_ids, rows


@triton.jit
def _full_tiles(lo, start, end, BLOCK_T: tl.constexpr):
    """Tiles of [lo, end) split by whether they need masks: the full ones [full_lo, full_hi),
    every token real and paged, and at most two that do not: the first when the window starts
    inside it (head), the last when the tokens end inside it."""
    has_head = (lo < start) & (start < end)
    full_lo = lo
    if lo < start:
        full_lo = lo + BLOCK_T
    full_hi = full_lo + tl.maximum(end - full_lo, 0) // BLOCK_T * BLOCK_T
    masked = has_head.to(tl.int32) + (full_hi < end).to(tl.int32)
    return has_head, full_lo, full_hi, masked


# What one token of KIVI's fp16 recent window costs a split, in paged tokens: its rows are 512 B
# (K and V of 128 values) against 128-192 B for KIVI-2 and KIVI-4 with their scales, read in
# steps of RECENT_T.
RECENT_WEIGHT = tl.constexpr(4)


@triton.jit
def _weighted_token(e, first, paged_len, recent_from):
    """The token at weighted position e of a sequence whose paged tokens count one each and
    whose recent-window tokens count RECENT_WEIGHT each."""
    return tl.where(e <= paged_len, first + e, recent_from + tl.cdiv(e - paged_len, RECENT_WEIGHT))


@triton.jit
def _split_bounds(CTX, QLEN, b, split, window, num_splits, HAS_RESIDUAL: tl.constexpr, BS: tl.constexpr,
                  BLOCK_T: tl.constexpr):
    """This program's token range [lo, hi) of sequence b, the window's first token and how many
    tokens sit in pages; tiles start on page boundaries. With KIVI's recent window, the splits
    share the paged tokens and the window by weight (RECENT_WEIGHT), so that the one holding the
    window is not the longest."""
    ctx = tl.load(CTX + b)
    start = 0
    if window > 0:
        start = tl.maximum(ctx - window, 0)
    paged = ctx
    first = start - start % BS
    if HAS_RESIDUAL:
        paged = tl.load(QLEN + b)
        recent_from = tl.maximum(paged, first)
        paged_len = recent_from - first
        total = paged_len + RECENT_WEIGHT * (ctx - recent_from)
        per = tl.cdiv(tl.cdiv(total, num_splits), BLOCK_T) * BLOCK_T
        e_lo = tl.minimum(split * per, total)
        lo = _weighted_token(e_lo, first, paged_len, recent_from)
        hi = tl.minimum(ctx, _weighted_token(tl.minimum(e_lo + per, total), first, paged_len, recent_from))
    else:
        tiles = tl.cdiv(ctx - first, BLOCK_T)
        per = tl.cdiv(tiles, num_splits)
        lo = first + split * per * BLOCK_T
        hi = tl.minimum(ctx, lo + per * BLOCK_T)
    return start, paged, lo, hi


@triton.jit
def _online_softmax(s, m_i, l_i):
    """One tile of scores (base 2) into the running max and sum; returns the tile's
    probabilities and the factor that rescales what was accumulated before."""
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp2(m_i - m_new)
    p = tl.exp2(s - m_new[:, None])
    return p, alpha, m_new, l_i * alpha + tl.sum(p, 1)


E2M1_UNIT = tl.constexpr(16384.0)  # _e2m1 returns values / 2^14; the per-tensor scale multiplies it back


@triton.jit
def _e2m1(u, DOT: tl.constexpr):
    """E2M1 codes (uint8, sign in bit 3) to their values / 2^14 as fp16 by placing the bits:
    the 2-bit exponent and 1-bit mantissa go to the bottom of fp16's exponent field and the top
    of its mantissa (fp16 subnormals line up with E2M1's), the sign to bit 15. Two masks and
    shifts per value; E2M1_UNIT, folded into the per-tensor scale, restores the magnitude."""
    c = u.to(tl.int16)
    x = (((c & 7) << 9) | ((c & 8) << 12)).to(tl.float16, bitcast=True)
    return _to_dot(x.to(tl.float32), DOT) if DOT != 2 else x


E4M3_UNIT = tl.constexpr(256.0)  # _byte_half returns e4m3 values / 2^8; the scales multiply it back


def _ptx_int_bytes(high: bool, magic: int) -> str:
    """Two words' low (or high) bytes to an fp16 pair: (byte ^ magic) in each 16-bit lane is
    0x6400 | code for uint8 (magic 0x6400) and 0x6400 | (code + 128) for int8 (0x6480), one LOP3
    after the mask; subtracting magic as fp16 (1024 or 1152) leaves the code exactly."""
    pair = f"0x{magic:04X}{magic:04X}"
    pick = "shr.b32 t, $1, 8; and.b32 t, t, 0x00FF00FF; " if high else "and.b32 t, $1, 0x00FF00FF; "
    return f"{{ .reg .b32 t, m; {pick}xor.b32 t, t, {pair}; mov.b32 m, {pair}; sub.f16x2 $0, t, m; }}"


def _ptx_nibbles(registers: str, setup: str, per_pair: str) -> str:
    """Four packed bytes' low or high nibbles to two fp16 pairs: `per_pair` runs once for bytes
    0-1 (PRMT selector 0x1100 spreads them over the two 16-bit lanes, into output $0) and once
    for bytes 2-3 (0x3322, into $1)."""
    pairs = "".join(per_pair.format(sel=sel, out=out) for sel, out in (("0x1100", "$0"), ("0x3322", "$1")))
    return f"{{ .reg .b32 {registers}; {setup}{pairs}}}"


def _ptx_e2m1(high: bool) -> str:
    """E2M1 nibbles placed as _e2m1 places them: exponent and mantissa to bits 9-11, sign to 15."""
    value_mask, value_shift, sign_mask, sign_shift = (
        ("0x00700070", 5, "0x00800080", 8) if high else ("0x00070007", 9, "0x00080008", 12))
    return _ptx_nibbles("t, a, c", "", f"prmt.b32 t, $2, $2, {{sel}}; and.b32 a, t, {value_mask}; "
                                       f"shl.b32 a, a, {value_shift}; and.b32 c, t, {sign_mask}; "
                                       f"shl.b32 c, c, {sign_shift}; or.b32 {{out}}, a, c; ")


# Built once here: Triton takes inline PTX as compile-time strings.
_PTX_INT8_LOW = tl.constexpr(_ptx_int_bytes(False, 0x6480))
_PTX_INT8_HIGH = tl.constexpr(_ptx_int_bytes(True, 0x6480))
_PTX_UINT8_LOW = tl.constexpr(_ptx_int_bytes(False, 0x6400))
_PTX_UINT8_HIGH = tl.constexpr(_ptx_int_bytes(True, 0x6400))
_PTX_UINT4_LOW = tl.constexpr(_ptx_nibbles(
    "t, m", "mov.b32 m, 0x64006400; ",
    "prmt.b32 t, $2, $2, {sel}; and.b32 t, t, 0x000F000F; or.b32 t, t, m; sub.f16x2 {out}, t, m; "))
# high nibbles land as 16 x code: one fma by 1/16 (0x2C00) and -64 (0xD400) after removing 1024
_PTX_UINT4_HIGH = tl.constexpr(_ptx_nibbles(
    "t, m, s, o", "mov.b32 m, 0x64006400; mov.b32 s, 0x2C002C00; mov.b32 o, 0xD400D400; ",
    "prmt.b32 t, $2, $2, {sel}; and.b32 t, t, 0x00F000F0; or.b32 t, t, m; fma.rn.f16x2 {out}, t, s, o; "))
_PTX_E2M1_LOW = tl.constexpr(_ptx_e2m1(False))
_PTX_E2M1_HIGH = tl.constexpr(_ptx_e2m1(True))


def _ptx_word_nibble(phase: int, e2m1: bool) -> str:
    """Nibble `phase` (bits 4·phase to 4·phase + 3) of two 16-bit words, one per lane, as an
    fp16 pair. Unsigned codes are ORed into 1024.0's mantissa (one LOP3 per pair, after a shift
    for the upper byte), giving 1024 + code for even nibbles and 1024 + 16·code for odd ones;
    one packed subtraction or fma leaves the code. E2M1 bits are placed as _e2m1 places them."""
    if e2m1:
        value, sign = 0x00070007 << 4 * phase, 0x00080008 << 4 * phase
        move = 9 - 4 * phase
        place = f"shl.b32 t, t, {move}; " if move > 0 else f"shr.b32 t, t, {-move}; "
        return (f"{{ .reg .b32 t, c; and.b32 t, $1, 0x{value:08X}; {place}and.b32 c, $1, 0x{sign:08X}; "
                f"shl.b32 c, c, {12 - 4 * phase}; or.b32 $0, t, c; }}")
    mask = 0x00F000F0 if phase % 2 else 0x000F000F
    word = "shr.b32 w, $1, 8; " if phase >= 2 else "mov.b32 w, $1; "
    # (w & mask) | 1024.0 as one lop3 (0xEA: a & b | c); written as and + or, ptxas keeps two
    place = f"{word}mov.b32 m, 0x64006400; lop3.b32 t, w, 0x{mask:08X}, m, 0xEA; "
    finish = ("mov.b32 s, 0x2C002C00; mov.b32 o, 0xD400D400; fma.rn.f16x2 $0, t, s, o; " if phase % 2
              else "sub.f16x2 $0, t, m; ")
    return f"{{ .reg .b32 w, t, m, s, o; {place}{finish}}}"


def _ptx_word_nibble_subnormal(phase: int) -> str:
    """Nibble `phase` of two 16-bit words, one per lane, left in place as an fp16 subnormal: one
    AND for the low byte's nibbles, a shift first for the high byte's (shared by its two). Even
    nibbles come out as code x 2^-24, odd ones as code x 2^-20 (SUBNORMAL_UNIT and the phase's
    factor of 16): no offset to remove, so no packed subtraction or fma."""
    mask = 0x00F000F0 if phase % 2 else 0x000F000F
    if phase < 2:
        return f"and.b32 $0, $1, 0x{mask:08X};"
    return f"{{ .reg .b32 w; shr.b32 w, $1, 8; and.b32 $0, w, 0x{mask:08X}; }}"


def _ptx_uint8_subnormal(high: bool) -> str:
    """Two words' low (or high) bytes as fp16 subnormals, code x 2^-24: one AND, or one PRMT
    that moves bytes 1 and 3 down and zeroes the rest."""
    if high:
        return "{ .reg .b32 z; mov.b32 z, 0; prmt.b32 $0, $1, z, 0x4341; }"
    return "and.b32 $0, $1, 0x00FF00FF;"


def _ptx_word_crumb(phase: int) -> str:
    """Bits 2·phase to 2·phase + 1 of two 16-bit words as an fp16 pair of 2-bit codes: ORed in
    place into 1024.0's mantissa (after moving the upper byte down for phases 5-7), which gives
    1024 + 4^k·code for the crumb at bit 2k; one packed fma by 4^-k and -1024·4^-k (exact in
    fp16) or, at k = 0, one subtraction leaves the code."""
    k = phase - 4 if phase > 4 else phase
    word = "shr.b32 w, $1, 8; " if phase > 4 else "mov.b32 w, $1; "
    place = f"{word}mov.b32 m, 0x64006400; lop3.b32 t, w, 0x{0x00030003 << 2 * k:08X}, m, 0xEA; "
    if k == 0:
        return f"{{ .reg .b32 w, t, m; {place}sub.f16x2 $0, t, m; }}"
    scale, offset = (struct.unpack("<H", struct.pack("<e", x))[0] for x in (4.0 ** -k, -1024.0 * 4.0 ** -k))
    return (f"{{ .reg .b32 w, t, m, s, o; {place}mov.b32 s, 0x{scale:04X}{scale:04X}; "
            f"mov.b32 o, 0x{offset:04X}{offset:04X}; fma.rn.f16x2 $0, t, s, o; }}")


# indexed by nibble (crumb) position inside the jit functions
_PTX_WORD_UINT4 = tl.constexpr(tuple(_ptx_word_nibble(i, False) for i in range(4)))
_PTX_WORD_UINT2 = tl.constexpr(tuple(_ptx_word_crumb(i) for i in range(8)))
_PTX_WORD_E2M1 = tl.constexpr(tuple(_ptx_word_nibble(i, True) for i in range(4)))
_PTX_WORD_UINT4_SUBNORMAL = tl.constexpr(tuple(_ptx_word_nibble_subnormal(i) for i in range(4)))
_PTX_UINT8_SUBNORMAL = tl.constexpr(tuple(_ptx_uint8_subnormal(high) for high in (False, True)))
# fp16's smallest subnormal: unsigned codes left in place in an fp16's low bits are multiples of it
SUBNORMAL_UNIT = tl.constexpr(2.0 ** -24)
RECENT_T = tl.constexpr(16)  # tokens per step over KIVI's fp16 recent window (the smallest dot)
NIBBLE_WORDS = tl.constexpr(5)  # the packed kernel's PAIR for split_words: 4-bit rows as 16-bit words of four
CRUMB_WORDS = tl.constexpr(6)  # the packed kernel's PAIR for split_words on 2-bit rows: words of eight
PHASE_COUNTS = tl.constexpr((2, 2, 2, 2, 2, 4, 8))  # the packed kernel's phases, by PAIR


@triton.jit
def _byte_half_asm(w, HIGH: tl.constexpr, PAIR: tl.constexpr, SUBNORMAL: tl.constexpr = False):
    """_byte_half's placements on 32-bit registers holding two words, so each result is already
    the fp16 pair the tensor cores take (Triton's 16-bit element code packs pairs with a PRMT)."""
    if SUBNORMAL:
        asm: tl.constexpr = _PTX_UINT8_SUBNORMAL[HIGH]
    elif PAIR == 3:
        asm: tl.constexpr = _PTX_INT8_HIGH if HIGH else _PTX_INT8_LOW
    elif PAIR == 4:
        asm: tl.constexpr = _PTX_UINT8_HIGH if HIGH else _PTX_UINT8_LOW
    elif PAIR == 2:
        if HIGH:
            asm: tl.constexpr = "and.b32 $0, $1, 0xFF00FF00;"
        else:
            asm: tl.constexpr = "shl.b32 $0, $1, 8; and.b32 $0, $0, 0xFF00FF00;"
    elif HIGH:
        asm: tl.constexpr = ("{ .reg .b32 t; shr.b32 t, $1, 1; and.b32 t, t, 0x3F803F80; "
                             "and.b32 $0, $1, 0x80008000; or.b32 $0, $0, t; }")
    else:
        asm: tl.constexpr = ("{ .reg .b32 t, u; shl.b32 t, $1, 7; and.b32 t, t, 0x3F803F80; shl.b32 u, $1, 8; "
                             "and.b32 u, u, 0x80008000; or.b32 $0, t, u; }")
    return tl.inline_asm_elementwise(asm, "=r,r", [w], dtype=tl.float16, is_pure=True, pack=2)


@triton.jit
def _nibble_half_asm(b, HIGH: tl.constexpr, E2M1: tl.constexpr):
    """The low (or HIGH) nibbles of packed bytes as fp16 pairs, four bytes per register;
    unsigned codes go into the mantissa of 1024.0 (0x6400), which packed arithmetic removes
    exactly; E2M1 bits are placed as _e2m1 places them."""
    if E2M1:
        asm: tl.constexpr = _PTX_E2M1_HIGH if HIGH else _PTX_E2M1_LOW
    else:
        asm: tl.constexpr = _PTX_UINT4_HIGH if HIGH else _PTX_UINT4_LOW
    return tl.inline_asm_elementwise(asm, "=r,=r,r", [b], dtype=tl.float16, is_pure=True, pack=4)


@triton.jit
def _code_unit(PHASE: tl.constexpr, PAIR: tl.constexpr, SUBNORMAL: tl.constexpr):
    """What code 1 of a phase decodes to: 1, or with SUBNORMAL fp16's smallest subnormal, 16
    times that for the odd nibbles of 4-bit words (they sit four bits up in their fp16)."""
    if not SUBNORMAL:
        unit = 1.0
    elif (PAIR == NIBBLE_WORDS) and (PHASE % 2 == 1):
        unit = SUBNORMAL_UNIT * 16.0
    else:
        unit = SUBNORMAL_UNIT
    return unit


@triton.jit
def _word_phase(w, PHASE: tl.constexpr, BITS: tl.constexpr, E2M1: tl.constexpr, ASM: tl.constexpr,
                DOT: tl.constexpr, SUBNORMAL: tl.constexpr = False):
    """The BITS-bit value at bits BITS·PHASE of each 16-bit word w (value (16 / BITS)·j + PHASE
    of the row for word j) in the dot dtype: E2M1 as _e2m1 gives it, unsigned codes as numbers
    (SUBNORMAL: times _code_unit, left in place in fp16's subnormal range)."""
    if ASM:  # the GPU: two words per register
        if E2M1:
            asm: tl.constexpr = _PTX_WORD_E2M1[PHASE]
        elif SUBNORMAL:
            asm: tl.constexpr = _PTX_WORD_UINT4_SUBNORMAL[PHASE]
        elif BITS == 4:
            asm: tl.constexpr = _PTX_WORD_UINT4[PHASE]
        else:
            asm: tl.constexpr = _PTX_WORD_UINT2[PHASE]
        x = tl.inline_asm_elementwise(asm, "=r,r", [w], dtype=tl.float16, is_pure=True, pack=2)
        out = _to_dot(x.to(tl.float32), DOT) if DOT != 2 else x
    else:
        c = (w >> (BITS * PHASE)) & ((1 << BITS) - 1)
        if E2M1:
            out = _e2m1(c, DOT)
        else:
            out = _to_dot(c.to(tl.float32) * _code_unit(PHASE, NIBBLE_WORDS, SUBNORMAL), DOT)
    return out


@triton.jit
def _phase_codes(codes, PHASE: tl.constexpr, PAIR: tl.constexpr, ASM: tl.constexpr, KIND: tl.constexpr,
                DOT: tl.constexpr, SUBNORMAL: tl.constexpr = False):
    """Values of one phase of a packed tile before any scale (E2M1: value / 2^14; SUBNORMAL:
    codes times _code_unit). With PAIR or ASM, `codes` are the raw bytes or words and the phase
    is picked here; otherwise they are already this half's codes."""
    if (PAIR == NIBBLE_WORDS) or (PAIR == CRUMB_WORDS):
        out = _word_phase(codes, PHASE, 4 if PAIR == NIBBLE_WORDS else 2, KIND == 4, ASM, DOT, SUBNORMAL)
    elif PAIR:
        out = _byte_half(codes, PHASE, PAIR, DOT, ASM, SUBNORMAL)
    elif ASM:
        out = _nibble_half_asm(codes, PHASE, KIND == 4)
    elif KIND == 4:
        out = _e2m1(codes, DOT)
    else:
        out = _to_dot(codes, DOT)
    return out


@triton.jit
def _byte_half(w, HIGH: tl.constexpr, PAIR: tl.constexpr, DOT: tl.constexpr, ASM: tl.constexpr = False,
               SUBNORMAL: tl.constexpr = False):
    """One of the two 8-bit values of each 16-bit word w (HIGH: the high byte) in the dot dtype:
    int8 (PAIR 3) and uint8 (4) codes as numbers (SUBNORMAL, uint8: times fp16's smallest
    subnormal, as the bits left in place give them); fp8 by placing bits: e5m2 (2) is the top byte
    of fp16 (exact); e4m3's (1) sign goes to bit 15 and its exponent and mantissa below fp16's top
    exponent bit, which gives value / 2^8 (fp16 subnormals line up with e4m3's; E4M3_UNIT, folded
    into the scales, restores the magnitude). e4m3's NaN code becomes a finite value, which only
    unused slots can hold and the masks drop."""
    if ASM:  # the GPU: the same bits, two words per instruction
        x = _byte_half_asm(w, HIGH, PAIR, SUBNORMAL)
    elif SUBNORMAL:  # uint8 codes left in fp16's subnormal range, as the PTX leaves them
        x = ((((w >> 8) if HIGH else w) & 0xFF).to(tl.float32) * SUBNORMAL_UNIT).to(tl.float16)
    elif PAIR == 3:
        x = ((w >> 8) if HIGH else ((w << 8) >> 8)).to(tl.float16)  # arithmetic shifts keep the sign
    elif PAIR == 4:
        x = (((w >> 8) if HIGH else w) & 0xFF).to(tl.float16)
    else:
        if PAIR == 2:
            bits = w & -256 if HIGH else w << 8  # -256 is 0xFF00 as int16
        elif HIGH:
            bits = ((w >> 1) & 0x3F80) | (w & -32768)  # -32768 is 0x8000 as int16
        else:
            bits = ((w << 7) & 0x3F80) | ((w << 8) & -32768)
        x = bits.to(tl.float16, bitcast=True)
    return _to_dot(x.to(tl.float32), DOT) if DOT != 2 else x


@triton.jit
def _grouped(x, SCALE, ZERO, rows, ROW: tl.constexpr, GROUP: tl.constexpr, PARTS: tl.constexpr,
             BLOCK_T: tl.constexpr, DOT: tl.constexpr, AFFINE: tl.constexpr, SCALE_WORDS: tl.constexpr = False):
    """x [BLOCK_T, ROW / PARTS] (dot dtype) times one scale (plus one zero when AFFINE) per GROUP
    consecutive values of a row. PARTS > 1 when x holds one phase of each row (values
    PARTS·j + phase: column j is in group j // (GROUP / PARTS)). SCALE_WORDS: e4m3 scales read
    as 16-bit words of two, so that no 8-bit tensor feeds the dot's operand (Triton then lays
    16-bit operands out for 8-bit sources, and every tile pays register moves for it)."""
    cg = tl.arange(0, ROW // GROUP)
    if SCALE_WORDS:  # group g is the low (even g) or high byte of word g // 2
        w = tl.load(SCALE + rows[:, None] * (ROW // GROUP // 2) + (cg // 2)[None, :])
        s = _byte_half(tl.where((cg % 2 == 1)[None, :], w >> 8, w), False, 1, DOT) * E4M3_UNIT
    else:
        s = _to_dot(tl.load(SCALE + rows[:, None] * (ROW // GROUP) + cg[None, :]).to(tl.float32), DOT)
    x3 = tl.reshape(x, [BLOCK_T, ROW // GROUP, GROUP // PARTS]) * s[:, :, None]
    if AFFINE:
        z = _to_dot(tl.load(ZERO + rows[:, None] * (ROW // GROUP) + cg[None, :]).to(tl.float32), DOT)
        x3 = x3 + z[:, :, None]
    return tl.reshape(x3, [BLOCK_T, ROW // PARTS])


@triton.jit
def _token_affine(TERMS, rows):
    """LMDeploy's per-token scale and zero point of `rows` (fp32), stored side by side as one
    32-bit word per token (scale in the low half): one 4-byte load, which Triton's cp.async
    pipeline takes, where two 2-byte ones are read outside it."""
    w = tl.load(TERMS + rows)
    scale = (w & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    zero = (w >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
    return scale, zero


@triton.jit
def _value_terms(p, acc_bias, VS, rows, KIND: tl.constexpr):
    """Per-token value terms where they cost least: each token's scale multiplies its column of
    probabilities (KIND 2, 3); LMDeploy's zero point adds p · zero to the output bias (KIND 3)."""
    pv = p
    if KIND == 2:
        pv = p * tl.load(VS + rows).to(tl.float32)[None, :]
    elif KIND == 3:
        vs3, vz3 = _token_affine(VS, rows)
        pv = p * vs3[None, :]
        acc_bias += tl.sum(p * vz3[None, :], 1)
    return pv, acc_bias


@triton.jit
def _page_affine(x, SCALE, ZERO, page_ids, kvh, HKV: tl.constexpr, ROW: tl.constexpr, BS: tl.constexpr,
                 NP: tl.constexpr, DOT: tl.constexpr):
    """KIVI keys: x [NP * BS, ROW] times the per-channel scale of each token's page, plus its min."""
    c = tl.arange(0, ROW)
    base = (page_ids[:, None] * HKV + kvh) * ROW + c[None, :]
    s = _to_dot(tl.load(SCALE + base).to(tl.float32), DOT)
    z = _to_dot(tl.load(ZERO + base).to(tl.float32), DOT)
    x3 = tl.reshape(x, [NP, BS, ROW]) * s[:, None, :] + z[:, None, :]
    return tl.reshape(x3, [NP * BS, ROW])


@triton.jit
def _plain_tile(t0, m_i, l_i, acc, acc_bias, q, q_rope, q_row_scale, qsum, K, KS, KZ, V, VS, VZ, BT, b, kvh,
                stride_bt, start, hi, paged, tile_rows, tile_in_page, tile_page_ids, k_loaded, v_loaded,
                MASKED: tl.constexpr, LOADED: tl.constexpr, D: tl.constexpr, D_ROPE: tl.constexpr, DV: tl.constexpr,
                BS: tl.constexpr, BLOCK_T: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr,
                VGROUP: tl.constexpr, V_FROM_K: tl.constexpr, DOT: tl.constexpr, KGROUP: tl.constexpr,
                SWAP_QK: tl.constexpr, I8_QK: tl.constexpr, HKV: tl.constexpr):
    """One tile of _decode_split_kernel's paged tokens into its running softmax state. LOADED:
    the caller prefetched the tile (its rows, pages and raw K and V); otherwise it is loaded here."""
    KROW: tl.constexpr = D + D_ROPE
    NP: tl.constexpr = BLOCK_T // BS
    if LOADED:
        rows = tile_rows
        in_page = tile_in_page
        page_ids = tile_page_ids
        k = _unraw(k_loaded, BITS, DOT)
        v = _unraw(v_loaded, BITS, DOT)
    else:
        t, valid, in_page, page_ids, rows = _tile(t0, b, kvh, BT, stride_bt, start, hi, paged, HKV, BS, BLOCK_T,
                                                  MASKED)
        # Issue both loads before any arithmetic so the K and V reads are in flight together.
        if DOT == 3:  # fp8 tensor cores take the stored bytes
            k = _codes(K, rows, KROW, 0, D, BITS, DOT, True)
            if not V_FROM_K:
                v = _codes(V, rows, DV, 0, DV, BITS, DOT, True)
        elif I8_QK:  # keys as stored for the int8 dot, values to the dot dtype
            k = _codes(K, rows, KROW, 0, D, BITS, DOT, True)
            v = _codes(V, rows, DV, 0, DV, BITS, DOT)
            if KIND == 3:  # uint8 codes u as int8 u - 128; the 128 moves into the zero point
                k = (k.to(tl.int32) - 128).to(tl.int8)
        else:
            k = _codes(K, rows, KROW, 0, D, BITS, DOT)
            if not V_FROM_K:
                v = _codes(V, rows, DV, 0, DV, BITS, DOT)
    if KIND == 4:
        k = _grouped(_e2m1(k, DOT), KS, KS, rows, KROW, KGROUP, 1, BLOCK_T, DOT, False)
    elif KIND == 5:
        k = _page_affine(_to_dot(k, DOT), KS, KZ, page_ids, kvh, HKV, KROW, BS, NP, DOT)
    elif BITS < 8:
        k = _to_dot(k, DOT)
    if DOT == 3:
        s = tl.dot(q, tl.trans(k)) * q_row_scale[:, None]
    elif I8_QK:
        s = tl.dot(q, tl.trans(k)).to(tl.float32) * q_row_scale[:, None]
    elif SWAP_QK:
        # the dequantized tile as the register-sourced A operand; q^T (loaded once) is B
        s = tl.trans(tl.dot(k, tl.trans(q)))
    else:
        s = tl.dot(q, tl.trans(k))
    if D_ROPE > 0:  # MLA: the rope part of the latent row
        s += tl.dot(q_rope, tl.trans(_codes(K, rows, KROW, D, D_ROPE, BITS, DOT)))
    if KIND == 2:
        ks_rows = tl.load(KS + rows).to(tl.float32)
        s = s * ks_rows[None, :]
    if KIND == 3:
        ks3, kz3 = _token_affine(KS, rows)
        if I8_QK:
            kz3 = kz3 + 128.0 * ks3
        s = s * ks3[None, :] + kz3[None, :] * qsum[:, None]
    if MASKED:
        s = tl.where(in_page[None, :], s, float("-inf"))
    p, alpha, m_new, l_i = _online_softmax(s, m_i, l_i)
    acc = acc * alpha[:, None]
    acc_bias = acc_bias * alpha
    if V_FROM_K:
        v = k  # MLA: the values are the latent part of the key row (D == DV)
        pv = p
        if KIND == 2:
            pv = p * ks_rows[None, :]
    else:
        pv, acc_bias = _value_terms(p, acc_bias, VS, rows, KIND)
        if KIND == 4:
            v = _grouped(_e2m1(v, DOT), VS, VS, rows, DV, KGROUP, 1, BLOCK_T, DOT, False)
        elif KIND == 5:
            v = _grouped(_to_dot(v, DOT), VS, VZ, rows, DV, VGROUP, 1, BLOCK_T, DOT, True)
        elif BITS < 8:
            v = _to_dot(v, DOT)
    if DOT == 3:
        # probabilities in e4m3 relative to each row's largest in the tile, rescaled after
        p_row = tl.maximum(tl.max(pv, 1), 1e-30)
        acc += tl.dot((pv / p_row[:, None]).to(tl.float8e4nv), v) * p_row[:, None]
    else:
        acc += tl.dot(_to_dot(pv, DOT), v)
    m_i = m_new
    return m_i, l_i, acc, acc_bias


@triton.jit(do_not_specialize=["num_splits"])  # one binary whatever the split count
def _decode_split_kernel(
    Q, K, KS, KZ, KG, V, VS, VZ, VG, RK, RV, QLEN, BT, CTX, M_OUT, L_OUT, ACC_OUT,
    sm_scale, window, stride_bt, rmax, num_splits,
    HQ: tl.constexpr, HKV: tl.constexpr, GROUP_Q: tl.constexpr, BLOCK_G: tl.constexpr,
    D: tl.constexpr, D_ROPE: tl.constexpr, DV: tl.constexpr, BS: tl.constexpr, BLOCK_T: tl.constexpr,
    KIND: tl.constexpr, BITS: tl.constexpr, VGROUP: tl.constexpr, V_FROM_K: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, DOT: tl.constexpr, KGROUP: tl.constexpr, SWAP_QK: tl.constexpr,
    PREFETCH: tl.constexpr, I8_QK: tl.constexpr,
):
    """Scales are applied where they cost least: per-tensor scales fold into q (keys) and the
    output (values); per-token scales multiply score columns and probabilities; zero points
    become a per-token score bias and a separate output bias; group scales (nvfp4 blocks,
    KIVI) are applied to the tile. Masked-off tokens read row 0 of their head (always valid
    memory), so loads need no masks and a stray value can never turn into NaN."""
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    KROW: tl.constexpr = D + D_ROPE
    NP: tl.constexpr = BLOCK_T // BS
    g = tl.arange(0, BLOCK_G)
    gmask = g < GROUP_Q
    heads = kvh * GROUP_Q + g
    d = tl.arange(0, D)
    dv = tl.arange(0, DV)
    qscale = sm_scale * 1.4426950408889634  # softmax in base 2
    if KIND == 1:
        qscale = qscale * tl.load(KS)
    if KIND == 4:
        qscale = qscale * tl.load(KG) * E2M1_UNIT
    q32 = tl.load(Q + (b * HQ + heads[:, None]) * KROW + d[None, :], mask=gmask[:, None], other=0.0).to(tl.float32)
    q32 = q32 * qscale
    qsum = tl.sum(q32, 1)  # zero points add z * sum(q) to every score
    if DOT == 3:
        # fp8 tensor cores read the fp8 cache as stored; q gets one scale per row (448 = e4m3 max)
        q_row_scale = tl.maximum(tl.max(tl.abs(q32), 1), 1e-30) / 448.0
        q = (q32 / q_row_scale[:, None]).to(tl.float8e4nv)
    elif I8_QK:
        # int8 tensor cores read int8 keys as stored; q rounded to int8 with one scale per row
        q_row_scale = tl.maximum(tl.max(tl.abs(q32), 1), 1e-30) / 127.0
        q = tl.floor(q32 / q_row_scale[:, None] + 0.5).to(tl.int8)
    else:
        q = _to_dot(q32, DOT)
        q_row_scale = qsum  # placeholder _plain_tile leaves unread
    if D_ROPE > 0:
        dr = D + tl.arange(0, D_ROPE)
        q_rope = tl.load(Q + (b * HQ + heads[:, None]) * KROW + dr[None, :], mask=gmask[:, None], other=0.0)
        q_rope = _to_dot(q_rope.to(tl.float32) * qscale, DOT)
    else:
        q_rope = q  # placeholder _plain_tile leaves unread

    start, paged, lo, hi = _split_bounds(CTX, QLEN, b, split, window, num_splits, HAS_RESIDUAL, BS, BLOCK_T)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, DV], tl.float32)
    acc_bias = tl.zeros([BLOCK_G], tl.float32)
    end = tl.minimum(hi, paged)  # KIVI's recent window: its own loop below
    if PREFETCH:  # the first tile's rows are loaded before the loop; each step loads the next
        t_n, valid_n, in_page_n, page_ids_n, rows_n = _tile(lo, b, kvh, BT, stride_bt, start, hi, paged, HKV, BS,
                                                            BLOCK_T)
        k_n = _codes(K, rows_n, KROW, 0, D, BITS, DOT, True)
        v_n = _codes(V, rows_n, DV, 0, DV, BITS, DOT, True)
        for t0 in range(lo, end, BLOCK_T):
            in_page, page_ids, rows, k_raw, v_raw = in_page_n, page_ids_n, rows_n, k_n, v_n
            t_n, valid_n, in_page_n, page_ids_n, rows_n = _tile(t0 + BLOCK_T, b, kvh, BT, stride_bt, start, hi, paged,
                                                                HKV, BS, BLOCK_T)
            k_n = _codes(K, rows_n, KROW, 0, D, BITS, DOT, True)
            v_n = _codes(V, rows_n, DV, 0, DV, BITS, DOT, True)
            m_i, l_i, acc, acc_bias = _plain_tile(
                t0, m_i, l_i, acc, acc_bias, q, q_rope, q_row_scale, qsum, K, KS, KZ, V, VS, VZ, BT, b, kvh,
                stride_bt, start, hi, paged, rows, in_page, page_ids, k_raw, v_raw, True, True, D, D_ROPE, DV, BS,
                BLOCK_T, KIND, BITS, VGROUP, V_FROM_K, DOT, KGROUP, SWAP_QK, I8_QK, HKV)
    else:
        has_head, full_lo, full_hi, masked = _full_tiles(lo, start, end, BLOCK_T)
        for t0 in range(full_lo, full_hi, BLOCK_T):
            m_i, l_i, acc, acc_bias = _plain_tile(
                t0, m_i, l_i, acc, acc_bias, q, q_rope, q_row_scale, qsum, K, KS, KZ, V, VS, VZ, BT, b, kvh,
                stride_bt, start, hi, paged, 0, 0, 0, 0, 0, False, False, D, D_ROPE, DV, BS, BLOCK_T, KIND, BITS,
                VGROUP, V_FROM_K, DOT, KGROUP, SWAP_QK, I8_QK, HKV)
        for j in range(0, masked):  # the head and tail tiles, with their masks
            t0 = full_hi
            if (j == 0) & has_head:
                t0 = lo
            m_i, l_i, acc, acc_bias = _plain_tile(
                t0, m_i, l_i, acc, acc_bias, q, q_rope, q_row_scale, qsum, K, KS, KZ, V, VS, VZ, BT, b, kvh,
                stride_bt, start, hi, paged, 0, 0, 0, 0, 0, True, False, D, D_ROPE, DV, BS, BLOCK_T, KIND, BITS,
                VGROUP, V_FROM_K, DOT, KGROUP, SWAP_QK, I8_QK, HKV)
    if HAS_RESIDUAL:  # KIVI's recent window in fp16, RECENT_T tokens at a time (no fp8/int8 dots)
        for r0 in range(tl.maximum(lo, paged), hi, RECENT_T):
            t = r0 + tl.arange(0, RECENT_T)
            ok = (t < hi) & (t >= start)
            res = tl.where(ok, (b * rmax + (t - paged)) * HKV + kvh, kvh)
            s = tl.dot(q, tl.trans(_recent(RK, res, D, 1, DOT)[0]))
            s = tl.where(ok[None, :], s, float("-inf"))
            p, alpha, m_new, l_i = _online_softmax(s, m_i, l_i)
            acc = acc * alpha[:, None] + tl.dot(_to_dot(p, DOT), _recent(RV, res, DV, 1, DOT)[0])
            acc_bias = acc_bias * alpha
            m_i = m_new
    acc = acc + acc_bias[:, None]
    if KIND == 1:
        acc = acc * tl.load(KS if V_FROM_K else VS)
    if KIND == 4:
        acc = acc * (tl.load(VG) * E2M1_UNIT)
    out = (b * HQ + heads) * num_splits + split
    tl.store(M_OUT + out, m_i, mask=gmask)
    tl.store(L_OUT + out, l_i, mask=gmask)
    tl.store(ACC_OUT + out[:, None] * DV + dv[None, :], acc, mask=gmask[:, None])


@triton.jit
def _phase_values(codes, SCALE, ZERO, rows, page_ids, kvh, PHASE: tl.constexpr, PHASES: tl.constexpr,
                  IS_K: tl.constexpr, PAIR: tl.constexpr, ASM: tl.constexpr, KIND: tl.constexpr,
                  ROW: tl.constexpr, GROUP: tl.constexpr, HKV: tl.constexpr, BS: tl.constexpr, NP: tl.constexpr,
                  BLOCK_T: tl.constexpr, DOT: tl.constexpr, SUBNORMAL: tl.constexpr):
    """One phase of a packed tile (values PHASES·j + PHASE of each row), dequantized up to its
    per-token terms."""
    x = _phase_codes(codes, PHASE, PAIR, ASM, KIND, DOT, SUBNORMAL)
    if KIND == 4:
        out = _grouped(x, SCALE, ZERO, rows, ROW, GROUP, PHASES, BLOCK_T, DOT, False, True)
    elif KIND == 5:
        if IS_K:  # per channel over the page: this phase's channels are PHASES·j + PHASE
            c = PHASES * tl.arange(0, ROW // PHASES) + PHASE
            base = (page_ids[:, None] * HKV + kvh) * ROW + c[None, :]
            sc = _to_dot(tl.load(SCALE + base).to(tl.float32), DOT)
            zc = _to_dot(tl.load(ZERO + base).to(tl.float32), DOT)
            x3 = tl.reshape(x, [NP, BS, ROW // PHASES]) * sc[:, None, :] + zc[:, None, :]
            out = tl.reshape(x3, [BLOCK_T, ROW // PHASES])
        else:
            out = _grouped(x, SCALE, ZERO, rows, ROW, GROUP, PHASES, BLOCK_T, DOT, True)
    else:
        out = x
    return out


@triton.jit
def _recent(R, res, ROW: tl.constexpr, PHASES: tl.constexpr, DOT: tl.constexpr):
    """KIVI: each phase's columns of the fp16 recent-window rows `res`, as a tuple."""
    out = ()
    for i in tl.static_range(PHASES):
        c = PHASES * tl.arange(0, ROW // PHASES) + i
        out = out + (_to_dot(tl.load(R + res[:, None] * ROW + c[None, :]).to(tl.float32), DOT),)
    return out


@triton.jit
def _phases(raw, SCALE, ZERO, rows, page_ids, kvh, PHASES: tl.constexpr, IS_K: tl.constexpr, PAIR: tl.constexpr,
            ASM: tl.constexpr, KIND: tl.constexpr, ROW: tl.constexpr, GROUP: tl.constexpr, HKV: tl.constexpr,
            BS: tl.constexpr, NP: tl.constexpr, BLOCK_T: tl.constexpr, DOT: tl.constexpr, SUBNORMAL: tl.constexpr):
    """Every phase of a packed tile as loaded (_phase_values of each), as a tuple."""
    out = ()
    for i in tl.static_range(PHASES):
        if PAIR or ASM:  # whole bytes or words: _phase_codes picks the phase
            codes = raw
        elif i == 0:
            codes = raw & 15
        else:
            codes = raw >> 4
        out = out + (_phase_values(codes, SCALE, ZERO, rows, page_ids, kvh, i, PHASES, IS_K, PAIR, ASM, KIND, ROW,
                                   GROUP, HKV, BS, NP, BLOCK_T, DOT, SUBNORMAL),)
    return out


@triton.jit
def _phase_scores(qd, kd, PHASES: tl.constexpr):
    """Scores summed over the phases' dots."""
    s = tl.dot(qd[0], tl.trans(kd[0]))
    for i in tl.static_range(1, PHASES):
        s += tl.dot(qd[i], tl.trans(kd[i]))
    return s


@triton.jit
def _rescaled(accs, alpha, PHASES: tl.constexpr):
    """Each phase's accumulated output times the tile's rescaling factor."""
    out = ()
    for i in tl.static_range(PHASES):
        out = out + (accs[i] * alpha[:, None],)
    return out


@triton.jit
def _phase_accumulate(accs, pd, vd, PHASES: tl.constexpr):
    """Each phase's output plus the tile's probabilities times that phase's values."""
    out = ()
    for i in tl.static_range(PHASES):
        out = out + (accs[i] + tl.dot(pd, vd[i]),)
    return out


@triton.jit
def _phase_output(acc, acc_bias, VS, VG, KIND: tl.constexpr, PAIR: tl.constexpr, PHASE: tl.constexpr,
                  SUBNORMAL: tl.constexpr):
    """One phase's accumulated output with what the loop left out: code units, zero points,
    per-tensor scales and units."""
    if SUBNORMAL:
        acc = acc * (1.0 / _code_unit(PHASE, PAIR, SUBNORMAL))
    acc = acc + acc_bias[:, None]
    if KIND == 4:
        acc = acc * (tl.load(VG) * E2M1_UNIT)
    if KIND == 1:
        acc = acc * tl.load(VS)
    if PAIR == 1:
        acc = acc * E4M3_UNIT
    return acc


@triton.jit
def _packed_tile(t0, m_i, l_i, accs, acc_bias, qd, qsum, K, KS, KZ, V, VS, VZ, BT, b, kvh, stride_bt, start, hi,
                 paged, MASKED: tl.constexpr, PHASES: tl.constexpr, D: tl.constexpr, DV: tl.constexpr,
                 BS: tl.constexpr, BLOCK_T: tl.constexpr, KIND: tl.constexpr, VGROUP: tl.constexpr,
                 KGROUP: tl.constexpr, HKV: tl.constexpr, DOT: tl.constexpr, PAIR: tl.constexpr, ASM: tl.constexpr,
                 SUBNORMAL: tl.constexpr):
    """One tile of _decode_split_kernel_packed's paged tokens into its running softmax state
    (accs: one accumulator per phase)."""
    NP: tl.constexpr = BLOCK_T // BS
    dh = tl.arange(0, D // PHASES)
    dvh = tl.arange(0, DV // PHASES)
    t, valid, in_page, page_ids, rows = _tile(t0, b, kvh, BT, stride_bt, start, hi, paged, HKV, BS, BLOCK_T, MASKED)
    kb = tl.load(K + rows[:, None] * (D // PHASES) + dh[None, :])
    vb = tl.load(V + rows[:, None] * (DV // PHASES) + dvh[None, :])
    kd = _phases(kb, KS, KZ, rows, page_ids, kvh, PHASES, True, PAIR, ASM, KIND, D, KGROUP, HKV, BS, NP, BLOCK_T,
                 DOT, SUBNORMAL)
    s = _phase_scores(qd, kd, PHASES)
    if KIND == 2:
        s = s * tl.load(KS + rows).to(tl.float32)[None, :]
    if KIND == 3:
        ks3, kz3 = _token_affine(KS, rows)
        if SUBNORMAL:  # every phase's products are codes x the largest code unit (q carries the rest)
            ks3 = ks3 * (1.0 / _code_unit(1, PAIR, SUBNORMAL))
        s = s * ks3[None, :] + kz3[None, :] * qsum[:, None]
    if MASKED:
        s = tl.where(in_page[None, :], s, float("-inf"))
    p, alpha, m_new, l_i = _online_softmax(s, m_i, l_i)
    accs = _rescaled(accs, alpha, PHASES)
    acc_bias = acc_bias * alpha
    pv, acc_bias = _value_terms(p, acc_bias, VS, rows, KIND)
    vd = _phases(vb, VS, VZ, rows, page_ids, kvh, PHASES, False, PAIR, ASM, KIND, DV, VGROUP, HKV, BS, NP, BLOCK_T,
                 DOT, SUBNORMAL)
    accs = _phase_accumulate(accs, _to_dot(pv, DOT), vd, PHASES)
    m_i = m_new
    return m_i, l_i, accs, acc_bias


@triton.jit(do_not_specialize=["num_splits"])  # one binary whatever the split count
def _decode_split_kernel_packed(
    Q, K, KS, KZ, KG, V, VS, VZ, VG, RK, RV, QLEN, BT, CTX, M_OUT, L_OUT, ACC_OUT,
    sm_scale, window, stride_bt, rmax, num_splits,
    HQ: tl.constexpr, HKV: tl.constexpr, GROUP_Q: tl.constexpr, BLOCK_G: tl.constexpr,
    D: tl.constexpr, DV: tl.constexpr, BS: tl.constexpr, BLOCK_T: tl.constexpr,
    KIND: tl.constexpr, VGROUP: tl.constexpr, HAS_RESIDUAL: tl.constexpr, DOT: tl.constexpr, KGROUP: tl.constexpr,
    PAIR: tl.constexpr, ASM: tl.constexpr, SUBNORMAL: tl.constexpr = False,
):
    """Packed layouts read in phases, never re-interleaved. PAIR = 0: 4-bit rows as bytes, the
    low nibble an even value and the high nibble an odd one; PAIR = 1-4: 8-bit rows (e4m3, e5m2,
    int8, uint8) as 16-bit words, low byte even, high byte odd; PAIR = 5: 4-bit rows as 16-bit
    words of four values, nibble i of word j being value 4j + i, so the tiles load like bf16's
    (no byte-wise shared-memory reads of the value tile); PAIR = 6: 2-bit rows as 16-bit words of
    eight, bits 2i to 2i + 1 of word j being value 8j + i. q is split into its phases' columns,
    scores are one dot per phase, values accumulate per phase and are stored to interleaved
    columns. SUBNORMAL (LMDeploy's unsigned codes, PAIR 4 and 5): codes are left in place in
    fp16's subnormal range with no offset to remove; even phases of q are scaled up by the 16
    that the odd nibbles carry, and the scores and each phase's output are scaled back once."""
    PHASES: tl.constexpr = PHASE_COUNTS[PAIR]
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    g = tl.arange(0, BLOCK_G)
    gmask = g < GROUP_Q
    heads = kvh * GROUP_Q + g
    dh = tl.arange(0, D // PHASES)
    dvh = tl.arange(0, DV // PHASES)
    qscale = sm_scale * 1.4426950408889634
    if KIND == 4:
        qscale = qscale * tl.load(KG) * E2M1_UNIT
    if KIND == 1:
        qscale = qscale * tl.load(KS)
    if PAIR == 1:
        qscale = qscale * E4M3_UNIT
    qbase = Q + (b * HQ + heads[:, None]) * D + PHASES * dh[None, :]
    qd = ()
    qsum = tl.zeros([BLOCK_G], tl.float32)
    for i in tl.static_range(PHASES):
        qi = tl.load(qbase + i, mask=gmask[:, None], other=0.0).to(tl.float32) * qscale
        qsum += tl.sum(qi, 1)  # zero points add z * sum(q) to every score
        if SUBNORMAL:  # so that every phase's products come out in the largest code unit
            qi = qi * (_code_unit(1, PAIR, SUBNORMAL) / _code_unit(i, PAIR, SUBNORMAL))
        qd = qd + (_to_dot(qi, DOT),)

    start, paged, lo, hi = _split_bounds(CTX, QLEN, b, split, window, num_splits, HAS_RESIDUAL, BS, BLOCK_T)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    accs = ()
    for i in tl.static_range(PHASES):
        accs = accs + (tl.zeros([BLOCK_G, DV // PHASES], tl.float32),)
    acc_bias = tl.zeros([BLOCK_G], tl.float32)
    # Tiles holding paged tokens; KIVI's fp16 recent window (tokens from `paged` on) has its own
    # loop after this one, so no tile merges the two (a merge lays the tiles out for the window's
    # strided loads and sends every decoded tile through shared memory).
    end = tl.minimum(hi, paged)
    has_head, full_lo, full_hi, masked = _full_tiles(lo, start, end, BLOCK_T)
    for t0 in range(full_lo, full_hi, BLOCK_T):
        m_i, l_i, accs, acc_bias = _packed_tile(
            t0, m_i, l_i, accs, acc_bias, qd, qsum, K, KS, KZ, V, VS, VZ, BT, b, kvh, stride_bt, start, hi, paged,
            False, PHASES, D, DV, BS, BLOCK_T, KIND, VGROUP, KGROUP, HKV, DOT, PAIR, ASM, SUBNORMAL)
    for j in range(0, masked):  # the head and tail tiles, with their masks
        t0 = full_hi
        if (j == 0) & has_head:
            t0 = lo
        m_i, l_i, accs, acc_bias = _packed_tile(
            t0, m_i, l_i, accs, acc_bias, qd, qsum, K, KS, KZ, V, VS, VZ, BT, b, kvh, stride_bt, start, hi, paged,
            True, PHASES, D, DV, BS, BLOCK_T, KIND, VGROUP, KGROUP, HKV, DOT, PAIR, ASM, SUBNORMAL)
    if HAS_RESIDUAL:  # KIVI's recent window in fp16, RECENT_T tokens at a time
        for r0 in range(tl.maximum(lo, paged), hi, RECENT_T):
            t = r0 + tl.arange(0, RECENT_T)
            ok = (t < hi) & (t >= start)
            res = tl.where(ok, (b * rmax + (t - paged)) * HKV + kvh, kvh)
            s = _phase_scores(qd, _recent(RK, res, D, PHASES, DOT), PHASES)
            s = tl.where(ok[None, :], s, float("-inf"))
            p, alpha, m_new, l_i = _online_softmax(s, m_i, l_i)
            accs = _phase_accumulate(_rescaled(accs, alpha, PHASES), _to_dot(p, DOT), _recent(RV, res, DV, PHASES, DOT),
                                     PHASES)
            acc_bias = acc_bias * alpha
            m_i = m_new
    out = (b * HQ + heads) * num_splits + split
    tl.store(M_OUT + out, m_i, mask=gmask)
    tl.store(L_OUT + out, l_i, mask=gmask)
    base = ACC_OUT + out[:, None] * DV + PHASES * dvh[None, :]
    for i in tl.static_range(PHASES):
        tl.store(base + i, _phase_output(accs[i], acc_bias, VS, VG, KIND, PAIR, i, SUBNORMAL), mask=gmask[:, None])


@triton.jit(do_not_specialize=["num_splits"])  # one binary whatever the split count
def _reduce_kernel(M, L, ACC, OUT, num_splits, DV: tl.constexpr, BLOCK_S: tl.constexpr):
    row = tl.program_id(0)  # b * HQ + head
    s = tl.arange(0, BLOCK_S)
    smask = s < num_splits
    dv = tl.arange(0, DV)
    m = tl.load(M + row * num_splits + s, mask=smask, other=float("-inf"))
    l = tl.load(L + row * num_splits + s, mask=smask, other=0.0)
    acc = tl.load(ACC + (row * num_splits + s[:, None]) * DV + dv[None, :], mask=smask[:, None], other=0.0)
    big = tl.max(m, 0)
    w = tl.where(m > float("-inf"), tl.exp2(m - big), 0.0)
    out = tl.sum(w[:, None] * acc, 0) / tl.sum(w * l, 0)
    tl.store(OUT + row * DV + dv, out)


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def _int8_qk(cache: PagedCache, wanted: bool) -> bool:
    """int8 tensor cores for q·k: int8 caches (per-token scales) and LMDeploy's uint8 one."""
    if wanted and not (cache.fmt.bits == 8 and cache.fmt.kind in (TOKEN_HEAD, ASYM)
                       and cache.fmt.value_dtype in (torch.int8, torch.uint8) and cache.v is not None):
        raise ValueError(f"int8 q·k needs an int8 or uint8 cache with per-token scales, not {cache.fmt.name}")
    return wanted and not interpreting()  # the interpreter has no int8 dot; checked on the GPU


def _asm_decode(wanted: bool) -> bool:
    """Packed halves decoded by inline PTX, several values per register; the interpreter runs
    no PTX, so there the same placements run per value (the tests check those)."""
    return wanted and not interpreting()


def _dot_kind(cache: PagedCache, fp8_dot: bool = False) -> int:
    if fp8_dot and (cache.fmt.value_dtype != torch.float8_e4m3fn or cache.fmt.kind not in (FP8_TENSOR, TOKEN_HEAD)):
        raise ValueError(f"fp8 dot needs an e4m3 cache with per-tensor or per-token scales, not {cache.fmt.name}")
    if interpreting():
        return DOT_F32  # the interpreter has no fp8 or bf16 arithmetic; the fp8 dot is checked on the GPU
    if fp8_dot:
        return DOT_FP8
    if cache.fmt.kind == PLAIN:
        return DOT_BF16 if cache.fmt.value_dtype == torch.bfloat16 else DOT_F16
    # Dequantized values carry scales and zero points: fp16 keeps 11 significant bits.
    return DOT_F16


# Residency rules of NVIDIA SMs (the CUDA occupancy calculator's): registers go to warps in
# units of 256, every resident block reserves 1 KiB of shared memory, at most 32 blocks.
REGISTER_UNIT = 256
RESERVED_SHARED_BYTES = 1024
MAX_PROGRAMS_PER_SM = 32


def resident_programs(registers: int, shared_bytes: int, num_warps: int, sm_registers: int,
                      sm_shared_bytes: int, sm_threads: int) -> int:
    """How many programs of a compiled kernel one SM holds at once (at least 1)."""
    warp_registers = math.ceil(registers * 32 / REGISTER_UNIT) * REGISTER_UNIT
    limits = [sm_registers // max(1, warp_registers * num_warps), sm_threads // (32 * num_warps),
              MAX_PROGRAMS_PER_SM]
    if shared_bytes:
        limits.append(sm_shared_bytes // (shared_bytes + RESERVED_SHARED_BYTES))
    return max(1, min(limits))


def wave_splits(pairs: int, tiles: int, slots: int) -> int:
    """Splits of each (sequence, KV head) pair's `tiles` that finish soonest on `slots`
    resident programs. A partly filled last wave costs as much as a full one (the H200 ran
    bf16 at 82% of copy bandwidth with 768 programs on 660 slots, 102% with 640), so the cost
    is waves × (tiles per program + 1), the 1 standing for a program's start and its partial
    result; ties go to fewer splits. More splits than slots only add whole waves, so the
    search stops there."""
    best, best_cost = 1, None
    for splits in range(1, max(1, min(tiles, slots)) + 1):
        cost = math.ceil(pairs * splits / slots) * (math.ceil(tiles / splits) + 1)
        if best_cost is None or cost < best_cost:
            best, best_cost = splits, cost
    return best


_RESIDENCY: dict = {}


def kernel_residency(kernel, constants: dict, num_warps: int, num_stages: int, device: torch.device,
                     maxnreg: int | None, probe_args) -> dict:
    """A compiled split kernel's registers, spills and shared bytes, the programs one SM holds,
    and the slots of the whole GPU (SMs × programs per SM); probe_args() gives launch arguments
    to compile it with, called once per kernel variant."""
    if device.type != "cuda":  # the interpreter: a nominal 4 SMs of 4 programs, so tests exercise splits
        return dict(registers=0, spills=0, shared_bytes=0, per_sm=4, slots=16)
    key = (kernel, tuple(sorted(constants.items())), num_warps, num_stages, maxnreg, device.index)
    if key not in _RESIDENCY:
        options = {} if maxnreg is None else dict(maxnreg=maxnreg)
        compiled = kernel.warmup(*probe_args(), grid=(1,), **constants, num_warps=num_warps, num_stages=num_stages,
                                 **options)
        compiled._init_handles()  # loads the binary; Triton fills in n_regs only then
        props = torch.cuda.get_device_properties(device)
        per_sm = resident_programs(compiled.n_regs, compiled.metadata.shared, num_warps,
                                   props.regs_per_multiprocessor, props.shared_memory_per_multiprocessor,
                                   props.max_threads_per_multi_processor)
        _RESIDENCY[key] = dict(registers=compiled.n_regs, spills=compiled.n_spills,
                               shared_bytes=compiled.metadata.shared, per_sm=per_sm,
                               slots=per_sm * props.multi_processor_count)
    return _RESIDENCY[key]


def phase_reading(fmt: CacheFormat) -> str | None:
    """The packed kernel's reading of a format's rows: 16-bit words of several values for 4- and
    2-bit layouts (split_words), of two values for 8-bit ones with per-tensor or per-token scales
    (split_bytes); None for the rest."""
    if fmt.bits in (2, 4):
        return "split_words"
    if fmt.kind in (FP8_TENSOR, TOKEN_HEAD, ASYM) and fmt.value_dtype in BYTE_PAIRS:
        return "split_bytes"
    return None


def kernel_constants(cache: PagedCache, q_heads: int, block_t: int = 64, swap_qk: bool = False,
                     prefetch: bool = False, fp8_dot: bool = False, int8_qk: bool = False,
                     split_nibbles: bool = False, split_bytes: bool = False, asm_decode: bool = False,
                     split_words: bool = False, subnormal_codes: bool = False):
    """The split kernel a cache and its options run, and that kernel's compile-time constants
    (paged_decode launches it with kernel_arguments; benchmarks/decode_sass.py compiles it from
    the same two without a GPU)."""
    hkv = cache.heads
    if q_heads % hkv:
        raise ValueError(f"{q_heads} query heads do not group over {hkv} KV heads")
    group_q = q_heads // hkv
    mla = cache.v is None
    d_main = cache.v_dim if mla else cache.head_dim
    for name, value in (("head size", d_main), ("value size", cache.v_dim)):
        if value & (value - 1):
            raise ValueError(f"{name} {value} must be a power of two for these kernels")
    f = cache.fmt
    shared = dict(HQ=q_heads, HKV=hkv, GROUP_Q=group_q, BLOCK_G=max(16, triton.next_power_of_2(group_q)),
                  DV=cache.v_dim, BS=cache.block_size, BLOCK_T=block_t, KIND=f.kind,
                  VGROUP=cache.group if f.kind == KIVI else NVFP4_GROUP, HAS_RESIDUAL=cache.residual_k is not None,
                  KGROUP=NVFP4_GROUP if f.kind == NVFP4 else cache.block_size)
    if split_nibbles + split_bytes + split_words > 1:
        raise ValueError("split_nibbles, split_bytes and split_words are different readings: choose one")
    if split_nibbles and (f.bits != 4 or mla):
        raise ValueError(f"split_nibbles reads 4-bit layouts, not {f.name}")
    if split_words and (phase_reading(f) != "split_words" or mla):
        raise ValueError(f"split_words reads 4-bit and 2-bit layouts, not {f.name}")
    if subnormal_codes and f.kind != ASYM:
        raise ValueError(f"subnormal_codes reads LMDeploy's unsigned codes (per-token scale and zero point), not "
                         f"{f.name}: its codes need per-value scales or signs")
    if subnormal_codes and not (split_words or split_bytes):
        raise ValueError(f"subnormal_codes reads LMDeploy's unsigned codes in phases: add split_words or split_bytes "
                         f"for {f.name}")
    if split_nibbles or split_words:
        pair = (NIBBLE_WORDS if f.bits == 4 else CRUMB_WORDS).value if split_words else 0
        width = min(cache.head_dim, cache.v_dim) // PHASE_COUNTS.value[pair]
        if width < 16:
            raise ValueError(f"{'split_words' if split_words else 'split_nibbles'} splits rows of "
                             f"{min(cache.head_dim, cache.v_dim)} {f.name} values into phases {width} wide, below "
                             f"the 16 a tensor-core dot needs: use the plain kernel at this head size")
        return _decode_split_kernel_packed, dict(shared, D=cache.head_dim, DOT=_dot_kind(cache), PAIR=pair,
                                               ASM=_asm_decode(asm_decode), SUBNORMAL=subnormal_codes)
    if split_bytes:
        if phase_reading(f) != "split_bytes" or mla:
            raise ValueError(f"split_bytes reads 8-bit layouts with per-tensor or per-token scales, not {f.name}")
        return _decode_split_kernel_packed, dict(shared, D=cache.head_dim, DOT=_dot_kind(cache),
                                               PAIR=BYTE_PAIRS[f.value_dtype], ASM=_asm_decode(asm_decode),
                                               SUBNORMAL=subnormal_codes)
    if asm_decode:
        raise ValueError("asm_decode decodes packed phases: use it with split_nibbles, split_bytes or split_words")
    return _decode_split_kernel, dict(
        shared, D=d_main, D_ROPE=cache.head_dim - d_main if mla else 0, BITS=f.bits, V_FROM_K=mla,
        DOT=_dot_kind(cache, fp8_dot), SWAP_QK=swap_qk, PREFETCH=prefetch and cache.v is not None and not int8_qk,
        I8_QK=_int8_qk(cache, int8_qk))


def kernel_arguments(q: torch.Tensor, cache: PagedCache, block_table: torch.Tensor, context_lens: torch.Tensor,
                     num_splits: int, window: int | None = None, sm_scale: float | None = None,
                     constants: dict | None = None) -> tuple[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The split kernels' run-time arguments in order (the cache's tensors, with a one-element
    placeholder for each one the layout lacks; the per-split outputs; the scalars), and those
    per-split outputs (max, sum, unnormalised output) for the reduction. `constants` (from
    kernel_constants) say which tensors the kernel reads as 16-bit words: the codes for
    split_bytes and split_words (PAIR > 0), nvfp4's e4m3 scales for the packed kernel."""
    constants = constants or {}
    words = constants.get("PAIR", 0) > 0
    scale_words = "PAIR" in constants and cache.fmt.kind == NVFP4
    batch, hq, _ = q.shape
    k, v = cache.k, cache.v
    dummy = torch.zeros(1, device=q.device, dtype=torch.float32)

    def arg(t):
        return dummy if t is None else t

    m = torch.empty(batch, hq, num_splits, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty(batch, hq, num_splits, cache.v_dim, device=q.device, dtype=torch.float32)
    def codes(side):
        return side.data.view(torch.int16) if words else side.data

    def scales(side):
        if side.affine_words is not None:  # LMDeploy: (scale, zero) as one 32-bit word per token
            return side.affine_words
        return side.scale.view(torch.int16) if scale_words else side.scale

    args = (q.contiguous(), codes(k), arg(scales(k)), arg(k.zero), arg(k.global_scale),
            arg(codes(v) if v else None), arg(scales(v) if v else None), arg(v.zero if v else None),
            arg(v.global_scale if v else None), arg(cache.residual_k), arg(cache.residual_v),
            arg(cache.quantized_lens), block_table, context_lens, m, l, acc,
            sm_scale if sm_scale is not None else cache.head_dim ** -0.5, int(window or 0), block_table.stride(0),
            cache.residual_k.shape[1] if cache.residual_k is not None else 0, num_splits)
    return args, (m, l, acc)


def compile_decode(q: torch.Tensor, cache: PagedCache, block_table: torch.Tensor, context_lens: torch.Tensor,
                   window: int | None = None, block_t: int = 64, num_warps: int = 4, num_stages: int = 2,
                   maxnreg: int | None = None, **options) -> None:
    """Compile the split kernel paged_decode would launch for these arguments and options, without
    launching it. Inside triton.AsyncCompileMode the compiles of many options run side by side,
    and paged_decode then finds each one compiled (the split count is not specialised on)."""
    if interpreting():
        return
    kernel, constants = kernel_constants(cache, q.shape[1], block_t, **options)
    args, _ = kernel_arguments(q, cache, block_table, context_lens, 2, window, None, constants)
    kernel.warmup(*args, grid=(1,), **constants, num_warps=num_warps, num_stages=num_stages,
                  **({} if maxnreg is None else dict(maxnreg=maxnreg)))


def paged_decode(q: torch.Tensor, cache: PagedCache, block_table: torch.Tensor, context_lens: torch.Tensor,
                 window: int | None = None, num_splits: int | None = None, block_t: int = 64, num_warps: int = 4,
                 num_stages: int = 2, sm_scale: float | None = None, max_context: int | None = None,
                 maxnreg: int | None = None, swap_qk: bool = False, prefetch: bool = False,
                 fp8_dot: bool = False, int8_qk: bool = False, split_nibbles: bool = False,
                 split_bytes: bool = False, asm_decode: bool = False, split_words: bool = False,
                 subnormal_codes: bool = False) -> torch.Tensor:
    """Decode attention over a paged cache: q [batch, Hq, head_dim] -> [batch, Hq, v_dim] fp32.
    num_splits defaults to whole waves of the GPU (wave_splits); maxnreg caps registers per
    thread so that more programs fit on an SM."""
    batch, hq, _ = q.shape
    hkv = cache.heads
    kernel, constants = kernel_constants(cache, hq, block_t, swap_qk, prefetch, fp8_dot, int8_qk, split_nibbles,
                                         split_bytes, asm_decode, split_words, subnormal_codes)
    longest = max_context if max_context is not None else int(context_lens.max())
    if cache.residual_k is not None:  # KIVI's recent window, weighted as _split_bounds weighs it
        longest += (RECENT_WEIGHT.value - 1) * cache.residual_k.shape[1]
    tiles = max(1, math.ceil(longest / block_t))
    if num_splits is None:
        slots = kernel_residency(kernel, constants, num_warps, num_stages, q.device, maxnreg,
                                 lambda: kernel_arguments(q, cache, block_table, context_lens, 2, window, sm_scale,
                                                          constants)[0])["slots"]
        num_splits = wave_splits(batch * hkv, tiles, slots)
    args, (m, l, acc) = kernel_arguments(q, cache, block_table, context_lens, num_splits, window, sm_scale,
                                         constants)
    options = {} if maxnreg is None else dict(maxnreg=maxnreg)
    kernel[(batch, hkv, num_splits)](*args, **constants, num_warps=num_warps, num_stages=num_stages, **options)
    out = torch.empty(batch, hq, cache.v_dim, device=q.device, dtype=torch.float32)
    _reduce_kernel[(batch * hq,)](m, l, acc, out, num_splits, DV=cache.v_dim,
                                  BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
    return out

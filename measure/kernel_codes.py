"""Stored codes to values, the part of the decode kernels (measure/kernel_plain.py,
measure/kernel_packed.py) that knows each layout's bits: @triton.jit helpers that load rows as
stored and unpack 2-, 4- and 8-bit codes (value by value, or one phase of packed bytes and
16-bit words at a time), the inline PTX strings the GPU runs for those placements, and the
group, page and per-token scales and zero points applied to a tile.

Triton resolves the globals of a jit function in its own module: the kernels import each helper
they call, and each tl.constexpr they read, from here.
"""

from __future__ import annotations

import struct

import triton
import triton.language as tl


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

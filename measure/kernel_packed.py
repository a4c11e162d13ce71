"""The split decode kernel that reads packed layouts in phases (_decode_split_kernel_packed:
4-bit and 2-bit rows as bytes or 16-bit words, 8-bit rows as 16-bit words of two) and its
per-phase helpers. It shares the tiling, split and softmax helpers of measure/kernel_plain.py
and the codes-to-values helpers of measure/kernel_codes.py; measure/kernels.py launches it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel_codes import (E2M1_UNIT, E4M3_UNIT, PHASE_COUNTS, _code_unit, _grouped, _phase_codes, _to_dot,
                           _token_affine, _value_terms)
from .kernel_plain import RECENT_T, _full_tiles, _online_softmax, _recent, _split_bounds, _tile


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

"""The split decode kernel for every stored layout read value by value (_decode_split_kernel),
the reduction of its splits (_reduce_kernel), and the tiling, split and online-softmax helpers
it shares with the packed layouts' phase kernel (measure/kernel_packed.py). measure/kernels.py
describes the kernels and launches them; the codes-to-values helpers are measure/kernel_codes.py.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .kernel_codes import (E2M1_UNIT, _codes, _e2m1, _grouped, _page_affine, _to_dot, _token_affine, _unraw,
                           _value_terms)


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


RECENT_T = tl.constexpr(16)  # tokens per step over KIVI's fp16 recent window (the smallest dot)


@triton.jit
def _recent(R, res, ROW: tl.constexpr, PHASES: tl.constexpr, DOT: tl.constexpr):
    """KIVI: each phase's columns of the fp16 recent-window rows `res`, as a tuple."""
    out = ()
    for i in tl.static_range(PHASES):
        c = PHASES * tl.arange(0, ROW // PHASES) + i
        out = out + (_to_dot(tl.load(R + res[:, None] * ROW + c[None, :]).to(tl.float32), DOT),)
    return out


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

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

import torch
import triton
import triton.language as tl

from .paged_cache import ASYM, FP8_TENSOR, KIVI, NVFP4, NVFP4_GROUP, PLAIN, TOKEN_HEAD, PagedCache

LOG2E = 1.4426950408889634
DOT_F32, DOT_BF16, DOT_F16 = 0, 1, 2


@triton.jit
def _to_dot(x, DOT: tl.constexpr):
    if DOT == 1:
        return x.to(tl.bfloat16)
    elif DOT == 2:
        return x.to(tl.float16)
    else:
        return x


@triton.jit
def _load_rows(DATA, SCALE, ZERO, GSCALE, rows, pages, kvh, cols, mask,
               ROW: tl.constexpr, KIND: tl.constexpr, BITS: tl.constexpr, GROUP: tl.constexpr,
               IS_K: tl.constexpr, HKV: tl.constexpr):
    """fp32 [tokens, cols] of one side; `rows` = (page * block_size + slot) * HKV + kvh."""
    r = rows[:, None]
    c = cols[None, :]
    m = mask[:, None]
    # fp8 loads take no `other` (no fp8 constant exists); masked lanes are zeroed after the cast,
    # since a stray NaN there would survive p = 0 in the P·V product.
    if KIND == 0:  # plain
        x = tl.where(m, tl.load(DATA + r * ROW + c, mask=m).to(tl.float32), 0.0)
    elif KIND == 1:  # fp8 with one scale per tensor
        x = tl.where(m, tl.load(DATA + r * ROW + c, mask=m).to(tl.float32), 0.0) * tl.load(SCALE)
    elif KIND == 2:  # one fp32 scale per token and head
        s = tl.load(SCALE + rows, mask=mask, other=0.0)
        x = tl.where(m, tl.load(DATA + r * ROW + c, mask=m).to(tl.float32), 0.0) * s[:, None]
    else:
        PER: tl.constexpr = 8 // BITS
        if BITS == 8:
            u = tl.load(DATA + r * ROW + c, mask=m, other=0).to(tl.int32)
        else:
            byte = tl.load(DATA + r * (ROW // PER) + c // PER, mask=m, other=0).to(tl.int32)
            u = (byte >> ((c % PER) * BITS)) & ((1 << BITS) - 1)
        if KIND == 3:  # asymmetric: fp16 scale and zero per token and head
            s = tl.load(SCALE + rows, mask=mask, other=0.0).to(tl.float32)
            z = tl.load(ZERO + rows, mask=mask, other=0.0).to(tl.float32)
            x = u.to(tl.float32) * s[:, None] + z[:, None]
        elif KIND == 4:  # nvfp4: e2m1 code, fp8 scale per 16 values, fp32 tensor scale
            mag = u & 7
            e = mag >> 1
            frac = (mag & 1).to(tl.float32) * 0.5
            val = tl.where(e == 0, frac, (1.0 + frac) * tl.exp2((e - 1).to(tl.float32)))
            val = tl.where(u >= 8, -val, val)
            bs = tl.where(m, tl.load(SCALE + r * (ROW // GROUP) + c // GROUP, mask=m).to(tl.float32), 0.0)
            x = val * bs * tl.load(GSCALE)
        else:  # KIVI
            if IS_K:  # per channel, one group per page
                idx = (pages[:, None] * HKV + kvh) * ROW + c
            else:  # per token, groups of GROUP channels
                idx = r * (ROW // GROUP) + c // GROUP
            s = tl.load(SCALE + idx, mask=m, other=0.0).to(tl.float32)
            z = tl.load(ZERO + idx, mask=m, other=0.0).to(tl.float32)
            x = u.to(tl.float32) * s + z
    return x


@triton.jit
def _decode_split_kernel(
    Q, K, KS, KZ, KG, V, VS, VZ, VG, RK, RV, QLEN, BT, CTX, M_OUT, L_OUT, ACC_OUT,
    sm_scale, window, stride_bt, rmax, num_splits,
    HQ: tl.constexpr, HKV: tl.constexpr, GROUP_Q: tl.constexpr, BLOCK_G: tl.constexpr,
    D: tl.constexpr, D_ROPE: tl.constexpr, DV: tl.constexpr, BS: tl.constexpr, BLOCK_T: tl.constexpr,
    KIND: tl.constexpr, BITS: tl.constexpr, VGROUP: tl.constexpr, V_FROM_K: tl.constexpr,
    HAS_RESIDUAL: tl.constexpr, DOT: tl.constexpr, KGROUP: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    split = tl.program_id(2)
    KROW: tl.constexpr = D + D_ROPE
    g = tl.arange(0, BLOCK_G)
    gmask = g < GROUP_Q
    heads = kvh * GROUP_Q + g
    d = tl.arange(0, D)
    dv = tl.arange(0, DV)
    qscale = sm_scale * 1.4426950408889634  # softmax in base 2
    q = tl.load(Q + (b * HQ + heads[:, None]) * KROW + d[None, :], mask=gmask[:, None], other=0.0).to(tl.float32)
    q = _to_dot(q * qscale, DOT)
    if D_ROPE > 0:
        dr = D + tl.arange(0, D_ROPE)
        q_rope = tl.load(Q + (b * HQ + heads[:, None]) * KROW + dr[None, :], mask=gmask[:, None], other=0.0)
        q_rope = _to_dot(q_rope.to(tl.float32) * qscale, DOT)

    ctx = tl.load(CTX + b)
    start = 0
    if window > 0:
        start = tl.maximum(ctx - window, 0)
    paged = ctx
    if HAS_RESIDUAL:
        paged = tl.load(QLEN + b)
    tiles = tl.cdiv(ctx - start, BLOCK_T)
    per = tl.cdiv(tiles, num_splits)
    lo = start + split * per * BLOCK_T
    hi = tl.minimum(ctx, lo + per * BLOCK_T)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, DV], tl.float32)
    for t0 in range(lo, hi, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        valid = t < hi
        in_page = valid & (t < paged)
        page = tl.load(BT + b * stride_bt + t // BS, mask=in_page, other=0)
        rows = (page * BS + t % BS) * HKV + kvh
        k = _load_rows(K, KS, KZ, KG, rows, page, kvh, d, in_page, KROW, KIND, BITS, KGROUP, True, HKV)
        if HAS_RESIDUAL:
            res = ((b * rmax + (t - paged)) * HKV + kvh)
            rmask = valid & (t >= paged)
            rk = tl.load(RK + res[:, None] * D + d[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
            k = tl.where(in_page[:, None], k, rk)
        s = tl.dot(q, tl.trans(_to_dot(k, DOT)))
        if D_ROPE > 0:
            kr = _load_rows(K, KS, KZ, KG, rows, page, kvh, dr, in_page, KROW, KIND, BITS, KGROUP, True, HKV)
            s += tl.dot(q_rope, tl.trans(_to_dot(kr, DOT)))
        s = tl.where(valid[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_FROM_K:
            v = k  # MLA: the values are the latent part of the key row (D == DV)
        else:
            v = _load_rows(V, VS, VZ, VG, rows, page, kvh, dv, in_page, DV, KIND, BITS, VGROUP, False, HKV)
            if HAS_RESIDUAL:
                rv = tl.load(RV + res[:, None] * DV + dv[None, :], mask=rmask[:, None], other=0.0).to(tl.float32)
                v = tl.where(in_page[:, None], v, rv)
        acc = acc * alpha[:, None] + tl.dot(_to_dot(p, DOT), _to_dot(v, DOT))
        m_i = m_new
    out = (b * HQ + heads) * num_splits + split
    tl.store(M_OUT + out, m_i, mask=gmask)
    tl.store(L_OUT + out, l_i, mask=gmask)
    tl.store(ACC_OUT + out[:, None] * DV + dv[None, :], acc, mask=gmask[:, None])


@triton.jit
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


def _dot_kind(cache: PagedCache) -> int:
    if interpreting():
        return DOT_F32
    if cache.fmt.kind == PLAIN:
        return DOT_BF16 if cache.fmt.value_dtype == torch.bfloat16 else DOT_F16
    # Dequantized values carry scales and zero points: fp16 keeps 11 significant bits.
    return DOT_F16


def default_splits(batch: int, kv_heads: int, tiles: int, sm_count: int) -> int:
    """Enough splits for about two programs per SM, never more than the tiles."""
    return max(1, min(tiles, math.ceil(2 * sm_count / max(1, batch * kv_heads))))


def paged_decode(q: torch.Tensor, cache: PagedCache, block_table: torch.Tensor, context_lens: torch.Tensor,
                 window: int | None = None, num_splits: int | None = None, block_t: int = 64, num_warps: int = 4,
                 num_stages: int = 2, sm_scale: float | None = None, max_context: int | None = None) -> torch.Tensor:
    """Decode attention over a paged cache: q [batch, Hq, head_dim] -> [batch, Hq, v_dim] fp32."""
    batch, hq, _ = q.shape
    hkv = cache.heads
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not group over {hkv} KV heads")
    group_q = hq // hkv
    mla = cache.v is None
    d_main = cache.v_dim if mla else cache.head_dim
    d_rope = cache.head_dim - d_main if mla else 0
    for name, value in (("head size", d_main), ("value size", cache.v_dim)):
        if value & (value - 1):
            raise ValueError(f"{name} {value} must be a power of two for these kernels")
    longest = max_context if max_context is not None else int(context_lens.max())
    tiles = max(1, math.ceil(longest / block_t))
    if num_splits is None:
        sms = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        num_splits = default_splits(batch, hkv, tiles, sms)
    f = cache.fmt
    k, v = cache.k, cache.v
    dummy = torch.zeros(1, device=q.device, dtype=torch.float32)

    def arg(t):
        return dummy if t is None else t

    m = torch.empty(batch, hq, num_splits, device=q.device, dtype=torch.float32)
    l = torch.empty_like(m)
    acc = torch.empty(batch, hq, num_splits, cache.v_dim, device=q.device, dtype=torch.float32)
    residual = cache.residual_k is not None
    _decode_split_kernel[(batch, hkv, num_splits)](
        q.contiguous(), k.data, arg(k.scale), arg(k.zero), arg(k.global_scale),
        arg(v.data if v else None), arg(v.scale if v else None), arg(v.zero if v else None),
        arg(v.global_scale if v else None), arg(cache.residual_k), arg(cache.residual_v),
        arg(cache.quantized_lens), block_table, context_lens, m, l, acc,
        sm_scale if sm_scale is not None else cache.head_dim ** -0.5, int(window or 0), block_table.stride(0),
        cache.residual_k.shape[1] if residual else 0, num_splits,
        HQ=hq, HKV=hkv, GROUP_Q=group_q, BLOCK_G=max(16, triton.next_power_of_2(group_q)), D=d_main,
        D_ROPE=d_rope, DV=cache.v_dim, BS=cache.block_size, BLOCK_T=block_t, KIND=f.kind, BITS=f.bits,
        VGROUP=cache.group if f.kind == KIVI else NVFP4_GROUP, V_FROM_K=mla, HAS_RESIDUAL=residual,
        DOT=_dot_kind(cache), KGROUP=NVFP4_GROUP if f.kind == NVFP4 else cache.block_size,
        num_warps=num_warps, num_stages=num_stages,
    )
    out = torch.empty(batch, hq, cache.v_dim, device=q.device, dtype=torch.float32)
    _reduce_kernel[(batch * hq,)](m, l, acc, out, num_splits, DV=cache.v_dim,
                                  BLOCK_S=max(2, triton.next_power_of_2(num_splits)))
    return out


KINDS_READ = (PLAIN, FP8_TENSOR, TOKEN_HEAD, ASYM, NVFP4, KIVI)  # every layout the kernel reads

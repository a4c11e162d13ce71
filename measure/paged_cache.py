"""Paged KV caches in each format's stored layout, and a torch reference decode over them.

The layouts are what the fused kernels (measure/kernels.py) read: pages of `block_size`
tokens, [num_blocks, block_size, kv_heads, row] with the row packed as the format packs it,
plus the format's scales. `pack` quantizes fp32 keys and values into a layout; `dequantize`
reads it back; `reference_decode` is decode attention over the dequantized cache in fp32 and
`split_reference_decode` runs the kernels' split-K algorithm (partial max, sum and output per
split, then one reduction) in torch, so the algorithm is checked on the CPU.

Everything here is plain torch and runs on any device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .quant import relative_error  # noqa: F401  (re-exported: the kernels' tests and benchmark compare with it)

E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)

# kind codes the kernel branches on (constexpr)
PLAIN, FP8_TENSOR, TOKEN_HEAD, ASYM, NVFP4, KIVI = range(6)


@dataclass(frozen=True)
class CacheFormat:
    name: str
    kind: int
    bits: int  # stored bits per value
    value_dtype: torch.dtype  # element type of the stored rows (uint8 for packed)


FORMATS = {
    "bf16": CacheFormat("bf16", PLAIN, 16, torch.bfloat16),
    "fp16": CacheFormat("fp16", PLAIN, 16, torch.float16),
    "fp8_e4m3": CacheFormat("fp8_e4m3", FP8_TENSOR, 8, torch.float8_e4m3fn),
    "fp8_e5m2": CacheFormat("fp8_e5m2", FP8_TENSOR, 8, torch.float8_e5m2),
    "fp8_per_token_head": CacheFormat("fp8_per_token_head", TOKEN_HEAD, 8, torch.float8_e4m3fn),
    "int8_per_token_head": CacheFormat("int8_per_token_head", TOKEN_HEAD, 8, torch.int8),
    "lmdeploy_int8": CacheFormat("lmdeploy_int8", ASYM, 8, torch.uint8),
    "lmdeploy_int4": CacheFormat("lmdeploy_int4", ASYM, 4, torch.uint8),
    "nvfp4": CacheFormat("nvfp4", NVFP4, 4, torch.uint8),
    "kivi4": CacheFormat("kivi4", KIVI, 4, torch.uint8),
    "kivi2": CacheFormat("kivi2", KIVI, 2, torch.uint8),
}
NVFP4_GROUP = 16
from .bounds import FP8_DOT_TOLERANCE, KERNEL_TOLERANCE, KIVI_RESIDUAL, kernel_tolerance  # noqa: E402,F401


@dataclass
class PagedSide:
    """One of K or V: stored rows and their metadata (absent tensors are None)."""

    data: torch.Tensor  # [num_blocks, heads, block_size, packed row]: head-major pages (TensorRT-LLM's
    # layout), so one head's rows of a page are one contiguous run
    scale: torch.Tensor | None = None  # per tensor [1], per token-head [nb, h, bs], nvfp4 [nb, h, bs, D/16],
    # KIVI keys [nb, h, D] (per channel over the page), KIVI values [nb, h, bs, D/G]
    zero: torch.Tensor | None = None  # asymmetric formats: same shape as scale
    global_scale: torch.Tensor | None = None  # nvfp4: [1] fp32
    # LMDeploy: each token's fp16 scale and zero point side by side; scale and zero are views of
    # it, and this is the same storage as one int32 word per token [nb, h, bs] for the kernels
    affine_words: torch.Tensor | None = None

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data, self.scale, self.zero, self.global_scale)
                   if t is not None)


@dataclass
class PagedCache:
    fmt: CacheFormat
    block_size: int
    heads: int
    head_dim: int  # K head size (MLA: the latent + rope size)
    v_dim: int  # V head size (MLA: the latent size, read from the K rows)
    k: PagedSide
    v: PagedSide | None  # None for MLA: V is the first v_dim values of each K row
    group: int = 0  # KIVI group (= block_size for keys)
    residual_k: torch.Tensor | None = None  # KIVI recent tokens in fp16 [batch, R, heads, D]
    residual_v: torch.Tensor | None = None
    quantized_lens: torch.Tensor | None = None  # KIVI: tokens of each sequence held in pages
    extra: dict = field(default_factory=dict)

    def nbytes(self) -> int:
        total = self.k.nbytes() + (self.v.nbytes() if self.v is not None else 0)
        for t in (self.residual_k, self.residual_v):
            if t is not None:
                total += t.numel() * t.element_size()
        return total


# -- packing ----------------------------------------------------------------------------------


def _pack_bits(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes (< 2^bits) along the last dim into bytes: element i of a byte at bits [i*bits, (i+1)*bits)."""
    per = 8 // bits
    c = codes.to(torch.int32).reshape(*codes.shape[:-1], codes.shape[-1] // per, per)
    shifts = torch.arange(per, device=codes.device, dtype=torch.int32) * bits
    return (c << shifts).sum(dim=-1).to(torch.uint8)


def unpack_bits(packed: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    shifts = torch.arange(per, device=packed.device, dtype=torch.int32) * bits
    c = (packed.to(torch.int32).unsqueeze(-1) >> shifts) & ((1 << bits) - 1)
    return c.reshape(*packed.shape[:-1], packed.shape[-1] * per)


def _e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """Nearest E2M1 magnitude (ties to the lower code), sign in bit 3; no 8x temporary."""
    grid = torch.tensor(E2M1, device=x.device)
    mids = (grid[1:] + grid[:-1]) / 2
    mag = torch.bucketize(x.abs(), mids, right=False)
    return (mag + 8 * (x < 0)).to(torch.int32)


def e2m1_values(codes: torch.Tensor) -> torch.Tensor:
    grid = torch.tensor(E2M1, device=codes.device)
    mag = grid[(codes & 7).long()]
    return torch.where(codes >= 8, -mag, mag)


def _asym(x: torch.Tensor, bits: int, dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    scale = ((hi - lo) / (2**bits - 1)).clamp(min=1e-6).half()
    zero = lo.half()
    q = ((x - zero.float()) / scale.float()).round().clamp(0, 2**bits - 1)
    return q.to(torch.int32), scale, zero


def _pack_side(fmt: CacheFormat, x: torch.Tensor, nb: int, bs: int, side: str, group: int) -> PagedSide:
    """x: [nb * bs, heads, D] fp32 in physical page order; stored head-major."""
    s = _pack_side_nhd(fmt, x, nb, bs, side, group)
    if fmt.kind == ASYM:
        pairs = torch.stack([_hnd(s.scale), _hnd(s.zero)], dim=-1).contiguous()  # [nb, h, bs, 2] fp16
        return PagedSide(_hnd(s.data), pairs[..., 0], pairs[..., 1],
                         affine_words=pairs.view(torch.int32).squeeze(-1))
    kivi_keys = fmt.kind == KIVI and side == "k"
    return PagedSide(_hnd(s.data), s.scale if kivi_keys else _hnd(s.scale), s.zero if kivi_keys else _hnd(s.zero),
                     s.global_scale)


def _hnd(t: torch.Tensor | None) -> torch.Tensor | None:
    """[nb, bs, h, ...] -> contiguous [nb, h, bs, ...]; per-tensor scalars pass through."""
    if t is None or t.dim() < 3:
        return t
    return t.transpose(1, 2).contiguous()


def _nhd(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None or t.dim() < 3:
        return t
    return t.transpose(1, 2)


def _pack_side_nhd(fmt: CacheFormat, x: torch.Tensor, nb: int, bs: int, side: str, group: int) -> PagedSide:
    h, d = x.shape[1], x.shape[2]
    pages = x.reshape(nb, bs, h, d)
    if fmt.kind == PLAIN:
        return PagedSide(pages.to(fmt.value_dtype))
    if fmt.kind == FP8_TENSOR:
        scale = (x.abs().amax() / torch.finfo(fmt.value_dtype).max).clamp(min=1e-12).reshape(1).float()
        return PagedSide((pages / scale).to(fmt.value_dtype), scale)
    if fmt.kind == TOKEN_HEAD:
        qmax = 127.0 if fmt.value_dtype == torch.int8 else torch.finfo(fmt.value_dtype).max
        scale = (pages.abs().amax(dim=-1) / qmax).clamp(min=1e-12).float()
        scaled = pages / scale.unsqueeze(-1)
        data = scaled.round().clamp(-127, 127).to(torch.int8) if fmt.value_dtype == torch.int8 else \
            scaled.to(fmt.value_dtype)
        return PagedSide(data, scale)
    if fmt.kind == ASYM:
        q, scale, zero = _asym(pages, fmt.bits, dim=-1)
        data = q.to(torch.uint8) if fmt.bits == 8 else _pack_bits(q, fmt.bits)
        return PagedSide(data, scale.squeeze(-1), zero.squeeze(-1))
    if fmt.kind == NVFP4:
        global_scale = (x.abs().amax() / (448.0 * 6.0)).clamp(min=1e-12).reshape(1).float()
        blocks = pages.reshape(nb, bs, h, d // NVFP4_GROUP, NVFP4_GROUP)
        bscale = (blocks.abs().amax(dim=-1) / 6.0 / global_scale).to(torch.float8_e4m3fn)
        denom = (bscale.float() * global_scale).clamp(min=1e-12).unsqueeze(-1)
        codes = _e2m1_codes(blocks / denom).reshape(nb, bs, h, d)
        return PagedSide(_pack_bits(codes, 4), bscale, None, global_scale)
    if fmt.kind == KIVI:
        if side == "k":  # per channel over the page's tokens (group = block_size)
            q, scale, zero = _asym(pages, fmt.bits, dim=1)
            return PagedSide(_pack_bits(q, fmt.bits), scale.squeeze(1), zero.squeeze(1))
        grouped = pages.reshape(nb, bs, h, d // group, group)
        q, scale, zero = _asym(grouped, fmt.bits, dim=-1)
        return PagedSide(_pack_bits(q.reshape(nb, bs, h, d), fmt.bits), scale.squeeze(-1), zero.squeeze(-1))
    raise ValueError(f"no paged layout for {fmt.name}")


def pack(name: str, k: torch.Tensor, v: torch.Tensor | None, block_size: int, v_dim: int | None = None,
         kivi_group: int | None = None) -> PagedCache:
    """Quantize fp32 keys/values [num_blocks * block_size, heads, D] into the paged layout.
    `v` None means MLA: values are the first `v_dim` entries of each key row."""
    fmt = FORMATS[name]
    n, h, d = k.shape
    if n % block_size:
        raise ValueError("token count must be a whole number of pages")
    nb = n // block_size
    if fmt.kind == KIVI and v is None:
        raise ValueError("KIVI has no MLA layout")
    group = kivi_group or block_size
    if fmt.kind == KIVI and group != block_size:
        raise ValueError("this layout groups KIVI keys by one page: kivi_group must equal block_size")
    ks = _pack_side(fmt, k, nb, block_size, "k", group)
    vs = _pack_side(fmt, v, nb, block_size, "v", group) if v is not None else None
    return PagedCache(fmt, block_size, h, d, v_dim if v is None else v.shape[2], ks, vs,
                      group if fmt.kind == KIVI else 0)


def add_kivi_residual(cache: PagedCache, k_recent: torch.Tensor, v_recent: torch.Tensor,
                      quantized_lens: torch.Tensor) -> PagedCache:
    """KIVI keeps each sequence's newest tokens in fp16: [batch, R, heads, D]."""
    cache.residual_k, cache.residual_v = k_recent.half(), v_recent.half()
    cache.quantized_lens = quantized_lens.to(torch.int32)
    return cache


# -- reading back --------------------------------------------------------------------------------


def dequantize_side(cache: PagedCache, stored: PagedSide, side: str) -> torch.Tensor:
    """fp32 [nb, bs, heads, D] (token-major) from the head-major stored side."""
    fmt = cache.fmt
    kivi_keys = fmt.kind == KIVI and side == "k"
    s = PagedSide(_nhd(stored.data), stored.scale if kivi_keys else _nhd(stored.scale),
                  stored.zero if kivi_keys else _nhd(stored.zero), stored.global_scale)
    if fmt.kind == PLAIN:
        return s.data.float()
    if fmt.kind == FP8_TENSOR:
        return s.data.float() * s.scale
    if fmt.kind == TOKEN_HEAD:
        return s.data.float() * s.scale.unsqueeze(-1)
    if fmt.kind == ASYM:
        q = s.data.to(torch.int32) if fmt.bits == 8 else unpack_bits(s.data, fmt.bits)
        return q.float() * s.scale.float().unsqueeze(-1) + s.zero.float().unsqueeze(-1)
    if fmt.kind == NVFP4:
        vals = e2m1_values(unpack_bits(s.data, 4))
        scale = s.scale.float().repeat_interleave(NVFP4_GROUP, dim=-1) * s.global_scale
        return vals * scale
    if fmt.kind == KIVI:
        q = unpack_bits(s.data, fmt.bits).float()
        if side == "k":
            return q * s.scale.float().unsqueeze(1) + s.zero.float().unsqueeze(1)
        g = cache.group
        return q * s.scale.float().repeat_interleave(g, -1) + s.zero.float().repeat_interleave(g, -1)
    raise ValueError(fmt.name)


def dequantize(cache: PagedCache) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (k, v) pages [nb, bs, heads, D]; MLA values are sliced from the keys."""
    k = dequantize_side(cache, cache.k, "k")
    v = dequantize_side(cache, cache.v, "v") if cache.v is not None else k[..., :cache.v_dim]
    return k, v


def sequence_kv(cache: PagedCache, block_table: torch.Tensor, context_lens: torch.Tensor, b: int,
                kv: tuple[torch.Tensor, torch.Tensor] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence b's keys and values [T, heads, D] in token order, through the block table."""
    k, v = kv if kv is not None else dequantize(cache)
    ctx = int(context_lens[b])
    paged = ctx if cache.quantized_lens is None else int(cache.quantized_lens[b])
    pages = block_table[b, : math.ceil(paged / cache.block_size)].long()
    ks = k[pages].reshape(-1, cache.heads, k.shape[-1])[:paged]
    vs = v[pages].reshape(-1, cache.heads, v.shape[-1])[:paged]
    if paged < ctx:
        ks = torch.cat([ks, cache.residual_k[b, : ctx - paged].float()])
        vs = torch.cat([vs, cache.residual_v[b, : ctx - paged].float()])
    return ks, vs


def _scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """q [Hq, D], k [T, Hkv, D] -> [Hq, T] with query head i reading KV head i // (Hq/Hkv)."""
    group = q.shape[0] // k.shape[1]
    kk = k.repeat_interleave(group, dim=1)
    return torch.einsum("hd,thd->ht", q.float(), kk) * scale


def reference_decode(q: torch.Tensor, cache: PagedCache, block_table: torch.Tensor, context_lens: torch.Tensor,
                     window: int | None = None, sm_scale: float | None = None) -> torch.Tensor:
    """fp32 decode attention over the dequantized cache: [batch, Hq, v_dim]."""
    kv = dequantize(cache)
    scale = sm_scale if sm_scale is not None else cache.head_dim ** -0.5
    out = []
    for b in range(q.shape[0]):
        ks, vs = sequence_kv(cache, block_table, context_lens, b, kv)
        start = max(0, ks.shape[0] - window) if window else 0
        s = _scores(q[b], ks[start:], scale)
        group = q.shape[1] // cache.heads
        out.append(torch.einsum("ht,thd->hd", s.softmax(-1), vs[start:].repeat_interleave(group, dim=1)))
    return torch.stack(out)


def split_ranges(start: int, end: int, splits: int, tile: int) -> list[tuple[int, int]]:
    """The kernels' split of [start, end) into `splits` runs of whole tiles (some may be empty)."""
    tiles = math.ceil((end - start) / tile) if end > start else 0
    per = math.ceil(tiles / splits) if splits else 0
    return [(min(end, start + i * per * tile), min(end, start + (i + 1) * per * tile)) for i in range(splits)]


def split_reference_decode(q: torch.Tensor, cache: PagedCache, block_table: torch.Tensor,
                           context_lens: torch.Tensor, splits: int, tile: int, window: int | None = None,
                           sm_scale: float | None = None) -> torch.Tensor:
    """The split-K algorithm in torch: per split (max, sum of exp, unnormalised output), then
    out = Σ_s e^(m_s − M) acc_s / Σ_s e^(m_s − M) l_s. Empty splits carry m = −inf, l = 0."""
    kv = dequantize(cache)
    scale = sm_scale if sm_scale is not None else cache.head_dim ** -0.5
    group = q.shape[1] // cache.heads
    out = []
    for b in range(q.shape[0]):
        ks, vs = sequence_kv(cache, block_table, context_lens, b, kv)
        ctx = ks.shape[0]
        start = max(0, ctx - window) if window else 0
        ms, ls, accs = [], [], []
        for lo, hi in split_ranges(start, ctx, splits, tile):
            if hi <= lo:
                ms.append(torch.full((q.shape[1],), -math.inf))
                ls.append(torch.zeros(q.shape[1]))
                accs.append(torch.zeros(q.shape[1], vs.shape[-1]))
                continue
            s = _scores(q[b], ks[lo:hi], scale)
            m = s.amax(-1)
            p = torch.exp(s - m[:, None])
            ms.append(m)
            ls.append(p.sum(-1))
            accs.append(torch.einsum("ht,thd->hd", p, vs[lo:hi].repeat_interleave(group, dim=1)))
        m_all = torch.stack(ms)  # [S, Hq]
        big = m_all.amax(0)
        w = torch.exp(m_all - big)  # empty splits: exp(-inf) = 0
        num = (w[..., None] * torch.stack(accs)).sum(0)
        den = (w * torch.stack(ls)).sum(0)
        out.append(num / den[:, None])
    return torch.stack(out)



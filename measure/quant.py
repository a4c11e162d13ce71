"""Quantize and dequantize K/V with each format's scheme (reference torch code, any device).

Inputs are [tokens, heads, head_dim] tensors; `roundtrip(name, x, side)` returns the
dequantized tensor. ERROR_BOUNDS gives the relative RMS error each scheme must stay under
on heavy-tailed keys and values (tests/test_measure_cpu.py checks them on the CPU).
"""

from __future__ import annotations

import torch

from sizing.cache.formats import FormatOptions

E2M1_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
# ggml-quants.c kvalues_iq4nl
IQ4NL_CODEBOOK = torch.tensor([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                              dtype=torch.float32)

from .bounds import ERROR_BOUNDS, TURBOQUANT_PRESETS  # noqa: E402  (torch-free, for kvsize validate)


def _float(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return x.to(dtype).float()


def _fp8_scaled(x: torch.Tensor, dtype: torch.dtype, dims: tuple[int, ...] | None) -> torch.Tensor:
    fmax = torch.finfo(dtype).max
    amax = x.abs().amax() if dims is None else x.abs().amax(dim=dims, keepdim=True)
    scale = (amax / fmax).clamp(min=1e-12)
    return (x / scale).to(dtype).float() * scale


def _int_sym(x: torch.Tensor, bits: int, dim: int) -> torch.Tensor:
    qmax = 2 ** (bits - 1) - 1
    scale = (x.abs().amax(dim=dim, keepdim=True) / qmax).clamp(min=1e-12)
    return (x / scale).round().clamp(-qmax - 1, qmax) * scale


def _int_asym(x: torch.Tensor, bits: int, dim: int, scale_dtype=torch.float16) -> torch.Tensor:
    lo, hi = x.amin(dim=dim, keepdim=True), x.amax(dim=dim, keepdim=True)
    scale = ((hi - lo) / (2**bits - 1)).clamp(min=1e-8).to(scale_dtype).float()
    zero = lo.to(scale_dtype).float()
    return ((x - zero) / scale).round().clamp(0, 2**bits - 1) * scale + zero


def _blocks(x: torch.Tensor, size: int) -> torch.Tensor:
    return x.reshape(*x.shape[:-1], x.shape[-1] // size, size)


def _ggml_signed(x: torch.Tensor, levels: int) -> torch.Tensor:
    """q4_0 / q5_0: d = (value of largest magnitude) / -levels, q = round(x/d) + levels."""
    b = _blocks(x, 32)
    idx = b.abs().argmax(dim=-1, keepdim=True)
    vmax = torch.gather(b, -1, idx)
    d = (vmax / -levels).to(torch.float16).float()
    d = torch.where(d == 0, torch.ones_like(d), d)
    q = (b / d + levels).round().clamp(0, 2 * levels - 1)
    return ((q - levels) * d).reshape(x.shape)


def _ggml_minmax(x: torch.Tensor, bits: int) -> torch.Tensor:
    return _int_asym(_blocks(x, 32), bits, -1).reshape(x.shape)


def _q8_0(x: torch.Tensor) -> torch.Tensor:
    b = _blocks(x, 32)
    d = (b.abs().amax(dim=-1, keepdim=True) / 127).to(torch.float16).float().clamp(min=1e-12)
    return ((b / d).round().clamp(-128, 127) * d).reshape(x.shape)


def _iq4_nl(x: torch.Tensor) -> torch.Tensor:
    b = _blocks(x, 32)
    d = (b.abs().amax(dim=-1, keepdim=True) / 127).to(torch.float16).float().clamp(min=1e-12)
    book = IQ4NL_CODEBOOK.to(x.device)
    idx = ((b / d).unsqueeze(-1) - book).abs().argmin(dim=-1)
    return (book[idx] * d).reshape(x.shape)


def _nvfp4(x: torch.Tensor) -> torch.Tensor:
    grid = E2M1_GRID.to(x.device)
    global_scale = (x.abs().amax() / (448.0 * 6.0)).clamp(min=1e-12)
    b = _blocks(x, 16)
    block_scale = (b.abs().amax(dim=-1, keepdim=True) / 6.0 / global_scale).to(torch.float8_e4m3fn).float()
    scale = (block_scale * global_scale).clamp(min=1e-12)
    v = b / scale
    idx = (v.abs().unsqueeze(-1) - grid).abs().argmin(dim=-1)
    return (grid[idx] * v.sign() * scale).reshape(x.shape)


def _mxfp4(x: torch.Tensor) -> torch.Tensor:
    """E2M1 values with one power-of-two (E8M0) scale per 32 (OCP MX)."""
    grid = E2M1_GRID.to(x.device)
    b = _blocks(x, 32)
    scale = torch.exp2(torch.ceil(torch.log2((b.abs().amax(dim=-1, keepdim=True) / 6.0).clamp(min=2.0**-126))))
    v = b / scale
    idx = (v.abs().unsqueeze(-1) - grid).abs().argmin(dim=-1)
    return (grid[idx] * v.sign() * scale).reshape(x.shape)


def _hadamard(d: int, device) -> torch.Tensor:
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / h.shape[0] ** 0.5


def _turboquant_key(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Keys rotated by a Hadamard matrix, unit-normalised (fp16 norm kept) and coded with the 2^bits
    normal-quantile centroids of a coordinate of a random unit vector (an approximation of vLLM's
    Lloyd-Max tables, turboquant/centroids.py); 8 bits means fp8 keys."""
    d = x.shape[-1]
    if bits == 8:
        return _float(x, torch.float8_e4m3fn)
    h = _hadamard(d, x.device)
    r = x @ h
    norm = r.norm(dim=-1, keepdim=True).to(torch.float16).float().clamp(min=1e-12)
    u = r / norm
    probs = (torch.arange(2**bits, dtype=torch.float32, device=x.device) + 0.5) / 2**bits
    book = torch.special.ndtri(probs) / d**0.5
    q = book[(u.unsqueeze(-1) - book).abs().argmin(dim=-1)]
    return (q * norm) @ h.T


def _kivi(x: torch.Tensor, bits: int, side: str, options: FormatOptions) -> torch.Tensor:
    g, r = options.kivi_group, options.kivi_residual
    tokens = x.shape[0]
    quantized = max(0, tokens - r)
    quantized -= quantized % g if side == "k" else 0  # keys quantize whole token groups; the rest stays fp16
    out = x.to(torch.float16).float().clone()
    if quantized == 0:
        return out
    head = x[:quantized]
    if side == "k":  # per channel over g tokens: [groups, g, heads, d] -> reduce over tokens
        grouped = head.reshape(quantized // g, g, *head.shape[1:])
        out[:quantized] = _int_asym(grouped, bits, 1).reshape(head.shape)
    else:  # per token over g channels
        out[:quantized] = _int_asym(_blocks(head, g), bits, -1).reshape(head.shape)
    return out


def _kvarn(x: torch.Tensor, side: str, tile: int) -> torch.Tensor:
    """KVarN's grid without its variance normalization (so at most its error): channels Hadamard-rotated,
    keys 4-bit asymmetric per channel over each whole tile of tokens (a partial last tile stays fp16),
    values 2-bit asymmetric per token."""
    h = _hadamard(x.shape[-1], x.device)
    r = x.float() @ h
    out = r.to(torch.float16).float().clone()
    if side == "k":
        whole = r.shape[0] - r.shape[0] % tile
        if whole:
            grouped = r[:whole].reshape(whole // tile, tile, *r.shape[1:])
            out[:whole] = _int_asym(grouped, 4, 1).reshape(r[:whole].shape)
    else:
        out = _int_asym(r, 2, -1)
    return out @ h.T


def _kvquant3(x: torch.Tensor, options: FormatOptions) -> torch.Tensor:
    frac = float(options.kvquant_outlier_fraction)
    flat = x.reshape(-1, x.shape[-1])
    k = max(1, int(-(-frac * x.shape[-1] // 1))) if frac > 0 else 0
    out = torch.empty_like(flat)
    # per-channel normalisation, then a shared 8-entry non-uniform codebook (normal quantiles)
    mean, std = flat.mean(dim=0, keepdim=True), flat.std(dim=0, keepdim=True).clamp(min=1e-6)
    z = (flat - mean) / std
    probs = (torch.arange(8, dtype=torch.float32, device=x.device) + 0.5) / 8
    book = torch.special.ndtri(probs)
    idx = (z.unsqueeze(-1) - book).abs().argmin(dim=-1)
    out = book[idx] * std + mean
    if k:
        top = flat.abs().topk(k, dim=-1).indices
        out.scatter_(-1, top, torch.gather(flat, -1, top).to(torch.float16).float())
    return out.reshape(x.shape)


def roundtrip(name: str, x: torch.Tensor, side: str = "k", options: FormatOptions | None = None) -> torch.Tensor:
    """Quantize then dequantize x ([tokens, heads, head_dim], float32) with format `name`."""
    o = options or FormatOptions()
    x = x.float()
    table = {
        "fp32": lambda: x.clone(),
        "fp16": lambda: _float(x, torch.float16),
        "bf16": lambda: _float(x, torch.bfloat16),
        "fp8_e4m3": lambda: _fp8_scaled(x, torch.float8_e4m3fn, None),
        "fp8_e5m2": lambda: _fp8_scaled(x, torch.float8_e5m2, None),
        "fp8_per_token_head": lambda: _fp8_scaled(x, torch.float8_e4m3fn, (-1,)),
        "int8_per_token_head": lambda: _int_sym(x, 8, -1),
        "nvfp4": lambda: _nvfp4(x),
        "q8_0": lambda: _q8_0(x),
        "q4_0": lambda: _ggml_signed(x, 8),
        "q5_0": lambda: _ggml_signed(x, 16),
        "q4_1": lambda: _ggml_minmax(x, 4),
        "q5_1": lambda: _ggml_minmax(x, 5),
        "iq4_nl": lambda: _iq4_nl(x),
        "lmdeploy_int8": lambda: _int_asym(x, 8, -1),
        "lmdeploy_int4": lambda: _int_asym(x, 4, -1),
        "lmdeploy_fp8": lambda: _fp8_scaled(x, torch.float8_e4m3fn, None),
        "lmdeploy_fp8_e5m2": lambda: _fp8_scaled(x, torch.float8_e5m2, None),
        # quant_policy 42: K and V as rotated unit vectors with their norms, K at 4 bits, V at 2.
        "lmdeploy_turboquant": lambda: _turboquant_key(x, 4 if side == "k" else 2),
        "kvarn_k4v2_g128": lambda: _kvarn(x, side, 128),
        "kvarn_k4v2_g64": lambda: _kvarn(x, side, 64),
        "kivi2": lambda: _kivi(x, 2, side, o),
        "kivi4": lambda: _kivi(x, 4, side, o),
        "kvquant3": lambda: _kvquant3(x, o),
        "int4_per_token_head": lambda: _int_asym(x, 4, -1),
        "nvfp4_4over6": lambda: _nvfp4(x),
        "nvfp4_ds_mla": lambda: _nvfp4(x),
        "fp4_e2m1_nvfp4": lambda: _nvfp4(x),
        "ultraquant_4bit": lambda: _mxfp4(x),
        "fp4_e2m1_mxfp4": lambda: _mxfp4(x),
        "sglang_int8": lambda: _int_asym(x, 8, -1),
        "int8": lambda: _int_sym(x.reshape(-1), 8, 0).reshape(x.shape),
    }
    for preset, (key_bits, value_bits) in TURBOQUANT_PRESETS.items():
        table[preset] = (lambda kb=key_bits, vb=value_bits:
                         _turboquant_key(x, kb) if side == "k" else _int_asym(x, vb, -1))
    return table[name]()


def realistic_kv(tokens: int, heads: int, head_dim: int, generator: torch.Generator | None = None,
                 device="cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Keys with a few heavy outlier channels (as KIVI and KVQuant describe), Gaussian-ish values."""
    k = torch.randn(tokens, heads, head_dim, generator=generator, device=device)
    outliers = torch.randperm(head_dim, generator=generator, device=device)[: max(1, head_dim // 32)]
    k[..., outliers] *= 8.0
    v = torch.randn(tokens, heads, head_dim, generator=generator, device=device) * 0.5
    return k, v


def relative_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return float((approx.float() - exact.float()).norm() / exact.float().norm().clamp(min=1e-12))

"""One decode step of paged attention, the plain torch reference path: gather pages through
a block table, dequantize, attend. Fused kernels are a separate piece of work."""

from __future__ import annotations

import torch

from .quant import realistic_kv, relative_error, roundtrip

STORAGE = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2, "fp8_per_token_head": torch.float8_e4m3fn}


def paged_decode_case(fmt: str, batch: int, context: int, q_heads: int, kv_heads: int, head_dim: int,
                      block_size: int, device: str, iters: int = 20, seed: int = 0) -> dict:
    g = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = -(-context // block_size)
    num_blocks = batch * blocks_per_seq
    k, v = realistic_kv(num_blocks * block_size, kv_heads, head_dim, g, device)
    kq = roundtrip(fmt, k, "k")
    vq = roundtrip(fmt, v, "v")
    storage = STORAGE.get(fmt, torch.bfloat16 if fmt not in ("fp32", "fp16") else getattr(torch, {
        "fp32": "float32", "fp16": "float16"}[fmt]))
    scale_k = scale_v = torch.tensor(1.0, device=device)
    if storage in (torch.float8_e4m3fn, torch.float8_e5m2):
        fmax = torch.finfo(storage).max
        scale_k = (kq.abs().amax() / fmax).to(device)
        scale_v = (vq.abs().amax() / fmax).to(device)
    k_pages = (kq.to(device) / scale_k).to(storage).reshape(num_blocks, block_size, kv_heads, head_dim)
    v_pages = (vq.to(device) / scale_v).to(storage).reshape(num_blocks, block_size, kv_heads, head_dim)
    block_table = torch.randperm(num_blocks, generator=g, device=device).reshape(batch, blocks_per_seq)
    q = torch.randn(batch, q_heads, head_dim, generator=g, device=device)

    def step() -> torch.Tensor:
        kk = k_pages[block_table].reshape(batch, -1, kv_heads, head_dim)[:, :context].float() * scale_k
        vv = v_pages[block_table].reshape(batch, -1, kv_heads, head_dim)[:, :context].float() * scale_v
        return _attend(q, kk, vv)

    # fp32 reference on the unquantized keys and values, through the same block table
    k_ref = k.to(device).reshape(num_blocks, block_size, kv_heads, head_dim)[block_table]
    v_ref = v.to(device).reshape(num_blocks, block_size, kv_heads, head_dim)[block_table]
    ref = _attend(q, k_ref.reshape(batch, -1, kv_heads, head_dim)[:, :context],
                  v_ref.reshape(batch, -1, kv_heads, head_dim)[:, :context])
    out = step()
    times = []
    if device.startswith("cuda"):
        for _ in range(3):
            step()
        torch.cuda.synchronize()
        for _ in range(iters):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end))
    times.sort()
    return dict(format=fmt, batch=batch, context=context, q_heads=q_heads, kv_heads=kv_heads, head_dim=head_dim,
                block_size=block_size, median_ms=times[len(times) // 2] if times else None,
                attention_rel_error=relative_error(out, ref))


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """q [B, Hq, D], k/v [B, T, Hkv, D] -> [B, Hq, D], GQA by repeating KV heads."""
    b, hq, d = q.shape
    hkv = k.shape[2]
    k = k.repeat_interleave(hq // hkv, dim=2)
    v = v.repeat_interleave(hq // hkv, dim=2)
    scores = torch.einsum("bhd,bthd->bht", q, k) / d**0.5
    return torch.einsum("bht,bthd->bhd", scores.softmax(dim=-1), v)

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

This module is the host side: the kernels' compile-time constants and run-time arguments for a
cache and its options, the split count that fills the GPU (SM residency of the compiled kernel),
and the launches (compile_decode, paged_decode). The device code: measure/kernel_plain.py (the
split kernel for every layout, the reduction, the shared tiling helpers), measure/kernel_packed.py
(packed layouts read in phases) and measure/kernel_codes.py (stored codes to values, inline PTX).
"""

from __future__ import annotations

import math
import os

import torch
import triton

from .kernel_codes import (  # noqa: F401  (SUBNORMAL_UNIT and the PTX strings re-exported: the tests run the PTX)
    CRUMB_WORDS, NIBBLE_WORDS, PHASE_COUNTS, SUBNORMAL_UNIT, _PTX_UINT8_SUBNORMAL, _PTX_WORD_UINT4_SUBNORMAL)
from .kernel_packed import _decode_split_kernel_packed
from .kernel_plain import RECENT_WEIGHT, _decode_split_kernel, _reduce_kernel
from .paged_cache import ASYM, FP8_TENSOR, KIVI, NVFP4, NVFP4_GROUP, PLAIN, TOKEN_HEAD, CacheFormat, PagedCache

LOG2E = 1.4426950408889634
DOT_F32, DOT_BF16, DOT_F16, DOT_FP8 = 0, 1, 2, 3
# the packed kernel's PAIR for split_bytes, by stored dtype
BYTE_PAIRS = {torch.float8_e4m3fn: 1, torch.float8_e5m2: 2, torch.int8: 3, torch.uint8: 4}


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

"""KV cache storage formats: one registry row per format, each citing where its layout comes from.

A format stores, for each (layer, K or V side), a payload tensor and zero or more metadata tensors (scales,
zero points, minimums, outliers, codebooks), each a Component (sizing/cache/components.py). K and V may use
different formats; KIVI is the one format whose K and V sides differ by design.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from fractions import Fraction

from ..hashing import hash_once
from ..errors import KvsizeError, unknown
from .components import (Component, OutliersPerRow, PerChannelTokenGroup, PerLayer, PerTokenHead,
                         PerTokenHeadFixed, PerValue, PerValueGroup, SideLayout)


@dataclass(frozen=True)
class KVFormat:
    name: str
    family: str
    k: SideLayout
    v: SideLayout
    source: str
    engines: tuple[str, ...]
    summary: str
    quality: str = ""
    quality_source: str = ""
    aliases: tuple[str, ...] = field(default=())
    # GPU profile flags that must all be true for an engine to run the format (nvfp4: "nvfp4_native").
    needs_gpu: tuple[str, ...] = field(default=())
    # What of the layout no source confirms (its bytes are then kvsize's reading of the method); empty when
    # the cited source gives every byte.
    unconfirmed: str = ""

    @property
    def mla_only(self) -> bool:
        """Laid out for one DeepSeek MLA latent width (fp8_ds_mla, nvfp4_ds_mla: 576; fp8_ds_mla_v4: 512)."""
        return any(getattr(c.granularity, "of_head_dim", None) for c in self.k.components)


@hash_once
@dataclass(frozen=True)
class FormatOptions:
    """Tunable layout parameters of the research formats."""

    kivi_group: int = 32
    kivi_residual: int = 128
    kvquant_outlier_fraction: Fraction = Fraction(1, 100)

    def __post_init__(self) -> None:
        if self.kivi_group <= 0:
            raise KvsizeError(f"--kivi-group must be a positive number of tokens/channels, got {self.kivi_group}")
        if self.kivi_residual < 0:
            raise KvsizeError(f"--kivi-residual must be zero or more tokens, got {self.kivi_residual}")
        if not 0 <= self.kvquant_outlier_fraction < 1:
            raise KvsizeError(
                f"--kvquant-outliers must be a fraction in [0, 1), got {float(self.kvquant_outlier_fraction)}"
            )


# -- rows ------------------------------------------------------------------------------

_ALL_PAGED = ("vllm", "sglang", "trtllm", "lmdeploy", "llamacpp", "ideal")


def _values(bits: int, dtype: str) -> Component:
    return Component("values", dtype, bits, PerValue(), "payload")


def _plain(name: str, bits: int, dtype: str, engines: tuple[str, ...], source: str, summary: str) -> KVFormat:
    side = SideLayout((_values(bits, dtype),))
    return KVFormat(name, "float", side, side, source, engines, summary,
                    quality="reference precision", quality_source=source)


def _fp8_per_tensor(name: str, dtype: str, aliases: tuple[str, ...] = (),
                    engines: tuple[str, ...] = ("vllm", "sglang", "trtllm", "ideal")) -> KVFormat:
    side = SideLayout((_values(8, dtype), Component("scale", "fp32", 32, PerLayer(parameter=True))))
    return KVFormat(
        name, "vllm", side, side,
        source="vLLM docs, Quantized KV Cache (FP8 E4M3/E5M2, one fp32 k_scale and v_scale per attention layer, "
               "kept as layer parameters beside the weights, not in the KV pool); vllm/attention/layer.py",
        engines=engines,
        summary=f"{dtype} values, one fp32 scale per layer for K and one for V",
        quality="near-lossless: vLLM and TensorRT-LLM docs report negligible accuracy loss for FP8 KV cache",
        quality_source="docs.vllm.ai/en/latest/features/quantization/quantized_kvcache.html; "
                       "nvidia.github.io/TensorRT-LLM (FP8 KV cache)",
        aliases=aliases,
    )


def _per_token_head(name: str, dtype: str) -> KVFormat:
    side = SideLayout((_values(8, dtype), Component("scale", "fp32", 32, PerTokenHead())))
    return KVFormat(
        name, "vllm", side, side,
        source="vLLM per-token-head KV quantization (one fp32 scale per token per head, stored beside the cache)",
        engines=("vllm", "ideal"),
        summary=f"{dtype} values plus one fp32 scale per token per head",
        quality="finer than per-tensor scales; close to fp8 per-tensor quality or better",
        quality_source="vLLM quantized KV cache docs",
    )


def _llamacpp(name: str, bits: int, block_bytes: int, with_min: bool, code: str) -> KVFormat:
    # ggml block layouts (ggml/src/ggml-common.h): 32 values per block, fp16 `d` scale,
    # fp16 `m` min for the _1 variants; q5 adds 32 high bits (qh) to the 4-bit nibbles.
    metadata = [Component("scale d", "fp16", 16, PerValueGroup(32))]
    if with_min:
        metadata.append(Component("min m", "fp16", 16, PerValueGroup(32)))
    side = SideLayout((_values(bits, code), *metadata))
    return KVFormat(
        name, "llama.cpp", side, side,
        source=f"ggml/src/ggml-common.h block_{name}: {block_bytes} bytes per 32 values",
        engines=("llamacpp", "ideal"),
        summary=f"llama.cpp {name}: {block_bytes} bytes per block of 32 values",
        quality="q8_0 is near-lossless; 4/5-bit llama.cpp cache types raise perplexity slightly "
                "(K is more sensitive than V)",
        quality_source="llama.cpp discussions on -ctk/-ctv quantized KV cache (ggml-org/llama.cpp #5932)",
    )


def _asymmetric_per_token_head(bits: int, dtype: str) -> SideLayout:
    """`bits`-bit codes with an fp16 scale and fp16 zero point per token per head (LMDeploy, SGLang's
    int8, TurboQuant's values)."""
    return SideLayout((_values(bits, dtype), Component("scale", "fp16", 16, PerTokenHead()),
                       Component("zero point", "fp16", 16, PerTokenHead())))


def _lmdeploy(name: str, bits: int) -> KVFormat:
    side = _asymmetric_per_token_head(bits, f"int{bits}")
    return KVFormat(
        name, "lmdeploy", side, side,
        source="LMDeploy docs, KV cache quantization (quant_policy 4/8: per-head per-token asymmetric, "
               "fp16 scale and zero point)",
        engines=("lmdeploy", "ideal"),
        summary=f"int{bits} values, fp16 scale and fp16 zero point per token per head",
        quality="int8: on par with fp16 on the LMDeploy evaluation set; int4: small drop"
        if bits == 8 else "int4: small accuracy drop vs fp16 in LMDeploy's evaluation",
        quality_source="lmdeploy.readthedocs.io/en/latest/quantization/kv_quant.html",
    )


LMDEPLOY_CACHE_ENGINE = ("LMDeploy PyTorch engine, lmdeploy/pytorch/engine/cache_engine/engine.py (InternLM/lmdeploy@"
                         "f97f25ac06755e786e6bea8b24f793e5d289023a): get_k_cache_desc, get_v_cache_desc, "
                         "get_quant_cache_descs")


def _lmdeploy_fp8(name: str, dtype: str, policy: int) -> KVFormat:
    side = SideLayout((_values(8, dtype), Component("scale", "fp32", 32, PerLayer(parameter=True))))
    return KVFormat(
        name, "lmdeploy", side, side,
        source=f"{LMDEPLOY_CACHE_ENGINE}: quant_policy {policy} stores K and V as torch {dtype} (one byte per "
               "value) and keeps no scale tensors in the cache: the scales are the attention layer's fixed "
               "scalars (counted here as one per layer and side, with the weights). PyTorch engine only; "
               "TurboMind rejects it",
        engines=("lmdeploy", "ideal"),
        summary=f"{dtype} values (--quant-policy {policy}), one scalar scale per layer for K and one for V",
        quality="near-lossless, as fp8 KV caches elsewhere; LMDeploy publishes no evaluation for it",
        quality_source="unconfirmed",
    )


def _lmdeploy_turboquant() -> KVFormat:
    # quant_policy 42: K packed 4-bit (head_size // 2 bytes) with two model-dtype values per token per
    # head (its MSE and QJL norms); V packed 2-bit (head_size // 4 bytes) with one (its MSE norm).
    k = SideLayout((_values(4, "uint4 TurboQuant index"),
                    Component("MSE norm and QJL norm", "2 x model dtype", 32, PerTokenHead())))
    v = SideLayout((_values(2, "uint2 TurboQuant index"), Component("MSE norm", "model dtype", 16, PerTokenHead())))
    return KVFormat(
        "lmdeploy_turboquant", "lmdeploy", k, v,
        source=f"{LMDEPLOY_CACHE_ENGINE}: quant_policy 42 (QuantPolicy.TURBO_QUANT) packs K at 4 bits and V at "
               "2 bits per value in uint8, with quant tensors of shape [..., 2] for K and [..., 1] for V in the "
               "model dtype (2 bytes each). PyTorch engine only",
        engines=("lmdeploy", "ideal"),
        summary="4-bit K with two norms, 2-bit V with one norm, per token per head (--quant-policy 42)",
        quality="LMDeploy publishes no evaluation for it; test on your own workload",
        quality_source="unconfirmed",
    )


def _kivi(name: str, bits: int, options: FormatOptions) -> KVFormat:
    g, r = options.kivi_group, options.kivi_residual
    k = SideLayout((
        _values(bits, f"int{bits}"),
        Component("scale", "fp16", 16, PerChannelTokenGroup(g)),
        Component("min", "fp16", 16, PerChannelTokenGroup(g)),
    ), r)
    v = SideLayout((
        _values(bits, f"int{bits}"),
        Component("scale", "fp16", 16, PerValueGroup(g)),
        Component("min", "fp16", 16, PerValueGroup(g)),
    ), r)
    return KVFormat(
        name, "kivi", k, v,
        source=f"KIVI (Liu et al., ICML 2024, arXiv:2402.02750): keys per channel over {g} tokens, values per "
               f"token over {g} channels, fp16 scale and min per group, latest {r} tokens in fp16",
        engines=("ideal",),
        summary=f"KIVI {bits}-bit, group {g}, residual {r} tokens",
        quality="KIVI-2 keeps LongBench scores within about 1 point of fp16 on Llama-2/Mistral"
        if bits == 2 else "KIVI-4 matches fp16 on LongBench within noise",
        quality_source="arXiv:2402.02750, Table 3 (LongBench)",
    )


def _kvarn(tile: int) -> KVFormat:
    # KVarN's README (huawei-csl/KVarN, a vLLM fork): 4-bit keys and 2-bit values, Hadamard-rotated and
    # variance-normalized over a tile of `tile` tokens (one vLLM block), asymmetric round-to-nearest with
    # the scales folded back per channel for keys and per token for values.
    k = SideLayout((
        _values(4, "uint4"),
        Component("scale", "fp16", 16, PerChannelTokenGroup(tile)),
        Component("zero point", "fp16", 16, PerChannelTokenGroup(tile)),
    ))
    v = _asymmetric_per_token_head(2, "uint2")
    return KVFormat(
        f"kvarn_k4v2_g{tile}", "kvarn", k, v,
        source=f"KVarN (Muller et al., arXiv:2606.03458; huawei-csl/KVarN README, a fork of vLLM 0.23): "
               f"--kv-cache-dtype kvarn_k4v2_g{tile} --block-size {tile}, 4-bit keys with per-channel scales over "
               f"each {tile}-token tile, 2-bit values with per-token scales, asymmetric",
        engines=("ideal",),
        summary=f"KVarN 4-bit keys (per channel per {tile}-token tile), 2-bit values (per token); layout unconfirmed",
        quality="matches fp16 accuracy on AIME25 with Qwen3-32B (authors' figure)",
        quality_source="huawei-csl/KVarN README; arXiv:2606.03458",
        unconfirmed="the scale and zero-point dtypes (counted as fp16), any per-token key or per-channel value "
                    "scale from the normalization, and the fp16 pool for the partial last tile are not given in "
                    "a source kvsize could read; it runs on its own vLLM fork, so kvsize sizes it as ideal",
    )


def _kvquant3(name: str, options: FormatOptions) -> KVFormat:
    frac = options.kvquant_outlier_fraction
    side = SideLayout((
        _values(3, "nuq3 index"),
        Component("outlier value", "fp16", 16, OutliersPerRow(frac)),
        Component("outlier index", "int32", 32, OutliersPerRow(frac)),
        Component("row pointer", "int32", 32, PerTokenHead()),
        Component("codebook", "fp16", 16, PerLayer(8)),
    ))
    return KVFormat(
        name, "kvquant", side, side,
        source=f"KVQuant (Hooper et al., NeurIPS 2024, arXiv:2401.18079): 3-bit non-uniform values, "
               f"{float(frac):.1%} dense-and-sparse outliers (fp16 value + int32 index, CSR row pointers), "
               "8-entry fp16 codebook per layer",
        engines=("ideal",),
        summary=f"KVQuant 3-bit NUQ, {float(frac):.1%} outliers",
        quality="3-bit with 1% outliers: within 0.1 perplexity of fp16 on Wikitext-2 (LLaMA-7B)",
        quality_source="arXiv:2401.18079, Table 1",
    )


def _fp8_ds_mla() -> KVFormat:
    # vLLM's DeepSeek sparse-attention MLA cache with fp8 KV: the 512 "nope" latent values in fp8 with
    # one fp32 scale per 128, the 64 rope values kept in bf16 (656 B per token per layer).
    side = SideLayout((
        Component("latent values", "fp8_e4m3", 8, PerTokenHeadFixed(512, of_head_dim=576), "payload"),
        Component("latent scales", "fp32", 32, PerTokenHeadFixed(4)),
        Component("rope values", "bf16", 16, PerTokenHeadFixed(64), "payload"),
    ))
    return KVFormat(
        "fp8_ds_mla", "vllm", side, side,
        source="vLLM FlashMLA sparse backend, kv_cache_dtype fp8_ds_mla (vllm/v1/attention/backends/mla/"
               "flashmla_sparse.py): 512 fp8 + 4 fp32 scales + 64 bf16 per token; chosen for DSA models "
               "(DeepSeek-V3.2, GLM-5) under --kv-cache-dtype fp8",
        engines=("vllm", "ideal"),
        summary="MLA latent: 512 fp8 values, 4 fp32 scales, 64 bf16 rope values",
        quality="DeepSeek's own serving format for V3.2 (DeepSeek-V3.2-Exp report)",
        quality_source="DeepSeek-V3.2-Exp technical report (2025)",
    )


def _fp8_ds_mla_v4() -> KVFormat:
    # DeepSeek-V4's latent is 512 values of which the last 64 carry RoPE: 448 fp8 values with one UE8M0
    # (power-of-two) scale per 64, the RoPE part in bf16, and one pad byte: 584 B per token per layer.
    side = SideLayout((
        Component("latent values", "fp8_e4m3", 8, PerTokenHeadFixed(448, of_head_dim=512), "payload"),
        Component("rope values", "bf16", 16, PerTokenHeadFixed(64), "payload"),
        Component("latent scales", "ue8m0", 8, PerTokenHeadFixed(7)),
        Component("pad", "uint8", 8, PerTokenHeadFixed(1)),
    ))
    return KVFormat(
        "fp8_ds_mla_v4", "vllm", side, side,
        source="vLLM 0.33 DeepSeek-V4 (vllm/models/deepseek_v4/attention.py get_kv_cache_spec: 448 B NoPE + 128 B "
               "RoPE + 8 B fp8 scale = 584 B per token; v1/attention/backends/mla/sparse_swa.py: pages rounded up "
               "to 576 B); vLLM names it fp8_ds_mla and chooses it for DeepSeek-V4 under auto or any fp8 "
               "--kv-cache-dtype on CUDA (attention.py _resolve_dsv4_kv_cache_dtype)",
        engines=("vllm", "ideal"),
        summary="DeepSeek-V4 latent: 448 fp8 values, 7 UE8M0 scales and a pad byte, 64 bf16 rope values",
        quality="DeepSeek's own serving format for V4", quality_source="vLLM 0.33 DeepSeek-V4 model code",
    )


def indexer_side(index_head_dim: int) -> SideLayout:
    """DSA's indexer key per token per layer: fp8 values and one fp32 scale per 128
    (vllm/model_executor/models/deepseek_v2.py, Indexer: head_dim + head_dim // 128 × 4 bytes)."""
    return SideLayout((
        Component("indexer key", "fp8_e4m3", 8, PerTokenHeadFixed(index_head_dim), "payload"),
        Component("indexer scales", "fp32", 32, PerTokenHeadFixed(index_head_dim // 128)),
    ))


def _nvfp4() -> KVFormat:
    side = SideLayout((
        _values(4, "e2m1"),
        Component("block scale", "fp8_e4m3", 8, PerValueGroup(16)),
        Component("global scale", "fp32", 32, PerLayer(parameter=True)),
    ))
    return KVFormat(
        "nvfp4", "vllm", side, side,
        source="NVIDIA NVFP4 (E2M1 values, one E4M3 scale per 16 values, one fp32 tensor scale); "
               "TensorRT-LLM and vLLM NVFP4 KV cache",
        engines=("vllm", "trtllm", "ideal"),
        summary="E2M1 values, one fp8 scale per 16 values, one fp32 scale per layer",
        needs_gpu=("nvfp4_native",),
        quality="small accuracy loss on Blackwell-era evaluations (under 1% on most benchmarks vs FP8)",
        quality_source="NVIDIA technical blog, 'Optimizing inference with NVFP4 KV cache' (2025)",
    )


def _turboquant(name: str, key_bits: int, value_bits: int) -> KVFormat:
    # vllm/model_executor/layers/quantization/turboquant/config.py (0.33): a key is head_dim fp8 bytes
    # (key_quant_bits 8) or Lloyd-Max indices of key_bits plus an fp16 vector norm; a value is uniform
    # value_bits codes plus an fp16 scale and fp16 zero point; the attention backend
    # (v1/attention/backends/turboquant_attn.py) packs [key | value] per token per head.
    if key_bits == 8:
        k = SideLayout((_values(8, "fp8_e4m3"),))
    else:
        k = SideLayout((_values(key_bits, f"int{key_bits} Lloyd-Max index"),
                        Component("vector norm", "fp16", 16, PerTokenHead())))
    v = _asymmetric_per_token_head(value_bits, f"uint{value_bits}")
    key_text = "fp8 keys" if key_bits == 8 else f"{key_bits}-bit Hadamard-rotated Lloyd-Max keys with an fp16 norm"
    return KVFormat(
        name, "vllm", k, v,
        source="vLLM 0.33 TurboQuant KV cache (vllm/model_executor/layers/quantization/turboquant/config.py "
               "key_packed_size, value_packed_size, slot_size_aligned; v1/attention/backends/turboquant_attn.py). "
               "vllm serve keeps the first 2 and last 2 attention layers of dense models in the model dtype "
               "(engine/arg_utils.py, get_boundary_skip_layers). The packed slot is rounded up to an even "
               "byte count, which these rows match for every even slot (all power-of-two head sizes)",
        engines=("vllm", "ideal"),
        summary=f"{key_text}; {value_bits}-bit values with fp16 scale and zero point",
        quality="k8v4 near fp8; 3-bit presets need the boundary layers kept in bf16 (vLLM: GSM8K drops "
                "~30 points on Qwen3-4B without them)",
        quality_source="vllm/model_executor/layers/quantization/turboquant/config.py (get_boundary_skip_layers docstring)",
    )


def _int4_per_token_head() -> KVFormat:
    side = SideLayout((_values(4, "int4"), Component("scale and zero point", "2 x fp16", 32, PerTokenHead())))
    return KVFormat(
        "int4_per_token_head", "vllm", side, side,
        source="vLLM 0.33 (v1/attention/backends/triton_attn.py customize_spec: head_size // 2 packed bytes plus "
               "4 bytes per K and V side per token per head; v1/kv_cache_interface.py INT4_PER_TOKEN_HEAD: "
               "packed 2 x int4 per byte, Hadamard rotation, asymmetric zero point). How the 4 bytes split "
               "between scale and zero point is unconfirmed; the total is vLLM's",
        engines=("vllm", "ideal"),
        summary="int4 values plus 4 bytes of scale and zero point per token per head",
        quality="4-bit per-token-head with a Hadamard rotation; accuracy not published by vLLM",
        quality_source="unconfirmed",
    )


def _nvfp4_ds_mla() -> KVFormat:
    side = SideLayout((Component("MLA latent (packed)", "nvfp4 + fp8", 8, PerTokenHeadFixed(352, of_head_dim=576),
                                 "payload"),))
    return KVFormat(
        "nvfp4_ds_mla", "vllm", side, side,
        source="vLLM 0.33 model_executor/layers/attention/mla_attention.py: nvfp4_ds_mla keeps 352 opaque bytes "
               "per token per layer for the 576-value MLA latent of DeepSeek sparse attention models (FlashMLA "
               "sparse); how the bytes split between values, scales and rope is not given in the source",
        engines=("vllm", "ideal"),
        summary="MLA latent in 352 bytes (NVFP4 values and scales)",
        needs_gpu=("nvfp4_native",),
        quality="unconfirmed", quality_source="unconfirmed",
    )


def _mx_fp4(name: str, engines: tuple[str, ...], source: str, summary: str) -> KVFormat:
    side = SideLayout((_values(4, "e2m1"), Component("block scale", "e8m0", 8, PerValueGroup(32))))
    return KVFormat(name, "mx", side, side, source=source, engines=engines, summary=summary,
                    quality="4-bit microscaling; coarser than NVFP4's 16-value blocks",
                    quality_source="OCP Microscaling Formats (MX) v1.0 specification")


def _int8_scale_zero(name: str, engines: tuple[str, ...], source: str) -> KVFormat:
    side = _asymmetric_per_token_head(8, "int8")
    return KVFormat(name, "sglang", side, side, source=source, engines=engines,
                    summary="int8 values, fp16 scale and zero point per token per head",
                    quality="int8 with per-token-head scales: near fp16", quality_source=source)


def _int8_per_tensor() -> KVFormat:
    side = SideLayout((_values(8, "int8"), Component("scale", "fp32", 32, PerLayer(parameter=True))))
    return KVFormat(
        "int8", "trtllm", side, side,
        source="TensorRT-LLM INT8 KV cache (QuantMode INT8_KV_CACHE: int8 values with one fp32 "
               "kv_cache_scaling_factor per attention layer, tensorrt_llm/quantization/mode.py)",
        engines=("trtllm", "ideal"),
        summary="int8 values, one fp32 scale per layer",
        quality="small loss vs fp16; calibrated per-tensor scales", quality_source="TensorRT-LLM quantization docs",
    )


_ROWS: dict[str, Callable[[FormatOptions], KVFormat]] = {
    "fp32": lambda o: _plain("fp32", 32, "fp32", ("vllm", "llamacpp", "ideal"), "IEEE 754-2008 binary32 (4 bytes per value)", "fp32 values"),
    "fp16": lambda o: _plain("fp16", 16, "fp16", _ALL_PAGED, "IEEE 754-2008 binary16 (2 bytes per value)", "fp16 values"),
    "bf16": lambda o: _plain("bf16", 16, "bf16", _ALL_PAGED, "bfloat16: 8-bit exponent, 7-bit mantissa (2 bytes per value)", "bf16 values"),
    "fp8_e4m3": lambda o: _fp8_per_tensor("fp8_e4m3", "fp8_e4m3", aliases=("fp8",)),
    # TensorRT-LLM's FP8 KV cache is E4M3 only (QuantMode FP8_KV_CACHE)
    "fp8_e5m2": lambda o: _fp8_per_tensor("fp8_e5m2", "fp8_e5m2", engines=("vllm", "sglang", "ideal")),
    "fp8_ds_mla": lambda o: _fp8_ds_mla(),
    "fp8_ds_mla_v4": lambda o: _fp8_ds_mla_v4(),
    "fp8_per_token_head": lambda o: _per_token_head("fp8_per_token_head", "fp8_e4m3"),
    "int8_per_token_head": lambda o: _per_token_head("int8_per_token_head", "int8"),
    "nvfp4": lambda o: _nvfp4(),
    "turboquant_k8v4": lambda o: _turboquant("turboquant_k8v4", 8, 4),
    "turboquant_4bit_nc": lambda o: _turboquant("turboquant_4bit_nc", 4, 4),
    "turboquant_k3v4_nc": lambda o: _turboquant("turboquant_k3v4_nc", 3, 4),
    "turboquant_3bit_nc": lambda o: _turboquant("turboquant_3bit_nc", 3, 3),
    "int4_per_token_head": lambda o: _int4_per_token_head(),
    "nvfp4_4over6": lambda o: replace(_nvfp4(), name="nvfp4_4over6", engines=("vllm", "ideal"),
                                      summary="NVFP4 layout with vLLM's 4-over-6 block scale selection",
                                      source="vLLM 0.33: every kv_cache_dtype starting with nvfp4 is KVQuantMode.NVFP4 "
                                             "(v1/kv_cache_interface.py get_kv_quant_mode) and packs head/2 fp4 bytes "
                                             "+ head/16 fp8 scales per side (utils/torch_utils.py nvfp4_kv_cache_full_dim)"),
    "nvfp4_ds_mla": lambda o: _nvfp4_ds_mla(),
    "ultraquant_4bit": lambda o: _mx_fp4(
        "ultraquant_4bit", ("vllm", "ideal"),
        "vLLM 0.33 v1/attention/ops/ultraquant/format.py: per token per head, K and V as 4-bit codes plus "
        "one E8M0 scale per 32 values (D=128: 136 B per slot)", "4-bit codes, one E8M0 scale per 32 values"),
    "fp4_e2m1_mxfp4": lambda o: _mx_fp4(
        "fp4_e2m1_mxfp4", ("sglang", "ideal"),
        "SGLang --kv-cache-dtype fp4_e2m1 with --fp4-kv-cache-recipe mxfp4 (E2M1 values, one E8M0 scale per "
        "32, srt/layers/quantization/kvfp4_tensor.py)", "E2M1 values, one E8M0 scale per 32 values"),
    "fp4_e2m1_nvfp4": lambda o: replace(_nvfp4(), name="fp4_e2m1_nvfp4", engines=("sglang", "ideal"),
                                        summary="SGLang fp4_e2m1 with the nvfp4 recipe",
                                        source="SGLang --kv-cache-dtype fp4_e2m1 --fp4-kv-cache-recipe nvfp4 "
                                               "(E2M1 values, one E4M3 scale per 16, one fp32 global scale)"),
    "sglang_int8": lambda o: _int8_scale_zero(
        "sglang_int8", ("sglang", "ideal"),
        "SGLang --int8-kv-cache: int8 values with an fp16 scale and fp16 zero point per token per head"),
    "int8": lambda o: _int8_per_tensor(),
    "q8_0": lambda o: _llamacpp("q8_0", 8, 34, False, "int8"),
    "q4_0": lambda o: _llamacpp("q4_0", 4, 18, False, "int4"),
    "q4_1": lambda o: _llamacpp("q4_1", 4, 20, True, "uint4"),
    "q5_0": lambda o: _llamacpp("q5_0", 5, 22, False, "int5"),
    "q5_1": lambda o: _llamacpp("q5_1", 5, 24, True, "uint5"),
    "iq4_nl": lambda o: _llamacpp("iq4_nl", 4, 18, False, "iq4 codebook index"),
    "lmdeploy_int8": lambda o: _lmdeploy("lmdeploy_int8", 8),
    "lmdeploy_int4": lambda o: _lmdeploy("lmdeploy_int4", 4),
    "lmdeploy_fp8": lambda o: _lmdeploy_fp8("lmdeploy_fp8", "fp8_e4m3", 16),
    "lmdeploy_fp8_e5m2": lambda o: _lmdeploy_fp8("lmdeploy_fp8_e5m2", "fp8_e5m2", 17),
    "lmdeploy_turboquant": lambda o: _lmdeploy_turboquant(),
    "kvarn_k4v2_g128": lambda o: _kvarn(128),
    "kvarn_k4v2_g64": lambda o: _kvarn(64),
    "kivi2": lambda o: _kivi("kivi2", 2, o),
    "kivi4": lambda o: _kivi("kivi4", 4, o),
    "kvquant3": lambda o: _kvquant3("kvquant3", o),
}

_ALIASES = {"fp8": "fp8_e4m3", "f16": "fp16", "f32": "fp32", "float16": "fp16", "bfloat16": "bf16",
            "float32": "fp32", "half": "fp16"}

# Layouts an engine picks by itself (vLLM's fp8_ds_mla for DeepSeek sparse attention under
# --kv-cache-dtype fp8): get_format knows them; the lists users choose from leave them out.
ENGINE_CHOSEN_FORMATS = frozenset({"fp8_ds_mla", "fp8_ds_mla_v4"})
FORMAT_NAMES: tuple[str, ...] = tuple(n for n in _ROWS if n not in ENGINE_CHOSEN_FORMATS)
MODEL_DTYPES = ("fp32", "fp16", "bf16")


def canonical_format_name(name: str, model_dtype: str, option: str = "--kv-cache-dtype") -> str:
    key = str(name).strip().lower()
    if key == "auto":
        return model_dtype
    key = _ALIASES.get(key, key)
    if key not in _ROWS:
        raise unknown("KV cache format", name, [*FORMAT_NAMES, "auto", "fp8"], option)
    return key


def get_format(name: str, model_dtype: str = "bf16", options: FormatOptions | None = None,
               option: str = "--kv-cache-dtype") -> KVFormat:
    """The format row for an engine-spelled name; `auto` means the model's dtype."""
    return _built_row(canonical_format_name(name, model_dtype, option), options or FormatOptions())


@lru_cache(maxsize=1024)
def _built_row(name: str, options: FormatOptions) -> KVFormat:
    # Rows are frozen, so one built row serves every caller (a sweep asks for the same few thousands of times).
    return _ROWS[name](options)


def all_formats(options: FormatOptions | None = None) -> list[KVFormat]:
    return [_built_row(name, options or FormatOptions()) for name in _ROWS]

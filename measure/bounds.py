"""Per-format error bounds of the quantizers, without torch: `kvsize validate` reads them on the base install."""

# vllm/model_executor/layers/quantization/turboquant/config.py TQ_PRESETS: (key bits, value bits)
TURBOQUANT_PRESETS = {"turboquant_k8v4": (8, 4), "turboquant_4bit_nc": (4, 4), "turboquant_k3v4_nc": (3, 4),
                      "turboquant_3bit_nc": (3, 3)}

ERROR_BOUNDS = {
    "fp32": 1e-6, "fp16": 1e-3, "bf16": 8e-3, "fp8_e4m3": 0.05, "fp8_e5m2": 0.1,
    "fp8_per_token_head": 0.05, "int8_per_token_head": 0.02, "nvfp4": 0.15,
    # per-token schemes pay for the outlier key channels (why KIVI quantizes keys per channel)
    "q8_0": 0.015, "q5_0": 0.1, "q5_1": 0.08, "q4_0": 0.2, "q4_1": 0.15, "iq4_nl": 0.2,
    "lmdeploy_int8": 0.02, "lmdeploy_int4": 0.25, "lmdeploy_fp8": 0.05, "lmdeploy_fp8_e5m2": 0.1,
    "lmdeploy_turboquant": 0.45,  # 2-bit values: four levels per rotated coordinate
    "kivi4": 0.12, "kivi2": 0.5, "kvquant3": 0.3,
    # 2-bit values per token over 128 rotated channels; the quantizer leaves out the variance normalization
    "kvarn_k4v2_g128": 0.55, "kvarn_k4v2_g64": 0.55,
    "int4_per_token_head": 0.25, "nvfp4_4over6": 0.15, "nvfp4_ds_mla": 0.15, "fp4_e2m1_nvfp4": 0.15,
    "ultraquant_4bit": 0.2, "fp4_e2m1_mxfp4": 0.2, "sglang_int8": 0.02, "int8": 0.05,
    "turboquant_k8v4": 0.12, "turboquant_4bit_nc": 0.15, "turboquant_k3v4_nc": 0.25, "turboquant_3bit_nc": 0.25,
}


KIVI_RESIDUAL = 128  # tokens KIVI keeps in fp16 in the benchmark (the paper's default R)
KERNEL_TOLERANCE = 2e-2  # fused kernels (fp16/bf16 tensor-core dots) against fp32 over the same cache
# fp8 tensor-core dots also round q and the probabilities to e4m3 (3 mantissa bits, as
# FlashAttention-3's fp8 path does); the format's own bound against the original values still holds
FP8_DOT_TOLERANCE = 0.1


def kernel_tolerance(config: dict | None) -> float:
    config = config or {}
    return FP8_DOT_TOLERANCE if config.get("fp8_dot") or config.get("int8_qk") else KERNEL_TOLERANCE

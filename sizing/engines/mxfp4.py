"""How vLLM keeps MXFP4 routed experts (gpt-oss) on a Hopper GPU, and through Marlin elsewhere, tensor by tensor.

vLLM picks an MXFP4 MoE backend per GPU (fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend): on sm90 the
first supported of its gpt-oss priority list is 'TRITON' (OpenAI's triton_kernels matmul_ogs), as the
H100 and H200 starts of 0.26.0 and 0.33.0 log ("Using 'TRITON' Mxfp4 MoE backend"). That backend changes
the experts' memory three ways from the checkpoint's 4.25 bits a weight:

- the intermediate size per TP rank is rounded up to 64 before the weights are built
  (mxfp4_round_up_hidden_size_and_intermediate_size, its last branch): gpt-oss's 2,880 splits into
  1,440 at TP 2, built as 1,472;
- process_weights_after_loading swizzles the block scales for the Hopper kernel (mxfp4_utils.py
  _swizzle_mxfp4; triton_kernels HopperMXScaleLayout.swizzle_data): each expert's scale rows (the
  output dimension) are padded to 2 x num_warps x 2 x 8 = 256 (num_warps 8), its scale groups to an
  even count, and from 0.26 to a multiple of 4 first ("Patches #47303: pad K (num scale groups) to 0
  mod 4"); the checkpoint-layout scales are deleted (del layer.w13_weight_scale);
- the expert biases are converted to fp32 (w13_bias.to(torch.float32)), replacing the bf16 ones.

The values keep their bytes: HopperMXValueLayout pads the output dimension to 16 and the packed input
to 32 bytes, which the rounded sizes already meet. Sources: the vllm 0.25.1, 0.26.0 and 0.33.0 wheels
(model_executor/layers/quantization/mxfp4.py, fused_moe/oracle/mxfp4.py,
quantization/utils/mxfp4_utils.py, third_party/triton_kernels/tensor_details/layout_details/).

On sm80, sm86, sm89 and sm120 vLLM 0.27-0.33 runs the experts through MARLIN instead (the TRITON backend's
gpt_oss_triton_kernels_moe.py _triton_kernel_moe_supports_current_device admits 9.0 <= cc < 11.0 up to 0.31 and
puts sm12x after MARLIN from 0.32; FLASHINFER_CUTLASS_MXFP4_BF16 takes sm90 only): the per-rank intermediate size
is rounded up to 128 and the hidden size to 256 before the weights are built
(mxfp4_round_up_hidden_size_and_intermediate_size, its MARLIN branch), and
quantization/utils/marlin_utils_fp4.py prepare_moe_fp4_layer_for_marlin repacks the values (same bytes), keeps the
permuted scales as E8M0 (one byte a group of 32, no padding) and casts the biases to the params dtype (bf16).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelShape
from ..units import cdiv
from .releases import version_key

MXFP4_BLOCK = 32  # values per E8M0 scale (mxfp4.py create_weights: mxfp4_block = 32)


@dataclass(frozen=True)
class Mxfp4MoeLayout:
    """The routed experts' tensors as one release's MXFP4 backend keeps them on one GPU architecture."""

    backend: str
    intermediate_align: int  # the per-rank intermediate size rounded up to this before the weights are built
    scale_rows_align: int  # each expert's swizzled scale rows (output features) padded to this
    scale_groups_align: int  # and its scale groups (input features / 32) to this
    bias_bytes: int  # bytes per expert bias element after loading
    source: str
    hidden_align: int = 1  # the hidden size rounded up to this before the weights are built


# vllm 0.25.1: fused_moe/oracle/mxfp4.py _get_priority_backends_for_gpt_oss (TRITON before FLASHINFER_CUTLASS
# and MARLIN; the TRTLLM and AITER backends refuse sm90); mxfp4_round_up_hidden_size_and_intermediate_size:
# round_up(intermediate_size, 64) for TRITON; mxfp4_utils.py _swizzle_mxfp4(num_warps=8) with
# HopperMXScaleLayout (SWIZZLE_ALIGN_M = 2 * num_warps * 2 * 8, SWIZZLE_ALIGN_K = 2); biases to fp32
_TRITON_SM90_0_25 = Mxfp4MoeLayout(
    "TRITON", 64, 256, 2, 4,
    "vllm 0.25.1 fused_moe/oracle/mxfp4.py (TRITON backend on sm90, intermediate rounded up to 64, biases to "
    "fp32) and quantization/utils/mxfp4_utils.py _swizzle_mxfp4 (triton_kernels HopperMXScaleLayout: scale rows "
    "padded to 256, groups to 2)")
# vllm 0.26.0 and 0.33.0: the same, and _swizzle_mxfp4 pads the scale groups to 0 mod 4 on sm90 first
_TRITON_SM90_0_26 = Mxfp4MoeLayout(
    "TRITON", 64, 256, 4, 4,
    "vllm 0.26.0 and 0.33.0 fused_moe/oracle/mxfp4.py (TRITON backend on sm90, as their H100/H200 starts "
    "log; intermediate rounded up to 64, biases to fp32) and quantization/utils/mxfp4_utils.py _swizzle_mxfp4 "
    "(scale groups padded to 0 mod 4, 'Patches #47303'; HopperMXScaleLayout rows padded to 256)")
# vllm 0.27.0, 0.28.0, 0.29.0, 0.31.0, 0.32.0 and 0.33.0: fused_moe/oracle/mxfp4.py
# mxfp4_round_up_hidden_size_and_intermediate_size, MARLIN branch: round_up(intermediate, 128), round_up(hidden, 256)
# (not XPU); quantization/utils/marlin_utils_fp4.py prepare_moe_fp4_layer_for_marlin: scales .to(float8_e8m0fnu)
# after marlin_permute_scales (as many elements), biases .to(param_dtype)
_MARLIN_0_27 = Mxfp4MoeLayout(
    "MARLIN", 128, 1, 1, 2,
    "vllm 0.27.0-0.33.0 fused_moe/oracle/mxfp4.py (MARLIN backend where the TRITON and FlashInfer backends refuse the "
    "GPU; intermediate rounded up to 128, hidden to 256) and quantization/utils/marlin_utils_fp4.py "
    "prepare_moe_fp4_layer_for_marlin (E8M0 scales, biases in the params dtype)", hidden_align=256)
_MARLIN_ROWS = (((0, 27), _MARLIN_0_27),)

# (engine, GPU architecture) -> (the first release of each layout, newest first); a release range takes the
# layout of the newest of these at or below its first version. Ranges before 0.21 are not read from source
# (0.10's Marlin backend, and 0.14, which kept the checkpoint's scales beside the swizzled ones, differ) and
# keep the checkpoint's bytes; so do the Marlin GPUs before 0.27 (0.21-0.26 not read for them) and the GPUs with
# no row (sm100/sm103: the FlashInfer TRT-LLM backends, not read).
_LAYOUTS = {
    ("vllm", "sm90"): (((0, 26), _TRITON_SM90_0_26), ((0, 21), _TRITON_SM90_0_25)),
    ("vllm", "sm80"): _MARLIN_ROWS,
    ("vllm", "sm86"): _MARLIN_ROWS,
    ("vllm", "sm89"): _MARLIN_ROWS,
    ("vllm", "sm120"): _MARLIN_ROWS,
}

# vLLM model classes whose MXFP4 routed experts carry biases (gpt_oss.py MLPBlock: FusedMoE(has_bias=True))
EXPERT_BIAS_ARCHITECTURES = frozenset({"GptOssForCausalLM"})
# methods whose experts vLLM loads through Mxfp4Config / GptOssMxfp4MoEMethod
MXFP4_MOE_METHODS = frozenset({"mxfp4", "gpt_oss_mxfp4"})


def mxfp4_moe_layout(engine: str, first_version: str | None, gpu_architecture: str | None,
                     quantization: str | None) -> Mxfp4MoeLayout | None:
    """The release's MXFP4 expert layout on this GPU architecture; None where it is not read from source
    (other GPUs, other engines, releases before 0.21) or the checkpoint is not MXFP4."""
    if (quantization or "") not in MXFP4_MOE_METHODS or first_version is None:
        return None
    version = version_key(first_version)
    for first, layout in _LAYOUTS.get((engine, gpu_architecture or ""), ()):
        if version >= first:
            return layout
    return None


def intermediate_per_rank(layout: Mxfp4MoeLayout, intermediate: int, tp: int) -> int:
    """FusedMoE's intermediate_size_per_partition (intermediate // tp), rounded up as the backend needs."""
    return cdiv(intermediate // tp, layout.intermediate_align) * layout.intermediate_align


def expert_tensors(layout: Mxfp4MoeLayout, experts: int, hidden: int, intermediate: int, tp: int,
                   bias: bool) -> list[int]:
    """Bytes of one MoE layer's expert tensors on one TP rank after loading: the merged gate/up values,
    its (swizzled or permuted) scales, the down values, its scales, then (with biases) the two biases."""
    inter = intermediate_per_rank(layout, intermediate, tp)
    hidden = cdiv(hidden, layout.hidden_align) * layout.hidden_align

    def scales(rows: int, columns: int) -> int:
        groups = cdiv(columns // MXFP4_BLOCK, layout.scale_groups_align) * layout.scale_groups_align
        return experts * cdiv(rows, layout.scale_rows_align) * layout.scale_rows_align * groups

    sizes = [experts * 2 * inter * hidden // 2, scales(2 * inter, hidden),
             experts * hidden * inter // 2, scales(hidden, inter)]
    if bias:
        sizes += [experts * 2 * inter * layout.bias_bytes, experts * hidden * layout.bias_bytes]
    return sizes


def mxfp4_expert_tensors(shape: ModelShape, layout: Mxfp4MoeLayout | None, params: int, tp: int) -> list[int] | None:
    """expert_tensors for a layer of `params` routed-expert parameters, where the layout is known and they are
    the gated experts of the config's shape (experts x 3 x hidden x moe_intermediate_size); None otherwise."""
    e, h, i = shape.num_experts, shape.hidden_size, shape.moe_intermediate_size
    if layout is None or not params or params != e * 3 * h * i:
        return None
    return expert_tensors(layout, e, h, i, tp, bool(EXPERT_BIAS_ARCHITECTURES.intersection(shape.architectures[:1])))

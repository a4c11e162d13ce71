"""GPU memory beside the KV cache: weights, peak activation, non-torch memory, CUDA graphs.

Weights are exact for the parameter count derived from the config. The activation,
non-torch and CUDA-graph figures are documented estimates; `measure/` checks them on a
real GPU and the reports under measure/reports record how close they come.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import unknown
from .shape import DTYPE_BYTES, ModelShape
from .units import MiB, cdiv


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bits: int  # per parameter
    scale_bits: int  # per group of `group` parameters
    group: int
    experts_only: bool  # mxfp4 checkpoints keep attention and dense layers in the model dtype
    source: str

    def bytes_for(self, params: int) -> int:
        return cdiv(params * self.bits + cdiv(params, self.group) * self.scale_bits, 8)


WEIGHT_FORMATS = {
    "fp32": WeightFormat("fp32", 32, 0, 1, False, "IEEE binary32"),
    "fp16": WeightFormat("fp16", 16, 0, 1, False, "IEEE binary16"),
    "bf16": WeightFormat("bf16", 16, 0, 1, False, "bfloat16"),
    "fp8": WeightFormat("fp8", 8, 32, 128 * 128, False,
                        "fp8 e4m3 with one fp32 scale per 128x128 block (DeepSeek-V3 weight_block_size)"),
    "int8": WeightFormat("int8", 8, 16, 128, False, "int8 with an fp16 scale per 128 weights (W8A16 grouped)"),
    "int4": WeightFormat("int4", 4, 20, 128, False,
                         "int4 with an fp16 scale and a 4-bit zero point per 128 weights (GPTQ/AWQ layout)"),
    "mxfp4": WeightFormat("mxfp4", 4, 8, 32, True,
                          "OCP MX FP4: E2M1 values, one E8M0 scale per 32 (gpt-oss experts)"),
}
_QUANT_METHODS = {"fp8": "fp8", "mxfp4": "mxfp4", "awq": "int4", "gptq": "int4", "compressed-tensors": None}


def resolve_weights_dtype(name: str, shape: ModelShape) -> WeightFormat:
    """`auto` follows the checkpoint's quantization_config, else the serving dtype."""
    key = str(name).strip().lower()
    if key == "auto":
        key = _QUANT_METHODS.get(shape.weights_quantization or "", None) or shape.serving_dtype
    key = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}.get(key, key)
    if key not in WEIGHT_FORMATS:
        raise unknown("weights dtype", name, [*WEIGHT_FORMATS, "auto"], "--weights-dtype")
    return WEIGHT_FORMATS[key]


@dataclass(frozen=True)
class WeightBytes:
    embedding_bytes: int
    lm_head_bytes: int
    vision_bytes: int
    layers_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.embedding_bytes + self.lm_head_bytes + self.vision_bytes + self.layers_bytes


def weight_bytes(shape: ModelShape, fmt: WeightFormat, tp: int, layers: range, first_stage: bool,
                 last_stage: bool) -> WeightBytes:
    """Weights one GPU holds: its share (1/tp) of the stage's layers, embeddings on the first
    stage, the lm_head on the last; norms, routers and embeddings stay in the model dtype."""
    dense = DTYPE_BYTES[shape.serving_dtype]
    linear = WEIGHT_FORMATS[shape.serving_dtype] if fmt.experts_only else fmt
    layer_total = 0
    for i in layers:
        p = shape.layer_params[i]
        layer_total += linear.bytes_for(cdiv(p.attention + p.mlp, tp))
        layer_total += fmt.bytes_for(cdiv(p.experts, tp))
        layer_total += cdiv(p.other, tp) * dense
    embedding = cdiv(shape.embedding_params, tp) * dense if first_stage else 0
    lm_head = cdiv(shape.lm_head_params, tp) * dense if last_stage else 0
    if shape.lm_head_params == 0 and last_stage and not first_stage:
        lm_head = cdiv(shape.embedding_params, tp) * dense  # a tied head still needs its copy on the last stage
    vision = cdiv(shape.vision_params, tp) * dense if first_stage else 0
    return WeightBytes(embedding, lm_head, vision, layer_total)


@dataclass(frozen=True)
class ActivationEstimate:
    """Peak activation of one forward pass at `tokens` tokens, on one GPU."""

    tokens: int
    hidden_bytes: int
    attention_bytes: int
    mlp_bytes: int
    logits_bytes: int

    @property
    def peak_bytes(self) -> int:
        return self.hidden_bytes + max(self.attention_bytes, self.mlp_bytes) + self.logits_bytes


def activation_estimate(shape: ModelShape, tokens: int, max_num_seqs: int, tp: int) -> ActivationEstimate:
    """Peak activation estimate (docs/formulas.md, 'Peak activation').

    Two hidden-size tensors (residual and normed input) stay alive through a layer; on top
    of them the larger of the attention block (q, k, v and the attention output) and the MLP
    block (gate_up output and the activated half; for MoE each token's top-k experts plus a
    permuted copy of the hidden states). The sampler of the profiling run adds fp32 logits
    and probabilities for up to max_num_seqs sequences.
    """
    dt = DTYPE_BYTES[shape.serving_dtype]
    h = shape.hidden_size
    hidden = 2 * tokens * h * dt
    if shape.is_mla:
        attn_width = 2 * shape.num_attention_heads * (shape.head_dim + shape.mla_latent_dim) // tp
    else:
        attn_width = (2 * shape.num_attention_heads + 2 * shape.num_kv_heads) * shape.head_dim // tp
    attention = tokens * attn_width * dt
    dense_mlp = tokens * 3 * cdiv(shape.intermediate_size, tp) * dt
    moe_mlp = 0
    if shape.num_experts:
        k = max(1, shape.num_experts_per_tok)
        moe_mlp = tokens * k * (3 * cdiv(shape.moe_intermediate_size, tp) + 2 * h) * dt
    sampled = min(max_num_seqs, tokens)
    logits = 2 * sampled * cdiv(shape.vocab_size, tp) * 4
    return ActivationEstimate(tokens, hidden, attention, max(dense_mlp, moe_mlp), logits)


CUDA_CONTEXT_BYTES = 512 * MiB  # a fresh CUDA context on H100/H200: about 0.5 GiB
# cuBLAS/cuBLASLt and attention kernel modules loaded on first use, on top of the context:
# measure/reports/h200-capacity.json measured 1310 MiB of non-torch memory in all after a forward pass.
KERNEL_LIBRARY_BYTES = 798 * MiB
NCCL_BYTES = 256 * MiB  # communicator buffers once tensor or pipeline parallel


def non_torch_estimate(tp: int, pp: int) -> int:
    """CUDA context, kernel libraries and, with more than one GPU, NCCL buffers."""
    return CUDA_CONTEXT_BYTES + KERNEL_LIBRARY_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)


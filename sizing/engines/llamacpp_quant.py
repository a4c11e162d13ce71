"""The GGUF a llama.cpp user names by its weight type, tensor by tensor, and where llama.cpp puts each tensor on a GPU.

A type name is what convert_hf_to_gguf.py --outtype (f32, f16, bf16, q8_0) or llama-quantize (Q4_0 ... Q6_K, Q4_K_M;
tools/quantize/quantize.cpp, with Q3_K, Q4_K and Q5_K its aliases of Q3_K_M, Q4_K_M and Q5_K_M) writes. llama-quantize
does not write every matrix in the type named: src/llama-quant.cpp llama_tensor_get_type_impl picks a type per tensor
from its name, its layer and the model's shape (no importance matrix, no overrides), and writes the tensors in
llama_model_loader's weights_map order (non-layer tensors first, then by layer, each by name). That choice is
deterministic from the config, so kvsize replays it for the presets below; the ones whose rules need an importance
matrix or that kvsize does not replay are refused.

With every layer offloaded (-ngl all, llama.cpp's default -1) llama.cpp keeps the input layer (token_embd) on the CPU,
mapped from the file (src/llama-model.cpp load_tensors: "there is very little benefit to offloading the input layer,
so always keep it on the CPU"; llama-model-loader.cpp: a host buffer type is swapped for the CPU's own under mmap),
and puts the repeating layers and the output layer on the GPU, where a tied output matrix is a copy of token_embd of
its own (TENSOR_DUPLICATED in another buffer type). A CUDA buffer pads each tensor to 128 bytes and a quantized
tensor whose rows are not a multiple of 512 values by the rest of a row of 512 (ggml-cuda.cu
ggml_backend_cuda_buffer_type_get_alignment, get_alloc_size, MATRIX_ROW_PADDING). The output buffer is in the GPU's
pinned host memory (src/llama-context.cpp output_reserve: the output device's host buffer type).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..config import ModelShape
from ..errors import KvsizeError
from .llamacpp_weights import (WEIGHT_TYPES, GgufTensor, _pad, gguf_tensors, model_buffers, tied_embeddings)

# convert_hf_to_gguf.py --outtype: every matrix in the type (q8_0 too: llama-quantize's rules keep Q8_0 whole)
CONVERT_TYPES = ("f32", "f16", "bf16", "q8_0")
# llama-quantize's names (tools/quantize/quantize.cpp) -> the ftype's default ggml type (llama_ftype_get_default_type)
QUANTIZE_PRESETS = {
    "q4_0": "q4_0", "q4_1": "q4_1", "q5_0": "q5_0", "q5_1": "q5_1", "iq4_nl": "iq4_nl", "q2_K": "q2_K",
    "q3_K_S": "q3_K", "q3_K_M": "q3_K", "q3_K_L": "q3_K", "q4_K_S": "q4_K", "q4_K_M": "q4_K", "q5_K_S": "q5_K",
    "q5_K_M": "q5_K", "q6_K": "q6_K",
}
ALIASES = {"q3_K": "q3_K_M", "q4_K": "q4_K_M", "q5_K": "q5_K_M", "fp16": "f16", "fp32": "f32", "float16": "f16",
           "bfloat16": "bf16", "float32": "f32"}
# what kvsize refuses, and why, for the one-line error
NOT_REPLAYED = "IQ1/IQ2/IQ3, IQ4_XS, Q2_K_S (an importance matrix picks their types), TQ1_0/TQ2_0, MXFP4_MOE"
ALLOWED = ("auto", *CONVERT_TYPES, *QUANTIZE_PRESETS, "q3_K", "q4_K", "q5_K")
CUDA_ALIGNMENT = 128  # ggml-cuda.cu ggml_backend_cuda_buffer_type_get_alignment
CUDA_ROW_PADDING = 512  # ggml-cuda/common.cuh MATRIX_ROW_PADDING
_BY_LOWER = {name.lower(): name for name in (*CONVERT_TYPES, *QUANTIZE_PRESETS)} | {
    k.lower(): v for k, v in ALIASES.items()}


def llamacpp_weight_type(name: str, shape: ModelShape) -> str:
    """The GGUF type a --weights-dtype names for llama.cpp (any case), or one line naming what is allowed. auto is
    convert_hf_to_gguf.py's --outtype auto: f16 for a float16 checkpoint, else bf16."""
    key = str(name).strip().lower()
    if key == "auto":
        return "f16" if shape.serving_dtype == "fp16" and shape.weights_quantization is None else "bf16"
    found = _BY_LOWER.get(key)
    if found is None:
        raise KvsizeError(f"--weights-dtype {name}: llama.cpp's GGUF types kvsize sizes are {', '.join(ALLOWED)} "
                          f"(case-insensitive; not {NOT_REPLAYED})")
    return found


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2  # llama-quant.cpp use_more_bits


def _is_70b(shape: ModelShape, arch: str) -> bool:
    """LLM_TYPE_70B as src/models/llama.cpp and qwen2.cpp set it: 80 layers (llama: with grouped KV heads)."""
    if shape.num_layers != 80:
        return False
    return arch == "qwen2" or (arch == "llama" and shape.num_attention_heads != shape.num_kv_heads)


def _fallback(t: str, ne0: int) -> str:
    """llama-quant.cpp tensor_type_fallback: a row that is not whole blocks of the type takes a 32-block type."""
    if ne0 % WEIGHT_TYPES[t][0] == 0:
        return t
    t = {"q2_K": "q4_0", "q3_K": "q4_0", "q4_K": "q5_0", "q5_K": "q5_1", "q6_K": "q8_0"}.get(t, t)
    return t if ne0 % WEIGHT_TYPES[t][0] == 0 else "f16"


def quantized_tensors(shape: ModelShape, preset: str) -> tuple[GgufTensor, ...]:
    """The tensors of the GGUF llama-quantize writes for this preset from a 16-bit GGUF, in its order and types."""
    from .llamacpp_weights import DENSE_ARCHES

    base = gguf_tensors(shape, "f16")
    arch = DENSE_ARCHES[shape.model_type]
    default = QUANTIZE_PRESETS[preset]
    tied = tied_embeddings(shape)
    gqa = shape.num_attention_heads // max(1, shape.num_kv_heads)
    n_layer, big = shape.num_layers, _is_70b(shape, arch)
    n_v = sum(1 for t in base if t.name.endswith("attn_v.weight"))

    def order(t: GgufTensor) -> tuple[int, str]:
        m = re.match(r"blk\.(\d+)\.", t.name)
        return (int(m.group(1)) if m else -1, t.name)

    i_v = i_down = 0
    out = []
    for t in sorted(base, key=order):
        name = t.name
        if len(t.ne) < 2 or not name.endswith("weight") or "_norm.weight" in name:
            out.append(t)  # tensor_allows_quantization: 1-D tensors and norms are copied as they are
            continue
        new = default
        if name == "output.weight" or (tied and name == "token_embd.weight"):
            new = "q8_0" if t.ne[0] % WEIGHT_TYPES[default][0] else "q6_K"
        elif name == "token_embd.weight":
            pass
        elif "attn_v.weight" in name:
            if preset == "q2_K":
                new = "q4_K" if gqa >= 4 else "q3_K"
            elif preset == "q3_K_M":
                new = "q5_K" if i_v < 2 else "q4_K"
            elif preset == "q3_K_L":
                new = "q5_K"
            elif preset == "iq4_nl" and gqa >= 4:
                new = "q5_K"
            elif preset in ("q4_K_M", "q5_K_M") and _more_bits(i_v, n_v):
                new = "q6_K"
            elif preset == "q4_K_S" and i_v < 4:
                new = "q5_K"
            if big and new in ("q3_K", "q4_K"):
                new = "q5_K"
            i_v += 1
        elif "ffn_down" in name:
            i = i_down
            if preset == "q2_K":
                new = "q3_K"
            elif preset == "q3_K_M":
                new = "q5_K" if i < n_layer // 16 else "q4_K"
            elif preset == "q3_K_L":
                new = "q5_K"
            elif preset == "q4_K_M":
                new = "q6_K" if _more_bits(i, n_layer) else new
            elif preset == "iq4_nl" and i < n_layer // 8:
                new = "q5_K"
            elif preset == "q5_K_M" and _more_bits(i, n_layer):
                new = "q6_K"
            elif preset == "q4_K_S" and i < n_layer // 8:
                new = "q5_K"
            i_down += 1
        elif "attn_output.weight" in name:
            new = {"q2_K": "q3_K", "q3_K_M": "q4_K", "q3_K_L": "q5_K"}.get(preset, new)
        out.append(replace(t, type=_fallback(new, t.ne[0])))
    return tuple(out)


def gguf_of(shape: ModelShape, weight_type: str) -> tuple[GgufTensor, ...]:
    """The GGUF's tensors for a type name as llamacpp_weight_type returns it."""
    if weight_type in CONVERT_TYPES:
        return gguf_tensors(shape, weight_type)
    return quantized_tensors(shape, weight_type)


def cuda_alloc_bytes(t: GgufTensor) -> int:
    """ggml_backend_cuda_buffer_type_get_alloc_size, padded to the buffer's alignment."""
    size = t.nbytes
    block, block_bytes = WEIGHT_TYPES[t.type]
    if block > 1 and t.ne[0] % CUDA_ROW_PADDING:  # ggml_row_size of the rest of a row of 512
        size += block_bytes * (CUDA_ROW_PADDING - t.ne[0] % CUDA_ROW_PADDING) // block
    return _pad(size, CUDA_ALIGNMENT)


@dataclass(frozen=True)
class OffloadedWeights:
    """The model buffers of a full offload (-ngl all) to one CUDA GPU, and of the same GGUF loaded on a CPU."""

    weight_type: str
    gpu_bytes: int  # "CUDA0 model buffer size"
    host_bytes: int  # "CPU_Mapped model buffer size": token_embd, mapped from the file
    cpu_load: dict[str, int]  # the model buffers of the same GGUF loaded on the CPU (-ngl 0)


def offloaded_weights(shape: ModelShape, weight_type: str) -> OffloadedWeights:
    tensors = gguf_of(shape, weight_type)
    host = [t for t in tensors if t.name == "token_embd.weight"]
    gpu = [t for t in tensors if t.name != "token_embd.weight"]
    if tied_embeddings(shape):
        gpu += [GgufTensor("output.weight", host[0].type, host[0].ne, "mul_mat")]
    return OffloadedWeights(weight_type, sum(cuda_alloc_bytes(t) for t in gpu), sum(t.nbytes for t in host),
                            model_buffers(tensors, tied_embeddings(shape)))


@dataclass(frozen=True)
class ServeBuffers:
    """llama.cpp's buffers beside the KV cache for kvsize's serve command (-c max_model_len x concurrency
    -np concurrency -kvu -fa on, every layer offloaded): on the GPU the model buffer and the compute buffer (a model,
    measured on CPU loads only), in host memory token_embd and the output buffer."""

    weights: OffloadedWeights
    n_ctx: int  # padded to 256
    compute: dict[str, int]  # logits_bytes, attention_bytes, compute_bytes (compute_buffer_model_bytes)
    output_bytes: int

    @property
    def compute_bytes(self) -> int:
        return self.compute["compute_bytes"]


def serve_buffers(shape: ModelShape, weights_dtype: str, max_model_len: int, concurrency: int, k_format: str,
                  v_format: str, tp: int = 1, pp: int = 1) -> ServeBuffers:
    """The buffers, or one line naming the field and what is allowed where kvsize cannot size them."""
    from .llamacpp import KVSIZE_FORMAT, LLAMACPP_CTX_PAD
    from .llamacpp_weights import DENSE_ARCHES, compute_buffer_model_bytes, compute_shape, output_buffer_bytes

    if tp > 1 or pp > 1:
        raise KvsizeError(f"--tensor-parallel-size {tp} --pipeline-parallel-size {pp}: kvsize sizes llama.cpp's "
                          "buffers on one GPU with every layer offloaded (allowed: 1 and 1)")
    if (DENSE_ARCHES.get(shape.model_type) is None or shape.num_experts or shape.is_mla
            or "recurrent" in shape.layer_kinds):
        raise KvsizeError(f"--model (model_type {shape.model_type!r}): kvsize has llama.cpp's tensor list, which "
                          f"sizes its weights, for dense {', '.join(sorted(DENSE_ARCHES))} models only")
    weight_type = llamacpp_weight_type(weights_dtype, shape)
    weights = offloaded_weights(shape, weight_type)
    n_ctx = _pad(max_model_len * concurrency, LLAMACPP_CTX_PAD)  # -kvu: one stream of n_ctx cells
    types = {fmt: t for t, fmt in KVSIZE_FORMAT.items()}
    tk, tv = (types.get(f, "f16") for f in (k_format, v_format))
    compute = compute_buffer_model_bytes(compute_shape(shape), n_ctx, n_ctx, min(max_model_len * concurrency, 512),
                                         True, tk, tv)
    return ServeBuffers(weights, n_ctx, compute, output_buffer_bytes(shape.vocab_size, concurrency))


def serve_buffers_where_sized(shape: ModelShape, weights_dtype: str, max_model_len: int, concurrency: int,
                              k_format: str, v_format: str, tp: int = 1, pp: int = 1
                              ) -> tuple[ServeBuffers | None, str | None]:
    """(buffers, None), or (None, why not) where kvsize has no llama.cpp tensor list for the model or its split over
    GPUs and the answer names no GGUF weight type: it keeps the parameter count in the model's dtype and the generic
    activation, and says so. Naming a GGUF type there is refused (it cannot be applied without the tensor list)."""
    try:
        return serve_buffers(shape, weights_dtype, max_model_len, concurrency, k_format, v_format, tp, pp), None
    except KvsizeError as e:
        if weights_dtype != "auto":
            raise
        return None, (f"llama.cpp's own buffers are not sized here ({e}): the weights are the parameter count in the "
                      "model's dtype and the activation the generic estimate, not llama.cpp's GGUF tensors and "
                      "compute buffer")


def scenario_buffers(s, engine, k_format: str, v_format: str, shape: ModelShape | None = None
                     ) -> tuple[ServeBuffers | None, str | None]:
    """serve_buffers_where_sized for a scenario served by `engine` (its context, else the engine's default), of the
    model as the engine builds it where given (`shape`), else as configured."""
    shape = shape or s.shape
    return serve_buffers_where_sized(shape, s.weights_dtype, s.max_model_len or engine.default_max_model_len(shape),
                                     s.concurrency, k_format, v_format, s.tensor_parallel_size,
                                     s.pipeline_parallel_size)


def is_gguf_type(name: str) -> bool:
    """Whether a --weights-dtype names one of llama.cpp's GGUF types (any case, aliases included)."""
    return str(name).strip().lower() in _BY_LOWER


def buffer_lines(b: ServeBuffers) -> tuple[str, ...]:
    """The buffers as llama.cpp names them, each marked exact or a model (MiB = 2^20 bytes, as llama.cpp prints)."""
    from .llamacpp_weights import mib_printed

    cpu = ", ".join(f"{name} {mib_printed(n)} MiB" for name, n in b.weights.cpu_load.items())
    c = b.compute
    return (
        f"model buffer, GPU: CUDA0 {mib_printed(b.weights.gpu_bytes)} MiB ({b.weights.gpu_bytes:,} B; "
        f"{b.weights.weight_type}, every layer offloaded; from the GGUF's tensors, not measured on a CUDA build)",
        f"model buffer, host: CPU_Mapped {mib_printed(b.weights.host_bytes)} MiB (token_embd stays on the CPU; "
        "not on the GPU)",
        f"model buffers of the same GGUF loaded on a CPU: {cpu} (the rule exact on six full-size CPU loads "
        "of one-type GGUFs, measure/reports/llamacpp-cpu-buffers.json)",
        f"compute buffer, GPU: {mib_printed(c['compute_bytes'])} MiB ({c['compute_bytes']:,} B; a model: the larger "
        f"of the logits stage {mib_printed(c['logits_bytes'])} MiB and the attention stage "
        f"{mib_printed(c['attention_bytes'])} MiB at n_ctx {b.n_ctx:,}; -1.5%..-0.6% of the printed figure on six "
        "full-size CPU loads, not measured on a CUDA build)",
        f"output buffer, host: CUDA_Host {mib_printed(b.output_bytes)} MiB ({b.output_bytes:,} B; exact on CPU loads; "
        "pinned host memory, not on the GPU)",
    )


def buffers_record(b: ServeBuffers) -> dict:
    """The buffers as plain values, for JSON and CSV."""
    return {"weight_type": b.weights.weight_type, "gpu_model_buffer_bytes": b.weights.gpu_bytes,
            "host_model_buffer_bytes": b.weights.host_bytes, "cpu_load_model_buffers_bytes": dict(b.weights.cpu_load),
            "compute_buffer_bytes": b.compute_bytes, "compute_logits_stage_bytes": b.compute["logits_bytes"],
            "compute_attention_stage_bytes": b.compute["attention_bytes"], "output_buffer_bytes": b.output_bytes,
            "n_ctx": b.n_ctx, "compute_buffer": "model; measured on CPU loads only, not on a CUDA build",
            "gpu_model_buffer": "from the GGUF's tensors and llama.cpp's placement; not measured on a CUDA build"}

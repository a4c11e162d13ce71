"""llama.cpp's model, output and compute buffers on the CPU: what it prints as "model buffer size", "output buffer
size" and "compute buffer size" when it loads a GGUF and makes a context.

The model buffers are exact: each tensor's bytes by its ggml type, laid out in the GGUF at its 32-byte alignment, a
tensor placed in the first buffer type of the CPU's list that runs its op (the CPU's repacked buffer for the weight
types the CPU repacks, else the CPU's own), the CPU's own mapped from the file as one range (mmap, the default) or
allocated tensor by tensor, each padded to the buffer type's alignment. The output buffer is exact. The compute buffer
is ggml's graph allocator packing every intermediate tensor of the worst-case batch; kvsize does not rebuild the
graph, so it is a model: the larger of the logits stage and the attention stage (docs/formulas.md, llama.cpp), whose
error on real loads is measured, not assumed (measure/reports/llamacpp-cpu-buffers.json).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import ModelShape
from ..errors import KvsizeError

# ggml/src/ggml.c type_traits: (values per block, bytes per block) of the weight types a GGUF holds
WEIGHT_TYPES: dict[str, tuple[int, int]] = {
    "f32": (1, 4), "f16": (1, 2), "bf16": (1, 2),
    "q8_0": (32, 34), "q4_0": (32, 18), "q4_1": (32, 20), "q5_0": (32, 22), "q5_1": (32, 24), "iq4_nl": (32, 18),
    "q2_K": (256, 84), "q3_K": (256, 110), "q4_K": (256, 144), "q5_K": (256, 176), "q6_K": (256, 210),
    "tq1_0": (256, 54), "tq2_0": (256, 66),
}
GGUF_ALIGNMENT = 32  # ggml/include/gguf.h GGUF_DEFAULT_ALIGNMENT: each tensor's data starts at a multiple of it
CPU_ALIGNMENT = 32  # ggml/src/ggml-impl.h TENSOR_ALIGNMENT: the CPU buffer types' get_alignment (and CPU_REPACK's)
# ggml/src/ggml-cpu/repack.cpp ggml_repack_get_optimal_repack_type, on an x86 CPU with AVX2 (no AVX-512): the types
# it repacks into 8-row interleaved blocks (ne[1] % 8 == 0) for a 2-D matrix multiplication
REPACKED_AVX2 = frozenset({"q4_0", "q4_K", "iq4_nl"})
REPACK_ROWS = 8
FLOAT_BYTES = 4  # logits, activations and the non-flash-attention mask are f32 (src/llama-graph.cpp)
HALF_BYTES = 2  # the flash-attention mask and the K/V a flash attention reads from an f32/bf16 cache are f16


def _pad(n: int, to: int) -> int:
    return -(-n // to) * to  # GGML_PAD


def tensor_bytes(type_name: str, ne: tuple[int, ...]) -> int:
    """ggml_nbytes of a contiguous tensor: whole blocks of its first dimension, times the others."""
    if type_name not in WEIGHT_TYPES:
        raise KvsizeError(f"ggml type {type_name!r}: kvsize knows {', '.join(WEIGHT_TYPES)}")
    block, size = WEIGHT_TYPES[type_name]
    if ne[0] % block:
        raise KvsizeError(f"a {type_name} tensor's rows must be whole blocks of {block}, got {ne[0]}")
    n = ne[0] // block * size
    for d in ne[1:]:
        n *= d
    return n


@dataclass(frozen=True)
class GgufTensor:
    name: str
    type: str
    ne: tuple[int, ...]  # ggml order: ne[0] is the row
    op: str  # what llama.cpp uses it for (src/llama-arch.cpp LLM_TENSOR_INFOS): mul_mat, get_rows, other

    @property
    def nbytes(self) -> int:
        return tensor_bytes(self.type, self.ne)


def repacked(t: GgufTensor) -> bool:
    """Whether the CPU's extra buffer type (CPU_REPACK) takes the tensor: its op is a 2-D matrix multiplication of a
    type the CPU repacks, with whole groups of 8 rows (repack.cpp extra_buffer_type::supports_op)."""
    return t.op == "mul_mat" and len(t.ne) == 2 and t.type in REPACKED_AVX2 and t.ne[1] % REPACK_ROWS == 0


def model_buffers(tensors: list[GgufTensor] | tuple[GgufTensor, ...], tied_output: bool, mmap: bool = True,
                  repack: bool = True) -> dict[str, int]:
    """The model buffers llama.cpp prints on the CPU, by name, in bytes (src/llama-model.cpp load_tensors), for the
    GGUF's tensors in file order.

    Where the file has no output matrix (tied embeddings) llama.cpp makes it from token_embd (TENSOR_DUPLICATED): a
    tensor of its own only where the matrix multiplication lands in another buffer type than token_embd's lookup
    (src/llama-model-loader.cpp create_tensor), that is where the CPU repacks it. The mapped buffer is the file range
    from the first to the end of the last tensor it holds (llama_model_loader::get_mapping_range); an allocated one
    sums each tensor padded to 32 bytes (ggml-alloc.c ggml_backend_alloc_ctx_tensors_from_buft)."""
    offsets, at = [], 0
    for t in tensors:
        offsets.append(at)
        at = _pad(at + t.nbytes, GGUF_ALIGNMENT)
    cpu, extra = [], []
    for offset, t in zip(offsets, tensors):
        (extra if repack and repacked(t) else cpu).append((offset, t))
    if tied_output:
        embd = next(t for t in tensors if t.name == "token_embd.weight")
        output = GgufTensor("output.weight", embd.type, embd.ne, "mul_mat")
        if repack and repacked(output):
            extra.append((-1, output))
    out: dict[str, int] = {}
    if cpu:
        if mmap:
            out["CPU_Mapped"] = max(o + t.nbytes for o, t in cpu) - min(o for o, _ in cpu)
        else:
            out["CPU"] = sum(_pad(t.nbytes, CPU_ALIGNMENT) for _, t in cpu)
    if extra:
        out["CPU_REPACK"] = sum(_pad(t.nbytes, CPU_ALIGNMENT) for _, t in extra)
    return out


# config.json model_type -> llama.cpp architecture whose dense tensor list kvsize writes (src/models/<arch>.cpp)
DENSE_ARCHES = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3",
                "gemma3_text": "gemma3", "gemma2": "gemma2"}
NORM_TYPE = "f32"  # convert_hf_to_gguf.py: 1-D tensors (norms, biases) stay f32 whatever --outtype


def gguf_tensors(shape: ModelShape, weight_type: str) -> tuple[GgufTensor, ...]:
    """The tensors of a dense model's GGUF with every matrix in one ggml type (convert_hf_to_gguf.py --outtype, or
    llama-quantize --pure), norms and biases f32, in the order measure/llamacpp/gguf_writer.py writes them
    (token_embd, output_norm, the blocks, then output unless the embeddings are tied). The names and shapes are those src/models/<arch>.cpp creates."""
    arch = DENSE_ARCHES.get(shape.model_type)
    if arch is None or shape.num_experts or shape.is_mla or "recurrent" in shape.layer_kinds:
        raise KvsizeError(f"kvsize writes llama.cpp's tensor list for dense {', '.join(sorted(DENSE_ARCHES))} "
                          f"models, not model_type {shape.model_type!r}")
    if weight_type not in WEIGHT_TYPES:
        raise KvsizeError(f"weight type {weight_type!r}: llama.cpp's ggml types are {', '.join(WEIGHT_TYPES)}")
    e, ff, vocab = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    heads, kv_heads, hd = shape.num_attention_heads, shape.num_kv_heads, shape.head_dim
    q_w, kv_w = heads * hd, kv_heads * hd
    out: list[GgufTensor] = []

    def mat(name: str, ne: tuple[int, ...], op: str = "mul_mat") -> None:
        out.append(GgufTensor(name, weight_type, ne, op))

    def vec(name: str, n: int) -> None:
        out.append(GgufTensor(name, NORM_TYPE, (n,), "other"))

    if any(kind == "llama3" for kind, _, _ in shape.rope_scalings) and arch == "llama":
        # conversion/llama.py generate_extra_tensors: rope_freqs (n_rot/2 f32) for llama3 rope scaling
        vec("rope_freqs.weight", hd // 2)
    mat("token_embd.weight", (e, vocab), "get_rows")
    vec("output_norm.weight", e)
    for i in range(shape.num_layers):
        b = f"blk.{i}."
        vec(b + "attn_norm.weight", e)
        for name, width in (("attn_q", q_w), ("attn_k", kv_w), ("attn_v", kv_w)):
            mat(b + name + ".weight", (e, width))
            if arch == "qwen2":  # src/models/qwen2.cpp: q, k and v biases
                vec(b + name + ".bias", width)
        mat(b + "attn_output.weight", (q_w, e))
        if arch in ("qwen3", "gemma3"):
            vec(b + "attn_q_norm.weight", hd)
            vec(b + "attn_k_norm.weight", hd)
        if arch in ("gemma2", "gemma3"):
            vec(b + "post_attention_norm.weight", e)
            vec(b + "post_ffw_norm.weight", e)
        vec(b + "ffn_norm.weight", e)
        mat(b + "ffn_gate.weight", (e, ff))
        mat(b + "ffn_up.weight", (e, ff))
        mat(b + "ffn_down.weight", (ff, e))
    if not tied_embeddings(shape):
        mat("output.weight", (e, vocab))
    return tuple(out)


def tied_embeddings(shape: ModelShape) -> bool:
    """Whether the GGUF has no output matrix (llama.cpp then multiplies by token_embd): the config ties them, and
    Gemma's converter never writes one (conversion/gemma.py)."""
    return shape.tie_word_embeddings or DENSE_ARCHES.get(shape.model_type) in ("gemma2", "gemma3")


def weight_buffers(shape: ModelShape, weight_type: str, mmap: bool = True, repack: bool = True) -> dict[str, int]:
    """The model buffers llama.cpp prints for the GGUF of this model at this weight type, loaded on the CPU."""
    return model_buffers(gguf_tensors(shape, weight_type), tied_embeddings(shape), mmap, repack)


def output_buffer_bytes(n_vocab: int, n_seq_max: int) -> int:
    """src/llama-context.cpp output_reserve(n_seq_max) at context creation: logits of n_vocab floats for each of
    max(n_outputs, n_seq_max) outputs (no embeddings, no backend sampling)."""
    return n_vocab * n_seq_max * FLOAT_BYTES


@dataclass(frozen=True)
class ComputeShape:
    """What kvsize's compute-buffer model reads of a model as llama.cpp loads it."""

    n_embd: int
    n_vocab: int
    n_head: int
    q_width: int  # n_head x n_embd_head_k
    kv_width: int  # n_embd_k_gqa (the widest layer's)


def compute_buffer_model_bytes(m: ComputeShape, n_ctx: int, n_ctx_seq: int, n_ubatch: int, flash_attn: bool,
                               type_k: str, type_v: str) -> dict[str, int]:
    """A model of the CPU compute buffer llama.cpp reserves for its worst-case batch (src/llama-context.cpp
    sched_reserve: n_tokens = min(n_ctx, n_ubatch), every token an output). ggml's graph allocator
    (ggml/src/ggml-alloc.c) packs each intermediate tensor between its first and last use, reusing memory in place;
    kvsize does not rebuild the graph, so this is the larger of two stages, not the allocator's exact answer:

    - logits: the output matrix multiplication holds the logits (n_vocab x n_tokens f32) and its input (n_embd x
      n_tokens f32);
    - attention: the queries and the attention output (2 x q_width x n_tokens f32), K and V of the batch (2 x
      kv_width x n_tokens f32), the residual and the normed input (2 x n_embd x n_tokens f32), the mask (n_kv x n_tokens, f16 with flash attention, f32 without), without flash
      attention the scores (n_kv x n_tokens x n_head f32), and with flash attention from an f32 cache the f16 copies of
      K and V it reads (n_kv x kv_width x 2 bytes each).

    Its error on real loads is measured (measure/reports/llamacpp-cpu-buffers.json), not assumed."""
    tokens = min(n_ctx, n_ubatch)
    logits_bytes = (m.n_vocab + m.n_embd) * tokens * FLOAT_BYTES
    mask_bytes = n_ctx_seq * tokens * (HALF_BYTES if flash_attn else FLOAT_BYTES)
    attention_bytes = (2 * m.q_width + 2 * m.kv_width + 2 * m.n_embd) * tokens * FLOAT_BYTES + mask_bytes
    if flash_attn:
        attention_bytes += sum(n_ctx_seq * m.kv_width * HALF_BYTES for t in (type_k, type_v) if t == "f32")
    else:
        attention_bytes += n_ctx_seq * tokens * m.n_head * FLOAT_BYTES
    return {"logits_bytes": logits_bytes, "attention_bytes": attention_bytes,
            "compute_bytes": max(logits_bytes, attention_bytes)}


def compute_shape(shape: ModelShape) -> ComputeShape:
    kv = max((shape.kv_heads_of(i) * shape.head_dim_of(i) for i, k in enumerate(shape.layer_kinds)
              if k in ("full", "sliding", "chunked")), default=shape.num_kv_heads * shape.head_dim)
    return ComputeShape(shape.hidden_size, shape.vocab_size, shape.num_attention_heads,
                        shape.num_attention_heads * shape.head_dim, kv)


def mib_printed(nbytes: int) -> str:
    """A buffer size as llama.cpp prints model and compute buffers: bytes / 1024.0 / 1024.0 (double), %8.2f."""
    return f"{nbytes / 1024.0 / 1024.0:.2f}"

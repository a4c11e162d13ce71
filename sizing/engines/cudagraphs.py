"""vLLM's CUDA-graph memory: what its profile_cudagraph_memory reports for one GPU, from the capture sizes and
the model's shapes (docs/formulas.md, 'CUDA graphs')."""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..config import DTYPE_BYTES, ModelShape
from ..errors import KvsizeError
from .memory import mlp_width
from .releases import CudaGraphEstimateModel


def cudagraph_capture_sizes(max_num_seqs: int, max_num_batched_tokens: int, model: CudaGraphEstimateModel,
                            model_type: str, largest: int | None = None) -> tuple[int, ...]:
    """The batch sizes vLLM captures (vllm/config/vllm.py _set_cudagraph_sizes): 1, 2, 4, then every 8
    below 256 and every 16 from 256, up to the largest size; the largest is capped by twice
    max_num_seqs and by max_num_batched_tokens, which is added where it falls below the largest."""
    if largest is None:
        largest = model.max_capture_size_by_model_type.get(
            model_type, min(model.max_capture_size, model.capture_sizes_per_seq * max_num_seqs))
    largest = min(largest, max_num_batched_tokens)
    sizes = {1, 2, 4, *range(8, min(largest + 1, 256), 8), *range(256, largest + 1, 16), largest}
    return tuple(sorted(x for x in sizes if x <= largest))


@dataclass(frozen=True)
class GraphCaptures:
    """What vLLM captures for one GPU, in config quantities; the release's constants multiply these."""

    piecewise: tuple[int, ...]  # PIECEWISE capture sizes
    full: tuple[int, ...]  # FULL capture sizes (uniform decode batches: one token a request)
    splitting_layers: int  # layers that split a graph (attention, Mamba)
    mla: bool
    mlp_width_values: float  # the widest MLP intermediate per token (mlp_width_values)


def graph_captures(shape: ModelShape, model: CudaGraphEstimateModel, tp: int, layers: range, max_num_seqs: int,
                   max_num_batched_tokens: int, sizes: tuple[int, ...] | None = None,
                   largest: int | None = None) -> GraphCaptures:
    piecewise = sizes or cudagraph_capture_sizes(max_num_seqs, max_num_batched_tokens, model, shape.model_type,
                                                 largest)
    return GraphCaptures(piecewise, tuple(x for x in piecewise if x <= max_num_seqs),
                         sum(1 for i in layers if shape.layer_kinds[i] != "none"), shape.mla_latent_dim is not None,
                         mlp_width_values(shape, layers, tp))


DEFAULT_CUDAGRAPH_MODE = "FULL_AND_PIECEWISE"  # vLLM's compilation_config default where the release captures graphs


def captured_mode(shape: ModelShape, model: CudaGraphEstimateModel, mode: str | None, layers: range,
                  compiled: bool = True) -> str:
    """The cudagraph_mode vLLM captures with: the mode asked for (its default where None), less what it cannot
    capture without torch.compile, and PIECEWISE where a layer's attention backend captures no FULL graph."""
    mode = mode or DEFAULT_CUDAGRAPH_MODE
    if not compiled:
        mode = uncompiled_cudagraph_mode(mode)
    if mode != "NONE" and model.piecewise_only_layer_kinds.intersection(shape.layer_kinds[i] for i in layers):
        mode = "PIECEWISE" if compiled else "NONE"  # the backend captures no FULL graph
    return mode


def uncompiled_cudagraph_mode(mode: str) -> str:
    """The CUDA-graph mode vLLM keeps without torch.compile: piecewise graphs are the compiled pieces, so an
    explicit FULL mode stays and the rest are turned off ("Cudagraph mode FULL_AND_PIECEWISE is not
    compatible with compilation mode 0", vllm/config/vllm.py)."""
    return mode if mode in ("FULL", "FULL_DECODE_ONLY") else "NONE"


# vllm/v1/attention/backends/fa_utils.py get_flash_attn_version (0.27.0-0.33.0): FA3 where the compute capability's
# major is 9, FA4 where it is 10, FA2 on every other CUDA GPU (sm80, sm86, sm89, sm120)
FLASH_ATTN_VERSION_BY_MAJOR = {9: 3, 10: 4}
FLASH_ATTN_OTHER_CUDA = 2
# the versions whose FULL graphs hold the split-KV accumulators: FA3, where FlashAttentionMetadataBuilder sets
# aot_schedule (get_flash_attn_version() == 3) and, under use_full_cuda_graph, bounds max_num_splits by
# flash_attn_max_num_splits_for_cuda_graph (v1/attention/backends/flash_attn.py); FA4 keeps them as kvsize had them
# (no sm100 start, its own split path not read); FA2 leaves max_num_splits 0 and captures UNIFORM_BATCH graphs
SPLIT_KV_FLASH_ATTN_VERSIONS = frozenset({3, 4})
# FlashMLA's dense decode: the compute-capability majors it runs on (vllm/v1/attention/ops/flashmla.py
# is_flashmla_dense_supported, 0.33.0: "FlashMLA Dense is only supported on Hopper devices") and the query heads
# one SM part takes (FlashMLA get_mla_metadata, block_size_m 64: num_sm_parts = SMs / KV heads / ceil(heads / 64))
FLASHMLA_DENSE_MAJORS = frozenset({9})
FLASHMLA_HEADS_PER_TILE = 64


def compute_capability_major(architecture: str | None) -> int | None:
    """The CUDA compute capability's major of an architecture id (sm90 -> 9, sm120 -> 12); None where it is not one
    (no GPU given, AMD)."""
    m = re.fullmatch(r"sm(\d+)(\d)", architecture or "")
    return int(m.group(1)) if m else None


def flash_attn_version(architecture: str | None) -> int | None:
    """The FlashAttention version vLLM picks on a CUDA GPU of this architecture (sm90 -> 3); None where it is not a
    CUDA compute capability (no GPU given, AMD)."""
    major = compute_capability_major(architecture)
    return None if major is None else FLASH_ATTN_VERSION_BY_MAJOR.get(major, FLASH_ATTN_OTHER_CUDA)


def holds_split_kv_accumulators(architecture: str | None) -> bool:
    """Whether a FULL graph's first capture holds FlashAttention's split-KV accumulators on this GPU (kept where
    the version is not known)."""
    version = flash_attn_version(architecture)
    return version is None or version in SPLIT_KV_FLASH_ATTN_VERSIONS


def unsplit_attention(shape: ModelShape, model: CudaGraphEstimateModel, kv_format: str | None) -> bool:
    """Whether the decode attention a FULL graph captures keeps no split-KV accumulators in the graph: a model type
    whose attention runs unsplit (gpt-oss's sinks) or a KV format whose backend holds its scratch outside it (not
    for MLA, whose layers run an MLA backend of their own)."""
    return shape.model_type in model.unsplit_model_types or (kv_format in model.unsplit_kv_formats
                                                              and shape.mla_latent_dim is None)


def v2_per_layer_bytes(shape: ModelShape, model: CudaGraphEstimateModel, kv_format: str | None,
                       architecture: str | None = None) -> int:
    """Model Runner V2's CUDA-graph estimate above the V1 model, per layer: its own figure where the decode
    attention is not FlashAttention's split path (own_decode_scratch), where the release has one."""
    if model.unsplit_v2_per_layer_bytes is not None and own_decode_scratch(shape, model, kv_format, architecture):
        return model.unsplit_v2_per_layer_bytes
    return model.v2_per_layer_bytes


def own_decode_scratch(shape: ModelShape, model: CudaGraphEstimateModel, kv_format: str | None,
                       architecture: str | None) -> bool:
    """Whether the decode attention schedules its splits its own way rather than FlashAttention's: unsplit
    (unsplit_attention) or FlashMLA's SM parts (flashmla_decode). Both take V2's smaller per-layer figure: 0.33.0's
    fp8 MLA starts printed 4.5 and 5.6 MiB a layer above the V1 model, the unsplit figure's 4.3, not FlashAttention's
    12.9 (tests/fixtures/vllm-starts: h200-0.33.0-glm-4.7-flash-fp8, h200-0.33.0-deepseek-v2-lite-fp8-s128)."""
    return unsplit_attention(shape, model, kv_format) or flashmla_decode(shape, model, kv_format, architecture)


def cuda_graph_estimate(shape: ModelShape, model: CudaGraphEstimateModel, mode: str | None, tp: int, layers: range,
                        max_num_seqs: int, max_num_batched_tokens: int, sizes: tuple[int, ...] | None = None,
                        largest: int | None = None, compiled: bool = True, architecture: str | None = None,
                        kv_format: str | None = None, multiprocessors: int | None = None) -> int:
    """What vLLM's profile_cudagraph_memory reports for one GPU (0 when no graph is captured); `architecture`
    (sm90, sm89, ...) picks the FlashAttention version, whose FULL graphs may hold no split-KV accumulators, and
    `kv_format` the backend, whose FULL graphs may hold none either (unsplit_attention) or, for MLA, hold
    FlashMLA's, one row per request and per SM part (`multiprocessors`: the GPU's SMs)."""
    mode = captured_mode(shape, model, mode, layers, compiled)
    if mode == "NONE":
        return 0
    c = graph_captures(shape, model, tp, layers, max_num_seqs, max_num_batched_tokens, sizes, largest)
    counts = {"PIECEWISE": (len(c.piecewise), 0), "FULL": (0, len(c.full)), "FULL_DECODE_ONLY": (0, len(c.full)),
              "FULL_AND_PIECEWISE": (len(c.piecewise), len(c.full))}[mode]
    per_graph = c.splitting_layers * (model.per_graph_mla_layer_bytes if c.mla else model.per_graph_layer_bytes)
    if model.full_per_graph_bytes:
        further_graphs = (max(0, counts[0] - 1) * max(0, 2 * per_graph - model.full_per_graph_bytes)
                          + max(0, counts[1] - 1) * model.full_per_graph_bytes)
    else:
        further_graphs = sum(max(0, n - 1) for n in counts) * per_graph
    # the first PIECEWISE capture holds copies of the largest size's MLP gate/up output
    first_piecewise = model.first_capture_bytes + int(model.activation_copies * max(c.piecewise) * 2
                                                      * c.mlp_width_values * DTYPE_BYTES[shape.serving_dtype])
    # MLA layers run FlashMLA or another MLA backend, not FlashAttention: their accumulators keep the rule below
    holds = c.mla or (holds_split_kv_accumulators(architecture) and not unsplit_attention(shape, model, kv_format))
    accumulators = split_kv_accumulator_bytes(shape, model, tp, max(c.full), kv_format, architecture,
                                              multiprocessors) if c.full and holds else 0
    first_full = model.full_first_capture_bytes + accumulators if c.full else 0
    first = max(first_piecewise if counts[0] else 0, first_full if counts[1] else 0)
    return first + further_graphs


def flashmla_decode(shape: ModelShape, model: CudaGraphEstimateModel, kv_format: str | None,
                    architecture: str | None) -> bool:
    """Whether an MLA model's decode runs FlashMLA's dense kernel: a format FLASH_ATTN_MLA does not take, on a GPU
    where the dense kernel runs (vllm/v1/attention/ops/flashmla.py is_flashmla_dense_supported: Hopper only)."""
    return (shape.is_mla and kv_format in model.flashmla_kv_formats
            and compute_capability_major(architecture) in FLASHMLA_DENSE_MAJORS)


def split_kv_accumulator_bytes(shape: ModelShape, model: CudaGraphEstimateModel, tp: int, batch: int,
                               kv_format: str | None = None, architecture: str | None = None,
                               multiprocessors: int | None = None) -> int:
    """The decode attention kernel's fp32 split-KV partial outputs for a FULL graph of `batch` requests.
    FlashAttention 3 and its MLA backend size them for the most splits a graph may use: splits x batch x query
    heads per rank x value width (MLA: the absorbed kernel outputs the latent, kv_lora_rank wide: the cached latent
    less its rotary part). FlashMLA's dense kernel (flashmla_decode) holds one row per request and one per SM part
    (get_mla_metadata: the SMs over the tiles of 64 query heads one KV head needs), each the latent's partial output
    and its log-sum-exp."""
    if shape.model_type in model.unsplit_model_types:
        return 0
    heads = max(1, shape.num_attention_heads // tp)
    if shape.is_mla:
        latent = shape.mla_kv_lora_rank
        if flashmla_decode(shape, model, kv_format, architecture):
            if multiprocessors is None:
                raise KvsizeError(f"FlashMLA's decode accumulators ({kv_format} MLA cache on {architecture}) need "
                                  "the GPU's multiprocessor count: name the GPU")
            sm_parts = multiprocessors // -(-heads // FLASHMLA_HEADS_PER_TILE)
            return (batch + sm_parts) * heads * (latent + 1) * 4
        return model.mla_attention_splits * batch * heads * latent * 4
    width = max(shape.layer_v_head_dims or (shape.head_dim,))
    return model.attention_splits * batch * heads * width * 4


def mlp_width_values(shape: ModelShape, layers: range, tp: int) -> float:
    """The widest MLP intermediate per token on one GPU: intermediate_size, or top-k experts' widths."""
    return mlp_width(shape, layers, tp, values=True)


def flash_attn_mla_decode(shape: ModelShape, model: CudaGraphEstimateModel, kv_format: str | None,
                          architecture: str | None) -> bool:
    """Whether an MLA model's decode runs FLASH_ATTN_MLA: a 16-bit cache (not FlashMLA's formats) on a GPU where vLLM
    runs FlashAttention 3 (the backend's kernel; fa_utils.py get_flash_attn_version)."""
    return (shape.is_mla and not flashmla_decode(shape, model, kv_format, architecture)
            and flash_attn_version(architecture) == 3)


def v2_flash_attn_mla_estimate(shape: ModelShape, model: CudaGraphEstimateModel, mode: str | None, tp: int,
                               layers: range, max_num_seqs: int, max_num_batched_tokens: int,
                               sizes: tuple[int, ...] | None = None, largest: int | None = None,
                               compiled: bool = True) -> int:
    """Model Runner V2's CUDA-graph estimate where the decode runs FLASH_ATTN_MLA, part by part as its
    profile_cudagraph_memory makes it (docs/formulas.md, 'CUDA graphs'): the PIECEWISE phase (a base and a figure per
    further graph and attention layer), the first FULL graph's split accumulators for its batch, the second's
    warm-up accumulators that the extrapolation adds back, and a floor per further FULL graph."""
    mode = captured_mode(shape, model, mode, layers, compiled)
    if mode == "NONE":
        return 0
    c = graph_captures(shape, model, tp, layers, max_num_seqs, max_num_batched_tokens, sizes, largest)
    n_piecewise = len(c.piecewise) if mode in ("PIECEWISE", "FULL_AND_PIECEWISE") else 0
    full = c.full if mode != "PIECEWISE" else ()
    piecewise = (model.v2_mla_piecewise_base_bytes + (n_piecewise - 1) * c.splitting_layers
                 * model.v2_mla_piecewise_graph_layer_bytes) if n_piecewise else 0
    return piecewise + v2_flash_attn_mla_full_bytes(shape, model, tp, full)


def v2_flash_attn_mla_full_bytes(shape: ModelShape, model: CudaGraphEstimateModel, tp: int,
                                 full: tuple[int, ...]) -> int:
    """The FULL part of V2's FLASH_ATTN_MLA estimate for the FULL batches `full` (ascending): the warm-up
    accumulators of the two largest and a floor per further FULL graph."""
    return warmup_accumulator_bytes(shape, model, tp, full) + max(0, len(full) - 1) * model.v2_full_graph_floor_bytes


def warmup_accumulator_bytes(shape: ModelShape, model: CudaGraphEstimateModel, tp: int, full: tuple[int, ...]) -> int:
    """The split accumulators the warm-ups of the two largest FULL batches of `full` (ascending) allocate."""
    return sum(flash_attn_mla_accumulator_bytes(shape, model, tp, b) for b in full[-2:])


def flash_attn_mla_accumulator_bytes(shape: ModelShape, model: CudaGraphEstimateModel, tp: int, batch: int) -> int:
    """FLASH_ATTN_MLA's fp32 split accumulators for a FULL graph of `batch` requests: `v2_warmup_splits` splits x
    batch x query heads per rank x kv_lora_rank (the absorbed decode's output width)."""
    return model.v2_warmup_splits * batch * max(1, shape.num_attention_heads // tp) * shape.mla_kv_lora_rank * 4


def flash_attn_3_decode(shape: ModelShape, model: CudaGraphEstimateModel, kv_format: str | None,
                        architecture: str | None) -> bool:
    """Whether the decode runs FlashAttention 3's own split path: a model without an MLA cache on a GPU where vLLM runs
    FlashAttention 3, in a format whose backend keeps its splits in the graph (not unsplit_attention)."""
    return (not shape.is_mla and flash_attn_version(architecture) == 3
            and not unsplit_attention(shape, model, kv_format))


def split_block_risk_bytes(shape: ModelShape, model: CudaGraphEstimateModel, mode: str | None, tp: int,
                           layers: range, max_num_seqs: int, max_num_batched_tokens: int,
                           sizes: tuple[int, ...] | None = None, largest: int | None = None,
                           kv_format: str | None = None, architecture: str | None = None) -> int:
    """What V2's estimate may hold once more where PyTorch's allocator split the freed accumulator block in the
    warm-ups of its largest FULL graphs (each then cudaMalloc's a second block): under FLASH_ATTN_MLA both warm-ups'
    accumulators again (GLM-4.7-Flash at 1,024 sequences), under FlashAttention 3 about the largest batch's once
    (0.7-1.0 of a copy above the others in the small-pool-0.33 probes: Qwen3-30B-A3B, Gemma-3-27B, Llama-3.1-70B with
    fp8 weights). 0 where the decode is neither or no FULL graph is captured, or the release samples no warm-up."""
    if not model.v2_warmup_splits or captured_mode(shape, model, mode, layers) == "PIECEWISE":
        return 0
    full = graph_captures(shape, model, tp, layers, max_num_seqs, max_num_batched_tokens, sizes, largest).full
    if not full:
        return 0
    if flash_attn_mla_decode(shape, model, kv_format, architecture):
        return warmup_accumulator_bytes(shape, model, tp, full)
    if flash_attn_3_decode(shape, model, kv_format, architecture):
        return split_kv_accumulator_bytes(shape, model, tp, full[-1], kv_format, architecture)
    return 0

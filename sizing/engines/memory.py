"""GPU memory beside the KV cache: weights, peak activation, non-torch memory (CUDA graphs: cudagraphs.py).

Weights are exact for the parameter count derived from the config. The activation,
non-torch and CUDA-graph figures are documented estimates; `measure/` checks them on a
real GPU and the reports under measure/reports record how close they come.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from ..errors import unknown
from .releases import ProfilingRunModel, WeightAllocatorModel, ZeroPointKernelRule
from ..config import DTYPE_BYTES, FORMAT_BY_METHOD, GPTQ_PACKED_METHODS, MODEL_DTYPE, ModelShape
from ..units import cdiv
from .mxfp4 import Mxfp4MoeLayout, mxfp4_expert_tensors
from .pp_vocab import FIRST_AND_LAST, StageVocab


@dataclass(frozen=True)
class WeightFormat:
    name: str
    bits: int  # per parameter
    scale_bits: int  # per group of `group` parameters
    group: int
    experts_only: bool  # mxfp4 checkpoints keep attention and dense layers in the model dtype
    source: str
    # the checkpoint's attention projections in another format: a WEIGHT_FORMATS key (FP8 in ModelOpt's mixed
    # precision) or MODEL_DTYPE where they are left unquantized; None: the linear layers' format
    attention_format: str | None = None
    zero_bits: int = 0  # of scale_bits, the zero point's (asymmetric integer formats)
    per_channel: bool = False  # one group per output channel (`group` then stands for in_features)
    # zero-point bits a group the checkpoint stores though the format is symmetric (GPTQ's qzeros)
    checkpoint_zero_bits: int = 0
    # the engine's dense linear kernel keeps each zero point in this many bits (Machete on Hopper: the
    # activation dtype, pre-multiplied by the scale; or a symmetric checkpoint's packed zeros it leaves
    # allocated); None: zero_bits
    linear_zero_bits: int | None = None
    expert_zero_bits: int | None = None  # likewise for the routed experts' kernel
    moe_layout: Mxfp4MoeLayout | None = None  # the engine's MXFP4 experts as its backend keeps them (mxfp4.py)

    @property
    def attention_in_model_dtype(self) -> bool:
        return self.attention_format == MODEL_DTYPE

    def bytes_for(self, params: int) -> int:
        return cdiv(params * self.bits + cdiv(params, self.group) * self.scale_bits, 8)


WEIGHT_FORMATS = {
    "fp32": WeightFormat("fp32", 32, 0, 1, False, "IEEE binary32"),
    "fp16": WeightFormat("fp16", 16, 0, 1, False, "IEEE binary16"),
    "bf16": WeightFormat("bf16", 16, 0, 1, False, "bfloat16"),
    "fp8": WeightFormat("fp8", 8, 32, 128 * 128, False,
                        "fp8 e4m3 with one fp32 scale per 128x128 block (DeepSeek-V3 weight_block_size)"),
    "fp8_channel": WeightFormat("fp8_channel", 8, 32, 4096, False,
                                "fp8 e4m3 with one fp32 scale per output channel (compressed-tensors strategy "
                                "'channel'): one per in_features weights, 4,096 taken (2,048-16,384: <0.1% of "
                                "the bytes)"),
    "fp8_tensor": WeightFormat("fp8_tensor", 8, 32, 1 << 24, False,
                               "fp8 e4m3 with one fp32 scale per tensor (ModelOpt FP8): 1 per 2^24 weights taken"),
    "nvfp4": WeightFormat("nvfp4", 4, 8, 16, False,
                          "NVFP4: E2M1 values with an FP8 E4M3 scale per 16 (compressed-tensors float 4-bit, "
                          "group 16)"),
    "int8": WeightFormat("int8", 8, 16, 128, False, "int8 with an fp16 scale per 128 weights (W8A16 grouped)"),
    "int4": WeightFormat("int4", 4, 20, 128, False,
                         "int4 with an fp16 scale and a 4-bit zero point per 128 weights (GPTQ/AWQ layout)",
                         zero_bits=4),
    "mxfp4": WeightFormat("mxfp4", 4, 8, 32, True,
                          "OCP MX FP4: E2M1 values, one E8M0 scale per 32 (gpt-oss experts)"),
    "bnb4": WeightFormat("bnb4", 4, 32, 64, False,
                         "bitsandbytes 4-bit (NF4/FP4): an fp32 absmax per block of 64 (quantize_4bit's blocksize); "
                         "double-quantized checkpoints load so too (vLLM's loader dequantizes the nested absmax)"),
    "bnb8": WeightFormat("bnb8", 8, 32, 4096, False,
                         "bitsandbytes LLM.int8: int8 with an fp32 scale per row (one per in_features weights, "
                         "4,096 taken)"),
}
PER_CHANNEL_GROUP = 4096


def resolve_weights_dtype(name: str, shape: ModelShape) -> WeightFormat:
    """`auto` follows the checkpoint's quantization_config, else the serving dtype."""
    key = str(name).strip().lower()
    if key != "auto":
        return _weight_format(key, name)
    fmt = _weight_format(shape.weights_quantization_format or FORMAT_BY_METHOD.get(shape.weights_quantization or "")
                         or shape.serving_dtype, name)
    if shape.weights_quantization in GPTQ_PACKED_METHODS and fmt.name.startswith("int") and not fmt.zero_bits:
        fmt = replace(fmt, checkpoint_zero_bits=fmt.bits)  # GPTQ's packing stores qzeros, symmetric or not
    if shape.dense_mlp_unquantized:
        # dense MLPs in the model dtype; the attention keeps the checkpoint's format unless it says otherwise
        fmt = replace(fmt, experts_only=True, attention_format=fmt.name)
    if shape.attention_quantization_format:
        fmt = replace(fmt, attention_format=shape.attention_quantization_format)
    return fmt


WEIGHT_ALIASES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32"}  # torch's dtype names


def _weight_format(key: str, name: str) -> WeightFormat:
    key = WEIGHT_ALIASES.get(key, key)
    grouped = re.fullmatch(r"int([2348])_g(\d{1,5}|channel)(_sym)?", key)
    if grouped:  # a checkpoint's integers in its own groups: an fp16 scale each, a zero of as many bits
        # unless symmetric
        bits, symmetric = int(grouped.group(1)), bool(grouped.group(3))
        per_channel = grouped.group(2) == "channel"
        # one group per output channel holds in_features weights: 4,096 taken (2,048-16,384: <0.1% of the bytes)
        size = PER_CHANNEL_GROUP if per_channel else int(grouped.group(2))
        if size == 0:
            raise unknown("weights dtype", name, [*WEIGHT_FORMATS, "auto", "intB_gN[_sym]"], "--weights-dtype")
        return WeightFormat(key, bits, 16 if symmetric else 16 + bits, size, False,
                            f"int{bits} in groups of " + ("one output channel" if per_channel else str(size))
                            + " with an fp16 scale" + ("" if symmetric else f" and a {bits}-bit zero"),
                            zero_bits=0 if symmetric else bits, per_channel=per_channel)
    if key not in WEIGHT_FORMATS:
        # intB_gN[_sym]: integers of B (2, 3, 4, 8) bits in groups of N (or "channel"), symmetric or with zeros
        raise unknown("weights dtype", name, [*WEIGHT_FORMATS, "auto", "intB_gN[_sym]"], "--weights-dtype")
    return WEIGHT_FORMATS[key]


@dataclass(frozen=True)
class WeightBytes:
    embedding_bytes: int
    lm_head_bytes: int
    vision_bytes: int
    layers_bytes: int
    buffers_bytes: int  # model buffers allocated with the weights (the rotary cos/sin cache)
    allocator_bytes: int = 0  # segment ends the caching allocator counts with the largest tensors
    per_layer_input_bytes: int = 0  # per-layer input embeddings (Gemma 3n, Gemma 4 E2B/E4B): table, projections

    @property
    def total_bytes(self) -> int:
        return (self.embedding_bytes + self.lm_head_bytes + self.vision_bytes + self.layers_bytes
                + self.buffers_bytes + self.allocator_bytes + self.per_layer_input_bytes)


# vLLM pads the vocabulary of its embedding and lm_head to a multiple of 64
# (vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE) before splitting it over TP ranks.
VOCAB_PADDING = 64
# PyTorch's caching allocator (c10/cuda/CUDACachingAllocator.cpp): kMinLargeAlloc, kRoundLarge, kSmallSize
# (the largest small-pool request, and the most of a large block's end left unsplit), kMinBlockSize.
OWN_SEGMENT_MIN_BYTES = 10 * 2**20
SEGMENT_ROUNDING_BYTES = 2 * 2**20
UNSPLIT_END_MAX_BYTES = 2**20
MIN_BLOCK_BYTES = 512


def padded_vocab(vocab: int) -> int:
    return cdiv(vocab, VOCAB_PADDING) * VOCAB_PADDING


def segment_end_bytes(size: int, max_split_bytes: int | None) -> int:
    """What the caching allocator counts beyond one tensor of `size` bytes that gets a segment of its own:
    the segment's end past the tensor, rounded to 2 MiB, unless that end is over 1 MiB and the tensor is
    below max_split_size (then the end is split off as a free block)."""
    if size < OWN_SEGMENT_MIN_BYTES:
        return 0
    end = cdiv(size, SEGMENT_ROUNDING_BYTES) * SEGMENT_ROUNDING_BYTES - size
    splits = end > UNSPLIT_END_MAX_BYTES and (max_split_bytes is None or size < max_split_bytes)
    return 0 if splits else end


def engine_weight_format(fmt: WeightFormat, shape: ModelShape, rule: ZeroPointKernelRule | None,
                         architecture: str | None, moe_keeps_checkpoint_zeros: bool = False,
                         moe_layout: Mxfp4MoeLayout | None = None) -> WeightFormat:
    """The checkpoint's format as the engine keeps it on this GPU: where its dense linear kernel takes the
    format's zero points in the activation dtype (`rule`: Machete on sm90), they weigh that many bits, and
    a symmetric checkpoint's packed zeros stay allocated beside it where the rule says so; the routed
    experts' kernel may keep them too (`moe_keeps_checkpoint_zeros`); MXFP4 experts as the release's backend
    lays them out on this GPU (`moe_layout`)."""
    if moe_layout is not None and fmt.name == "mxfp4":
        fmt = replace(fmt, moe_layout=moe_layout)
    if moe_keeps_checkpoint_zeros and fmt.checkpoint_zero_bits and not fmt.zero_bits:
        fmt = replace(fmt, expert_zero_bits=fmt.checkpoint_zero_bits)
    if rule is None or architecture not in rule.architectures or fmt.bits not in rule.bits \
            or (-1 if fmt.per_channel else fmt.group) not in rule.group_sizes:
        return fmt
    if fmt.zero_bits:
        return replace(fmt, linear_zero_bits=8 * DTYPE_BYTES[shape.serving_dtype])
    if rule.keeps_checkpoint_zeros and fmt.checkpoint_zero_bits:
        return replace(fmt, linear_zero_bits=fmt.checkpoint_zero_bits)
    return fmt


def _with_zero_bits(fmt: WeightFormat, bits: int | None) -> WeightFormat:
    if bits is None:
        return fmt
    return replace(fmt, scale_bits=fmt.scale_bits - fmt.zero_bits + bits, zero_bits=bits, linear_zero_bits=None,
                   expert_zero_bits=None)


def linear_format(shape: ModelShape, fmt: WeightFormat) -> WeightFormat:
    """The format of the dense linear layers (attention and MLP): the model dtype where only experts are
    quantized, else the checkpoint's, with the zero points as the engine's kernel keeps them."""
    if fmt.experts_only:
        return WEIGHT_FORMATS[shape.serving_dtype]
    return _with_zero_bits(fmt, fmt.linear_zero_bits)


def expert_format(fmt: WeightFormat) -> WeightFormat:
    """The routed experts' format, with the zero points as the engine's MoE kernel keeps them."""
    return _with_zero_bits(fmt, fmt.expert_zero_bits)


def attention_format(shape: ModelShape, fmt: WeightFormat) -> WeightFormat:
    """The format of the attention projections: the linear layers' unless the checkpoint gives its own
    (ModelOpt's mixed precision) or leaves them in the model dtype."""
    if fmt.attention_format is None:
        return linear_format(shape, fmt)
    if fmt.attention_in_model_dtype:
        return WEIGHT_FORMATS[shape.serving_dtype]
    if fmt.attention_format == fmt.name:  # the checkpoint's own format (its dense MLPs left unquantized)
        return _with_zero_bits(replace(fmt, experts_only=False, attention_format=None), fmt.linear_zero_bits)
    return _weight_format(fmt.attention_format, fmt.attention_format)


def attention_projections(shape: ModelShape, layer: int, tp: int) -> tuple[int, int] | None:
    """(merged q/k/v, o) parameters one TP rank holds where the layer's attention parameters are those
    projections (biases and norms aside); vLLM replicates K/V heads over ranks when there are fewer than TP
    (QKVParallelLinear). None for other projections (MLA's, MiniCPM3's low-rank ones, recurrent mixers)."""
    p, kind = shape.layer_params[layer], shape.layer_kinds[layer]
    whole = sum(_projection_params(shape, layer, 1))
    if kind not in ("full", "sliding", "chunked", "shared") or abs(p.attention - whole) > p.attention // 100:
        return None
    return _projection_params(shape, layer, tp)


def _projection_params(shape: ModelShape, layer: int, tp: int) -> tuple[int, int]:
    """(q/k/v, o) parameters of one rank; an output gate doubles the queries (Qwen3-Next, Qwen3.5)."""
    heads, kv_heads, head_dim = shape.num_attention_heads, shape.kv_heads_of(layer), shape.head_dim_of(layer)
    heads_tp, kv_tp = cdiv(heads, tp), max(1, kv_heads // tp)
    queries = heads_tp * (2 if shape.attention_output_gate else 1)
    return (queries + 2 * kv_tp) * head_dim * shape.hidden_size, heads_tp * head_dim * shape.hidden_size


def attention_per_rank(shape: ModelShape, layer: int, tp: int) -> int:
    """One rank's attention parameters: its projections (K/V replicated as vLLM does) and its share of the
    rest (biases, norms)."""
    projections = attention_projections(shape, layer, tp)
    p = shape.layer_params[layer]
    if projections is None:
        return cdiv(p.attention, tp)
    return sum(projections) + cdiv(p.attention - sum(_projection_params(shape, layer, 1)), tp)


def vocab_tensors(shape: ModelShape, first_stage: bool, last_stage: bool,
                  vocab: StageVocab = FIRST_AND_LAST) -> tuple[bool, bool]:
    """(embedding, lm_head) on this stage: the embedding on the first, the head on the last, or either on every
    stage where the model class builds it there (`vocab`, sizing/engines/pp_vocab.py); a tied head shares the
    embedding's tensor where the stage holds one, and is a copy of its own where it does not."""
    embedding = first_stage or vocab.embedding_every_stage
    head = last_stage or vocab.lm_head_every_stage
    return embedding, head and (bool(shape.lm_head_params) or not embedding)


def vocab_bytes(shape: ModelShape, tp: int) -> int:
    """One rank's embedding (or lm_head): the padded vocabulary split over TP, in the model dtype."""
    return cdiv(padded_vocab(shape.vocab_size), tp) * shape.hidden_size * DTYPE_BYTES[shape.serving_dtype]


@dataclass(frozen=True)
class PerLayerInputLayout:
    """Where an engine keeps the per-layer input table and the projection into it."""

    split: bool  # split over TP ranks (vLLM: VocabParallelEmbedding, ColumnParallelLinear) or whole on each
    every_stage: bool  # on every pipeline stage (vLLM's Gemma4Model builds them unconditionally) or the first


# vLLM 0.33's gemma4.py: split over TP, built on every PP rank; SGLang 0.5.23's gemma4_causal.py: an nn.Embedding
# and a ReplicatedLinear, whole on every TP rank, on the first PP rank only
VLLM_PER_LAYER_INPUTS = PerLayerInputLayout(split=True, every_stage=True)
SGLANG_PER_LAYER_INPUTS = PerLayerInputLayout(split=False, every_stage=False)


def per_layer_table_bytes(shape: ModelShape, tp: int, split: bool = True) -> int:
    """One rank's per-layer embedding table, num_layers * hidden_size_per_layer_input wide in the model dtype:
    vLLM's VocabParallelEmbedding of vocab_size_per_layer_input rows padded to 64 and split over TP, or
    (`split` False: SGLang's gemma4_causal.py, a plain nn.Embedding) every row on every rank."""
    rows = cdiv(padded_vocab(shape.per_layer_input_vocab), tp) if split else shape.per_layer_input_vocab
    return rows * shape.per_layer_input_width * DTYPE_BYTES[shape.serving_dtype]


def per_layer_input_bytes(shape: ModelShape, linear: WeightFormat, tp: int, layers: range, first_stage: bool,
                          layout: PerLayerInputLayout = VLLM_PER_LAYER_INPUTS) -> int:
    """Per-layer inputs on one GPU (vLLM's gemma4.py, gemma3n.py): the table and per_layer_model_projection
    (hidden -> layers x d: vLLM's ColumnParallelLinear) with its norm of d, on the stages and split as the
    engine's `layout` says; on each of the stage's layers per_layer_input_gate and per_layer_projection
    (ReplicatedLinear, hidden x d each, whole on every rank) and a norm of hidden. The linear layers in the
    linear layers' format."""
    d, h, dense = shape.per_layer_input_size, shape.hidden_size, DTYPE_BYTES[shape.serving_dtype]
    if not d:
        return 0
    per_layer = len(layers) * (linear.bytes_for(2 * h * d) + h * dense)
    if not (first_stage or layout.every_stage):
        return per_layer
    projection = linear.bytes_for(cdiv(shape.per_layer_input_width, tp if layout.split else 1) * h)
    return per_layer_table_bytes(shape, tp, layout.split) + projection + d * dense + per_layer


# vLLM's multimodal wrappers that keep a staging buffer of per-layer inputs beside the language model
PER_LAYER_INPUT_BUFFER_ARCHITECTURES = frozenset({"Gemma3nForConditionalGeneration", "Gemma4ForConditionalGeneration"})


def per_layer_input_buffer_bytes(shape: ModelShape, tokens: int) -> int:
    """The staging buffer vLLM's multimodal Gemma 4 and Gemma 3n wrappers allocate with the model for CUDA
    graphs, text-only too (gemma4_mm.py, gemma3n_mm.py: per_layer_embeddings, max_num_batched_tokens x layers
    x d in the model dtype): counted in the weights' memory. 0 for other classes."""
    if not PER_LAYER_INPUT_BUFFER_ARCHITECTURES.intersection(shape.architectures[:1]):
        return 0
    return tokens * shape.per_layer_input_width * DTYPE_BYTES[shape.serving_dtype]


def large_weight_tensors(shape: ModelShape, fmt: WeightFormat, tp: int, layers: range, first_stage: bool,
                         last_stage: bool, vocab: StageVocab = FIRST_AND_LAST) -> list[int]:
    """Bytes of the weight tensors vLLM builds that can take a segment of their own, one GPU's share: the
    embedding and lm_head (vocabulary padded), each layer's merged q/k/v and o projections (attention with
    per-head K and V), merged gate/up and down (dense MLP and shared experts) and the two stacked expert
    tensors, each with its scales beside it. MLA, low-rank and recurrent projections and vision towers are
    left out."""
    linear, attention = linear_format(shape, fmt), attention_format(shape, fmt)

    def stored(f: WeightFormat, params: int) -> list[int]:
        values = cdiv(params * f.bits, 8)
        return [values, f.bytes_for(params) - values]

    sizes = [vocab_bytes(shape, tp)] * sum(vocab_tensors(shape, first_stage, last_stage, vocab))
    if shape.per_layer_input_size:  # the per-layer table and the projection into it, on every stage in vLLM
        sizes += [per_layer_table_bytes(shape, tp)]
        sizes += stored(linear, cdiv(shape.per_layer_input_width, tp) * shape.hidden_size)
    matrices = 3 if shape.gated_mlp else 2
    for i in layers:
        p = shape.layer_params[i]
        projections = attention_projections(shape, i, tp)
        if projections is not None:
            sizes += stored(attention, projections[0]) + stored(attention, projections[1])
        for params, f, routed in ((p.mlp, linear, False), (p.experts, expert_format(fmt), True)):
            kept = mxfp4_expert_tensors(shape, fmt.moe_layout, params, tp) if routed else None
            if kept is not None:
                sizes += kept
            elif params:
                part = cdiv(params, tp * matrices)
                sizes += stored(f, (matrices - 1) * part) + stored(f, part)
    return sizes


def weight_bytes(shape: ModelShape, fmt: WeightFormat, tp: int, layers: range, first_stage: bool,
                 last_stage: bool, vision: bool = True, allocator: WeightAllocatorModel | None = None,
                 per_layer_inputs: PerLayerInputLayout = VLLM_PER_LAYER_INPUTS,
                 vocab: StageVocab = FIRST_AND_LAST) -> WeightBytes:
    """Weights one GPU holds: its share (1/tp) of the stage's layers, embeddings on the first
    stage, the lm_head on the last; norms, routers and embeddings stay in the model dtype. A
    multimodal model's vision encoder sits on the first stage unless it is served text-only
    (`vision` False: vLLM's --language-model-only builds no tower). With the engine's `allocator`, the
    segment ends the caching allocator counts with the largest tensors are added. Per-layer input tables
    are placed as the engine places them (`per_layer_inputs`: vLLM's layout, or SGLang's)."""
    dense = DTYPE_BYTES[shape.serving_dtype]
    linear, attention = linear_format(shape, fmt), attention_format(shape, fmt)
    layer_total = 0
    for i in layers:
        p = shape.layer_params[i]
        if attention == linear:
            layer_total += linear.bytes_for(attention_per_rank(shape, i, tp) + cdiv(p.mlp, tp))
        else:
            layer_total += attention.bytes_for(attention_per_rank(shape, i, tp)) + linear.bytes_for(cdiv(p.mlp, tp))
        kept = mxfp4_expert_tensors(shape, fmt.moe_layout, p.experts, tp)
        layer_total += expert_format(fmt).bytes_for(cdiv(p.experts, tp)) if kept is None else sum(kept)
        layer_total += cdiv(p.other, tp) * dense
    has_embedding, has_head = vocab_tensors(shape, first_stage, last_stage, vocab)
    embedding, lm_head = vocab_bytes(shape, tp) * has_embedding, vocab_bytes(shape, tp) * has_head
    vision = cdiv(shape.vision_params, tp) * dense if first_stage and vision else 0
    ends = 0
    if allocator is not None:
        ends = sum(segment_end_bytes(size, allocator.max_split_bytes)
                   for size in large_weight_tensors(shape, fmt, tp, layers, first_stage, last_stage, vocab))
    return WeightBytes(embedding, lm_head, vision, layer_total, rotary_cache_bytes(shape) if len(layers) else 0, ends,
                       per_layer_input_bytes(shape, linear, tp, layers, first_stage, per_layer_inputs))


@dataclass(frozen=True)
class ActivationEstimate:
    """The peak of an engine's profiling run on one GPU, as its two phases (docs/formulas.md,
    'Profiling peak'): the forward pass over `tokens` tokens, then the sampler over `rows` rows."""

    tokens: int
    rows: int
    forward_bytes: int
    sampler_bytes: int  # 0 on pipeline stages that do not sample
    stage_buffer_bytes: int  # buffers the profiling run allocates and keeps (pipeline stages after the first)
    workspace_bytes: int  # allocated by the run's first matmul and kept
    moe_workspace_bytes: int = 0  # the fused-MoE experts' workspace, kept by vLLM's workspace manager
    # the forward through the layers before the first MoE layer, which runs before that workspace exists
    forward_before_moe_bytes: int = 0
    # the compile-time autotuning's example arguments, live before the first matmul takes its workspace
    compile_examples_bytes: int = 0
    # an MLA layer's attention in the profiling run: the up-projected context it allocates (mla_context_bytes) beside
    # the layer's inputs, once the fused-MoE workspace exists
    mla_attention_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        run = self.workspace_bytes + max(
            self.moe_workspace_bytes + max(self.forward_bytes, self.sampler_bytes, self.mla_attention_bytes),
            self.forward_before_moe_bytes)
        return self.stage_buffer_bytes + max(run, self.compile_examples_bytes)


# vLLM's MLA chunked-prefill workspace, in tokens (vllm/model_executor/layers/attention/mla_attention.py
# MLACommonMetadataBuilder.determine_chunked_prefill_workspace_size, the same in 0.20.0, 0.26.0 and 0.33.0): room for
# 8 full-length requests or 4 blocks of every request, at most 64 Ki tokens, rounded up to whole blocks
MLA_WORKSPACE_REQUESTS = 8
MLA_WORKSPACE_BLOCKS_PER_REQUEST = 4
MLA_WORKSPACE_MAX_TOKENS = 64 * 1024
# the context length from which the workspace is at its cap, whatever the batch: longer contexts share one peak
MLA_WORKSPACE_FULL_LENGTH = MLA_WORKSPACE_MAX_TOKENS // MLA_WORKSPACE_REQUESTS


def mla_workspace_tokens(max_model_len: int, max_num_seqs: int, block_size: int) -> int:
    wanted = max(MLA_WORKSPACE_REQUESTS * max_model_len, MLA_WORKSPACE_BLOCKS_PER_REQUEST * max_num_seqs * block_size)
    rows = min(wanted, MLA_WORKSPACE_MAX_TOKENS)
    return cdiv(max(rows, block_size), block_size) * block_size


def mla_context_bytes(shape: ModelShape, workspace_tokens: int, tp: int) -> int:
    """What vLLM's MLAAttention allocates in the profiling run (forward_impl with no attention metadata, 0.20.0-0.33.0)
    to stand for the largest up-projected context a chunked prefill builds: workspace tokens x heads per rank x
    (qk_nope_head_dim + v_head_dim) in the model dtype, beside the layer's inputs. 0 for a model vLLM builds without
    MLA, or without the up-projection's width."""
    if not shape.is_mla or not shape.mla_kv_b_proj_params:
        return 0
    width = shape.mla_kv_b_proj_params // shape.mla_kv_lora_rank  # heads x (qk_nope_head_dim + v_head_dim)
    return workspace_tokens * cdiv(width, tp) * DTYPE_BYTES[shape.serving_dtype]


def mlp_width(shape: ModelShape, layers: range, tp: int, routed: bool = True, values: bool = False) -> float:
    """The widest feed-forward activation of the stage's layers per GPU, in gated-MLP units
    (a gated MLP of width I keeps 2I + I alive; an ungated one half of that, as measured on Falcon-7B's
    profiling peak, vLLM 0.26.0, tests/fixtures/vllm-starts), or with `values` the width I itself; an MoE
    layer counts its shared experts and, with `routed`, its top-k experts' width."""
    matrices = 3 if shape.gated_mlp else 2
    scale = 1.0 if shape.gated_mlp or values else 1 / 2
    widest = 0.0
    for i in layers:
        p = shape.layer_params[i]
        width = p.mlp / (matrices * shape.hidden_size)
        if p.experts and routed:
            per_expert = p.experts / (max(1, shape.num_experts) * matrices * shape.hidden_size)
            width += max(1, shape.num_experts_per_tok) * per_expert
        widest = max(widest, width / tp * scale)
    return widest


def profiling_peak(shape: ModelShape, run: ProfilingRunModel, tokens: int, rows: int, tp: int, layers: range,
                   first_stage: bool, last_stage: bool, multiprocessors: int,
                   compiled: bool = True, mla_workspace: int = 0) -> ActivationEstimate:
    """What the engine's profiling run holds at its peak on one GPU.

    Forward: `tokens` tokens through the stage's layers; hidden-size tensors (residual and normed
    input), the attention's query-width tensors per GPU and the widest MLP activation, in copies the
    release's file gives. Sampler (last stage):
    one row per dummy request; the logits in the model dtype (all-gathered: full vocabulary on every
    TP rank), the release's fp32 copies of them, a Triton top-k/top-p buffer of min(SMs, rows) rows,
    the forward's hidden states and the sampled rows' hidden states with their random stand-ins.
    Stages after the first keep their received hidden and residual buffers of `tokens` rows.
    Compiled (torch.compile on), the first stage's compile autotunes the embedding-and-norm kernel on
    example copies of its arguments: the embedding shard and the release's outputs of `tokens` rows
    (no shard at TP > 1 where the release looks the embedding up in its own CUDA op).
    MLA attention (`mla_workspace`: vLLM's chunked-prefill workspace in tokens): the up-projected context it allocates
    (mla_context_bytes) beside the forward's hidden-size and query-width tensors.
    """
    dt = DTYPE_BYTES[shape.serving_dtype]
    h = shape.hidden_size
    moe = moe_workspace_bytes(shape, tokens, tp) if run.moe_workspace else 0
    before = range(0)
    if moe:
        # the routed experts' activations live in the fused-MoE workspace, counted once below; the dense
        # layers before the first MoE layer (DeepSeek's first_k_dense_replace) run before it is allocated
        first_moe = next((i for i in layers if shape.layer_params[i].experts), layers.start)
        before, layers = range(layers.start, first_moe), range(first_moe, layers.stop)

    query = shape.num_attention_heads * shape.head_dim / tp
    # a layer's hidden-size and query-width tensors a token, the attention's inputs
    layer_inputs = run.forward_hidden_copies * h + run.forward_attention_copies * query

    def forward_bytes(span: range, routed: bool) -> int:
        if not span:
            return 0
        width = mlp_width(shape, span, tp, routed=routed)
        return int(tokens * dt * (layer_inputs + run.forward_mlp_copies * width))

    forward = forward_bytes(layers, routed=not moe)
    context = mla_context_bytes(shape, mla_workspace, tp) if mla_workspace else 0
    mla_attention = context + int(tokens * dt * layer_inputs) if context else 0
    sampler = 0
    if last_stage:
        vocab = shape.vocab_size
        per_logit = dt + run.sampler_extra_bytes_per_logit - (run.sampler_upcast_bytes_per_logit if dt == 4 else 0)
        if tp > 1 and run.tensor_parallel_logit_copies is not None:
            per_logit = run.tensor_parallel_logit_copies * dt + dt / tp
        elif tp == 1 and run.single_gpu_logit_copies is not None:
            per_logit = run.single_gpu_logit_copies * dt
        if shape.logit_softcap:
            per_logit = max(per_logit, 2 * dt)  # the capped copy beside the logits it is computed from
        topk = min(multiprocessors, rows) * vocab * 4 if run.topk_buffer and rows >= 8 else 0
        sampler = int(rows * vocab * per_logit) + topk + tokens * h * dt + 2 * rows * h * dt
    stage_buffers = 0 if first_stage else 2 * tokens * h * dt
    examples = 0
    if compiled and first_stage and run.compile_example_outputs:
        shard = 0 if tp > 1 and run.tensor_parallel_embedding_op else vocab_bytes(shape, tp)
        examples = shard + run.compile_example_outputs * tokens * h * dt
    return ActivationEstimate(tokens, rows, forward, sampler, stage_buffers, run.workspace_bytes, moe,
                              forward_bytes(before, routed=False), examples, mla_attention)


# Checkpoint formats whose MoE runs on a monolithic kernel that keeps no workspace of the manager's
# (vLLM's OAITritonMxfp4ExpertsMonolithic for gpt-oss's mxfp4 experts).
MONOLITHIC_MOE_QUANTIZATION = frozenset({"mxfp4", "gpt_oss_mxfp4"})


def moe_workspace_bytes(shape: ModelShape, tokens: int, tp: int) -> int:
    """The Triton fused-MoE workspaces for `tokens` tokens: workspace13 of tokens x top_k x
    max(activation out, hidden) and workspace2 of tokens x top_k x max(gate/up width, hidden), in
    the model dtype, per GPU (the expert width is split over TP ranks)."""
    if not shape.num_experts or (shape.weights_quantization or "") in MONOLITHIC_MOE_QUANTIZATION:
        return 0
    if not any(p.experts for p in shape.layer_params):
        return 0  # expert fields in a config whose layers hold no experts (Nemotron-H's n_routed_experts)
    h = shape.hidden_size
    width = cdiv(shape.moe_intermediate_size, tp)
    gate_up = 2 * width if shape.gated_mlp else width
    act_out = width
    return tokens * shape.num_experts_per_tok * (max(act_out, h) + max(gate_up, h)) * DTYPE_BYTES[shape.serving_dtype]


MROPE_CACHE_POSITIONS = 4


# model classes whose rotary cache vLLM builds in fp32 (gpt_oss.py get_rope(dtype=torch.float32), 0.25.1-0.33.0)
FP32_ROPE_ARCHITECTURES = frozenset({"GptOssForCausalLM"})


def rotary_cache_bytes(shape: ModelShape) -> int:
    """vLLM's rotary cos/sin caches (get_rope): max_position × rotary_dim in the model dtype, one per RoPE
    the model builds (one per layer type where the config gives each its own: Gemma 3's local and global);
    linear scaling caches max_position × factor positions (linear_scaling_rope.py)."""
    positions = 0
    for kind, factor, original in shape.rope_scalings or (("default", None, None),):
        scale = factor if kind == "linear" and factor and factor > 1 else 1
        positions += int(shape.max_position_embeddings * scale)
        # longrope: a short cache of the pretraining length beside the long one (phi3_long_rope_scaled_rope.py)
        if kind == "longrope":
            positions += original or shape.original_max_position_embeddings or shape.max_position_embeddings
    if shape.mrope:  # MRotaryEmbedding enlarges the cache to 4 x max_position for video positions (mrope.py)
        positions *= MROPE_CACHE_POSITIONS
    return positions * shape.rotary_dim * (4 if FP32_ROPE_ARCHITECTURES.intersection(shape.architectures[:1])
                                           else DTYPE_BYTES[shape.serving_dtype])

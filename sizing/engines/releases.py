"""Engine releases as data: each release range's defaults and the terms its KV budget subtracts.

One file per release range under profiles/engines/, validated on load. `--engine vllm` means the
newest release of vLLM; `--engine vllm@0.19` (any version inside a range: `vllm@0.18.1`) picks the
range holding that version. Every figure carries its source in the file's `sources`.
"""

from __future__ import annotations

from dataclasses import dataclass

import json
import re
from fractions import Fraction
from functools import cache
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from ..errors import KvsizeError
from .sglang_fraction import prefill_graph_sizes, vlm_fraction
from .state_pool import StatePoolRule

ENGINES_DIR = Path(__file__).resolve().parents[2] / "profiles" / "engines"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BatchDefault(_Strict):
    """max_num_batched_tokens and max_num_seqs the engine picks on GPUs of at least min_gpu_bytes."""

    min_gpu_bytes: int = Field(ge=0)
    exclude_gpu_names: tuple[str, ...]
    max_num_batched_tokens: int = Field(gt=0)
    max_num_seqs: int = Field(gt=0)
    # the offline LLM() class's defaults (UsageContext.LLM_CLASS) where they differ from vllm serve's
    llm_max_num_batched_tokens: int | None = Field(default=None, gt=0)
    llm_max_num_seqs: int | None = Field(default=None, gt=0)

    def for_llm_class(self) -> BatchDefault:
        return self.model_copy(update={"max_num_batched_tokens": self.llm_max_num_batched_tokens
                                       or self.max_num_batched_tokens,
                                       "max_num_seqs": self.llm_max_num_seqs or self.max_num_seqs})


class ProfilingRunModel(_Strict):
    """What the engine's profiling run keeps alive at its peak (docs/formulas.md, 'Profiling peak')."""

    forward_hidden_copies: float = Field(ge=0)
    forward_mlp_copies: float = Field(ge=0)
    # copies of the attention's query width per GPU (heads / TP x head_dim): q and the attention's output
    forward_attention_copies: float = Field(default=0, ge=0)
    sampler_extra_bytes_per_logit: int = Field(ge=0)  # beyond the model-dtype logits
    sampler_upcast_bytes_per_logit: int = Field(ge=0)  # the fp32 copy, absent when the model runs in fp32
    # At TP > 1, model-dtype copies of the full logits at the sampler's peak (the all-gather's output and
    # the rows put back together) beside the rank's own shard (dtype / TP); None: as at TP 1
    tensor_parallel_logit_copies: float | None = Field(default=None, ge=0)
    # On one GPU (or a pipeline's last stage), model-dtype copies of the logits at the sampler's peak, the lm_head's
    # output among them; None: the model-dtype logits and sampler_extra_bytes_per_logit
    single_gpu_logit_copies: float | None = Field(default=None, ge=0)
    # model types whose profiling forward vLLM measured above this model, with the evidence (shown as a
    # warning: the term is uncertain there, and kvsize says so rather than lean either way)
    forward_above_model: tuple[tuple[str, str], ...] = ()  # (model_type, evidence)
    topk_buffer: bool  # Triton top-k/top-p keeps min(SMs, rows) x vocab fp32
    workspace_bytes: int = Field(ge=0)  # allocated by the first matmul of the run (cuBLAS workspace)
    # The fused-MoE workspace the Triton experts take from vLLM's workspace manager and keep
    # (modular_kernel.py _allocate_buffers; experts/triton_moe.py workspace_shapes)
    moe_workspace: bool = False
    # torch.compile's Inductor autotunes the first fused kernel (the embedding lookup with the first norm) at
    # compile time on fresh example copies of its arguments: the embedding shard and this many outputs of
    # tokens x hidden; 0 where the release's compile keeps none
    compile_example_outputs: int = Field(default=0, ge=0)
    # at TP > 1 the embedding lookup is the engine's own CUDA op (vLLM 0.33 vocab_parallel_embedding.py
    # use_fused_embedding), outside Inductor's kernels: the examples hold the outputs, not the shard
    tensor_parallel_embedding_op: bool = False

    @model_validator(mode="after")
    def _upcast_within_extra(self):
        # the fp32 copy an fp32 model does not need is one of the extra bytes; it cannot exceed them
        if self.sampler_upcast_bytes_per_logit > self.sampler_extra_bytes_per_logit:
            raise ValueError("sampler_upcast_bytes_per_logit must not exceed sampler_extra_bytes_per_logit")
        return self


class WeightAllocatorModel(_Strict):
    """How PyTorch's caching allocator counts the weights the engine loads: a tensor of 10 MiB or more gets a
    segment of its own rounded up to 2 MiB, and keeps the segment's end unless that is over 1 MiB and the
    tensor below max_split_size, which the engine may lower while it loads (docs/formulas.md, 'Weights')."""

    max_split_bytes: int | None = Field(default=None, ge=20 * 2**20)  # None: PyTorch's default (no limit)


class ZeroPointKernelRule(_Strict):
    """The GPUs and integer weights a kernel that keeps zero points in the activation dtype takes."""

    architectures: frozenset[str] = Field(min_length=1)
    bits: frozenset[int] = Field(min_length=1)
    group_sizes: frozenset[int] = Field(min_length=1)  # -1: one group per output channel
    # a symmetric checkpoint's packed zeros (GPTQ's qzeros) stay allocated beside the kernel's weights
    keeps_checkpoint_zeros: bool = False


class NonTorchModel(_Strict):
    single_gpu_bytes: int = Field(ge=0)
    # on one GPU under the V2 model runner, where it differs from the V1 runner's (None: the same)
    single_gpu_v2_bytes: int | None = Field(default=None, ge=0)
    # and beside it, per logit of the V2 sampler's profiling pass (max_num_seqs x vocab_size): what the
    # 0.27-0.33 starts print grows with the vocabulary (0: no such term)
    v2_bytes_per_sampled_logit: float = Field(default=0, ge=0, le=64)
    # and per element of the vocab x hidden embedding (0.27-0.30: about one model-dtype copy of it)
    v2_bytes_per_embedding_element: float = Field(default=0, ge=0, le=64)
    pipeline_bytes: int = Field(ge=0)
    tensor_parallel_bytes: int = Field(ge=0)
    tensor_parallel_per_rank_bytes: int = Field(ge=0)

    def single_gpu_v2(self, sampled_logits: int, embedding_elements: int) -> int:
        """The V2 runner's figure on one GPU, where single_gpu_v2_bytes is set: its base, the sampler's per-logit
        term and the embedding-sized part."""
        return self.single_gpu_v2_bytes + round(self.v2_bytes_per_sampled_logit * sampled_logits
                                                + self.v2_bytes_per_embedding_element * embedding_elements)

    @property
    def parallel_terms(self) -> tuple:
        """The terms that come with TP and PP only (releases sharing them are confirmed by each other's starts)."""
        return (self.pipeline_bytes, self.tensor_parallel_bytes, self.tensor_parallel_per_rank_bytes,
                self.v2_bytes_per_sampled_logit)


class CudaGraphModel(_Strict):
    single_gpu_bytes: int = Field(ge=0)
    tensor_parallel_bytes: int = Field(ge=0)


class ModelRunnerRule(_Strict):
    """Which of vLLM's two GPU model runners serves a model (vllm/config/vllm.py use_v2_model_runner).
    V2 (vllm/v1/worker/gpu/model_runner.py) profiles no CUDA-graph memory before sizing the KV cache
    (profile_cudagraph_memory returns 0) and runs its own profiling pass."""

    v2_architectures: frozenset[str]  # these architectures take V2 (where the rest of the rule allows)
    v2_dense_models: bool  # every non-MoE architecture takes V2 too (0.26+)
    v2_quantized: bool  # a checkpoint with a quantization_config may take V2
    v2_hybrid: bool  # a model with recurrent (Mamba, linear-attention) layers may take V2
    v2_moe_models: bool = False  # every MoE architecture takes V2 too (0.33)
    # a listed architecture takes V2 even as an MoE (0.24+); before, only a dense one did (0.22-0.23)
    v2_listed_moe: bool = True
    v2_profiles_cuda_graphs: bool = False  # V2 estimates its graphs before sizing (0.33), or not (0.22-0.26)

    def runner(self, architectures: tuple[str, ...], moe: bool, quantized: bool, hybrid: bool) -> str:
        listed = any(a in self.v2_architectures for a in architectures) and (self.v2_listed_moe or not moe)
        if (hybrid and not self.v2_hybrid) or (quantized and not self.v2_quantized):
            return "v1"
        return "v2" if listed or (self.v2_moe_models if moe else self.v2_dense_models) else "v1"


class SubRange(_Strict):
    """Releases inside a range file whose starts show one term changed: they keep the range's terms and
    replace the fields they name. A sub-range is drawn where a start shows the change, and names the
    source that explains it."""

    release: str = Field(min_length=1)
    first_version: str = Field(pattern=r"^\d+(\.\d+){0,3}$")
    last_version: str = Field(pattern=r"^\d+(\.\d+){0,3}$")
    label: str = Field(min_length=1)
    model_runners: ModelRunnerRule | None = None
    non_torch: NonTorchModel | None = None
    # the V2 sampler's logit copies at TP >= 2 where the sub-range's starts show another figure than the range's
    tensor_parallel_logit_copies: float | None = Field(default=None, ge=0)
    recurrent_state_pool: StatePoolRule | None = None
    prefill_graphs: PrefillGraphRule | None = None
    sources: dict[str, str] = Field(min_length=1)


class CudaGraphEstimateModel(_Strict):
    """vLLM's "Estimated CUDA graph memory" (gpu_model_runner.py profile_cudagraph_memory): it captures
    the two largest sizes of each mode, takes the largest first capture whole and extrapolates each
    mode's second capture to its other sizes. In config quantities (docs/formulas.md, 'CUDA graphs'):
    the first PIECEWISE capture holds `activation_copies` copies of the largest size's MLP gate/up output
    plus `first_capture_bytes`; the first FULL capture holds the attention kernel's split-KV fp32
    accumulators (`attention_splits` splits x batch x heads per rank x value width; MLA's latent width
    with `mla_attention_splits`) plus `full_first_capture_bytes`; each further graph holds driver memory
    per layer that splits the graph (attention, Mamba; MLA layers `per_graph_mla_layer_bytes`)."""

    # Model Runner V2's own estimate (0.29+, v1/worker/gpu/cudagraph_utils.py profile_cudagraph_memory) runs
    # above the V1 runner's by this much per layer of the model, on every pipeline stage (0: the same)
    v2_per_layer_bytes: int = Field(default=0, ge=0)
    max_capture_size: int = Field(gt=0)  # the largest size before max_num_seqs and batched tokens cap it
    capture_sizes_per_seq: int = Field(gt=0)  # the largest size is at most this x max_num_seqs
    max_capture_size_by_model_type: dict[str, int] = Field(default_factory=dict)  # model files that raise it
    first_capture_bytes: int = Field(ge=0)
    activation_copies: float = Field(ge=0)
    full_first_capture_bytes: int = Field(ge=0)
    attention_splits: int = Field(ge=0)
    mla_attention_splits: int = Field(ge=0)
    # model types whose decode attention runs unsplit in a FULL graph (gpt-oss's attention sinks), so its
    # first FULL capture holds no accumulators
    unsplit_model_types: frozenset[str] = frozenset()
    # KV formats whose decode attention runs in a backend that keeps its split-KV scratch outside the graphs (vLLM's
    # TRITON_ATTN allocates it when its metadata builder is made): their first FULL capture holds no accumulators
    unsplit_kv_formats: frozenset[str] = frozenset()
    # KV formats whose MLA decode runs FlashMLA's dense kernel on Hopper, because FLASH_ATTN_MLA (first on sm90) takes
    # 16-bit caches only: its fp32 accumulators hold batch + SM parts rows, not splits x batch (flashmla_decode)
    flashmla_kv_formats: frozenset[str] = frozenset()
    # Model Runner V2's surplus per layer where the decode attention is unsplit (a model type or KV format above);
    # None: the same as v2_per_layer_bytes
    unsplit_v2_per_layer_bytes: int | None = Field(default=None, ge=0)
    # layer kinds whose attention backend captures no FULL graph (AttentionCGSupport.NEVER): a model with
    # one runs FULL modes piecewise (vllm/config/compilation.py)
    piecewise_only_layer_kinds: frozenset[str] = frozenset()
    # what each further FULL graph holds; the per-layer figures below are the mean over both modes' further
    # graphs (vLLM captures as many of each), so a PIECEWISE graph holds twice that less this (0: the same)
    full_per_graph_bytes: int = Field(default=0, ge=0)
    # V2's estimate where the decode runs FLASH_ATTN_MLA (cudagraphs.py v2_flash_attn_mla_estimate): the split
    # accumulators of its two largest FULL batches at this many splits (attention.py
    # flash_attn_max_num_splits_for_cuda_graph), a fitted PIECEWISE phase, and a floor per further FULL graph
    # (cudagraph_utils.py _MIN_PER_GRAPH_BYTES). 0: not modelled
    v2_warmup_splits: int = Field(default=0, ge=0)
    v2_mla_piecewise_base_bytes: int = Field(default=0, ge=0)
    v2_mla_piecewise_graph_layer_bytes: int = Field(default=0, ge=0)
    v2_full_graph_floor_bytes: int = Field(default=0, ge=0)
    # evidence that vLLM measures more per graph with an fp8 KV cache than this model holds (None: none seen)
    fp8_kv_above_model: str | None = None
    per_graph_layer_bytes: int = Field(ge=0)
    per_graph_mla_layer_bytes: int = Field(ge=0)


class BoundaryLayers(_Strict):
    """Formats whose first and last `layers` attention layers the engine keeps in the model dtype."""

    formats: frozenset[str] = Field(min_length=1)
    layers: int = Field(gt=0)


class GpuBucket(_Strict):
    """SGLang's settings for GPUs below `below_mib` of nvidia-smi memory (None: every larger GPU)."""

    below_mib: int | None = Field(default=None, gt=0)
    chunked_prefill_size: int = Field(gt=0)
    cuda_graph_max_bs: int = Field(gt=0)  # below TP 4
    cuda_graph_max_bs_tp4: int = Field(gt=0)  # TP 4 and more
    reserve_mib: float = Field(default=0, ge=0)  # flat reserve of this bucket (SGLang 0.4.8-0.5.2)
    reserve_mib_per_rank: float = Field(default=0, ge=0)  # times TP x PP


@dataclass(frozen=True)
class FractionInputs:
    """What SGLang's default mem_fraction_static reads beside the GPU and parallel sizes (server_args.py
    _handle_gpu_memory_settings): the model's attention (MLA or not), the context length (which caps the
    piecewise prefill graphs' sizes), the settings that replace the GPU bucket's, and whether CUDA graphs
    run at all."""

    mla: bool = False
    context_length: int | None = None
    chunked_prefill_size: int | None = None  # <= 0: chunked prefill off (the max prefill tokens count)
    cuda_graph_max_bs: int | None = None
    cuda_graphs: bool = True
    max_prefill_tokens: int = 16384  # server_args.py default, used where chunked prefill is off
    prefill_graphs: bool = True  # the release keeps the model's prefill graphs on (PrefillGraphRule)
    prefill_graphs_capped_by_context: bool = True  # their sizes stop at the context length
    vision_tower: tuple[int, int] | None = None  # a multimodal model served as one: its ViT's (layers, hidden size)


class FractionByParallelSize(_Strict):
    """mem_fraction_static from a table by TP x PP, raised on GPUs above large_gpu_above_mib."""

    kind: Literal["by_parallel_size"]
    table_max_gpu_mib: int = Field(gt=0)  # the table applies up to this nvidia-smi total
    fractions: tuple[tuple[int, float], ...] = Field(min_length=1)  # (least TP x PP, fraction), largest first
    otherwise: float = Field(gt=0, le=1)
    large_gpu_above_mib: int = Field(gt=0)
    large_gpu_bump_mib: int = Field(ge=0)
    large_gpu_reserve_mib: int = Field(ge=0)

    def fraction(self, gpu_mib: int, tp: int, pp: int, inputs: FractionInputs | None = None) -> float:
        parallel = tp * pp
        f = self.otherwise
        if gpu_mib <= self.table_max_gpu_mib:
            f = next((v for least, v in self.fractions if parallel >= least), self.otherwise)
        if gpu_mib > self.large_gpu_above_mib:
            f = min(f + self.large_gpu_bump_mib * (1 - f) / gpu_mib,
                    (gpu_mib - self.large_gpu_reserve_mib) / gpu_mib)
        return f


class FractionByReserve(_Strict):
    """mem_fraction_static = round((gpu − reserve) / gpu, 3) with gpu the nvidia-smi total in MiB and
    reserve (MiB) = bucket reserve + base + per token × max(chunked prefill, min) + per graph batch ×
    cuda_graph_max_bs + per rank × TP × PP + per prefill graph × captured prefill sizes, at least
    floor_mib on GPUs above floor_above_gpu_mib."""

    kind: Literal["reserve"]
    buckets: tuple[GpuBucket, ...] = Field(min_length=1)
    base_mib: float = Field(ge=0)
    mib_per_prefill_token: float = Field(ge=0)
    min_prefill_tokens: int = Field(ge=0)
    mib_per_graph_batch: float = Field(ge=0)
    mib_per_rank: float = Field(ge=0)
    mib_per_prefill_graph: float = Field(ge=0)  # piecewise prefill CUDA graphs, one per captured size
    mla_prefill_graphs_mib: float | None = Field(default=None, ge=0)  # MLA models: instead of the per-graph term
    floor_mib: float = Field(ge=0)
    floor_above_gpu_mib: int = Field(ge=0)
    # a multimodal model: the fraction times this base and a factor from its ViT's size against ViT-L/14's
    # (vlm_fraction); None where the release's rule is not known to lower it
    vlm_base_factor: float | None = Field(default=None, gt=0, le=1)

    def bucket(self, gpu_mib: int) -> GpuBucket:
        return next((b for b in self.buckets if b.below_mib is None or gpu_mib < b.below_mib), self.buckets[-1])

    def fraction(self, gpu_mib: int, tp: int, pp: int, inputs: FractionInputs | None = None) -> float:
        b = self.bucket(gpu_mib)
        given = inputs or FractionInputs()
        parallel = tp * pp
        graph_bs = given.cuda_graph_max_bs or (b.cuda_graph_max_bs_tp4 if tp >= 4 else b.cuda_graph_max_bs)
        chunked = given.chunked_prefill_size if given.chunked_prefill_size is not None else b.chunked_prefill_size
        prefill = chunked if chunked > 0 else given.max_prefill_tokens
        reserve = (b.reserve_mib + b.reserve_mib_per_rank * parallel + self.base_mib
                   + self.mib_per_prefill_token * max(prefill, self.min_prefill_tokens)
                   + self.mib_per_graph_batch * graph_bs + self.mib_per_rank * parallel)
        if given.cuda_graphs and given.prefill_graphs:
            # prefill graphs up to the chunk (capped by the context length where the release does); MLA a flat
            # reserve
            if given.mla and self.mla_prefill_graphs_mib is not None:
                reserve += self.mla_prefill_graphs_mib
            else:
                capped = given.context_length and given.prefill_graphs_capped_by_context
                largest = min(prefill, given.context_length) if capped else prefill
                reserve += self.mib_per_prefill_graph * len(prefill_graph_sizes(largest))
        if gpu_mib > self.floor_above_gpu_mib:
            reserve = max(reserve, self.floor_mib)
        fraction = round((gpu_mib - reserve) / gpu_mib, 3)
        if given.vision_tower and self.vlm_base_factor is not None:
            fraction *= vlm_fraction(self.vlm_base_factor, *given.vision_tower)
        return fraction


class PrefillGraphRule(_Strict):
    """Which models a release turns its prefill CUDA graphs off for before it picks its default memory fraction,
    so that the fraction reserves nothing for them (SGLang's checks of the breakable prefill graph against the
    model, run in server_args before _handle_gpu_memory_settings), and whether the graphs' sizes stop at the
    context length."""

    # MLA models: "all" of them, those "without_indexer" (0.5.17 spares DeepSeek's sparse-attention models,
    # told by their indexer), or "never"
    off_for_mla: Literal["never", "all", "without_indexer"] = "never"
    off_for_architectures: frozenset[str] = frozenset()  # config.json architectures the release names
    sizes_capped_by_context: bool = True

    def captures(self, shape) -> bool:
        """Whether a model's prefill graphs stay on, and so are reserved for."""
        if shape.is_mla and (self.off_for_mla == "all"
                             or (self.off_for_mla == "without_indexer" and not shape.index_head_dim)):
            return False
        return not self.off_for_architectures.intersection(shape.architectures)


class DefaultContextRule(_Strict):
    """How vLLM derives max_model_len when none is given (vllm/config/model.py, _get_and_verify_max_len)."""

    # LongRoPE models default to original_max_position_embeddings (Phi-3-mini-128k: 4,096).
    longrope_uses_original: bool
    # RoPE scaling types whose factor does not multiply the derived length.
    factor_exempt_rope_types: frozenset[str]
    # YaRN's derived length is original_max_position_embeddings × factor (0.21-0.26), not max_position_embeddings.
    yarn_length_from_original: bool = False
    # model_types (by substring) whose max_position_embeddings already includes the scaling (Gemma 3).
    factor_skipped_model_types: frozenset[str] = frozenset()


class Release(_Strict):
    """One release range, as its data file holds it. Engines without a profiling run of their own
    (SGLang, TensorRT-LLM, ...) leave the vLLM-only fields out; the activation and CUDA graphs shown
    beside their budget then come from the newest vLLM release's model."""

    engine: Literal["vllm", "sglang", "trtllm", "lmdeploy", "llamacpp"]
    release: str = Field(min_length=1)
    first_version: str = Field(pattern=r"^\d+(\.\d+){0,3}$")  # llama.cpp numbers builds: b6000 -> 6000
    last_version: str = Field(pattern=r"^\d+(\.\d+){0,3}$")
    label: str = Field(min_length=1)
    memory_fraction_default: float = Field(ge=0, le=1)
    memory_fraction_rule: FractionByParallelSize | FractionByReserve | None = Field(default=None, discriminator="kind")
    block_size_default: int = Field(gt=0)
    batch_defaults: tuple[BatchDefault, ...] | None = Field(default=None, min_length=1)
    profile_tokens: Literal["max_num_batched_tokens", "v0_unchunked"] | None = None
    requested_memory: Literal["ceil", "floor"] = "floor"
    subtracts: frozenset[Literal["weights", "activation", "non_torch", "cuda_graphs"]]
    activation: ProfilingRunModel | None = None
    model_runners: ModelRunnerRule | None = None  # None: every model runs on the V1 runner
    activation_v2: ProfilingRunModel | None = None  # the V2 runner's profiling run
    non_torch: NonTorchModel | None = None  # None: the newest vLLM release's measured figures
    # At PP > 1 under the V2 runner the last stage, the only one that builds the sampler and its per-request penalty
    # state (v1/worker/gpu/model_runner.py load_model: is_last_pp_rank), leaves the one-GPU non-torch figure and the
    # earlier stages none, in place of pipeline_bytes (False: pipeline_bytes on every stage)
    v2_non_torch_on_last_stage: bool = False
    # the allocator's count of the loaded weights; None: the weights are their tensors' bytes
    weight_allocator: WeightAllocatorModel | None = None
    # where the dense linear kernel for asymmetric integer weights keeps each zero point in the activation
    # dtype, pre-multiplied by its scale (Machete on sm90), not packed as stored; None: nowhere
    activation_dtype_zero_points: ZeroPointKernelRule | None = None
    # the routed experts' integer kernel leaves a symmetric checkpoint's packed zeros allocated
    moe_keeps_checkpoint_zeros: bool = False
    # the engine keeps a contiguous copy of each MLA layer's kv_b_proj, split into the absorbed key and value
    # up-projections, beside the checkpoint's tensor (SGLang's w_kc and w_vc)
    mla_absorbed_weight_copies: bool = False
    cuda_graphs: CudaGraphModel | None = None
    cuda_graph_estimate: CudaGraphEstimateModel | None = None  # None: the fixed cuda_graphs figures
    # How vLLM's "GPU KV cache size: N tokens" line is computed: num_blocks // groups x block size
    # (0.8-0.20), or int(max concurrency x max_model_len) (0.21 and later).
    kv_cache_size_tokens: Literal["blocks_per_group", "concurrency"] | None = None
    # Batches in flight beyond the pipeline stages: sliding-window and chunked-local layers keep the
    # blocks of (PP + this) x max_num_batched_tokens tokens per request (async scheduling, 0.26+).
    in_flight_extra_batches: int = Field(default=0, ge=0)
    # State pages a request holds per Mamba group in the block pool: 1 (+ speculative tokens) where
    # prefix caching is off for hybrid models (mamba_cache_mode "none", 0.21-0.26), 3 in "align" mode.
    mamba_pages_per_request: int = Field(default=3, gt=0)
    # A fixed pool of recurrent-state slots beside the KV pool, sized by a ratio of the cache budget
    # (SGLang's MambaPool); None: the state is kept per running request (or in the block pool: vLLM)
    recurrent_state_pool: StatePoolRule | None = None
    # Which models' prefill CUDA graphs the default memory fraction leaves out (SGLang; None: every model's
    # counted, their sizes capped by the context length)
    prefill_graphs: PrefillGraphRule | None = None
    # A global sliding_window with no layer_types (Mistral-7B-v0.1) windows every layer (0.21-0.26:
    # CacheConfig.sliding_window reaches each Attention) rather than none (0.33).
    global_window_every_layer: bool = False
    # KV formats a real start of this release failed to run, with what failed (format -> evidence)
    kv_formats_failed: dict[str, str] = Field(default_factory=dict)
    # model_types vLLM builds with an MLA cache; a config with kv_lora_rank whose model_type is not
    # listed is built with per-head K and V (None: not known for this release).
    mla_model_types: frozenset[str] | None = None
    # model_types whose vLLM attention is built without the cache config: the cache stays in the
    # model dtype whatever --kv-cache-dtype says.
    kv_dtype_ignored_model_types: frozenset[str] = frozenset()
    # vllm serve keeps the first and last N layers of dense (non-hybrid) models in the model dtype
    # under these formats (TurboQuant's boundary protection).
    boundary_layers_in_model_dtype: BoundaryLayers | None = None
    # None: the model's max_position_embeddings (releases whose rule is not confirmed from source).
    default_context: DefaultContextRule | None = None
    # The block size an attention family's backend needs when no --block-size is given (its only kernel
    # block size): "sparse_mla" (DeepSeek sparse attention's MLA with an indexer), "compressed_mla"
    # (DeepSeek-V4). A family not listed gets block_size_default; a release without "compressed_mla"
    # is not modelled for DeepSeek-V4.
    attention_block_sizes: dict[Literal["sparse_mla", "compressed_mla"], int] = Field(default_factory=dict)
    # What no real start of this range confirms, said with every estimate that follows it (the costly
    # direction is a plan that promises memory the engine does not give)
    unconfirmed: str = ""
    # releases inside this range whose starts show a term changed (their own rules, the rest kept)
    sub_ranges: tuple[SubRange, ...] = ()
    sources: dict[str, str]

    def __hash__(self) -> int:  # estimates cache on the engine; one file per (engine, release)
        return hash((self.engine, self.release))

    @property
    def name(self) -> str:
        return f"{self.engine}@{self.release}"

    def covers(self, version: str) -> bool:
        """Bounds hold every release they name: 0.19.1 is in 0.17-0.20, 0.4.7.post1 in 0.4.0-0.4.7."""
        v, lo, hi = version_key(version), version_key(self.first_version), version_key(self.last_version)
        v = v + (0,) * max(0, len(lo) - len(v))
        return lo <= v[:len(lo)] and v[:len(hi)] <= hi

    def default_fraction(self, gpu_mib: int, tp: int, pp: int, inputs: FractionInputs | None = None) -> float:
        """The memory fraction the engine picks when the user sets none."""
        if self.memory_fraction_rule is None:
            return self.memory_fraction_default
        return self.memory_fraction_rule.fraction(gpu_mib, tp, pp, inputs)

    def batch_default(self, gpu_bytes: int, gpu_name: str) -> BatchDefault | None:
        if self.batch_defaults is None:
            return None
        name = gpu_name.lower()
        for row in self.batch_defaults:
            if gpu_bytes >= row.min_gpu_bytes and not any(x in name for x in row.exclude_gpu_names):
                return row
        return self.batch_defaults[-1]

    def non_torch_bytes(self, tp: int, pp: int, runner: str = "v1", sampled_logits: int = 0,
                        embedding_elements: int = 0, last_stage: bool = True) -> int:
        """`sampled_logits`: max_num_seqs x vocab_size, the logits of the sampler's profiling pass;
        `embedding_elements`: vocab_size x hidden_size; `last_stage`: the pipeline stage is the last (it
        builds the sampler)."""
        if self.non_torch is None:
            return find_release("vllm", None).non_torch_bytes(tp, pp, runner, sampled_logits, embedding_elements,
                                                              last_stage)
        n = self.non_torch
        if tp > 1:
            # the sampler's state spans the whole vocabulary on every rank of the last pipeline stage (the only
            # one that builds a sampler); the embedding-sized part follows the vocab-parallel embedding, one shard
            # a rank (0.29.0's TP 4 start leaves what one-GPU starts fit / 4)
            per_logit = n.v2_bytes_per_sampled_logit if last_stage else 0
            sampler = round(per_logit * sampled_logits
                            + n.v2_bytes_per_embedding_element * embedding_elements / tp) if runner == "v2" else 0
            return n.tensor_parallel_bytes + tp * n.tensor_parallel_per_rank_bytes + sampler
        single_v2 = runner == "v2" and n.single_gpu_v2_bytes is not None
        if pp > 1:
            if single_v2 and self.v2_non_torch_on_last_stage:
                return n.single_gpu_v2(sampled_logits, embedding_elements) if last_stage else 0
            return n.pipeline_bytes
        return n.single_gpu_v2(sampled_logits, embedding_elements) if single_v2 else n.single_gpu_bytes

    def cuda_graph_bytes(self, tp: int) -> int:
        if self.cuda_graphs is None:
            return find_release("vllm", None).cuda_graph_bytes(tp)
        return self.cuda_graphs.tensor_parallel_bytes if tp > 1 else self.cuda_graphs.single_gpu_bytes

    def in_flight_batches(self, pp: int) -> int:
        return pp + self.in_flight_extra_batches

    def requested(self, total_bytes: int, fraction: float) -> int:
        """total x fraction as the engine rounds it."""
        exact = Fraction(total_bytes) * Fraction(str(fraction))
        return -(-exact.numerator // exact.denominator) if self.requested_memory == "ceil" else int(exact)


def penalty_state_bytes(max_num_seqs: int, vocab_size: int) -> int:
    """The V2 sampler's penalty state (vllm/v1/worker/gpu/sample/penalties.py PenaltiesState.__init__, 0.27.0-0.33.0):
    output_bin_counts int32 [max_num_reqs, vocab] and prompt_bin_mask int32 [max_num_reqs, cdiv(vocab, 32)],
    max_num_reqs being max_num_seqs: about 4.125 B per (sequence x vocabulary entry)."""
    return max_num_seqs * (vocab_size + -(-vocab_size // 32)) * 4


def version_key(text: str) -> tuple[int, ...]:
    """The numeric release (0.4.7.post1 -> (0, 4, 7); 0.19.0+cu128 -> (0, 19, 0); llama.cpp b6000 -> (6000,))."""
    text = str(text).strip()
    m = re.fullmatch(r"[vb]?(\d{1,9}(?:\.\d{1,9}){0,3})(?:[.+-]?(?:post|rc|dev|a|b)\d{0,9})*(?:\+[\w.]{1,64})?",
                     text[:200])
    if m is None or len(text) > 200:
        raise KvsizeError(f"engine version {text[:40]!r} must look like 0.19 or 0.19.1 (post, rc and +local tags "
                          "allowed; at most 9 digits a part)")
    return tuple(int(p) for p in m.group(1).split("."))


@cache
def releases(engine: str) -> tuple[Release, ...]:
    """Every release range of one engine, oldest first."""
    out = []
    for path in sorted(ENGINES_DIR.glob(f"{engine}-*.json")):
        try:
            release = Release.model_validate(json.loads(path.read_text(encoding="utf-8")))
        except (ValidationError, json.JSONDecodeError) as e:
            first = " ".join(str(e).splitlines()[0:3])
            raise KvsizeError(f"engine profile {path.name} is invalid: {first}") from None
        out.extend(_split(release, path.name))
    return tuple(sorted(out, key=lambda r: version_key(r.first_version)))


def _split(release: Release, file_name: str) -> list[Release]:
    """A range file as the releases it holds: each sub-range its own release (the range's terms with the
    sub-range's fields), which must tile the range in order, leaving no version to two rules or none."""
    if not release.sub_ranges:
        return [release]
    parts, expected = [], release.first_version
    for sub in release.sub_ranges:
        if version_key(sub.first_version) != version_key(expected) and parts:
            raise KvsizeError(f"engine profile {file_name}: sub-range {sub.release} starts at {sub.first_version}, "
                              f"not right after the previous one")
        update = {k: getattr(sub, k) for k in ("release", "first_version", "last_version", "label")}
        if sub.model_runners is not None:
            update["model_runners"] = sub.model_runners
        if sub.non_torch is not None:
            update["non_torch"] = sub.non_torch
        for field in ("recurrent_state_pool", "prefill_graphs"):
            if getattr(sub, field) is not None:
                update[field] = getattr(sub, field)
        if sub.tensor_parallel_logit_copies is not None:
            if release.activation_v2 is None:
                raise KvsizeError(f"engine profile {file_name}: sub-range {sub.release} sets "
                                  f"tensor_parallel_logit_copies, but the range has no activation_v2 to hold it")
            # a sub-range with its own TP figure samples otherwise: the range's one-GPU copies are not its own
            update["activation_v2"] = release.activation_v2.model_copy(
                update={"tensor_parallel_logit_copies": sub.tensor_parallel_logit_copies,
                        "single_gpu_logit_copies": None})
        update["sources"] = {**release.sources, **sub.sources}
        update["sub_ranges"] = ()
        parts.append(release.model_copy(update=update))
        last = version_key(sub.last_version)
        expected = ".".join(map(str, (*last[:-1], last[-1] + 1)))
    if (version_key(release.sub_ranges[0].first_version) != version_key(release.first_version)
            or version_key(release.sub_ranges[-1].last_version) != version_key(release.last_version)):
        raise KvsizeError(f"engine profile {file_name}: its sub-ranges must cover {release.first_version}-"
                          f"{release.last_version} exactly")
    return parts


def find_release(engine: str, version: str | None) -> Release | None:
    """The release range of `engine` holding `version` (None: the newest); None when the engine has no files."""
    known = releases(engine)
    if not known:
        return None
    if version is None:
        return known[-1]
    version_key(version)
    for r in reversed(known):
        if r.covers(version):
            return r
    ranges = ", ".join(f"{r.first_version}-{r.last_version}" for r in known)
    raise KvsizeError(f"--engine {engine}@{version}: no rules for that version; kvsize knows {engine} {ranges}")

"""One serving engine step's time (docs/formulas.md, 'Serving simulation'), what sizing/planners/serving.py's
simulation steps through.

A step is its GEMMs (the larger of reading the weights and computing with them), its attention kernels, and a fixed
cost per layer (and per layer's all-reduce where TP > 1), never less than the engine's fixed floor per step:

    GPU  = max(weights read / (HBM bandwidth × engine weights efficiency),
               2 × ((active − routed) params × step tokens + lm_head × requests) / FLOP/s
               + 2 × routed params × step tokens × tile_k / FLOP/s)   (tile_k: the experts' K loops, below)
                                           (the GEMMs: reads overlap compute; logits only at each request's last token)
           + Σ KV read of the decoding requests / (HBM bandwidth × efficiency) × the kernel's waves
           + causal attention FLOPs of the prompt chunks / (FLOP/s × the format's prefill attention share)
           + layers × (per-layer step overhead + TP all-reduce per layer if TP > 1)
           + MoE layers × (per-MoE-layer step overhead + routing kernels × its share a kernel)
                                                         (the fused-expert kernels' own cost; moe_routing.py)
           + MLA layers × per-MLA-layer step overhead        (the latent's projections around the attention kernel)
           + requests in the step × per-request step overhead               (beside their KV read)
    host = step floor + decoding requests × core                            (the engine core's side of the step)
    API  = decoding requests × API / API servers                            (the tokens the API servers stream)
    launch = layers × launch per layer     (eager past the largest CUDA graph; the pieces' under it, with prompts)
             + MoE layers × eager MoE launch                  (past the graph: the fused-expert path's own launches)
             + MLA layers × MLA launch, eager or under the graph     (the latent's up-projection inside attention)
    step = max(GPU, host, API, launch)                                      (FLOP/s = dense bf16 × MFU × TP)

The host's side of a step is the engine core's: a fixed floor (scheduling, sampling, sending the tokens) and its
work on each decoding request's output, one after the other in its one process; the engine overlaps it with the
GPU's, so it shows only where the GPU's part is shorter (a small model), and there it grows with the streams. A step
of more tokens than the largest CUDA graph the engine captured (graph_steps.py's estimate) runs without one: the host
launches its kernels layer by layer, a MoE layer's fused-expert path (router, top-k, alignment, grouped GEMMs, combine)
beyond a dense layer's. The engine core launches a step while the GPU runs the one before (async scheduling), so the
launch is a bound beside the GPU's part, not a cost added to it: the traces show it as the period before a prompt
chunk (measure/steps.py launch_rows). A step with a prompt chunk under the graph replays the graph's pieces and
launches each layer's attention between them, a bound of the same kind at a cost of its own a layer. An MLA layer's
attention launches more, eager or between the pieces: its prompt path up-projects the cached latent (kv_b_proj), splits
it into keys and values and pads the values to the keys' head size around FlashAttention's kernel. The fused-MoE
GEMMs pay each tile a fixed cost worth `k0` elements of its K loop: tile_k = (2 (1 + k0 / hidden) + (1 + k0 /
expert intermediate per rank)) / 3 (gate and up reduce over the hidden size, down over the expert's, a third).
The API servers, processes of their own that stream each decoding request's token beside the engine's step,
hand each request to the engine (sizing/planners/front_end.py). A KV format the engine decodes in programs that each
read one request's whole cache for one KV head (vLLM's TRITON_ATTN, the only backend of its per-token-head integer
formats) reads in waves of as many programs as the GPU runs at once, the last wave as long as a full one; with few
requests decoding the engine splits each request's cache into segments instead, read at a share of its own and in
rounds of as many segment programs as an SM holds. No program reads faster than its pace alone, nor than the SM's
rate shared among the programs the SM holds (for whole caches, as many as the launched grid, its empty query blocks
included, puts there). Every term is fitted on the points profiles/serving.json names
(scripts/fit_serving_terms.py).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cache, cached_property, lru_cache
from pathlib import Path
from types import MappingProxyType

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ..cache.layers import CacheLayout, kv_heads_per_rank
from ..config import ModelShape
from ..efficiency import DecodeEfficiency
from ..engines.memory import WeightFormat
from ..profiles import validated_profile
from .graph_steps import UNLIMITED, GraphedSteps
from .speed import decode_step, gemm_flops, prefill_attention_flops, routed_expert_params

SERVING_PROFILE = Path(__file__).resolve().parents[2] / "profiles" / "serving.json"


class QueryGroupWaves(BaseModel):
    """A whole-request kernel as compiled for one count of query heads a KV head: the programs each SM runs at once
    in the waves its read's bytes take and the share of HBM bandwidth a full wave of them reads at, and where its
    build holds another count of programs an SM than the format's, that count and the SM's rate across them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    programs_per_sm: int = Field(ge=1, le=64)
    kv_efficiency: float = Field(gt=0, le=1)
    # the whole-cache programs one SM holds at once, sharing its rate, and that rate across them, where this build's
    # differ from the format's (ProgramPace); None: the format's
    whole_programs_per_sm: int | None = Field(default=None, ge=1, le=64)
    whole_sm: float | None = Field(default=None, gt=0, le=1e10)

    @model_validator(mode="after")
    def _sm_pair_together(self):
        if (self.whole_programs_per_sm is None) != (self.whole_sm is None):
            raise ValueError("whole_programs_per_sm and whole_sm: both or neither")
        return self


class ProgramPace(BaseModel):
    """The cached tokens one program of a format's kernel reads a second: a program of a request's whole cache for one
    KV head (the 2D grid) and one of a segment of it (the 3D grid, whose partial results a second kernel reduces);
    and the segment programs one SM holds at once, with the cached tokens an SM reads a second across them (the
    segments of many requests run in rounds of that many programs an SM, each program slower than alone once the
    SM's own rate is shared), and the whole-cache programs one SM holds at once with the SM's rate across them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    whole: float = Field(gt=0, le=1e9)
    split: float = Field(gt=0, le=1e9)
    # seconds a split read costs each KV layer beside its programs' tokens, once a step however many rounds they run
    # in (None: none fitted); a one-request step at two lengths tells it from the pace
    split_layer_s: float | None = Field(default=None, ge=0, le=1e-3)
    # None: not fitted (no ramp of steps has shown them), a program's pace alone bounds its read
    split_programs_per_sm: int | None = Field(default=None, ge=1, le=64)
    split_sm: float | None = Field(default=None, gt=0, le=1e10)
    # the whole-cache programs one SM holds at once, sharing its rate, and that rate across them: the launched grid
    # puts up to this many on an SM whatever the waves its read's bytes take (QueryGroupWaves)
    whole_programs_per_sm: int | None = Field(default=None, ge=1, le=64)
    whole_sm: float | None = Field(default=None, gt=0, le=1e10)

    @model_validator(mode="after")
    def _sm_terms_together(self):
        for grid in ("split", "whole"):
            if (getattr(self, f"{grid}_programs_per_sm") is None) != (getattr(self, f"{grid}_sm") is None):
                raise ValueError(f"{grid}_programs_per_sm and {grid}_sm: both or neither")
        return self


class StepOverhead(BaseModel):
    """The fixed cost of one engine step per layer, with the points it was fitted on."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    per_layer_step_overhead_s: float = Field(ge=0, le=0.01)
    prefill_mfu: float = Field(gt=0, le=1)  # of the GPU's dense bf16 FLOP/s, reached by chunked prefill
    # the share of HBM bandwidth the engine's own decode attention reads each KV format at, where its servers were
    # measured (it replaces the efficiency of kvsize's kernels, which read fp8 faster than the engine does)
    engine_kv_efficiency: dict[str, float] = Field(default_factory=dict)
    # per KV format whose prompt attention the engine runs in another kernel than bf16's (vLLM runs the per-token-head
    # integer formats under TRITON_ATTN only, dequantizing the cached chunks), the share of the prefill FLOP rate it
    # reaches with its programs' query rows full (query_tile_fill scales it); a format not named: the prefill MFU
    engine_prefill_attention_share: dict[str, float] = Field(default_factory=dict)
    # a format no server ran that the engine decodes and prefills in the same kernel as a measured one: it takes that
    # format's shares (vLLM runs fp8_per_token_head through the same TRITON_ATTN path as int8_per_token_head, one byte
    # an element and a scale per token and head), and a design says it was carried
    engine_kernel_twins: dict[str, str] = Field(default_factory=dict)
    # per KV format the engine decodes in programs of one request's whole cache for one KV head (vLLM's TRITON_ATTN
    # 2D grid, triton_unified_attention.py), how many of them each SM runs at once: a step's programs run in waves
    # and its last wave takes a full one's time; engine_kv_efficiency is the share a full wave reads at
    engine_programs_per_sm: dict[str, int] = Field(default_factory=dict)
    # per such format, the share of HBM bandwidth its read reaches where the engine splits each request's cache into
    # segments instead (TRITON_ATTN's 3D grid: a decode-only step of few requests, SPLIT_KV_GRID below)
    engine_split_kv_efficiency: dict[str, float] = Field(default_factory=dict)
    # per such format, the counts of query heads a KV head whose kernel runs other waves: vLLM's unified attention is
    # a Triton kernel compiled for each num_queries_per_kv (a constexpr), and a compiled kernel's registers set how
    # many programs an SM holds. A count named here takes its own programs an SM and full-wave share; any other count
    # takes the format's (engine_programs_per_sm, engine_kv_efficiency)
    engine_query_group_waves: dict[str, dict[int, QueryGroupWaves]] = Field(default_factory=dict)
    # per such format, the counts of query heads a KV head whose servers' traces fitted its waves (the format's own
    # and engine_query_group_waves'): a model of another count takes the format's own waves, carried, and says so
    engine_waves_query_groups: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    # per such format, the cached tokens one of its programs reads a second: a program walks its request's cache for
    # its KV head one tile after another, so no step's KV read is shorter than its longest program's tokens (a
    # request's, or a segment's where the cache is split) at this pace, layer after layer, however few the programs
    # and however little of the HBM rate they draw. A pace of the SM's, carried to another GPU unchanged
    engine_program_pace_tokens_per_s: dict[str, ProgramPace] = Field(default_factory=dict)
    # the share of HBM bandwidth the engine's GEMMs read the weights at (None: kvsize's measured kernels' share)
    engine_weights_efficiency: float | None = Field(default=None, gt=0, le=1)
    tp_per_layer_step_overhead_s: float = Field(default=0.0, ge=0, le=0.01)  # each layer's all-reduce, TP > 1
    step_floor_s: float = Field(default=0.0, ge=0, le=0.1)  # the host's side of a step, overlapped with the GPU's
    # each MoE layer's fused-expert kernels beyond a dense MLP's (router, top-k, block alignment, combine), a step
    moe_layer_step_overhead_s: float = Field(default=0.0, ge=0, le=0.01)
    # each MLA layer's kernels beyond a dense layer's attention (the queries' and outputs' absorbed projections, the
    # latent's cache write), a step (scripts/fit_serving_mla.py)
    mla_layer_step_overhead_s: float = Field(default=0.0, ge=0, le=0.01)
    # past the largest CUDA graph, the host's launch of a MoE layer's fused-MoE path beyond a dense layer's
    eager_moe_layer_launch_s: float = Field(default=0.0, ge=0, le=0.01)
    # the host's launch of an MLA layer's prompt path beyond a dense layer's: past the largest CUDA graph, and under
    # it between the graph's pieces (scripts/fit_serving_mla.py)
    eager_mla_layer_launch_s: float = Field(default=0.0, ge=0, le=0.01)
    piecewise_mla_layer_launch_s: float = Field(default=0.0, ge=0, le=0.01)
    moe_tile_fixed_k: float = Field(default=0.0, ge=0, le=1e5)  # a fused-MoE tile's fixed cost, in K-loop elements
    # past the largest CUDA graph, the host's launch of each layer's kernels one by one (the compiled pieces called
    # from Python): hidden behind the GPU's work of the step before, a bound only where it is the longer
    eager_layer_launch_s: float = Field(default=0.0, ge=0, le=0.01)
    # a step with prompt chunks under the largest CUDA graph: the graph's pieces replayed, each layer's attention
    # launched between them (a decode-only step replays one FULL graph), a bound as the launch past the graph
    piecewise_layer_launch_s: float = Field(default=0.0, ge=0, le=0.01)
    # the front end's work per token it streams: the engine core's output handling, in the host's side of a step
    # beside the floor (one process whatever the API servers), and the API server's (detokenizing, the SSE chunk),
    # shared among `--api-server-count` processes, a bound of its own (the host paces small models at many streams)
    frontend_core_s_per_token: float = Field(default=0.0, ge=0, le=0.001)
    frontend_api_s_per_token: float = Field(default=0.0, ge=0, le=0.001)
    # the front end's handling of a request, from the client's send to the engine's queue (HTTP, tokenizing, the
    # hand-off to the engine core) and of its first token back: every request's first token comes this much later
    request_handling_s: float = Field(default=0.0, ge=0, le=1.0)
    # its part on an API server's loop before the tokenizer thread (front_end.py; fitted: first_token.py burst_rows)
    request_parse_s: float = Field(default=0.0, ge=0, le=1.0)
    # what the front end spends on each prompt token: on the way in (tokenizing, the request's token list handed to
    # the engine core) and on the first token's way back (the first output's handling), both read off the step traces
    # of requests alone on the engine (measure/steps.py prompt_handling_rows)
    prompt_in_s_per_token: float = Field(default=0.0, ge=0, le=1e-4)
    first_token_s_per_prompt_token: float = Field(default=0.0, ge=0, le=1e-4)
    # each request a step carries (decoding or prefilling a chunk): the work serialized with the step's kernels that
    # grows with its requests apart from the KV they read (the model runner's per-request inputs, the sampler's row,
    # the attention kernels' per-sequence work); the step traces of closed-loop ladders (one model at 1,000- and
    # 8,000-token prompts) tell it apart from the KV read, which a fixed prompt length cannot
    request_step_overhead_s: float = Field(default=0.0, ge=0, le=0.001)
    fitted_on: tuple[str, ...] = Field(min_length=1)
    # the engine release and the bundled GPU every fitted point ran on: a figure for another is carried there
    fitted_engine: str = Field(min_length=1)  # "vllm 0.33.0"
    fitted_gpu: str = Field(min_length=1)  # a bundled GPU id
    source: str

    @property
    def fitted_engine_name(self) -> str:
        """The engine of fitted_engine ("vllm" of "vllm 0.33.0")."""
        return self.fitted_engine.partition(" ")[0]

    @property
    def fitted_engine_version(self) -> str:
        return self.fitted_engine.partition(" ")[2]

    @model_validator(mode="after")
    def _twins_measured(self):
        if self.request_parse_s > self.request_handling_s:
            raise ValueError(f"request_parse_s {self.request_parse_s} must not exceed request_handling_s, its whole")
        for twin, measured in self.engine_kernel_twins.items():
            if measured not in self.engine_kv_efficiency or twin in self.engine_kv_efficiency:
                raise ValueError(f"engine_kernel_twins {twin}: needs a measured format ({measured} must be in "
                                 f"engine_kv_efficiency, {twin} must not)")
        for name, per_sm in self.engine_programs_per_sm.items():
            if name not in self.engine_kv_efficiency or name not in self.engine_split_kv_efficiency:
                raise ValueError(f"engine_programs_per_sm {name}: needs its engine_kv_efficiency and "
                                 "engine_split_kv_efficiency")
            if not 1 <= per_sm <= 64:
                raise ValueError(f"engine_programs_per_sm {name} must be 1-64, got {per_sm}")
        if set(self.engine_split_kv_efficiency) - set(self.engine_programs_per_sm):
            raise ValueError("engine_split_kv_efficiency: every format needs its engine_programs_per_sm")
        for name, groups in self.engine_query_group_waves.items():
            if name not in self.engine_programs_per_sm:
                raise ValueError(f"engine_query_group_waves {name}: needs the format's engine_programs_per_sm")
            if any(q < 1 for q in groups):
                raise ValueError(f"engine_query_group_waves {name}: query heads a KV head must be 1 or more")
            if not set(groups) <= set(self.engine_waves_query_groups.get(name, ())):
                raise ValueError(f"engine_query_group_waves {name}: each count must be in engine_waves_query_groups")
        if set(self.engine_waves_query_groups) - set(self.engine_programs_per_sm):
            raise ValueError("engine_waves_query_groups: every format needs its engine_programs_per_sm")
        if set(self.engine_program_pace_tokens_per_s) - set(self.engine_programs_per_sm):
            raise ValueError("engine_program_pace_tokens_per_s: every format needs its engine_programs_per_sm")
        return self

    @field_validator("engine_kv_efficiency", "engine_prefill_attention_share", "engine_split_kv_efficiency")
    @classmethod
    def _shares(cls, value: dict[str, float], info) -> dict[str, float]:
        for name, share in value.items():
            if not 0 < share <= 1:
                raise ValueError(f"{info.field_name} {name} must be in (0, 1], got {share}")
        return value


@cache
def step_overhead() -> StepOverhead:
    return validated_profile(SERVING_PROFILE, StepOverhead)


def with_twins(shares: dict, twins: dict[str, str]) -> dict:
    """`shares` (per KV format) with each twin format taking its measured format's share."""
    return {**{twin: shares[measured] for twin, measured in twins.items() if measured in shares}, **shares}


def queries_per_kv_head(shape: ModelShape) -> int:
    """The query heads sharing one KV head: the count the engine's attention kernel is compiled for (alike per rank)."""
    return max(shape.num_attention_heads // max(shape.num_kv_heads, 1), 1)


# vLLM's unified Triton attention (v1/attention/ops/triton_unified_attention.py): a program's tile is BLOCK_M query
# rows, 16 while a KV head has at most 16 query heads (else the next power of two), holding BLOCK_Q = BLOCK_M //
# (query heads a KV head) prompt positions of one KV head's query heads; the rows left over compute nothing
TRITON_BLOCK_M = 16


def _block_m(queries: int) -> int:
    return TRITON_BLOCK_M if queries <= TRITON_BLOCK_M else 1 << (queries - 1).bit_length()


def query_block_positions(shape: ModelShape) -> int:
    """BLOCK_Q: the prompt positions one Triton attention program holds (BLOCK_M // query heads a KV head)."""
    queries = queries_per_kv_head(shape)
    return _block_m(queries) // queries


def query_tile_fill(shape: ModelShape) -> float:
    """The share of a Triton attention program's query rows a prompt fills: BLOCK_Q positions x the query heads a KV
    head over BLOCK_M (12 of 16 at 6 query heads a KV head, 14 at 7, 15 at 5, all 16 at 4 and 8)."""
    queries = queries_per_kv_head(shape)
    return query_block_positions(shape) * queries / _block_m(queries)


def query_group_waves(fitted: dict, kv_format: str, shape: ModelShape) -> dict | None:
    """The waves (programs_per_sm, kv_efficiency) of `kv_format`'s kernel as compiled for `shape`'s query heads a KV
    head, where the fitted terms (a StepOverhead's model_dump) name that count; None: the format's own."""
    groups = with_twins(fitted["engine_query_group_waves"], fitted["engine_kernel_twins"])
    waves = groups.get(kv_format, {}).get(queries_per_kv_head(shape))
    return None if waves is None else dict(waves)


@dataclass(frozen=True, eq=False)  # hashed by identity: its step times are cached per replica
class StepModel:
    """Seconds of one step of one replica (every TP rank works in parallel on its share)."""

    shape: ModelShape
    layout: CacheLayout
    weights: WeightFormat
    tp: int
    hbm_bandwidth_gb_s: float
    bf16_dense_tflops: float
    efficiency: DecodeEfficiency
    kv_format: str
    per_layer_overhead_s: float
    prefill_mfu: float
    tp_layer_overhead_s: float = 0.0  # each layer's all-reduce where tp > 1
    floor_s: float = 0.0  # the least a step takes: the host's side, overlapped with the GPU's
    moe_layer_overhead_s: float = 0.0  # each layer with routed experts: its fused-MoE kernels beyond a dense MLP's
    graphs: GraphedSteps = UNLIMITED  # the largest steps run under a CUDA graph (the default: every step)
    eager_moe_layer_launch_s: float = 0.0  # each layer with routed experts: its launch beyond a dense layer's, eager
    core_s_per_token: float = 0.0  # the engine core's work on each decoding request's token, in the host's side
    api_s_per_token: float = 0.0  # an API server's time per streamed token, divided among the API servers
    request_handling_s: float = 0.0  # from the client's send to the engine's queue, and the first token back
    request_overhead_s: float = 0.0  # each request in a step, beside its KV read (serialized with the kernels)
    prefill_attention_share: float = 1.0  # the share of the prefill FLOP rate the format's prompt attention reaches
    kv_wave_programs: int = 0  # whole-request programs the GPU runs at once (0: the KV read is not in waves)
    split_kv_requests: int = 0  # the most requests a decode-only step splits each request's cache for (0: none)
    split_kv_time_ratio: float = 1.0  # a split read's time over a full wave's, per byte
    # cached tokens a program reads a second, of a request's whole cache and of a split one's segment (0: no bound)
    kv_whole_pace_tokens_per_s: float = 0.0
    kv_split_pace_tokens_per_s: float = 0.0
    kv_split_segments: int = 1  # the segments a split read cuts each request's cache into, one program each
    kv_split_layer_s: float = 0.0  # a split read's cost each KV layer beside its programs' tokens (ProgramPace)
    # the segment programs an SM holds at once, the cached tokens an SM reads a second across them, and the SMs
    # (0: a split read is bound by one program's pace alone)
    kv_split_programs_per_sm: int = 0
    kv_split_sm_tokens_per_s: float = 0.0
    kv_whole_programs_per_sm: int = 0  # the whole-cache programs an SM holds at once (0: as many as a wave puts there)
    kv_whole_sm_tokens_per_s: float = 0.0  # the same across the whole-cache programs an SM holds (0: no SM bound)
    multiprocessors: int = 0
    prompt_in_s_per_token: float = 0.0  # an API server's time on each prompt token before the engine's queue
    first_token_s_per_prompt_token: float = 0.0  # the first token's way back, per prompt token
    eager_layer_launch_s: float = 0.0  # the host's launch of one layer's kernels in a step run without a graph
    piecewise_layer_launch_s: float = 0.0  # the same in a step with prompt chunks replaying the graph's pieces
    request_parse_s: float = 0.0  # of request_handling_s, an API server's loop's part before the tokenizer's
    moe_tile_fixed_k: float = 0.0  # a fused-MoE GEMM tile's fixed cost, in elements of its K loop
    eager_mla_layer_launch_s: float = 0.0  # each MLA layer: its launch beyond a dense layer's, eager
    piecewise_mla_layer_launch_s: float = 0.0  # the same between the graph's pieces
    mla_layer_overhead_s: float = 0.0  # each MLA layer's kernels beyond a dense layer's attention, a step
    moe_routing_overhead_s: float = 0.0  # each MoE layer's routing run op by op, beyond the fused top-k (moe_routing.py)

    def seconds(self, decoding: int, decode_tokens_in_cache: int, chunks: list[tuple[int, int]]) -> float:
        """`decoding` requests reading `decode_tokens_in_cache` cached tokens in all; `chunks`: (start, end) of the
        prompt tokens each prefilling request computes this step."""
        return max(self.gpu_seconds(decoding, decode_tokens_in_cache, chunks), self.host_side_seconds(decoding, chunks))

    def host_side_seconds(self, decoding: int, chunks: list[tuple[int, int]]) -> float:
        """The host's part of a step: its streams' (host_seconds) or the launch of its layers, the longer: in a step
        past the largest CUDA graph every kernel one by one, in a step with prompt chunks under it the graph's pieces
        and each layer's attention between them. The launch overlaps the step before it on the GPU, so it sets the
        step only where the GPU's part is shorter."""
        return max(self.host_seconds(decoding), self.launch_seconds(decoding, chunks))

    def launch_seconds(self, decoding: int, chunks: list[tuple[int, int]]) -> float:
        """The host's launch of a step's layers: past the largest CUDA graph every kernel, with prompt chunks under
        it the attention between the graph's pieces; a step replaying one FULL graph launches none."""
        tokens = decoding + sum(end - start for start, end in chunks)
        if self.graphs.eager(tokens, bool(chunks)):
            return self.eager_launch_s
        if self.graphs.piecewise(tokens, bool(chunks)):
            return (self.shape.num_layers * self.piecewise_layer_launch_s
                    + self.mla_layers * self.piecewise_mla_layer_launch_s)
        return 0.0

    def gpu_seconds(self, decoding: int, decode_tokens_in_cache: int, chunks: list[tuple[int, int]]) -> float:
        """The GPU's side of `seconds`: the step's kernels and what is serialized with them."""
        mean = decode_tokens_in_cache // decoding if decoding else 0
        # Every token of the step, prompt chunks included, goes through the same GEMMs: their weights are read once
        # (every expert a token is routed to) while they compute; only each request's last token goes through the
        # lm_head. Attention is kernels of its own, the decoding requests' KV reads and the chunks' causal attention.
        step_tokens = decoding + sum(end - start for start, end in chunks)
        gemms = max(self._weights(_rounded(step_tokens or 1)), self._gemm_seconds(step_tokens, len(chunks) + decoding))
        attention = sum(self._attention(b) - self._attention(a) for a, b in chunks) / self._attention_flops()
        kv = self._kv_read_seconds(decoding, mean, bool(chunks)) if decoding else 0.0
        requests = (decoding + len(chunks)) * self.request_overhead_s
        return gemms + attention + kv + self.layers_overhead_s + requests

    def handling_seconds(self, prompt_tokens: int) -> float:
        """The front end's time on one request alone outside the steps: handling, the way in, the first token's back."""
        return self.request_handling_s + prompt_tokens * (self.prompt_in_s_per_token
                                                          + self.first_token_s_per_prompt_token)

    def host_seconds(self, decoding: int) -> float:
        """The host's part of a step of `decoding` streams: the engine core's side (its floor and its work on each
        stream) or the API servers' streaming, the longer; a step this long or shorter is the host's, not the GPU's."""
        return max(self.floor_s + decoding * self.core_s_per_token, decoding * self.api_s_per_token)

    @cached_property
    def layers_overhead_s(self) -> float:
        """The fixed cost of a step's layers: each layer's, its all-reduce where TP > 1, each MoE and MLA layer's."""
        per_layer = self.per_layer_overhead_s + (self.tp_layer_overhead_s if self.tp > 1 else 0.0)
        return (self.shape.num_layers * per_layer
                + self.moe_layers * (self.moe_layer_overhead_s + self.moe_routing_overhead_s)
                + self.mla_layers * self.mla_layer_overhead_s)

    @cached_property
    def eager_launch_s(self) -> float:
        """The host's launch of a step run without a CUDA graph, layer by layer (a MoE or MLA layer's beyond a dense
        one's)."""
        return (self.shape.num_layers * self.eager_layer_launch_s + self.moe_layers * self.eager_moe_layer_launch_s
                + self.mla_layers * self.eager_mla_layer_launch_s)

    @property
    def mla_layers(self) -> int:
        """The layers whose attention is MLA (every layer of an MLA model; vLLM builds them alike)."""
        return self.shape.num_layers if self.shape.is_mla else 0

    @cached_property
    def moe_layers(self) -> int:
        return sum(1 for p in self.shape.layer_params if p.experts > 0)

    def read_seconds(self, decoding: int, tokens_in_cache: int) -> tuple[float, float]:
        """(weights, KV) read seconds of a step that only decodes: `decoding` requests of `tokens_in_cache` each."""
        return self._weights(_rounded(max(decoding, 1))), self._kv_read_seconds(decoding, tokens_in_cache, False)

    def _kv_read_seconds(self, decoding: int, mean_tokens: int, prompts: bool) -> float:
        """The decoding requests' KV read: their bytes at the format's share and the kernel's factor, and no
        shorter than the longest program's tokens at the program pace, layer after layer (a request's cache, or a
        segment of it where the engine splits each)."""
        factor, split = self.kv_kernel_factor(decoding, prompts)
        read = self._kv(decoding, _rounded(mean_tokens)) * factor
        pace = self.kv_split_pace_tokens_per_s if split else self.kv_whole_pace_tokens_per_s
        if not pace:
            return read
        segments = self.kv_split_segments if split else 1
        tokens = self.layout.read_tokens(_rounded(-(-mean_tokens // segments)))
        per_sm, sm_rate = ((self.kv_split_programs_per_sm, self.kv_split_sm_tokens_per_s) if split else
                           (self.kv_whole_programs_per_sm or self.kv_wave_programs // max(self.multiprocessors, 1),
                            self.kv_whole_sm_tokens_per_s))
        fixed = self.kv_split_layer_s * self.kv_layers if split else 0.0
        if not (per_sm and sm_rate and self.multiprocessors):
            return max(read, fixed + tokens / pace)
        programs = decoding * self.kv_heads_per_rank * segments
        # a decode-only step launches the query blocks of its graph's batch (vLLM's upper bound, q tokens // BLOCK_Q
        # + sequences, a KV head and segment), the empty ones among them; in a step with prompt chunks only the
        # decoding requests' blocks are counted here (the chunks' attention is timed apart, beside this read)
        batch = decoding if prompts else self.graphs.padded_batch(decoding)
        launched = max(programs, (batch // self.query_block + batch) * self.kv_heads_per_rank * segments)
        if not split:
            # whole-cache programs past one round overlap the next round's: the read's waves are the bytes' (factor
            # above), and the pace binds the programs an SM holds at once
            held = min(per_sm, -(-launched // self.multiprocessors))
            return max(read, tokens / min(pace, sm_rate / held))
        return max(read, fixed + program_rounds_seconds(programs, launched, self.multiprocessors, per_sm, tokens,
                                                        pace, sm_rate))

    @cached_property
    def kv_layers(self) -> int:
        return sum(layers for _, layers in self.layout.distinct_kv())

    def kv_kernel_factor(self, decoding: int, prompts: bool) -> tuple[float, bool]:
        """The decoding requests' KV read time over a read of its bytes at the format's share, and whether the
        engine splits each request's cache (a decode-only step of at most split_kv_requests requests; a step with a
        prompt chunk never does); otherwise, where the kernel reads in waves, the last wave is a full one's time."""
        if not prompts and decoding <= self.split_kv_requests:
            return self.split_kv_time_ratio, True
        if not self.kv_wave_programs or not decoding:
            return 1.0, False
        programs = decoding * self.kv_heads_per_rank
        return -(-programs // self.kv_wave_programs) * self.kv_wave_programs / programs, False

    @cached_property
    def query_block(self) -> int:
        return query_block_positions(self.shape)

    @cached_property
    def kv_heads_per_rank(self) -> int:
        return kv_heads_per_rank(self.shape.num_kv_heads, self.tp)

    def prefill_compute_seconds(self, tokens: int) -> float:
        """The least time a prompt of `tokens` takes in any chunking: its GEMMs' and its causal attention's FLOPs."""
        return self._gemm_seconds(tokens, 1) + self._attention(tokens) / self._attention_flops()

    def _gemm_seconds(self, step_tokens: int, sampled: int) -> float:
        """The step's GEMMs' FLOPs at the prefill rate, the routed experts' lengthened by their tiles' fixed cost."""
        routed = 2 * routed_expert_params(self.shape) * step_tokens
        return (gemm_flops(self.shape, step_tokens, sampled) + routed * (self._tile_k - 1)) / self._flops()

    @cached_property
    def _tile_k(self) -> float:  # TP splits each expert's intermediate size, down's K loop, among the ranks
        k0, shape = self.moe_tile_fixed_k, self.shape
        per_element = (2 / shape.hidden_size + self.tp / shape.moe_intermediate_size) / 3 if shape.num_experts else 0
        return 1 + k0 * per_element

    def decode_seconds(self, decoding: int, decode_tokens_in_cache: int) -> float:
        """A step that only decodes: `seconds` with no chunks, kept per batch and rounded mean length."""
        return self._decode_only(decoding, _rounded(decode_tokens_in_cache // decoding))

    @lru_cache(maxsize=65536)
    def _decode_only(self, decoding: int, mean_tokens: int) -> float:
        return self.seconds(decoding, mean_tokens * decoding, [])

    def _flops(self) -> float:
        return self.bf16_dense_tflops * 1e12 * self.prefill_mfu * self.tp

    def _attention_flops(self) -> float:
        return self._flops() * self.prefill_attention_share

    @lru_cache(maxsize=65536)
    def _weights(self, step_tokens: int) -> float:
        return self._read(step_tokens, 0).weights_seconds

    @lru_cache(maxsize=65536)
    def _kv(self, decoding: int, mean_tokens: int) -> float:
        return self._read(decoding, mean_tokens).kv_seconds

    def _read(self, requests: int, tokens: int):
        return decode_step(self.shape, self.layout, self.weights, self.tp, [(requests, tokens)],
                           self.hbm_bandwidth_gb_s, self.efficiency, self.kv_format)

    @lru_cache(maxsize=65536)
    def _attention(self, tokens: int) -> int:
        return prefill_attention_flops(self.shape, tokens)


def program_rounds_seconds(programs: int, launched: int, sms: int, per_sm: int, tokens: int,
                           alone_tokens_per_s: float, sm_tokens_per_s: float) -> float:
    """Seconds for `programs` programs of `tokens` cached tokens each (every layer's, one after another) on `sms` SMs
    that hold `per_sm` of them at once: full rounds of per_sm programs an SM, then a last round of the rest spread
    over the SMs. A program reads at its pace alone until the programs an SM holds share the SM's rate
    (sm_tokens_per_s over their count). A step of one round places every block it launched at once (`launched`:
    its programs and the grid's empty blocks), so as many share an SM as the grid puts there."""
    per_round = sms * per_sm
    full = (programs - 1) // per_round
    last = min(per_sm, -(-(launched if not full else programs - full * per_round) // sms))
    return sum(tokens / min(alone_tokens_per_s, sm_tokens_per_s / held) for held in (per_sm,) * full + (last,))


def _rounded(tokens: int) -> int:
    """Cached tokens to 1/64 of their size: a step's KV read moves by less than that within a few steps."""
    unit = max(1, 1 << max(0, tokens.bit_length() - 6))
    return tokens // unit * unit


def engine_efficiency(efficiency: DecodeEfficiency, engine_kv: dict[str, float] | None = None,
                      engine_weights: float | None = None) -> DecodeEfficiency:
    """`efficiency` with the KV formats and the weights the engine's own servers were measured reading at their
    fitted shares."""
    fitted = step_overhead()
    engine_kv = with_twins(fitted.engine_kv_efficiency if engine_kv is None else engine_kv,
                           fitted.engine_kernel_twins)
    engine_kv = {k: v for k, v in engine_kv.items() if k not in efficiency.given}  # the user's figures stand
    engine_weights = fitted.engine_weights_efficiency if engine_weights is None else engine_weights
    if engine_kv:
        efficiency = replace(efficiency, kv=MappingProxyType({**efficiency.kv, **engine_kv}))
    if engine_weights is None or "weights" in efficiency.given:
        return efficiency
    return replace(efficiency, weights=engine_weights)

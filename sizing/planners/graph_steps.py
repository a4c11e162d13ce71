"""Which of a serving engine's steps run under a CUDA graph (docs/formulas.md, 'Serving simulation'): the largest
step, in tokens, that the engine replays from a captured graph, from kvsize's own estimate of the capture sizes (the
ones its CUDA-graph memory term counts, sizing/engines/cudagraphs.py). vLLM pads a step to the next captured size
and replays that graph; a step past the largest runs without one, each kernel launched from the host (the compiled
pieces called one by one from Python, and for an MoE layer the fused-MoE path's Python), which the serving
simulation prices as a launch a layer that bounds the step and a cost per MoE layer (sizing/planners/step_model.py,
StepModel)."""

from __future__ import annotations

from dataclasses import dataclass

from ..capacity.budget import profiling_model
from ..engines.cudagraphs import captured_mode, graph_captures


@dataclass(frozen=True)
class GraphedSteps:
    """The largest step run under a CUDA graph: one with prompt tokens (a prefill or mixed step) and one that only
    decodes (one token a request). 0: no such step is graphed; None: no limit modelled (every step graphed)."""

    prefill_tokens: int | None = None
    decode_tokens: int | None = None
    # the batch sizes of the FULL graphs a decode-only step is padded to, attention inside them (empty: its attention
    # runs with the step's own requests)
    decode_batches: tuple[int, ...] = ()
    # whether a step with prompt chunks under the largest graph replays the graph's pieces, each layer's attention
    # launched from the host between them (PIECEWISE, FULL_AND_PIECEWISE), rather than one FULL graph
    piecewise_prompts: bool = False

    def padded_batch(self, decoding: int) -> int:
        """The requests a decode-only step of `decoding` launches its attention for: the next FULL graph's batch."""
        return min((b for b in self.decode_batches if b >= decoding), default=decoding)

    def eager(self, tokens: int, prefills: bool) -> bool:
        """Whether a step of `tokens` tokens (with prompt chunks or not) runs without a graph."""
        largest = self.prefill_tokens if prefills else self.decode_tokens
        return largest is not None and tokens > largest

    def piecewise(self, tokens: int, prefills: bool) -> bool:
        """Whether a step of `tokens` tokens with prompt chunks (`prefills`) replays the graph's pieces, its layers'
        attention launched between them. A decode-only step is not counted: under FULL_AND_PIECEWISE it replays a
        FULL graph, and under PIECEWISE alone its launch has not been measured."""
        return prefills and self.piecewise_prompts and not self.eager(tokens, prefills)


UNLIMITED = GraphedSteps()


# vLLM's TRITON_ATTN (v1/attention/backends/triton_attn.py, MIN_LAUNCH_GRID_SIZE_2D): the fewest programs its grid of
# one program per request and KV head must launch; a decode-only step of fewer requests splits each request's cache
# into segments (the 3D grid) instead
SPLIT_KV_GRID = 128
# the same file's NUM_PAR_SOFTMAX_SEGMENTS: the segments the 3D grid splits each request's cache into, one program each
# (64 only on compute capability 12.0, whose SMs a 16-segment grid under-fills)
SPLIT_KV_SEGMENTS = 16
# the CUDA-graph modes whose decode-only steps replay a FULL graph, attention inside it at the graph's batch
FULL_DECODE_MODES = ("FULL_AND_PIECEWISE", "FULL_DECODE_ONLY", "FULL")
# the CUDA-graph modes whose steps with prompt chunks replay piecewise graphs (the attention between the pieces)
PIECEWISE_PROMPT_MODES = ("FULL_AND_PIECEWISE", "PIECEWISE")


def split_kv_requests(scenario, engine, kv_heads_per_rank: int) -> int:
    """The most requests a decode-only step of vLLM's TRITON_ATTN splits each request's cache for: SPLIT_KV_GRID over
    the KV heads a rank holds, moved to the nearest CUDA graph capture size (the smaller of two as near) where decode
    steps are replayed from full graphs, so that each graph holds one kernel; 0 for another engine."""
    threshold = SPLIT_KV_GRID // kv_heads_per_rank
    if engine.name != "vllm":
        return 0
    if not engine.cuda_graphs or scenario.cudagraph_mode == "NONE":
        return threshold
    _, release = profiling_model(engine)
    model = release.cuda_graph_estimate
    shape = scenario.shape
    layers = range(shape.num_layers)
    if model is None or captured_mode(shape, model, scenario.cudagraph_mode, layers,
                                      scenario.torch_compile) not in FULL_DECODE_MODES:
        return threshold
    sizes = _captures(scenario, model, layers).piecewise
    return min(sizes, key=lambda size: abs(size - threshold))


def _captures(scenario, model, layers):
    return graph_captures(scenario.shape, model, scenario.tensor_parallel_size, layers, scenario.max_num_seqs,
                          scenario.max_num_batched_tokens, scenario.cudagraph_capture_sizes,
                          scenario.max_cudagraph_capture_size)


def graphed_steps(scenario, engine) -> GraphedSteps:
    """The largest graphed steps of vLLM serving `scenario` (resolved: its batch settings filled in) under `engine`'s
    release: the graphs its CUDA-graph memory term counts (sizing/engines/cudagraphs.py). Engines other than vLLM,
    and vLLM releases whose capture sizes kvsize does not estimate, get no limit: the eager steps' cost was measured
    on vLLM 0.33.0's graphs alone."""
    if engine.name != "vllm":
        return UNLIMITED
    if not engine.cuda_graphs or scenario.cudagraph_mode == "NONE":
        # no graph at all (--enforce-eager, or cudagraph_mode NONE): every step, a decode of one request included,
        # launches its kernels from the host, so every step pays the eager cost
        return GraphedSteps(0, 0)
    _, release = profiling_model(engine)
    model = release.cuda_graph_estimate
    if model is None:
        return UNLIMITED
    shape = scenario.shape
    layers = range(shape.num_layers)
    mode = captured_mode(shape, model, scenario.cudagraph_mode, layers, scenario.torch_compile)
    if mode == "NONE":
        return GraphedSteps(0, 0)
    c = _captures(scenario, model, layers)
    full = tuple(sorted(b for b in c.piecewise if b <= scenario.max_num_seqs)) if mode in FULL_DECODE_MODES else ()
    if mode == "FULL_DECODE_ONLY":
        # FULL graphs of uniform decode batches alone (up to max_num_seqs requests): a step with a prompt chunk
        # is never replayed from one
        return GraphedSteps(0, min(max(c.piecewise), scenario.max_num_seqs), full)
    return GraphedSteps(max(c.piecewise), max(c.piecewise), full, piecewise_prompts=mode in PIECEWISE_PROMPT_MODES)

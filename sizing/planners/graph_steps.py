"""Which of a serving engine's steps run under a CUDA graph (docs/formulas.md, 'Serving simulation'): the largest
step, in tokens, that the engine replays from a captured graph, from kvsize's own estimate of the capture sizes (the
ones its CUDA-graph memory term counts, sizing/engines/cudagraphs.py). vLLM pads a step to the next captured size
and replays that graph; a step past the largest runs without one, each kernel launched from the host (the compiled
pieces called one by one from Python, and for an MoE layer the fused-MoE path's Python), which the serving
simulation prices per MoE layer (sizing/planners/serving.py, StepModel)."""

from __future__ import annotations

from dataclasses import dataclass

from ..capacity.budget import profiling_model
from ..engines.cudagraphs import cudagraph_capture_sizes, uncompiled_cudagraph_mode

DEFAULT_MODE = "FULL_AND_PIECEWISE"  # vLLM's default cudagraph_mode where a release's CUDA graphs are estimated


@dataclass(frozen=True)
class GraphedSteps:
    """The largest step run under a CUDA graph: one with prompt tokens (a prefill or mixed step) and one that only
    decodes (one token a request). 0: no such step is graphed; None: no limit modelled (every step graphed)."""

    prefill_tokens: int | None = None
    decode_tokens: int | None = None

    def eager(self, tokens: int, prefills: bool) -> bool:
        """Whether a step of `tokens` tokens (with prompt chunks or not) runs without a graph."""
        largest = self.prefill_tokens if prefills else self.decode_tokens
        return largest is not None and tokens > largest


UNLIMITED = GraphedSteps()


def graphed_steps(scenario, engine) -> GraphedSteps:
    """The largest graphed steps of vLLM serving `scenario` (resolved: its batch settings filled in) under `engine`'s
    release. Engines other than vLLM, and vLLM releases whose capture sizes kvsize does not estimate, get no limit:
    the eager steps' cost was measured on vLLM 0.33.0's graphs alone."""
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
    mode = scenario.cudagraph_mode or DEFAULT_MODE
    if not scenario.torch_compile:
        mode = uncompiled_cudagraph_mode(mode)  # the piecewise graphs are torch.compile's pieces
    if mode != "NONE" and model.piecewise_only_layer_kinds.intersection(scenario.shape.layer_kinds):
        mode = "PIECEWISE" if scenario.torch_compile else "NONE"  # the backend captures no FULL graph
    if mode == "NONE":
        return GraphedSteps(0, 0)
    sizes = scenario.cudagraph_capture_sizes or cudagraph_capture_sizes(
        scenario.max_num_seqs, scenario.max_num_batched_tokens, model, scenario.shape.model_type,
        scenario.max_cudagraph_capture_size)
    largest = max(sizes)
    if mode == "FULL_DECODE_ONLY":
        # FULL graphs of uniform decode batches alone (up to max_num_seqs requests): a step with a prompt chunk
        # is never replayed from one
        return GraphedSteps(0, min(largest, scenario.max_num_seqs))
    return GraphedSteps(largest, largest)

"""A pipeline stage's memory beside the KV cache (weights, profiling activation, non-torch, CUDA graphs) and
the KV budget the engine release leaves from them: everything of an estimate but --max-model-len and
--concurrency, built once per setting and reused across lengths."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from functools import lru_cache

from ..engines import Budget, Engine, MemoryTerms, Pool
from ..engines.mxfp4 import mxfp4_moe_layout
from ..engines.pp_vocab import FIRST_AND_LAST, stage_vocab
from ..engines.started import (CarriedTerms, architecture_evidence, gpu_evidence, parallel_evidence,
                               release_evidence)
from ..cache.formats import FormatOptions, get_format
from ..cache.layers import CacheLayout, build_layout, parse_layer_overrides
from ..engines.cudagraphs import (cuda_graph_estimate, flash_attn_mla_decode, split_block_risk_bytes,
                                  v2_flash_attn_mla_estimate, v2_per_layer_bytes)
from ..engines.memory import (MLA_WORKSPACE_FULL_LENGTH, SGLANG_PER_LAYER_INPUTS, VLLM_PER_LAYER_INPUTS,
                              ActivationEstimate, engine_weight_format, mla_workspace_tokens,
                              per_layer_input_buffer_bytes, profiling_peak, resolve_weights_dtype, weight_bytes)
from ..engines.releases import find_release, version_key
from ..engines.state_pool import StatePool
from ..engines.support import support
from ..config import DTYPE_BYTES, ModelShape
from ..config.family import family
from ..units import GiB, cdiv, ceil_fraction
from .scenario import Scenario


def _format_warnings(engine: Engine, architecture: str | None, k_name: str, v_name: str, dtype: str) -> list[str]:
    out = [f"{row.name}: layout unconfirmed: {row.unconfirmed}"
           for row in dict.fromkeys(get_format(name, dtype) for name in (k_name, v_name)) if row.unconfirmed]
    if architecture is None or engine.name == "ideal":
        return out
    for name in dict.fromkeys((k_name, v_name)):
        fmt = get_format(name, dtype).name
        verdict = support(engine.name, fmt, architecture)
        failed = engine.release.kv_formats_failed.get(fmt) if engine.release is not None else None
        if failed:
            out.append(f"{engine.release.name} failed to start with {fmt} KV on a real GPU ({failed}); choose "
                       "another --kv-cache-dtype or check your build with kvsize verify")
        elif verdict.status == "unsupported":
            out.append(f"{engine.name} does not run {fmt} KV on {architecture} GPUs ({verdict.source}); "
                       "choose another --kv-cache-dtype or GPU")
        elif verdict.status == "unconfirmed":
            out.append(f"no engine source confirms {engine.name} runs {fmt} KV on {architecture} GPUs")
    return out


@lru_cache(maxsize=4096)
def _layout(shape: ModelShape, k: str, v: str, tp: int, stage: range, overrides: str | None,
            options: FormatOptions) -> CacheLayout:
    return build_layout(shape, k, v, tp, stage, parse_layer_overrides(overrides, shape.num_layers), options)


@lru_cache(maxsize=4096)
def _pool(engine: Engine, layout: CacheLayout, block_size: int, mnbt: int, pp: int) -> Pool:
    return engine.pool(layout, block_size, mnbt, pp)


@lru_cache(maxsize=4096)
def engine_weight_bytes(engine: Engine, shape: ModelShape, wfmt, tp: int, stage: range, first: bool, last: bool,
                        vision: bool = True, architecture: str | None = None) -> int:
    """The weights one GPU loads as the engine's release counts them: its kernels' zero points on this
    GPU, and the caching allocator's segment ends (docs/formulas.md, Weights)."""
    release = engine.release
    wfmt = engine_weight_format(wfmt, shape, release.activation_dtype_zero_points if release else None, architecture,
                                release.moe_keeps_checkpoint_zeros if release else False,
                                mxfp4_moe_layout(release.engine, release.first_version, architecture,
                                                 shape.weights_quantization) if release else None)
    allocator = release.weight_allocator if release is not None else None
    copies = 0
    if release is not None and release.mla_absorbed_weight_copies and shape.mla_kv_b_proj_params:
        copies = len(stage) * cdiv(shape.mla_kv_b_proj_params, tp) * DTYPE_BYTES[shape.serving_dtype]
    # SGLang's Gemma 4 keeps its per-layer input table and projection whole on every TP rank, on the first stage
    layout = SGLANG_PER_LAYER_INPUTS if engine.name == "sglang" else VLLM_PER_LAYER_INPUTS
    vocab = stage_vocab(engine.version, shape.architectures) if engine.name == "vllm" else FIRST_AND_LAST
    return weight_bytes(shape, wfmt, tp, stage, first, last, vision, allocator, layout, vocab).total_bytes + copies


@lru_cache(maxsize=4096)
def _activation(shape, run, tokens, rows, tp, stage, first, last, sms, compiled=True,
                mla_workspace: int = 0) -> ActivationEstimate:
    return profiling_peak(shape, run, tokens, rows, tp, stage, first, last, sms, compiled, mla_workspace)


# the share of the KV budget from which the allocator's split of the graph warm-ups' accumulators is named in the
# answer: kvsize's own accuracy bar against the engine (docs/accuracy.md), below which the split cannot move the answer
# past it
SPLIT_RISK_SHARE = 0.01


def mla_workspace_of(s: Scenario, engine: Engine, shape: ModelShape, block_size: int) -> int:
    """vLLM's MLA chunked-prefill workspace in tokens for this scenario (0 for another engine or a model without
    MLA): it reads the context length, so an MLA model's profiling peak can move with --max-model-len."""
    if engine.name != "vllm" or not shape.is_mla:
        return 0
    return mla_workspace_tokens(s.max_model_len or engine.default_max_model_len(shape), s.max_num_seqs, block_size)


def activation_context_key(s: Scenario, engine: Engine):
    """What of the context length the profiling peak reads, so that a setup is shared only by lengths it gives the
    same peak: llama.cpp's compute buffer reads the length and the concurrency, vLLM's MLA workspace the length up to
    MLA_WORKSPACE_FULL_LENGTH (mla_workspace_tokens); None where neither does."""
    if engine.activation_reads_context:
        return s.max_model_len, s.concurrency
    if engine.name == "vllm" and s.shape.is_mla and s.max_model_len is not None:
        return min(s.max_model_len, MLA_WORKSPACE_FULL_LENGTH)
    return None


def profiling_model(engine: Engine):
    """The engine release's profiling-run model; engines without release files use vLLM's newest."""
    newest = find_release("vllm", None)
    release = engine.release or newest
    return release.activation or newest.activation, release


@dataclass(frozen=True)
class StageSetup:
    """What a pipeline stage's estimate takes from everything but --max-model-len and --concurrency."""

    shape: ModelShape
    k_name: str
    v_name: str
    notes: tuple[str, ...]
    layout: CacheLayout
    pool: Pool
    weights_format: str
    activation: ActivationEstimate
    terms: MemoryTerms
    fraction: float
    budget: Budget
    state_bytes: int  # recurrent state per sequence kept beside the pool
    payload_bytes_per_token: int
    metadata_bytes_per_token: int
    model_runner: str = "v1"
    # the engine's own pool of recurrent-state slots, sized from the budget (SGLang's MambaPool), else None
    state_pool: StatePool | None = None


# The fields a stage's setup does not read: a sweep over contexts builds each setup once.
_PER_LENGTH_FIELDS = frozenset({"max_model_len", "concurrency", "model_name", "gpu_name"})


_SETUP_FIELDS = tuple(f.name for f in fields(Scenario) if f.name not in _PER_LENGTH_FIELDS)


def _setup_key(s: Scenario) -> tuple:
    return tuple(getattr(s, name) for name in _SETUP_FIELDS)


_SETUPS: dict[tuple, StageSetup] = {}


_SETUPS_MAX = 4096


def stage_setup(s: Scenario, engine: Engine, k_name: str, v_name: str, index: int, stage: range,
                 num_stages: int) -> StageSetup:
    # Keyed by hand: an lru_cache would key on `s` whole, and so miss on every new length. SGLang's default
    # fraction reads the context length, so the fraction the engine would pick is part of the key, and so is what of
    # the length the profiling peak reads.
    key = (_setup_key(s), chosen_fraction(s, engine), engine, k_name, v_name, index, stage.start, stage.stop,
           num_stages, activation_context_key(s, engine))
    found = _SETUPS.get(key)
    if found is None:
        if len(_SETUPS) >= _SETUPS_MAX:
            _SETUPS.clear()
        found = _SETUPS[key] = _build_stage_setup(s, engine, k_name, v_name, index, stage, num_stages)
    return found


def chosen_fraction(s: Scenario, engine: Engine) -> float:
    """The memory fraction asked for, else the engine's default for this scenario."""
    return s.memory_fraction if s.memory_fraction is not None else engine.default_fraction(
        s.nvml_mib, s.tensor_parallel_size, s.pipeline_parallel_size, fraction_inputs(s, s.shape, engine))


def fraction_inputs(s: Scenario, shape: ModelShape, engine: Engine):
    """What an engine's default memory fraction reads of the scenario beside the GPU (SGLang's rule): the
    release's rule says whether the model's prefill graphs are reserved for."""
    from ..engines.releases import FractionInputs

    rule = engine.release.prefill_graphs if engine.release is not None else None
    return FractionInputs(mla=shape.is_mla, context_length=s.max_model_len,
                          chunked_prefill_size=s.max_num_batched_tokens, cuda_graph_max_bs=s.cuda_graph_max_bs,
                          cuda_graphs=s.cudagraph_mode != "NONE",
                          prefill_graphs=rule is None or rule.captures(shape),
                          prefill_graphs_capped_by_context=rule is None or rule.sizes_capped_by_context,
                          vision_tower=shape.vision_tower if s.serve_multimodal and not s.language_model_only else None)


def _build_stage_setup(s: Scenario, engine: Engine, k_name: str, v_name: str, index: int, stage: range,
                       num_stages: int) -> StageSetup:
    tp = s.tensor_parallel_size
    shape, k_name, v_name, built_notes = engine.build_model(s.shape, k_name, v_name)
    if s.mamba_ssm_dtype is not None and "recurrent" in shape.layer_kinds:
        shape = replace(shape, recurrent_state_dtype=s.mamba_ssm_dtype)  # the engine's own setting wins
    notes = (*shape.notes, *built_notes, *_format_warnings(engine, s.gpu_architecture, k_name, v_name,
                                                            shape.serving_dtype))
    if engine.release is not None and engine.release.unconfirmed:
        notes += (f"{engine.release.name} rules: {engine.release.unconfirmed}",)
    evidence = release_evidence(engine.name, engine.version)
    if evidence is not None:
        notes += (evidence.sentence(),)
    parallel = parallel_evidence(engine.name, engine.version) if engine.release is not None else None
    parallel_note = parallel.note(engine.name, engine.release.name, tp * s.pipeline_parallel_size,
                                  s.pipeline_parallel_size) if parallel else None
    if parallel_note:
        notes += (parallel_note,)
    if engine.name == "vllm" and s.pipeline_parallel_size > 1:
        notes += _stage_vocab_note(engine.version, shape.architectures)
    unstarted = architecture_evidence(engine.name, shape.architectures, family(shape))
    if unstarted:
        notes += (unstarted,)
    fraction = s.memory_fraction if s.memory_fraction is not None else engine.default_fraction(
        s.nvml_mib, tp, s.pipeline_parallel_size, fraction_inputs(s, shape, engine))
    layout = _layout(shape, k_name, v_name, tp, stage, engine.layer_overrides(shape, k_name, s.layer_kv_dtype),
                     s.format_options)
    block_size = s.block_size or engine.block_size_for(layout)
    pool = _pool(engine, layout, block_size, s.max_num_batched_tokens, s.pipeline_parallel_size)

    first, last = index == 0, index == num_stages - 1
    served, unsized = _llamacpp_buffers(s, engine, shape, k_name, v_name)
    if unsized:
        notes += (unsized,)
    if served is not None:  # llama.cpp: the GGUF's tensors on the GPU (docs/formulas.md, llama.cpp)
        weights_format, weights = served.weights.weight_type, served.weights.gpu_bytes + s.extra_weights_bytes
        notes += ("llama.cpp: the weights are the CUDA0 model buffer and the activation its compute buffer (a model "
                  "measured on CPU loads only, not on a CUDA build); token_embd and the output buffer stay in host "
                  "memory",)
    else:
        wfmt = resolve_weights_dtype(s.weights_dtype, shape)
        weights_format = wfmt.name
        # Per-tensor KV scales are attention-layer parameters, loaded with the weights.
        weights = (engine_weight_bytes(engine, shape, wfmt, tp, stage, first, last, not s.language_model_only,
                                       s.gpu_architecture)
                   + layout.parameter_bytes()
                   + s.extra_weights_bytes)
    if engine.name == "vllm":  # built by the multimodal wrapper on every pipeline stage
        weights += per_layer_input_buffer_bytes(shape, s.max_num_batched_tokens)
    run, rules = profiling_model(engine)
    runner = model_runner(engine, shape)
    if runner == "v2" and rules.activation_v2 is not None:
        run = rules.activation_v2
    above = dict(run.forward_above_model)
    # only where the budget subtracts the profiling peak (vLLM); SGLang's activation lives outside its fraction
    subtracts_activation = engine.release is None or "activation" in engine.release.subtracts
    if shape.model_type in above and subtracts_activation:
        notes += (f"activation: {rules.name}'s profiling forward of {shape.model_type} models ran above "
                  f"kvsize's model ({above[shape.model_type]}): the KV pool may be that much smaller; kvsize "
                  "verify measures it",)
    if engine.name == "vllm" and shape.vision_params and not s.language_model_only and first:
        notes += ("activation: vLLM also runs the vision encoder on its largest dummy images before sizing the KV "
                  "cache, which kvsize does not model (its starts of multimodal models ran text-only): the pool "
                  "may be smaller; --language-model-only serves the model without it, kvsize verify measures it",)
    rows = min(s.max_num_seqs, s.max_num_batched_tokens)
    act = _activation(shape, run, s.max_num_batched_tokens, rows, tp, stage, first, last,
                      s.gpu_multiprocessors or rows, s.torch_compile and not s.compile_cache_hit,
                      mla_workspace_of(s, engine, shape, block_size))
    if served is not None:
        act = ActivationEstimate(min(served.n_ctx, 512), 0, served.compute_bytes, 0, 0, 0)
    non_torch = s.non_torch_bytes if s.non_torch_bytes is not None else rules.non_torch_bytes(
        tp, s.pipeline_parallel_size, runner, s.max_num_seqs * shape.vocab_size, shape.vocab_size * shape.hidden_size,
        last)
    graphs = s.cuda_graph_bytes if s.cuda_graph_bytes is not None else _cuda_graph_bytes(s, engine, rules, shape,
                                                                                          stage, runner, k_name)
    profiled = runner == "v1" or engine.release.model_runners.v2_profiles_cuda_graphs
    estimate_model = rules.cuda_graph_estimate
    if (graphs and profiled and s.cuda_graph_bytes is None and estimate_model is not None
            and estimate_model.fp8_kv_above_model and "fp8" in f"{k_name} {v_name}"):
        notes += (f"cuda graphs: with an fp8 KV cache {engine.release.name} measured more per graph than kvsize's "
                  f"estimate ({estimate_model.fp8_kv_above_model}): the KV pool may be that much smaller; "
                  "kvsize verify measures it",)
    twice = 0
    if graphs and runner == "v2" and profiled and s.cuda_graph_bytes is None and estimate_model is not None:
        twice = split_block_risk_bytes(shape, estimate_model, s.cudagraph_mode, s.tensor_parallel_size, stage,
                                       s.max_num_seqs, s.max_num_batched_tokens, s.cudagraph_capture_sizes,
                                       s.max_cudagraph_capture_size, k_name, s.gpu_architecture)
    terms = MemoryTerms(s.gpu_memory_bytes, weights, act.peak_bytes, non_torch, graphs, profiled)
    budget = engine.budget(terms, fraction, s.headroom)
    if s.kv_cache_memory_bytes is not None:
        budget = Budget(s.kv_cache_memory_bytes, s.gpu_memory_bytes - terms.model_bytes - s.kv_cache_memory_bytes,
                        s.gpu_memory_bytes, "--kv-cache-memory (fixed KV budget)")
    if twice and s.kv_cache_memory_bytes is None and twice >= SPLIT_RISK_SHARE * max(budget.kv_budget_bytes, 0):
        notes += (f"cuda graphs: {engine.release.name}'s estimate holds the split accumulators of its largest "
                  "FULL graphs' warm-ups, and holds more where PyTorch's allocator split their freed block "
                  "(GLM-4.7-Flash at 1,024 sequences on 0.33.0: 3.24 GiB estimated against 2.02 otherwise; "
                  "Llama-3.1-70B with fp8 weights, FlashAttention 3: 2.25 against kvsize's 2.08): the KV pool may "
                  f"be up to {twice / GiB:.2f} GiB smaller here; kvsize verify measures it",)
    elsewhere = gpu_evidence(engine.name, s.gpu_name, CarriedTerms(act.peak_bytes, non_torch, graphs,
                                                                    budget.kv_budget_bytes))
    if elsewhere:
        notes += (elsewhere,)
    if engine.name == "sglang" and budget.headroom_bytes < 0:
        notes += ("activation and CUDA graphs exceed the memory outside --mem-fraction-static; lower it to avoid OOM",)
    payload_tok, metadata_tok = layout.token_bytes()
    # vLLM keeps a hybrid model's recurrent state in its block pool, not beside it.
    state = 0 if pool.holds_recurrent else layout.state_bytes_per_sequence()
    slots, slot_notes = _state_slots(engine, state, budget.kv_budget_bytes, s.mamba_full_memory_ratio)
    return StageSetup(shape, k_name, v_name, notes + slot_notes, layout, pool, weights_format, act, terms, fraction,
                      budget, state, ceil_fraction(payload_tok), ceil_fraction(metadata_tok), runner, slots)


def _state_slots(engine: Engine, state_bytes: int, kv_budget_bytes: int,
                 ratio: float | None = None) -> tuple[StatePool | None, tuple[str, ...]]:
    """The engine's pool of recurrent-state slots where its release sizes one from the budget (at `ratio`, the
    user's --mamba-full-memory-ratio, where given), and what a plan must know of it: the running requests it caps."""
    if state_bytes == 0:
        return None, ()
    rule = engine.release.recurrent_state_pool if engine.release else None
    if rule is not None and ratio is not None:
        rule = rule.model_copy(update={"full_memory_ratio": ratio})
    if rule is None:
        if engine.name != "sglang":
            return None, ()
        named = engine.release.name if engine.release else engine.name
        return None, (f"recurrent state: how {named} sizes its Mamba state pool is not modelled (SGLang 0.5.7 on "
                      "is); kvsize keeps one request's state per running request beside the KV pool, where SGLang "
                      "sets a pool of slots aside first (512, or a ratio of the cache memory): the tokens here may be "
                      "far too many",)
    slots = rule.pool(max(0, kv_budget_bytes), state_bytes)
    return slots, (f"recurrent state: {engine.name} keeps {slots.slots:,} state slots of {state_bytes:,} B "
                   f"(mamba_full_memory_ratio {rule.full_memory_ratio:g} of the cache memory), so at most "
                   f"{slots.max_requests:,} requests run at once ({rule.slots_per_request} slots a request with "
                   "the radix cache); the engine's --mamba-full-memory-ratio moves the split",)


def _stage_vocab_note(version: str, architectures: tuple[str, ...]) -> tuple[str, ...]:
    """A note where the stages' vocabulary placement comes from a newer release's source than the one asked."""
    vocab = stage_vocab(version, architectures)
    if vocab.scanned_release is None or version_key(vocab.scanned_release) <= version_key(version):
        return ()
    return (f"pipeline stages: which stages hold the embedding and lm_head is read from vLLM "
            f"{vocab.scanned_release}'s model classes, the oldest release scanned (scripts/scan_vllm_pp_vocab.py), "
            f"not from {version}'s",)


def _llamacpp_buffers(s: Scenario, engine: Engine, shape: ModelShape, k_name: str, v_name: str):
    """llama.cpp's buffers for its serve command (sizing/engines/llamacpp_quant.py) and None, or (None, why not)."""
    if engine.name != "llamacpp":
        return None, None
    from ..engines.llamacpp_quant import scenario_buffers

    return scenario_buffers(s, engine, k_name, v_name, shape)


def model_runner(engine: Engine, shape: ModelShape) -> str:
    """The vLLM model runner ("v1" or "v2") the engine release serves this model with."""
    rule = engine.release.model_runners if engine.name == "vllm" and engine.release else None
    if rule is None:
        return "v1"
    return rule.runner(shape.architectures, shape.num_experts > 0, shape.weights_quantization is not None,
                       "recurrent" in shape.layer_kinds)


def _cuda_graph_bytes(s: Scenario, engine: Engine, rules, shape: ModelShape, stage: range, runner: str = "v1",
                      kv_format: str | None = None) -> int:
    """The CUDA-graph term: 0 without graphs (--enforce-eager, cudagraph_mode NONE), vLLM's estimate
    from its capture sizes where the release models it, else the release's fixed figure."""
    if not engine.cuda_graphs or s.cudagraph_mode == "NONE":
        return 0
    model = rules.cuda_graph_estimate
    if model is None:
        return rules.cuda_graph_bytes(s.tensor_parallel_size)
    v1 = cuda_graph_estimate(shape, model, s.cudagraph_mode, s.tensor_parallel_size,
                             stage, s.max_num_seqs, s.max_num_batched_tokens, s.cudagraph_capture_sizes,
                             s.max_cudagraph_capture_size, compiled=s.torch_compile,
                             architecture=s.gpu_architecture, kv_format=kv_format,
                             multiprocessors=s.gpu_multiprocessors)
    # V2's part above the V1 model follows the whole model's layers, not the stage's: each PP 2 stage of 0.33.0
    # printed 0.41-0.59 GiB above the V1 model of its layers, what a one-GPU start of the same model prints
    if runner != "v2" or not v1:
        return v1
    if model.v2_mla_piecewise_graph_layer_bytes and flash_attn_mla_decode(shape, model, kv_format,
                                                                           s.gpu_architecture):
        return v2_flash_attn_mla_estimate(shape, model, s.cudagraph_mode, s.tensor_parallel_size, stage,
                                          s.max_num_seqs, s.max_num_batched_tokens, s.cudagraph_capture_sizes,
                                          s.max_cudagraph_capture_size, compiled=s.torch_compile)
    return v1 + shape.num_layers * v2_per_layer_bytes(shape, model, kv_format, s.gpu_architecture)

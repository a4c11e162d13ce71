"""An estimate as the JSON record `kvsize estimate --format json` writes (schema kvsize.estimate/1), with the
engine's own log lines it predicts and the notes on tensor-parallel terms."""

from __future__ import annotations


from ..engines.started import release_evidence
from ..units import GiB
from .estimate import Estimate, _gib


ESTIMATE_SCHEMA = "kvsize.estimate/1"


def tensor_parallel_notes(e: Estimate) -> tuple[str, ...]:
    """What changes per GPU at this TP size, term by term (docs/formulas.md, 'Engine releases'): each
    GPU's share of the weights and the KV heads, and the terms that do not shrink or that grow."""
    s = e.scenario
    tp = s.tensor_parallel_size
    if tp == 1:
        return ()
    shape = s.shape
    gib = e.breakdown.non_torch_bytes / GiB
    notes = [f"weights: each GPU holds 1/{tp} of every layer's weights, and of the embeddings and head "
             f"({e.breakdown.weights_bytes / GiB:.2f} GiB here)"]
    if shape.is_mla:
        notes.append("KV: the MLA latent is not split by TP: every GPU holds all of it, so KV per GPU does not "
                      "shrink")
    elif shape.num_kv_heads < tp:
        notes.append(f"KV: {shape.num_kv_heads} KV heads over {tp} GPUs: each holds one, replicated, so KV per GPU "
                     f"stops shrinking at TP {shape.num_kv_heads}")
    else:
        notes.append(f"KV: each GPU holds {e.kv_heads_per_gpu} of {shape.num_kv_heads} KV heads")
    if e.model_runner == "v2":
        notes.append("activation: the MLP's share shrinks with TP; the V2 sampler holds two model-dtype copies of "
                     "the all-gathered logits beside this GPU's shard, so it grows a little with TP")
    else:
        notes.append("activation: the MLP's share shrinks with TP; the sampler's logits are all-gathered and do not")
    if e.breakdown.cuda_graph_bytes:
        notes.append("CUDA graphs: the decode kernel's split-KV accumulators hold this GPU's query heads, so they "
                     "shrink with TP; the per-graph memory does not")
    notes.append(f"non-torch: NCCL's and the custom all-reduce's buffers come with TP ({gib:.2f} GiB per GPU "
                 f"under {e.engine.label.split(':')[0]})")
    return tuple(notes)


def graphs_subtracted(e: Estimate) -> bool:
    """Whether the engine takes its CUDA-graph estimate out of the KV budget for this model."""
    release = e.engine.release
    if release is None or "cuda_graphs" not in release.subtracts:
        return release is None
    return e.model_runner == "v1" or (release.model_runners is not None
                                      and release.model_runners.v2_profiles_cuda_graphs)


def engine_log_lines(e: Estimate) -> tuple[str, ...]:
    """The lines the engine prints at startup for this plan, worded as the engine words them, so a
    log can be held against them line by line (vLLM: gpu_worker.py and kv_cache_utils.py; SGLang:
    model_runner.py and memory_pool.py; TensorRT-LLM: resource_manager's MemUsageChange line)."""
    name = e.engine.name
    if e.kv_budget_bytes <= 0:
        return ()
    if name == "vllm":
        budget = e.printed_kv_budget_bytes
        release = e.engine.release
        graphs = ()
        if release is not None and release.cuda_graph_estimate is not None and graphs_subtracted(e) \
                and e.breakdown.cuda_graph_bytes:
            # gpu_model_runner.py profile_cudagraph_memory; the V2 runner prints none
            graphs = (f"Estimated CUDA graph memory: {e.breakdown.cuda_graph_bytes / GiB:.2f} GiB total",)
        return (*graphs, f"Available KV cache memory: {_gib(budget)}",
                f"GPU KV cache size: {e.max_tokens:,} tokens",
                f"Maximum concurrency for {e.max_model_len:,} tokens per request: {e.max_concurrency_ratio:.2f}x")
    allocated = e.breakdown.kv_payload_bytes + e.breakdown.kv_metadata_bytes
    if name == "sglang":
        half = f"{allocated // 2 / GiB:.2f} GB"  # SGLang divides by 2^30 and writes GB
        return (f"max_total_num_tokens={e.max_tokens}",
                f"KV Cache is allocated. #tokens: {e.max_tokens}, K size: {half}, V size: {half}")
    if name == "trtllm":
        return (f"[MemUsageChange] Allocated {_gib(allocated)} for max tokens in paged KV cache "
                f"({e.max_tokens}).",)
    if name == "llamacpp":  # the cache llama-server makes for kvsize's serve command
        from ..engines.llamacpp import serve_log_lines

        return serve_log_lines(e.scenario.shape, e.max_model_len, e.scenario.concurrency, e.k_format, e.v_format)
    return ()


def _evidence_record(e: Estimate) -> dict | None:
    """Whether the release was started, and kvsize's figures on its starts or the nearest started release's."""
    ev = release_evidence(e.engine.name, e.engine.version)
    if ev is None:
        return None
    f = ev.figures
    return {"version": ev.version or ev.started_version, "started": ev.started, "nearest_started": ev.nearest_version,
            "starts": f.starts if f else 0, "predictions": f.predictions if f else 0,
            "within_1pct": f.within_1pct if f else 0, "worst_token_error": f.worst_token_error if f else None,
            "gpus": list(f.gpus) if f else []}


def to_record(e: Estimate) -> dict:
    """The estimate as plain values: the stable JSON of `kvsize estimate --format json`."""
    s = e.scenario
    return {
        "schema": ESTIMATE_SCHEMA,
        "model": s.model_name,
        "gpu": s.gpu_name,
        "engine": e.engine.name,
        "model_runner": e.model_runner,
        "engine_release": e.engine.release.name if e.engine.release else None,
        "engine_rules": e.engine.label,
        "engine_release_evidence": _evidence_record(e),
        "engine_log_lines": list(engine_log_lines(e)),
        "tensor_parallel_notes": list(tensor_parallel_notes(e)),
        "k_cache_dtype": e.k_format,
        "v_cache_dtype": e.v_format,
        "weights_dtype": e.weights_format,
        "tensor_parallel_size": s.tensor_parallel_size,
        "pipeline_parallel_size": s.pipeline_parallel_size,
        "pipeline_stage": e.pipeline_stage,
        "kv_heads_per_gpu": e.kv_heads_per_gpu,
        "kv_layers": e.kv_layers,
        "max_model_len": e.max_model_len,
        "concurrency": s.concurrency,
        "block_size": e.block_size,
        "kv_bytes_per_token": e.kv_bytes_per_token,
        "kv_payload_bytes_per_token": e.kv_payload_bytes_per_token,
        "kv_metadata_bytes_per_token": e.kv_metadata_bytes_per_token,
        "kv_layer_fixed_bytes": e.kv_layer_fixed_bytes,
        "kv_bytes_per_sequence": e.kv_bytes_per_sequence,
        "kv_reserved_bytes_per_sequence": e.kv_reserved_bytes_per_sequence,
        "recurrent_state_bytes_per_sequence": e.recurrent_state_bytes_per_sequence,
        # the engine's own pool of recurrent-state slots (SGLang) and the running requests it caps; None: no such pool
        "recurrent_state_slots": e.state_pool.slots if e.state_pool else None,
        "recurrent_state_capped_requests": e.state_pool.max_requests if e.state_pool else None,
        "num_blocks": e.num_blocks,
        "block_bytes": e.block_bytes,
        "max_tokens": e.max_tokens,
        "max_concurrency": e.max_concurrency,
        "max_concurrency_ratio": round(e.max_concurrency_ratio, 4),
        "max_context_at_concurrency": e.max_context_at_concurrency,
        "kv_budget_bytes": e.kv_budget_bytes,
        "budget_formula": e.budget_formula,
        "fits": e.fits,
        "fit_message": e.fit_message,
        "warnings": list(e.warnings),
        "breakdown": dict(total_bytes=e.breakdown.total_bytes, **e.breakdown.terms()),
    }

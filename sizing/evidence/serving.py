"""Real serving runs (measure/serving/points.json: `vllm bench serve` against vLLM's OpenAI server) held to the
serving simulation (sizing/planners/serving.py): each point's settings in, kvsize's figures for it out."""

from __future__ import annotations

from ..capacity.scenario import Scenario
from ..errors import KvsizeError
from ..planners.serving import Load, Served, serving_replica, simulate
from ..profiles import gpu_profile, load_model, matching_gpus, measured_efficiency


def point_gpu(settings: dict):
    """The bundled GPU whose name begins with the device name nvidia-smi gave ("NVIDIA H200")."""
    found = matching_gpus(name=settings["gpu_name"])
    if len(found) != 1:
        raise KvsizeError(f"the device name {settings['gpu_name']!r} names {len(found)} bundled GPUs, not one")
    return gpu_profile(found[0])


def point_scenario(settings: dict, root) -> Scenario:
    """The server of a point as kvsize sizes it: its config, GPU, release, TP, KV format, batch settings and largest
    CUDA graph. Its API server count (settings' api_server_count, batch b8) goes to the replica (point_replica)."""
    gpu = point_gpu(settings)
    name, shape = load_model(str(root / settings["config"]))
    return Scenario(name, shape, gpu.name, gpu.memory_bytes, engine=f"vllm@{settings['vllm_version']}",
                    k_cache_dtype=settings["kv_cache_dtype"], v_cache_dtype=settings["kv_cache_dtype"],
                    tensor_parallel_size=settings["tensor_parallel_size"], max_model_len=settings["max_model_len"],
                    memory_fraction=settings["gpu_memory_utilization"],
                    max_num_batched_tokens=settings["max_num_batched_tokens"], max_num_seqs=settings["max_num_seqs"],
                    gpu_multiprocessors=gpu.multiprocessors, gpu_nvml_mib=gpu.nvml_memory_mib,
                    gpu_architecture=gpu.architecture,
                    max_cudagraph_capture_size=settings.get("max_cudagraph_capture_size"))


def served_settings(point: dict) -> dict:
    """A measured point's settings as the server served them: a request the server refused (a 400 answer) never ran,
    so the load is the completed requests under the same concurrency limit or rate, sent when the load generator
    sent them where it recorded that (an open loop's own Poisson draws), on a server that had run as many requests
    at once as its earlier points had (FIRST_USE_PAD)."""
    sent = point["measured"].get("sent_s")
    return {**point["settings"], "num_prompts": point["measured"]["completed"],
            "server_seen_requests": point.get("server_running_before", 1),
            **({"sent_s": sent} if sent and len(sent) == point["measured"]["completed"] else {})}


def point_replica(settings: dict, root, per_layer_overhead_s: float | None = None,
                  prefill_mfu: float | None = None, engine_kv: dict[str, float] | None = None,
                  terms: dict | None = None):
    """The simulated replica of a point's server and its scheduler (the fitted terms unless given)."""
    gpu = point_gpu(settings)
    return serving_replica(point_scenario(settings, root), gpu.hbm_bandwidth_gb_s, gpu.bf16_dense_tflops,
                           gpu.multiprocessors, measured_efficiency(), per_layer_overhead_s, prefill_mfu, engine_kv, terms,
                           settings.get("api_server_count") or 1)


def predict_point(settings: dict, root, per_layer_overhead_s: float | None = None,
                  prefill_mfu: float | None = None, engine_kv: dict[str, float] | None = None,
                  terms: dict | None = None) -> Served:
    """kvsize's figures for one point: the simulated load against the simulated replica (the fitted terms, unless a
    fit gives its trial ones)."""
    model, engine = point_replica(settings, root, per_layer_overhead_s, prefill_mfu, engine_kv, terms)
    load = Load(settings["input_len"], settings["output_len"], settings["num_prompts"], settings["concurrency"],
                settings["request_rate"], settings.get("seed") or 0, sent_at=tuple(settings.get("sent_s") or ()),
                server_seen_requests=settings.get("server_seen_requests"))
    return simulate(model, engine, load)


# What the serving simulation is held to, per figure a load generator reports (issue goals: p50 within 10%, p99
# within 25%; throughput as a p50): the benchmark, `kvsize check-serve` and the app's Validation tab all use these.
SPEED_BARS = {"ttft_p50_ms": 0.10, "itl_p50_ms": 0.10, "ttft_p99_ms": 0.25, "itl_p99_ms": 0.25,
              "output_tokens_per_s": 0.10, "requests_per_s": 0.10}


def served_figures(served: Served) -> dict[str, float]:
    """The simulation's figures under the names a load generator's result gives them."""
    return dict(ttft_p50_ms=served.ttft_ms[50], ttft_p99_ms=served.ttft_ms[99], itl_p50_ms=served.itl_ms[50],
                itl_p99_ms=served.itl_ms[99], output_tokens_per_s=served.output_tokens_per_s,
                requests_per_s=served.requests_per_s)


def held_to(measured: dict[str, float], predicted: dict[str, float]) -> list[dict]:
    """Each measured figure beside kvsize's, its signed error (kvsize / measured - 1) and its bar."""
    rows = []
    for key, value in measured.items():
        error = predicted[key] / value - 1 if value else None
        rows.append(dict(figure=key, measured=value, kvsize=predicted[key], error=error, bar=SPEED_BARS[key],
                         within=error is not None and abs(error) <= SPEED_BARS[key]))
    return rows


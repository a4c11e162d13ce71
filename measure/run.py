"""`kvsize measure`: allocation, capacity at the boundary and paged decode on an NVIDIA GPU."""

from __future__ import annotations

import copy
import gc
import platform
import sys
import time
from pathlib import Path

from sizing.errors import KvsizeError
from sizing.cache.layers import build_layout
from sizing.capacity.scenario import Scenario
from sizing.capacity.estimate import estimate
from sizing.profiles import model_profile
from sizing.config import ModelShape, resolve_shape

from .report_io import write_report

REPORT_SCHEMA = "kvsize.measure/1"
# Capacity records name what was read from the GPU ("measured") apart from what follows from it by
# vLLM's rule and kvsize's pool ("derived"); version 2 adds formats, tied weights and the 2% boundary;
# version 3 the bytes of each weight tensor, apart from what the caching allocator adds to them.
CAPACITY_VERSION = 3


def scaled_config(config: dict, layers: int | None) -> dict:
    """The config with its decoder cut to `layers` layers (per-layer lists cut to match)."""
    config = copy.deepcopy(config)
    if not layers:
        return config
    text = config.get("text_config") or config
    if layers > text["num_hidden_layers"]:
        raise KvsizeError(f"--layers {layers} exceeds the model's {text['num_hidden_layers']} layers")
    text["num_hidden_layers"] = layers
    for key in ("layer_types", "layers_block_type"):
        if isinstance(text.get(key), list):
            text[key] = text[key][:layers]
    if isinstance(text.get("hybrid_override_pattern"), str):
        text["hybrid_override_pattern"] = text["hybrid_override_pattern"][:layers]
    return config


def model_shape(model: str, layers: int | None) -> tuple[dict, ModelShape]:
    config = scaled_config(model_profile(model).config, layers)
    return config, resolve_shape(config)


def nvml_handle(pynvml, torch):
    """NVML's handle for the GPU torch is using. NVML numbers every GPU of the host, CUDA only those
    CUDA_VISIBLE_DEVICES names, so the two indices differ whenever it names others: the device is
    found by its UUID (or PCI address), and by index only where CUDA sees every GPU."""
    import os

    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        return pynvml.nvmlDeviceGetHandleByUUID(text if text.startswith(("GPU-", "MIG-")) else f"GPU-{text}")
    if getattr(props, "pci_bus_id", None) is not None:
        return pynvml.nvmlDeviceGetHandleByPciBusId(
            f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0")
    if os.environ.get("CUDA_VISIBLE_DEVICES") is not None:
        raise KvsizeError("cannot tell which NVML device is torch's: CUDA_VISIBLE_DEVICES is set and torch "
                          "reports neither the GPU's UUID nor its PCI address")
    return pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())


def non_torch_bytes(used: int | None, reserved: int, other_processes: int) -> int:
    """The memory this process holds outside torch: NVML's used minus torch's segments minus the other
    processes on the GPU. Without NVML, or below zero (NVML read another GPU, or counted this process
    among the others), there is no reading, and the capacity point is not measured."""
    if used is None:
        raise KvsizeError("the memory outside torch is read through NVML (pip install nvidia-ml-py), which "
                          "this process cannot reach")
    value = used - reserved - other_processes
    if value < 0:
        raise KvsizeError(f"NVML's reading leaves {value} B outside torch (used {used} B, torch's segments "
                          f"{reserved} B, other processes {other_processes} B): NVML did not read this process's GPU")
    return value


def _longrope_with_factor(level: dict) -> None:
    """transformers' rope scaling (the newer rope_parameters or the file's rope_scaling; one dict, or one
    per layer type; the kind under rope_type or type): a longrope entry without 'factor' gets the one
    transformers derives for it (modeling_rope_utils._compute_longrope_parameters: max_position_embeddings
    over the pretraining length, the config's own original_max_position_embeddings first, as
    standardize_rope_params takes it), which vLLM's longrope derives too. Some transformers 5 classes
    read the key unconditionally (MiniCPM3's attention: rope_parameters["factor"] for any type but
    default), so a config without it fails there with KeyError: 'factor'."""
    for key in ("rope_parameters", "rope_scaling"):
        params = level.get(key)
        if not isinstance(params, dict) or not params:
            continue
        nested = all(isinstance(v, dict) for v in params.values())
        for entry in params.values() if nested else [params]:
            if entry.get("rope_type", entry.get("type")) != "longrope" or entry.get("factor") is not None:
                continue
            longest = level.get("max_position_embeddings")
            original = level.get("original_max_position_embeddings") or entry.get(
                "original_max_position_embeddings") or longest
            if isinstance(longest, int) and isinstance(original, int) and original > 0:
                entry["factor"] = longest / original


def replica_config(config: dict) -> dict:
    """The config transformers builds the replica from: the file's, without its quantization (the
    replica holds bf16 weights), with rope scaling read as transformers and vLLM read it."""
    out = copy.deepcopy({k: v for k, v in config.items() if k != "quantization_config"})
    _longrope_with_factor(out)
    if isinstance(out.get("text_config"), dict):
        _longrope_with_factor(out["text_config"])
    return out


class Gpu:
    def __init__(self) -> None:
        import torch

        if not torch.cuda.is_available():
            raise KvsizeError("no NVIDIA GPU is visible (torch.cuda.is_available() is False); "
                              "kvsize measure needs a CUDA device")
        self.torch = torch
        try:
            import pynvml

            pynvml.nvmlInit()
            self.handle = nvml_handle(pynvml, torch)
            self.nvml = pynvml
        except Exception:  # NVML missing, or no NVML device is torch's: report torch figures only
            self.nvml = None

    def used_bytes(self) -> int | None:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used if self.nvml else None

    def other_processes_bytes(self) -> int:
        if not self.nvml:
            return 0
        import os

        total = 0
        for p in self.nvml.nvmlDeviceGetComputeRunningProcesses(self.handle):
            if p.pid != os.getpid() and p.usedGpuMemory:
                total += p.usedGpuMemory
        return total

    def info(self) -> dict:
        t = self.torch
        props = t.cuda.get_device_properties(0)
        driver = self.nvml.nvmlSystemGetDriverVersion() if self.nvml else None
        return dict(name=props.name, total_bytes=props.total_memory,
                    total_mib=props.total_memory // 2**20,
                    nvml_total_bytes=self.nvml.nvmlDeviceGetMemoryInfo(self.handle).total if self.nvml else None,
                    driver=driver if isinstance(driver, str) else (driver.decode() if driver else None),
                    torch=t.__version__, cuda=t.version.cuda, python=platform.python_version(),
                    other_processes_bytes=self.other_processes_bytes())

    def settle(self) -> None:
        gc.collect()
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()


def measure_allocation(gpu: Gpu, model: str, fmt: str, blocks: int, layers: int | None, block_size: int) -> dict:
    from .tensors import allocate_layout, predicted_bytes

    t = gpu.torch
    _, shape = model_shape(model, layers)
    layout = build_layout(shape, fmt, fmt)
    gpu.settle()
    a0, r0, n0 = t.cuda.memory_allocated(), t.cuda.memory_reserved(), gpu.used_bytes()
    cache = allocate_layout(layout, blocks, block_size, "cuda")
    t.cuda.synchronize()
    a1, r1, n1 = t.cuda.memory_allocated(), t.cuda.memory_reserved(), gpu.used_bytes()
    storage = cache.storage_bytes
    cache.release()
    del cache
    gpu.settle()
    a2 = t.cuda.memory_allocated()
    predicted = predicted_bytes(layout, blocks, block_size)
    return dict(model=model, layers=layers, kv_cache_dtype=fmt, num_blocks=blocks, block_size=block_size,
                predicted_bytes=predicted, storage_bytes=storage, allocated_delta_bytes=a1 - a0,
                reserved_delta_bytes=r1 - r0, nvml_delta_bytes=(n1 - n0) if n0 is not None else None,
                allocator_rounding_bytes=(a1 - a0) - storage, released_to_baseline=a2 == a0,
                storage_error_bytes=storage - predicted)


def pool_tensor_sizes(pool, layout, num_blocks: int) -> list[int]:
    """Bytes of each KV cache tensor the engine allocates: vLLM's one buffer of num_blocks pages per
    layer (scales inline), or group_size buffers shared by the layers of its hybrid groups."""
    if getattr(pool, "groups", None) and len(pool.groups) > 1:
        return [num_blocks * pool.unit_bytes // pool.group_size] * pool.group_size
    return [num_blocks * spec.page_bytes(pool.block_size) for spec in layout.kv.values()]


def pool_tensors(pool, layout, num_blocks: int, device) -> list:
    import torch

    return [torch.empty(size, dtype=torch.uint8, device=device) for size in pool_tensor_sizes(pool, layout, num_blocks)]


# The harness allocates the pool by vLLM 0.33's rule (the source its derived figures follow); pinned, so the
# committed reports do not move when the default engine follows a newer started release.
HARNESS_ENGINE = "vllm@0.33"


def predict_capacity(model: str, shape: ModelShape, total: int, util: float, mnbt: int, block_size: int, fmt: str,
                     non_torch: int | None, kv_bytes: int | None = None, tp: int = 1, engine: str = HARNESS_ENGINE):
    """kvsize's vLLM estimate for a harness run (one sequence of max_num_batched_tokens, no CUDA graphs)
    with the measured non-torch memory (None: the release's own figure) and, given kv_bytes, a fixed KV
    budget: what measure/run.py, measure/tp.py and `kvsize validate` all compare with."""
    return estimate(Scenario(model, shape, "measured", total, engine=engine, tensor_parallel_size=tp,
                             memory_fraction=util, non_torch_bytes=non_torch, max_num_batched_tokens=mnbt,
                             max_num_seqs=1, cuda_graph_bytes=0, weights_dtype="bf16", block_size=block_size,
                             torch_compile=False,  # the replica's forward is transformers', never compiled
                             max_model_len=mnbt, k_cache_dtype=fmt, v_cache_dtype=fmt, kv_cache_memory_bytes=kv_bytes))


def predicted_record(e, shape: ModelShape) -> dict:
    """A capacity point's `predicted` fields from kvsize's estimate `e` of it."""
    return dict(weights_bytes=e.breakdown.weights_bytes, weights_tensor_bytes=predicted_weight_tensors_bytes(shape),
                activation_bytes=e.breakdown.activation_bytes, kv_budget_bytes=e.kv_budget_bytes,
                num_blocks=e.num_blocks)


def predicted_weight_tensors_bytes(shape: ModelShape) -> int:
    """kvsize's bytes of the replica's weight tensors (bf16, one GPU): the estimate's weights without the
    segment ends vLLM's allocator counts with its own (merged) tensors, which the replica does not build."""
    from sizing.engines.memory import resolve_weights_dtype, weight_bytes

    return weight_bytes(shape, resolve_weights_dtype("bf16", shape), 1, range(shape.num_layers), True, True).total_bytes


def _pool_and_forward(torch, gpu: Gpu, derived, blocks: int, forward) -> tuple[int, int, int]:
    """(peak bytes torch allocated, peak reserved, the allocator's rounding of the pool) while the pool
    of `blocks` blocks is held and a forward pass runs, read from the GPU's allocator. The rounding
    (allocated minus the tensors' own bytes: a segment's tail too small to split goes with its block)
    is what vLLM's per-tensor allocation adds beyond its rule too."""
    gpu.settle()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    pool = pool_tensors(derived.pool, derived.layout, blocks, "cuda")
    rounding = torch.cuda.memory_allocated() - before - sum(t.numel() for t in pool)
    forward()
    peaks = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), rounding
    del pool
    gpu.settle()
    return peaks


def weight_tensor_sizes(model) -> list[int]:
    """Bytes of each storage the model's parameters and buffers hold on the GPU, once each (tied
    weights share one)."""
    sizes: dict[int, int] = {}
    for tensor in (*model.parameters(), *model.buffers()):
        storage = tensor.untyped_storage()
        if storage.nbytes() and tensor.device.type == "cuda":
            sizes.setdefault(storage.data_ptr(), storage.nbytes())
    return list(sizes.values())


def measure_capacity(gpu: Gpu, model: str, layers: int | None, util: float, mnbt: int, block_size: int,
                     formats: list[str]) -> list[dict]:
    """One real transformers model on the GPU (weights tied as the model ties them): its weights,
    its forward pass's peak and the memory outside torch are read from the GPU; for each KV format,
    vLLM's rule on those readings gives the KV bytes and kvsize's pool rule the blocks (derived); the
    boundary is then tried under vLLM's limit (torch may hold utilization x total minus non-torch):
    the derived pool plus a forward pass must fit, and a pool 2% larger must not."""
    import torch
    from transformers import AutoConfig

    config, shape = model_shape(model, layers)
    hf_config = AutoConfig.for_model(**replica_config(config))
    gpu.settle()
    total = torch.cuda.get_device_properties(0).total_memory
    a0 = torch.cuda.memory_allocated()
    n0 = gpu.used_bytes()
    hf, attention = build_replica(hf_config)
    hf = hf.to_empty(device="cuda")
    hf.tie_weights()  # to_empty gives every parameter its own storage; the model shares some (lm_head)
    with torch.no_grad():
        for param in hf.parameters():
            param.normal_(0, 0.02)
        del param
    torch.cuda.synchronize()
    # What an engine counts as its weights is the allocator's figure (vLLM's "Model loading took" is
    # memory_allocated's growth); the tensors themselves hold less where a block keeps a segment's
    # unsplittable end. Both are read: kvsize predicts the tensors, the budget takes the allocator's.
    weights = torch.cuda.memory_allocated() - a0
    tensor_sizes = weight_tensor_sizes(hf)
    ids = torch.randint(0, shape.vocab_size, (1, mnbt), device="cuda")

    def forward() -> None:
        with torch.no_grad():
            hf(input_ids=ids, logits_to_keep=1, use_cache=False)
        torch.cuda.synchronize()

    # The activation is everything torch holds beside the weights at the forward pass's peak: what the
    # pass allocates and what persists from earlier (the cuBLAS workspace, made at a process's first
    # matmul, is already there for every model after the first), as a fresh vLLM process's profile
    # run counts it (measure/NOTES.md, capacity at the boundary).
    forward()
    torch.cuda.reset_peak_memory_stats()
    forward()
    activation = torch.cuda.max_memory_allocated() - weights
    gpu.settle()
    non_torch = non_torch_bytes(gpu.used_bytes(), torch.cuda.memory_reserved(), gpu.other_processes_bytes())
    limit = int(total * util) - non_torch
    available = limit - weights - activation
    records = []
    for fmt in formats:
        try:
            derived = predict_capacity(model, shape, total, util, mnbt, block_size, fmt, non_torch, available)
            predicted = predict_capacity(model, shape, total, util, mnbt, block_size, fmt, non_torch)
        except KvsizeError as e:
            records.append(dict(model=model, layers=layers, kv_cache_dtype=fmt, skipped=str(e)))
            continue
        blocks = derived.num_blocks
        extra = max(1, blocks * 2 // 100)
        peak, reserved_peak, rounding = _pool_and_forward(torch, gpu, derived, blocks, forward)
        peak_over, _, rounding_over = _pool_and_forward(torch, gpu, derived, blocks + extra, forward)
        records.append(dict(
            model=model, layers=layers, kv_cache_dtype=fmt, gpu_memory_utilization=util,
            max_num_batched_tokens=mnbt, block_size=block_size, total_bytes=total,
            measured=dict(weights_bytes=weights, weights_tensor_bytes=sum(tensor_sizes),
                          activation_bytes=activation, non_torch_bytes=non_torch),
            weight_tensor_sizes_bytes=tensor_sizes,
            # the activation is the replica's: transformers' forward pass with this attention, not vLLM's
            # profiling run (the real-engine starts in tests/fixtures/vllm-starts judge vLLM's)
            activation_source=f"transformers forward ({attention} attention), not vLLM's profile run",
            derived=dict(kv_budget_bytes=available, num_blocks=blocks, block_bytes=derived.block_bytes,
                         kv_cache_tokens=derived.max_tokens),
            predicted=predicted_record(predicted, shape),
            # vLLM's budget is in bytes torch allocates: the pool and a forward pass must stay within
            # utilization x total - non-torch, and 2% more blocks must not, apart from the allocator's
            # rounding of the pool's tensors, which vLLM's rule does not count either; the segments
            # (reserved) exceed both, which 1 - utilization leaves room for.
            boundary=dict(limit_bytes=limit, peak_allocated_bytes=peak, pool_rounding_bytes=rounding,
                          blocks_fit=peak - rounding <= limit, two_percent_more_blocks=extra,
                          peak_allocated_two_percent_more_bytes=peak_over,
                          pool_rounding_two_percent_more_bytes=rounding_over,
                          two_percent_more_exceeds=peak_over - rounding_over > limit,
                          peak_reserved_bytes=reserved_peak),
            nvml_before_bytes=n0,
        ))
    del hf, ids
    gpu.settle()
    for r in records:
        r["released_to_baseline"] = torch.cuda.memory_allocated() == a0
    return records


def run_measurement(args) -> int:
    from .decode import paged_decode_case

    gpu = Gpu()
    started = time.time()
    report = dict(schema=REPORT_SCHEMA, capacity_version=CAPACITY_VERSION, device=gpu.info(), started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  allocation=[], capacity=[], decode=[])
    models = [_model_and_layers(m, args.layers) for m in args.model]
    jobs = []
    if "allocation" not in args.skip:
        jobs += [("allocation", m, f) for m in models for f in args.kv_cache_dtype]
    if "capacity" not in args.skip:
        jobs += [("capacity", m, None) for m in models]
    if "decode" not in args.skip:
        # the reference path materialises fp32 copies: keep each case under 128K live tokens
        jobs += [("decode", f, (int(b), int(c))) for f in args.kv_cache_dtype for b in args.decode_batches
                 for c in args.decode_contexts if int(b) * int(c) <= 131072]
    for i, (kind, a, b) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {kind} {a} {b or ''}", file=sys.stderr, flush=True)
        try:
            if kind == "allocation":
                report["allocation"].append(measure_allocation(gpu, a[0], b, args.blocks, a[1], 16))
            elif kind == "capacity":
                for record in measure_capacity(gpu, a[0], a[1], args.gpu_memory_utilization,
                                               args.max_num_batched_tokens, 16, args.kv_cache_dtype):
                    target = "skipped" if "skipped" in record else "capacity"
                    report.setdefault(target, []).append(record)
            else:
                report["decode"].append(paged_decode_case(a, b[0], b[1], 32, 8, 128, 16, "cuda"))
        except KvsizeError as e:
            report.setdefault("skipped", []).append(dict(kind=kind, item=a, reason=str(e)))
        except Exception as e:  # keep measuring the rest; the report says what failed
            gpu.settle()
            report.setdefault("skipped", []).append(dict(kind=kind, item=a, reason=f"{type(e).__name__}: {e}"))
    report["seconds"] = round(time.time() - started, 1)
    write_report(Path(args.out), report)
    print(f"kvsize: wrote {args.out}", file=sys.stderr)
    skipped = report.get("skipped", [])
    for s in skipped:
        print(f"kvsize: warning: not measured: {s.get('kind', 'capacity')} {s.get('item') or s.get('model')} "
              f"{s.get('kv_cache_dtype', '')}: {s.get('reason') or s.get('skipped')}", file=sys.stderr)
    if skipped:
        print(f"kvsize: {len(skipped)} requested point(s) were not measured (the report's 'skipped' says why)",
              file=sys.stderr)
        return 1
    return 0


def build_replica(hf_config):
    """The model transformers builds for the config, on the meta device: with SDPA attention where the
    class offers it, else its eager attention (gpt-oss offers no SDPA); returns it and the implementation."""
    import torch
    from transformers import AutoModelForCausalLM

    for attention in ("sdpa", "eager"):
        try:
            with torch.device("meta"):
                return AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16,
                                                        attn_implementation=attention), attention
        except ValueError as e:
            if "does not support" not in str(e) or attention == "eager":
                raise
    raise AssertionError("unreachable")


def _model_and_layers(spec: str, default_layers: int | None) -> tuple[str, int | None]:
    """'qwen3-30b-a3b:12' -> the model cut to 12 layers."""
    name, _, layers = spec.partition(":")
    if layers and not layers.isdigit():
        raise KvsizeError(f"--model {spec!r}: the part after ':' must be a layer count")
    return name, int(layers) if layers else default_layers

"""`kvsize validate`: recompute every prediction in a measurement report with today's sizing."""

from __future__ import annotations

import json
import math
import sys

from sizing.errors import KvsizeError
from sizing.cache.layers import build_layout
from sizing.engines.memory import MIN_BLOCK_BYTES, SEGMENT_ROUNDING_BYTES, UNSPLIT_END_MAX_BYTES

from .bounds import ERROR_BOUNDS
from .run import REPORT_SCHEMA, model_shape, pool_tensor_sizes, predict_capacity, predicted_weight_tensors_bytes

# Relative tolerances per checked figure; storage must match to the byte.
TOLERANCES = {"storage_bytes": 0.0, "weights_bytes": 0.005, "num_blocks": 0.01,
              "transfer_seconds": 0.10}  # issue goal: the tier and P/D models within 10% of measured copies


def _rel(a: float, b: float) -> float:
    """Relative difference of a from b (absolute when b is 0); valid for bytes and seconds alike."""
    return abs(a - b) / abs(b) if b else abs(a)


def check_report(report: dict, tolerance: float | None = None) -> list[str]:
    """Every disagreement beyond tolerance, one line each; empty when the report agrees."""
    if not isinstance(report, dict):
        raise KvsizeError(f"not a kvsize measurement report: a JSON {type(report).__name__}, expected an object")
    if report.get("schema") != REPORT_SCHEMA:
        raise KvsizeError(f"not a kvsize measurement report (schema {report.get('schema')!r}, expected {REPORT_SCHEMA})")
    problems = _check_evidence(report)
    for p in report.get("allocation", []):
        from .tensors_math import layout_bytes

        _, shape = model_shape(p["model"], p.get("layers"))
        layout = build_layout(shape, p["kv_cache_dtype"], p["kv_cache_dtype"])
        predicted = layout_bytes(layout, p["num_blocks"], p["block_size"])
        tol = TOLERANCES["storage_bytes"] if tolerance is None else tolerance
        if _rel(p["storage_bytes"], predicted) > tol:
            problems.append(f"allocation {p['model']} {p['kv_cache_dtype']}: measured storage {p['storage_bytes']} B, "
                            f"predicted {predicted} B")
    for p in report.get("capacity", []):
        problems += _check_capacity(p, tolerance)
    for p in report.get("tensor_parallel", []):
        problems += _check_tensor_parallel(p, tolerance)
    for p in report.get("decode", []):
        # Softmax over long contexts amplifies key error (keys carry outlier channels): the output
        # bound is 5x the per-element bound of the format.
        bound = 5 * ERROR_BOUNDS[p["format"]] if tolerance is None else tolerance
        if p["attention_rel_error"] > bound:
            problems.append(f"decode {p['format']} b{p['batch']} ctx{p['context']}: attention error "
                            f"{p['attention_rel_error']:.4f} > bound {bound}")
    problems += _check_kernels(report, tolerance)
    problems += _check_transfers(report, tolerance)
    return problems


# The caching allocator takes memory from CUDA in whole segments of 2 MiB pages (SEGMENT_ROUNDING_BYTES), and
# NVML counts them; a large block keeps at most one segment's unsplittable end.


def _check_evidence(report: dict) -> list[str]:
    """A report of allocation or capacity points (measure/run.py) holds what only a real NVIDIA GPU
    gives: a device kvsize bundles, named by the driver, its CUDA and NVML totals those of that GPU,
    and beside each figure the torch and NVML readings it came from. One line for each that is missing
    or could not have been read: a report computed without a GPU, or with NVML reading another GPU
    than torch's, is rejected however well its figures agree."""
    from sizing.profiles import gpu_profile, matching_gpus

    if not (report.get("allocation") or report.get("capacity")):
        return []
    device = report.get("device") if isinstance(report.get("device"), dict) else {}
    name, total, nvml_total = device.get("name"), device.get("total_bytes"), device.get("nvml_total_bytes")
    gpus = [gpu_profile(g) for g in matching_gpus(name=name)] if isinstance(name, str) and \
        name.startswith("NVIDIA ") else []
    problems = []
    if not gpus:
        problems.append(f"device {name!r} is no NVIDIA GPU kvsize bundles (kvsize gpus): the report was not "
                        "measured on one")
    if not (isinstance(device.get("driver"), str) and device["driver"]) or not isinstance(nvml_total, int):
        problems.append(f"device {name!r} has no NVIDIA driver version or NVML total: nothing was read through NVML")
    if gpus and not any(g.memory_bytes == total for g in gpus):
        problems.append(f"device {name!r}: CUDA's total {total} B is not the bundled GPU's "
                        f"({', '.join(f'{g.name} {g.memory_bytes} B' for g in gpus)})")
    if gpus and isinstance(nvml_total, int) and not any(g.nvml_memory_mib * 2**20 == nvml_total for g in gpus):
        problems.append(f"device {name!r}: NVML's total {nvml_total} B is not the bundled GPU's "
                        f"({', '.join(f'{g.name} {g.nvml_memory_mib} MiB' for g in gpus)})")
    for p in report.get("allocation", []):
        where = f"allocation {p['model']} {p['kv_cache_dtype']}"
        allocated, reserved, nvml = p.get("allocated_delta_bytes"), p.get("reserved_delta_bytes"), \
            p.get("nvml_delta_bytes")
        if not (isinstance(allocated, int) and isinstance(reserved, int)) or allocated < p["storage_bytes"] or \
                reserved % SEGMENT_ROUNDING_BYTES:
            problems.append(f"{where}: no torch allocator reading (allocated {allocated} B, reserved {reserved} B "
                            f"for {p['storage_bytes']} B of tensors in whole {SEGMENT_ROUNDING_BYTES} B segments)")
        elif not isinstance(nvml, int) or abs(nvml - reserved) > SEGMENT_ROUNDING_BYTES:
            problems.append(f"{where}: NVML saw {nvml} B taken while torch reserved {reserved} B: NVML read "
                            "another GPU, or none")
    for p in report.get("capacity", []):
        where = f"capacity {p['model']} ({p.get('layers') or 'all'} layers) {p['kv_cache_dtype']}"
        m, b = p["measured"], p["boundary"]
        if p["total_bytes"] != total:
            problems.append(f"{where}: sized for a total of {p['total_bytes']} B on a device of {total} B")
        if not isinstance(p.get("nvml_before_bytes"), int) or p["nvml_before_bytes"] <= 0:
            problems.append(f"{where}: no NVML reading before the replica was built")
        if m["non_torch_bytes"] <= 0:
            problems.append(f"{where}: {m['non_torch_bytes']} B outside torch, where a CUDA context alone holds "
                            "hundreds of MiB: NVML read another GPU, or none")
        reserved_peak = b.get("peak_reserved_bytes")
        if not isinstance(reserved_peak, int) or reserved_peak % SEGMENT_ROUNDING_BYTES or \
                b["peak_reserved_bytes"] < b["peak_allocated_bytes"]:
            problems.append(f"{where}: torch's reserved peak {b.get('peak_reserved_bytes')} B is not whole "
                            f"{SEGMENT_ROUNDING_BYTES} B segments holding the allocated peak "
                            f"{b['peak_allocated_bytes']} B")
        _, shape = model_shape(p["model"], p.get("layers"))
        today = predict_capacity(p["model"], shape, p["total_bytes"], p["gpu_memory_utilization"],
                                 p["max_num_batched_tokens"], p["block_size"], p["kv_cache_dtype"],
                                 m["non_torch_bytes"]).breakdown
        stored = p.get("predicted", {})
        measured = (m["weights_bytes"], m["activation_bytes"])
        if measured in ((today.weights_bytes, today.activation_bytes),
                        (stored.get("weights_bytes"), stored.get("activation_bytes"))):
            problems.append(f"{where}: the measured weights and activation are kvsize's prediction to the byte: "
                            "written, not read from a GPU")
    return problems


def _check_transfers(report: dict, tolerance: float | None) -> list[str]:
    """Paged offload/reload and layer-wise peer sends against the link model fitted on the report's
    contiguous sweeps (sizing/planners/tiers.py); each point's bytes must be what its layout holds."""
    from sizing.planners.tiers import host_transfer_from_report, layered_send_seconds, peer_link_from_report

    tol = TOLERANCES["transfer_seconds"] if tolerance is None else tolerance
    problems = []
    if report.get("host_paged"):
        model = host_transfer_from_report(report, "report")
        for p in report["host_paged"]:
            _, shape = model_shape(p["model"], None)
            layout = build_layout(shape, p["format"], p["format"])
            block_bytes = sum(spec.page_bytes(p["block_size"]) for spec in layout.kv.values())
            where = f"host {p['direction']} {p['format']} block {p['block_size']} x {p['blocks']}"
            if (p["block_bytes"], p["bytes"]) != (block_bytes, p["blocks"] * block_bytes):
                problems.append(f"{where}: {p['bytes']} B recorded, the layout holds {p['blocks'] * block_bytes} B")
                continue
            predicted = (model.offload_seconds if p["direction"] == "d2h" else model.reload_seconds)(p["bytes"])
            if _rel(predicted, p["seconds"]) > tol:
                problems.append(f"{where}: measured {p['seconds'] * 1e3:.3f} ms, predicted {predicted * 1e3:.3f} ms")
    if report.get("peer_layered"):
        link = peer_link_from_report(report, "report")
        for p in report["peer_layered"]:
            _, shape = model_shape(p["model"], None)
            layout = build_layout(shape, p["format"], p["format"])
            layer_bytes = [sum(spec.bytes_for(p["tokens"])) for spec in layout.kv.values()]
            where = f"peer {p['format']} {p['tokens']} tokens"
            if (p["bytes"], p["layers"]) != (sum(layer_bytes), len(layer_bytes)):
                problems.append(f"{where}: {p['bytes']} B in {p['layers']} sends recorded, the layout holds "
                                f"{sum(layer_bytes)} B in {len(layer_bytes)}")
                continue
            predicted = layered_send_seconds(link, layer_bytes)
            if _rel(predicted, p["seconds"]) > tol:
                problems.append(f"{where}: measured {p['seconds'] * 1e3:.3f} ms, predicted {predicted * 1e3:.3f} ms")
    return problems


def _check_capacity(p: dict, tolerance: float | None) -> list[str]:
    """A version-2 capacity point: the derived pool follows from the measured figures by vLLM's rule
    and kvsize's pool (recomputed here, exactly), the prediction is within tolerance of it, and the
    boundary held on the GPU."""
    _, shape = model_shape(p["model"], p.get("layers"))
    m, d = p["measured"], p["derived"]
    where = f"capacity {p['model']} ({p.get('layers') or 'all'} layers) {p['kv_cache_dtype']}"
    args = (p["model"], shape, p["total_bytes"], p["gpu_memory_utilization"], p["max_num_batched_tokens"],
            p["block_size"], p["kv_cache_dtype"], m["non_torch_bytes"])
    available = int(p["total_bytes"] * p["gpu_memory_utilization"]) - m["non_torch_bytes"] - m["weights_bytes"] \
        - m["activation_bytes"]
    again = predict_capacity(*args, available)
    problems = []
    if (available, again.num_blocks) != (d["kv_budget_bytes"], d["num_blocks"]):
        problems.append(f"{where}: the derived pool ({d['kv_budget_bytes']} B, {d['num_blocks']} blocks) does not "
                        f"follow from the measured figures ({available} B, {again.num_blocks} blocks)")
    # every derived figure follows exactly from the measured ones
    for name, want, got in (("block_bytes", d["block_bytes"], again.block_bytes),
                            ("kv_cache_tokens", d["kv_cache_tokens"], again.max_tokens)):
        if want != got:
            problems.append(f"{where}: derived {name} {want} does not follow from the measured figures ({got})")
    predicted = predict_capacity(*args)
    # a stored prediction is today's within the prediction tolerance (sizing may have moved since; the
    # activation term is left out: the real-engine starts revise it, and the pool it leaves is checked)
    stored = p.get("predicted", {})
    for name, got in (("weights_bytes", predicted.breakdown.weights_bytes), ("num_blocks", predicted.num_blocks),
                      ("kv_budget_bytes", predicted.kv_budget_bytes),
                      ("weights_tensor_bytes", predicted_weight_tensors_bytes(shape))):
        tol = TOLERANCES["num_blocks"] if tolerance is None else tolerance
        if name in stored and _rel(stored[name], got) > tol:
            problems.append(f"{where}: the stored prediction {name} {stored[name]} is not kvsize's ({got})")
    problems += _check_weight_tensors(p, where)
    # the replica's tensors against kvsize's (the allocator's count of vLLM's merged tensors left out);
    # where the report reads them apart from the allocator's figure (capacity version 3), against those
    weights = m.get("weights_tensor_bytes", m["weights_bytes"])
    for name, want, got in (("weights_bytes", weights, predicted_weight_tensors_bytes(shape)),
                            ("num_blocks", d["num_blocks"], predicted.num_blocks)):
        tol = TOLERANCES[name] if tolerance is None else tolerance
        if _rel(got, want) > tol:
            problems.append(f"{where}: {name} predicted {got}, {'measured' if name == 'weights_bytes' else 'derived'} "
                            f"{want} ({100 * _rel(got, want):.2f}% > {100 * tol:.2f}%)")
    b = p["boundary"]
    # peak = weights + pool + activation + the allocator's tails (a segment's unsplittable end goes
    # with its block: at most 2 MiB for each pool tensor and for the forward pass), which vLLM's rule
    # does not count either. The forward pass must need no more with the pool held than alone.
    for label, blocks, peak in (("the derived pool", d["num_blocks"], b["peak_allocated_bytes"]),
                                ("a pool 2% larger", d["num_blocks"] + b["two_percent_more_blocks"],
                                 b["peak_allocated_two_percent_more_bytes"])):
        sizes = pool_tensor_sizes(again.pool, again.layout, blocks)
        tails = peak - m["weights_bytes"] - sum(sizes) - m["activation_bytes"]
        if not 0 <= tails <= (len(sizes) + 1) * SEGMENT_ROUNDING_BYTES:
            problems.append(f"{where}: with {label} held the peak was {tails:+} B beyond weights, pool and "
                            f"activation: more than the allocator's segment tails")
        inside = peak - tails <= b["limit_bytes"]
        if label == "the derived pool" and not inside:
            problems.append(f"{where}: the derived pool and a forward pass need {peak - tails} B, above the limit "
                            f"{b['limit_bytes']} B")
        if label != "the derived pool" and inside:
            problems.append(f"{where}: a pool 2% larger stays within the limit: the boundary is not where the rule "
                            "puts it")
    return problems


# PyTorch's caching allocator rounds a request up to 512 B (kMinBlockSize) and gives a block the rest of
# what it was cut from when too little is left to split: under 512 B in the small pool (requests up to
# 1 MiB, kSmallSize), up to 1 MiB in the large pool (sizing/engines/memory.py holds the allocator's constants).


def allocator_slack_bytes(size: int) -> int:
    """The most the caching allocator can count for one tensor of `size` bytes beyond its size."""
    rounded = max(MIN_BLOCK_BYTES, -(-size // MIN_BLOCK_BYTES) * MIN_BLOCK_BYTES)
    unsplit = MIN_BLOCK_BYTES - 1 if rounded <= UNSPLIT_END_MAX_BYTES else UNSPLIT_END_MAX_BYTES
    return rounded - size + unsplit


def _check_weight_tensors(p: dict, where: str) -> list[str]:
    """The weight tensors' bytes are the sum of the sizes recorded, and the allocator's figure exceeds
    them by no more than its rounding and unsplit ends can add."""
    m = p["measured"]
    if "weights_tensor_bytes" not in m:
        return []
    sizes = p.get("weight_tensor_sizes_bytes")
    if not isinstance(sizes, list) or not sizes or not all(isinstance(s, int) and s > 0 for s in sizes):
        return [f"{where}: weights_tensor_bytes is given without the size of each weight tensor"]
    if sum(sizes) != m["weights_tensor_bytes"]:
        return [f"{where}: the {len(sizes)} weight tensors hold {sum(sizes)} B, not the "
                f"{m['weights_tensor_bytes']} B recorded"]
    slack = sum(allocator_slack_bytes(s) for s in sizes)
    rounding = m["weights_bytes"] - m["weights_tensor_bytes"]
    if not 0 <= rounding <= slack:
        return [f"{where}: the allocator counted {rounding:+} B beyond the weight tensors; its rounding and "
                f"unsplit ends allow 0 to {slack} B"]
    return []


# vLLM holds two NCCL communicators per tensor-parallel group (torch's device group and its own
# PyNcclCommunicator: vllm/distributed/parallel_state.py, device_communicators/cuda_communicator.py).
VLLM_COMMUNICATORS = 2
# The last releases whose non-torch figure holds the communicators: from 0.21 vLLM takes its memory snapshot after
# NCCL's setup (v1/worker/gpu_worker.py init_device), so their buffers fall outside the budget it reports
# (profiles/engines/vllm-0.21-0.25.json 'non_torch').
COMMUNICATORS_COUNTED = "vllm@0.19"
NON_TORCH_TOLERANCE_BYTES = 2**28  # 0.25 GiB


def _check_tensor_parallel(p: dict, tolerance: float | None) -> list[str]:
    """One rank of a tensor-parallel run: weights within 0.5% of kvsize's per-GPU share, the page the
    rank's KV heads hold per layer exactly kvsize's, the pool exactly num_blocks pages, the pool and a
    forward pass within the limit apart from the allocator's tails, and kvsize's non-torch figure of the releases
    that count the communicators within 0.25 GiB of one TP-1 process's plus vLLM's two communicators as measured."""
    _, shape = model_shape(p["model"], p.get("layers"))
    m, d = p["measured"], p["derived"]
    where = f"tensor parallel {p['model']} TP {p['tensor_parallel_size']} rank {p['rank']} {p['kv_cache_dtype']}"
    tp = p["tensor_parallel_size"]
    run = (p["model"], shape, p["total_bytes"], p["gpu_memory_utilization"], p["max_num_batched_tokens"], 16,
           p["kv_cache_dtype"])
    e = predict_capacity(*run, m["non_torch_bytes"], tp=tp)
    problems = []
    tol = TOLERANCES["weights_bytes"] if tolerance is None else tolerance
    if _rel(e.breakdown.weights_bytes, m["weights_bytes"]) > tol:
        problems.append(f"{where}: weights predicted {e.breakdown.weights_bytes}, measured {m['weights_bytes']}")
    page = e.block_bytes // max(1, len(e.layout.kv))
    if page != m["kv_page_bytes_per_layer"]:
        problems.append(f"{where}: a layer's page is {m['kv_page_bytes_per_layer']} B on this rank, kvsize says {page} B")
    available = int(p["total_bytes"] * p["gpu_memory_utilization"]) - m["non_torch_bytes"] - m["weights_bytes"] \
        - m["activation_bytes"]
    derived = predict_capacity(*run, m["non_torch_bytes"], available, tp=tp)
    if (available, derived.num_blocks, derived.num_blocks * derived.block_bytes) != \
            (d["kv_budget_bytes"], d["num_blocks"], d["pool_bytes"]):
        problems.append(f"{where}: the derived pool does not follow from the measured figures")
    tails = m["pool_peak_allocated_bytes"] - m["weights_bytes"] - d["pool_bytes"] - m["activation_bytes"]
    tensors = len(pool_tensor_sizes(derived.pool, derived.layout, d["num_blocks"]))
    if not 0 <= tails <= (tensors + 1) * SEGMENT_ROUNDING_BYTES:
        problems.append(f"{where}: the pool and a forward pass peaked {tails:+} B beyond their terms")
    if m["pool_peak_allocated_bytes"] - tails > p["limit_bytes"]:
        problems.append(f"{where}: the derived pool and a forward pass exceed the limit")
    steps = m["non_torch_steps"]
    communicator = steps["after_first_all_reduce"] - steps["cuda_context"]
    vllm = predict_capacity(*run, None, tp=tp, engine=COMMUNICATORS_COUNTED).breakdown.non_torch_bytes
    single = predict_capacity(*run, None, engine=COMMUNICATORS_COUNTED).breakdown.non_torch_bytes
    composed = single + VLLM_COMMUNICATORS * communicator
    if abs(vllm - composed) > NON_TORCH_TOLERANCE_BYTES:
        problems.append(f"{where}: kvsize's {COMMUNICATORS_COUNTED} non-torch {vllm} B is more than 0.25 GiB from "
                        f"one process's {single} B plus {VLLM_COMMUNICATORS} communicators of {communicator} B")
    return problems


# Kernel time against sizing's attention_seconds (overhead + bytes over the fitted bandwidth +
# per-sequence and per-context-token terms, fitted per format on every grid point): the goal is
# 10%, met on 175 of the 176 points of the committed main report (the miss: bf16 at batch 4 x 4K,
# 34 us, 11.0%). The KIVI window report, from before KIVI's splits shared the fp16
# recent window by weight, has KIVI-4 at batch 4 x 4K tokens 15.0% above the model: the split
# holding the window ran longest. The check holds the committed reports to what they meet, so a
# change to sizing's time formula or a report that fits worse fails here.
KERNEL_TIME_TOLERANCE = 0.15
KERNEL_MEDIAN_BIAS = 0.05


def _check_kernels(report: dict, tolerance: float | None) -> list[str]:
    """Kernel points: output within the kernel tolerance of fp32 over the dequantized cache and
    within 5x the format's bound of fp32 over the original values; bytes read equal to sizing's
    layout; time within KERNEL_TIME_TOLERANCE of sizing's attention_seconds with the report's
    fitted efficiency (points in the fitted batch range)."""
    from sizing.cache.formats import FormatOptions
    from sizing.efficiency import efficiency_from_report, efficiency_section
    from sizing.planners.speed import attention_seconds

    from .bounds import KIVI_RESIDUAL, kernel_tolerance

    points = report.get("kernels", []) + report.get("kernel_extras", [])
    if not points:
        return []
    problems = []
    signed: dict[str, list[float]] = {}
    eff = efficiency_from_report(report, "report") if "decode_efficiency" in report else None
    section = efficiency_section(report, "report") if eff is not None else None
    _, shape = model_shape("llama-3.1-8b", 1)  # 8 KV heads of 128: the grid's shape, one layer
    for p in points:
        where = f"kernel {p['format']} b{p['batch']} ctx{p['context']} d{p['head_dim']}" + (
            " mla" if p.get("mla") else "") + (f" w{p['window']}" if p.get("window") else "")
        if p["kernel_rel_error"] > (tolerance if tolerance is not None else kernel_tolerance(p.get("config"))):
            problems.append(f"{where}: kernel error {p['kernel_rel_error']:.2e} against fp32 over the same cache")
        bound = 5 * ERROR_BOUNDS[p["format"]] if tolerance is None else tolerance
        if p.get("attention_rel_error") is not None and p["attention_rel_error"] > bound:
            problems.append(f"{where}: attention error {p['attention_rel_error']:.4f} > bound {bound}")
        # figures derived from the measured time follow from it exactly (a time changed alone is caught)
        if p.get("achieved_gb_s") is not None and p.get("median_ms"):
            achieved = p["bytes_read"] / (p["median_ms"] / 1e3) / 1e9
            if _rel(p["achieved_gb_s"], achieved) > 1e-6:
                problems.append(f"{where}: achieved {p['achieved_gb_s']:.2f} GB/s does not follow from "
                                f"{p['bytes_read']} B in {p['median_ms']} ms ({achieved:.2f} GB/s)")
            copy = report.get("copy_bandwidth_gb_s")
            if copy and p.get("pct_of_copy") is not None and _rel(p["pct_of_copy"], 100 * achieved / copy) > 1e-6:
                problems.append(f"{where}: {p['pct_of_copy']:.2f}% of the copy bandwidth does not follow from the "
                                f"measured time ({100 * achieved / copy:.2f}%)")
        plain_grid = p["head_dim"] == 128 and p["kv_heads"] == 8 and not p.get("window") and not p.get("mla")
        if plain_grid:
            options = FormatOptions(kivi_group=p["block_size"], kivi_residual=KIVI_RESIDUAL)
            layout = build_layout(shape, p["format"], p["format"], options=options)
            expected = p["batch"] * sum(layout.sequence_bytes(p["context"])) + layout.layer_bytes()
            if expected != p["bytes_read"]:
                problems.append(f"{where}: kernel read {p['bytes_read']} B, sizing's layout holds {expected} B")
        if eff is not None and p in report.get("kernels", []) and p["format"] in eff.kv and \
                p["batch"] >= section.fitted_on_batch_at_least:
            predicted = attention_seconds(p["bytes_read"], section.reference_bandwidth_gb_s, eff, p["format"],
                                          sequences=p["batch"], context_tokens=p["context"])
            measured = p["median_ms"] / 1e3
            tol = KERNEL_TIME_TOLERANCE if tolerance is None else tolerance
            error = _rel(predicted, measured)
            signed.setdefault(p["format"], []).append(predicted / measured - 1)
            if error > tol:
                problems.append(f"{where}: predicted {predicted * 1e3:.3f} ms, measured {measured * 1e3:.3f} ms "
                                f"({100 * error:.1f}% > {100 * tol:.0f}%)")
    # A fit is unbiased over its own points: times changed after fitting (a copy with every time
    # raised 10%) move the median error of every format.
    for fmt, errors in signed.items():
        middle = sorted(errors)[len(errors) // 2]
        if len(errors) >= 3 and abs(middle) > KERNEL_MEDIAN_BIAS:
            problems.append(f"kernels {fmt}: the report's own fit is off by {100 * middle:+.1f}% at the median of "
                            f"its {len(errors)} points (more than {100 * KERNEL_MEDIAN_BIAS:.0f}%): times and fit disagree")
    return problems


MAX_REPORT_BYTES = 64 * 2**20
POINT_SECTIONS = ("allocation", "capacity", "decode", "kernels", "kernel_extras", "tensor_parallel", "host_paged",
                  "peer_layered")


def _leaves(value, where: str = ""):
    """Every (path, key, leaf) of a report, depth first in the file's order (key: the field's name, or None in a
    list)."""
    if isinstance(value, dict):
        for key, item in value.items():
            path = f"{where}.{key}" if where else str(key)
            if isinstance(item, (dict, list)):
                yield from _leaves(item, path)
            else:
                yield path, key, item
    elif isinstance(value, list):
        for i, item in enumerate(value):
            if isinstance(item, (dict, list)):
                yield from _leaves(item, f"{where}[{i}]")
            else:
                yield f"{where}[{i}]", None, item
    else:
        yield where or "(top)", None, value


def _non_finite(value) -> list[str]:
    """Paths of NaN or infinite numbers anywhere in the report."""
    return [p for p, _, leaf in _leaves(value) if isinstance(leaf, float) and not math.isfinite(leaf)]


def read_report(path: str) -> dict:
    """A report file through the one bounded reader (a device or pipe is refused, not read forever)."""
    from pathlib import Path

    from sizing.inputs import read_limited

    data = read_limited(Path(path), MAX_REPORT_BYTES, "REPORT", "a kvsize report (JSON)")
    try:
        report = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as e:
        raise KvsizeError(f"cannot read report {path}: not JSON ({e})") from None
    except ValueError:  # Python refuses integers of more than 4,300 digits
        raise KvsizeError(f"report {path} holds a number too long to be a measurement") from None
    if _depth(report) > MAX_REPORT_DEPTH:
        raise KvsizeError(f"report {path} nests more than {MAX_REPORT_DEPTH} levels; a measurement report is far "
                          "flatter")
    return report


MAX_REPORT_DEPTH = 32  # reports are 5 levels deep; deeper ones are refused before anything walks them


def _depth(value) -> int:
    """How deeply lists and objects nest, counted without recursion."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, (dict, list)):
            deepest = max(deepest, level)
            if deepest > MAX_REPORT_DEPTH:
                return deepest
            stack.extend((child, level + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


# Fields of a point that name what was measured: never null in a report kvsize wrote.
NON_NULL_FIELDS = frozenset({"model", "kv_cache_dtype", "format", "kernel", "direction", "gpu"})


def _first_null(value, fields: frozenset[str]) -> str | None:
    """The path of the first null among `fields` in the report, or None."""
    return next((p for p, key, leaf in _leaves(value) if leaf is None and key in fields), None)


# The problems `checked` finds in a report that is not one, as against a figure that disagrees.
MALFORMED_PREFIXES = ("not a kvsize measurement report", "non-finite number at", "the report has no device",
                      "the report holds no points", "a point lacks the field", "a point holds a value of the wrong kind",
                      "report.", "a point holds a zero")


# a field with one of these endings holds a measured or derived number (JSON true and false would pass Python's
# arithmetic as 1 and 0)
NUMBER_ENDINGS = ("_ms", "_bytes", "_s", "_gb_s", "_mib", "_pct", "_error", "tokens", "batch", "context", "seconds",
                  "blocks", "count", "bytes", "transfers", "heads", "head_dim", "block_size", "utilization")
FLAG_FIELDS = frozenset({"split_bytes"})  # a kernel configuration's switch (measure/kernel_bench.py), not a size


def _booleans_for_numbers(value) -> list[str]:
    return [f"report.{p}" for p, key, leaf in _leaves(value) if isinstance(leaf, bool) and isinstance(key, str)
            and key.endswith(NUMBER_ENDINGS) and key not in FLAG_FIELDS]


def checked(report, tolerance: float | None) -> list[str]:
    """check_report, with a malformed report's first missing or mistyped field named instead of raised."""
    if tolerance is not None and not (math.isfinite(tolerance) and tolerance >= 0):
        raise KvsizeError(f"--tolerance must be a finite fraction of at least 0, got {tolerance}")
    if not isinstance(report, dict):
        return [f"not a kvsize measurement report: a JSON {type(report).__name__}, expected an object"]
    bad = _non_finite(report)
    if bad:
        return [f"non-finite number at {p}" for p in bad[:5]]
    flags = _booleans_for_numbers(report)
    if flags:
        return [f"{p} is true or false where a measured number belongs" for p in flags[:5]]
    if not isinstance(report.get("device"), dict) or "name" not in report["device"]:
        return ["the report has no device (name of the GPU it was measured on)"]
    if not any(isinstance(report.get(k), list) and report[k] for k in POINT_SECTIONS):
        return [f"the report holds no points (none of {', '.join(POINT_SECTIONS)})"]
    try:
        return check_report(report, tolerance)
    except KeyError as e:
        return [f"a point lacks the field {e.args[0]!r}"]
    except ArithmeticError:
        return ["a point holds a zero where a measured time, size or bandwidth divides (nothing measured takes "
                "no time or holds no bytes)"]
    except (TypeError, ValueError, AttributeError) as e:
        where = _first_null(report, NON_NULL_FIELDS)
        if where:
            return [f"a point holds a value of the wrong kind ({where} is null; it names what was measured)"]
        return [f"a point holds a value of the wrong kind ({e})"]


def report_problems(report: dict, tolerance: float | None = None) -> list[str]:
    """Every failed check of a report of either kind: a kvsize verify report (a real vLLM start, re-read from
    its log) or a measurement report (`checked`)."""
    from .llamacpp import buffers as llamacpp_buffers
    from .llamacpp import report as llamacpp_report
    from .verify import VERIFY_SCHEMA
    from .verify import problems as verify_problems

    # llama.cpp loads on a CPU (their KV caches; the full-size loads' model, output and compute buffers), re-read
    # from their raw lines
    for schema, check, kind in ((llamacpp_report.SCHEMA, llamacpp_report.problems, "load"),
                                (llamacpp_buffers.SCHEMA, llamacpp_buffers.problems, "buffers")):
        if report.get("schema") == schema:
            try:
                return check(report)
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                return [f"a malformed llama.cpp {kind} report ({e!r})"]
    if report.get("schema") == VERIFY_SCHEMA:
        try:
            return verify_problems(report)
        except KvsizeError as e:
            return [f"a malformed verify report: {e}"]
        except (KeyError, TypeError, ValueError) as e:
            return [f"a malformed verify report ({e!r})"]
    return checked(report, tolerance)


def validate_files(paths: list[str], tolerance: float | None = None) -> int:
    """0 when every report agrees, 1 when a check fails; a report that is not one (malformed, a field
    missing or of the wrong kind) is refused in one line (exit 2)."""
    from .llamacpp import buffers as llamacpp_buffers
    from .llamacpp import report as llamacpp_report
    from .verify import VERIFY_SCHEMA

    failed = 0
    for path in paths:
        report = read_report(path)
        if not isinstance(report, dict):
            raise KvsizeError(f"{path}: not a kvsize measurement report: a JSON {type(report).__name__}, expected an object")
        problems = report_problems(report, tolerance)
        # reports re-read from a real engine's own lines: every problem is a disagreement, none a malformed point
        agreed = {llamacpp_report.SCHEMA: lambda r: f"{len(r['loads'])} llama.cpp loads agree",
                  llamacpp_buffers.SCHEMA: lambda r: f"{len(r['loads'])} full-size llama.cpp loads' buffers agree",
                  VERIFY_SCHEMA: lambda r: "the real vLLM start agrees within 1%"}.get(report.get("schema"))
        if agreed is not None:
            for line in problems:
                print(f"{path}: {line}", file=sys.stderr)
            failed += bool(problems)
            if not problems:
                print(f"{path}: {agreed(report)} ({report['device']['name']})")
            continue
        malformed = [p for p in problems if p.startswith(MALFORMED_PREFIXES)]
        if malformed:
            raise KvsizeError(f"{path}: {malformed[0]}")
        points = sum(len(report.get(k, [])) for k in POINT_SECTIONS)
        if problems:
            failed += 1
            for line in problems:
                print(f"{path}: {line}", file=sys.stderr)
        else:
            skipped = report.get("skipped") or []
            if skipped:
                failed += 1
                print(f"{path}: {points} points agree ({report['device']['name']}); {len(skipped)} requested "
                      f"point(s) were not measured (the report's 'skipped' says why)", file=sys.stderr)
            else:
                print(f"{path}: {points} points agree ({report['device']['name']})")
    return 1 if failed else 0

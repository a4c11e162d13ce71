"""Predicted against logged for a file of engine-log rows (one run a line, as tests/fixtures/engine-logs)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import KvsizeError
from ..capacity.scenario import Scenario
from ..capacity.estimate import estimate
from ..profiles import gpu_profile, load_model
from ..units import GiB


@dataclass(frozen=True)
class LogRowCheck:
    id: str
    predicted_kv_bytes: int
    logged_kv_gib: float
    predicted_tokens: int
    logged_tokens: int

    @property
    def kv_error(self) -> float:
        return self.predicted_kv_bytes / GiB / self.logged_kv_gib - 1

    @property
    def tokens_error(self) -> float:
        return self.predicted_tokens / self.logged_tokens - 1


def _row_gpu(row: dict):
    """The bundled GPU the row ran on: the one whose model its name gives and whose CUDA total is the
    one the engine logged (an H100's SXM, PCIe and NVL parts differ), never a guess."""
    from ..profiles import matching_gpus

    total = row.get("total_memory_gib")
    # the logged total is printed to two decimals
    found = matching_gpus(name=row["gpu"], total_bytes=round(total * GiB), total_slack_bytes=GiB // 50) \
        if total is not None else []
    if found:
        return gpu_profile(found[0])
    raise KvsizeError(f"the row's GPU {row['gpu']!r} with {total} GiB matches no bundled GPU profile")


def row_scenario(row: dict, configs: Path) -> Scenario:
    """The logged run as a scenario: its config, GPU total, release and settings."""
    name, shape = load_model(str(configs / Path(row["config"]).name))
    gpu = _row_gpu(row)
    fp32 = row["kv_cache_dtype"] == "fp32"  # the run served the model with --dtype float32
    kv = "auto" if fp32 else row["kv_cache_dtype"]
    return Scenario(
        name, shape, gpu.name, gpu.memory_bytes, engine=f"vllm@{row['vllm_version']}", k_cache_dtype=kv,
        v_cache_dtype=kv, tensor_parallel_size=row["tp"], pipeline_parallel_size=row["pp"],
        max_model_len=row["max_model_len"], memory_fraction=row["gpu_memory_utilization"],
        weights_dtype="fp32" if fp32 else (row["weights_dtype"] or "auto"), dtype="float32" if fp32 else "auto",
        max_num_batched_tokens=row["max_num_batched_tokens"], max_num_seqs=row["max_num_seqs"],
        gpu_multiprocessors=gpu.multiprocessors, gpu_nvml_mib=gpu.nvml_memory_mib, gpu_architecture=gpu.architecture,
    )


def check_rows(path: Path, configs: Path) -> list[LogRowCheck]:
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        e = estimate(row_scenario(row, configs))
        budget = e.printed_kv_budget_bytes
        out.append(LogRowCheck(row["id"], budget, row["available_kv_gib"], e.max_tokens, row["kv_cache_tokens"]))
    return out

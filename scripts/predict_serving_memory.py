"""kvsize's memory figures for every server of a planned serving batch (measure/serving/plan.json) on a GPU, written
before the batch runs: measure/serving/<batch>-memory-predictions-<gpu>.json.

Each server's `vllm serve` prints its KV budget and tokens at startup; tests/test_serving_server_logs.py holds these
committed figures to what it printed once the batch has run (predicted before seen), beside check-log's figures of
today. An existing file is never rewritten: predictions are made once, before.

usage: python scripts/predict_serving_memory.py h200 BATCH ...   (the servers of each batch that have not run)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sizing.capacity.estimate import estimate  # noqa: E402
from sizing.capacity.scenario import Scenario  # noqa: E402
from sizing.profiles import gpu_profile, load_model  # noqa: E402

SERVING = ROOT / "measure" / "serving"
SCHEMA = "kvsize.serving-memory-predictions/1"


def server_scenario(plan: dict, server: dict, gpu: str) -> Scenario:
    """The server's settings as a kvsize scenario: what `kvsize estimate` sizes for its `vllm serve` command."""
    name, shape = load_model(str(ROOT / server["config"]))
    g = gpu_profile(gpu)
    kv = server["kv_cache_dtype"]
    return Scenario(name, shape, g.name, g.memory_bytes, engine=f"vllm@{plan['vllm_version']}", k_cache_dtype=kv,
                    v_cache_dtype=kv, tensor_parallel_size=server["tensor_parallel_size"],
                    max_model_len=server["max_model_len"], memory_fraction=server["gpu_memory_utilization"],
                    max_num_batched_tokens=server["max_num_batched_tokens"], max_num_seqs=server["max_num_seqs"],
                    max_cudagraph_capture_size=server.get("max_cudagraph_capture_size"),
                    gpu_multiprocessors=g.multiprocessors, gpu_nvml_mib=g.nvml_memory_mib,
                    gpu_architecture=g.architecture)


def predicted(plan: dict, server: dict, gpu: str) -> dict:
    e = estimate(server_scenario(plan, server, gpu))
    b = e.breakdown
    return {"server": server["tag"], "weights_bytes": b.weights_bytes, "activation_bytes": b.activation_bytes,
            "non_torch_bytes": b.non_torch_bytes, "cuda_graph_bytes": b.cuda_graph_bytes,
            "kv_budget_bytes": e.kv_budget_bytes, "kv_tokens": e.max_tokens}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__.split("usage:")[1].strip(), file=sys.stderr)
        return 2
    gpu, named = argv[0], argv[1:]
    plan = json.loads((SERVING / "plan.json").read_text())
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    for batch in named:
        if batch not in plan["batches"]:
            print(f"no batch {batch!r} in plan.json", file=sys.stderr)
            return 2
        out = SERVING / f"{batch}-memory-predictions-{gpu}.json"
        if out.exists():
            print(f"{out.relative_to(ROOT)} exists: predictions are made once, before the batch runs", file=sys.stderr)
            continue
        # a server that has already run is not predicted: its log was seen
        servers = [predicted(plan, s, gpu) for s in plan["servers"] if s["batch"] == batch
                   and not (SERVING / batch / s["tag"] / "server.log").exists()]
        if not servers:
            print(f"{batch}: every server has run; nothing to predict", file=sys.stderr)
            continue
        part = out.with_suffix(".json.part")
        part.write_text(json.dumps({"schema": SCHEMA, "batch": batch, "gpu": gpu, "code": commit,
                                    "servers": servers}, indent=1) + "\n")
        part.replace(out)
        print(f"wrote {out.relative_to(ROOT)} ({len(servers)} servers)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

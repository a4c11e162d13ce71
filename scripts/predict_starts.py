"""Write kvsize's predictions of a batch of starts before the batch runs (predicted before seen).

usage: python scripts/predict_starts.py PLAN.json GPU BATCH > tests/fixtures/vllm-starts/predictions/BATCH.jsonl
PLAN.json is what scripts/vllm_corpus_plan.py writes; GPU the bundled id the batch will run on (h100-sxm, h200).
Each line names the start as the corpus will (GPU-release-model), the code it was predicted with, and kvsize's
terms as the engine prints them: the weights, the CUDA-graph estimate, the profiling peak, the non-torch memory and
the KV budget in bytes, and the KV tokens; for SGLang's hybrid models, its Mamba state slots and the running
requests they cap. The file is committed before the batch's logs are read, so that the
accuracy page can hold these figures apart from the ones kvsize was later fitted to.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sizing.errors import KvsizeError  # noqa: E402
from sizing.capacity.estimate import estimate  # noqa: E402
from sizing.evidence.sglang_starts import planned_sglang_scenario  # noqa: E402
from sizing.evidence.starts import planned_scenario  # noqa: E402


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    return done.stdout.strip() or "unknown"


def predict(row: dict, gpu: str, code: str) -> dict:
    sglang = "version" in row  # an SGLang plan (scripts/sglang_corpus_plan.py) names its version
    release = row["version"] if sglang else row["release"]
    out = {"id": f"{gpu}-{row['id']}", "release": release, "engine": "sglang" if sglang else "vllm", "code": code}
    try:
        if sglang:
            scenario = planned_sglang_scenario(ROOT / row["config"], gpu, release, row["args"])
        else:
            scenario = planned_scenario(ROOT / row["config"], gpu, release, row["args"], row["context"])
        e = estimate(scenario)
    except KvsizeError as err:
        return {**out, "refused": str(err)[:400]}
    b = e.breakdown
    # an engine's own recurrent-state pool (SGLang): its slots and the running requests they cap, as SGLang logs them
    slots = {} if e.state_pool is None else {"state_slots": e.state_pool.slots,
                                             "state_capped_requests": e.state_pool.max_requests}
    return {**out, "model_runner": e.model_runner, "weights_bytes": b.weights_bytes,
            "cuda_graph_bytes": b.cuda_graph_bytes, "activation_bytes": b.activation_bytes,
            "non_torch_bytes": b.non_torch_bytes, "kv_budget_bytes": e.printed_kv_budget_bytes,
            "kv_tokens": e.max_tokens, **slots}


def main(argv: list[str]) -> int:
    plan, gpu, batch = Path(argv[1]), argv[2], argv[3]
    code = commit()
    for row in json.loads(plan.read_text()):
        print(json.dumps({"batch": batch, **predict(row, gpu, code)}, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

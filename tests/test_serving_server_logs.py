"""Every vLLM server the serving runs started (measure/serving/<batch>/<server>/server.log) is a real start on dummy
weights: check-log, from the log alone and the server's config.json, holds kvsize's KV tokens to what the server
printed, as it does for the start corpus (docs/accuracy.md). The per-token-head formats (batch b14) have no start of
their own in the corpus; these logs are their only memory evidence."""

import json

import pytest

from conftest import ROOT
from sizing.evidence.logs import compare_log, log_scenario, read_log
from sizing.profiles import gpu_profile, load_model, matching_gpus

SERVING = ROOT / "measure" / "serving"
PLAN = json.loads((SERVING / "plan.json").read_text())
STARTED = [s for s in PLAN["servers"] if (SERVING / s["batch"] / s["tag"] / "server.log").exists()]
# the GPU each server ran on, as its points' settings name it (vLLM 0.33 prints no GPU total at INFO level)
RAN_ON = {p["server"]: p["settings"]["gpu_name"] for p in json.loads((SERVING / "points.json").read_text())["points"]}


def test_the_serving_runs_started_servers_of_every_kind():
    formats = {s["kv_cache_dtype"] for s in STARTED}
    assert len(STARTED) >= 35 and {"int4_per_token_head", "int8_per_token_head", "fp8", "auto"} <= formats


# Known misses, on the safe side (kvsize gives less KV than the engine): Qwen3-30B-A3B with CUDA graphs captured up to
# 2,048 tokens loses 0.77 GiB of KV against vLLM's default graphs (65.43 GiB against 66.20 logged) where its CUDA-graph
# estimate grows by 0.08 GiB (the utilization it prints as equivalent: 0.8912 and 0.8906); kvsize's graphs grow by
# 0.92 GiB, and its default is already 0.9% below this server (the same settings elsewhere log 65.50 GiB).
# And one on the dangerous side, open in issue 49: GLM-4.7-Flash (MLA, bf16 KV, 47 layers) on vLLM 0.33.0, whose bf16
# latent cache runs under FLASH_ATTN_MLA (FLASHMLA under fp8): the engine estimated its CUDA-graph pool at 3.24 GiB
# (1.71 actual) where kvsize gives 2.02. Taken apart on a start of the same settings (measure/graph_samples.py,
# tests/fixtures/vllm-starts/graph-samples-0.33-h200.json): both FULL warm-ups' split accumulators were held twice
# (the second sample released 1,340 MB, one copy 650), where PyTorch's allocator split the freed block; at 256 and 64
# sequences, at TP 2 and on DeepSeek-V2-Lite once, and kvsize's model of that is within 0.03 GiB of those starts'
# estimates. The answer names the second copies as a risk (sizing/capacity/budget.py).
KNOWN_MISSES = {"b7-qwen3moe-cg2048": "kvsize's CUDA graphs at max_cudagraph_capture_size 2048 under the V2 runner: "
                                      "-1.10% (706,752 tokens against 714,624)",
                "b7-qwen3moe": "Qwen3-30B-A3B with the settings of b6's and b12's servers (the same non-default args, "
                               "the same 1.23 GiB graph estimate): they printed 65.5 GiB and 715,472 tokens, kvsize "
                               "715,696 (+0.03%); b7's host left 66.2 GiB and 723,120 tokens: -1.03%, below the "
                               "engine, since the one-GPU sampler's 3.2 logit copies (-0.86% before)",
                "b40-glm47flash": "GLM-4.7-Flash's bf16 MLA cache under FLASH_ATTN_MLA: CUDA-graph estimate 3.24 GiB "
                                  "against kvsize's 2.02, the warm-ups' accumulators held twice where the allocator "
                                  "split their block: +2.32% (1,304,464 tokens against 1,274,864)"}


def _known_miss(tag: str) -> list:
    reason = KNOWN_MISSES.get(tag)
    return [pytest.mark.xfail(strict=True, reason=reason)] if reason else []


def _param(server: dict):
    return pytest.param(server, id=server["tag"], marks=_known_miss(server["tag"]))


@pytest.mark.parametrize("server", [_param(s) for s in STARTED])
def test_check_log_holds_the_servers_kv_tokens_within_1_percent(server):
    text = (SERVING / server["batch"] / server["tag"] / "server.log").read_text(encoding="utf-8", errors="replace")
    run = read_log(text)
    tokens = run.figures.get("max_tokens")
    assert tokens, f"{server['tag']}: no 'GPU KV cache size' line"
    name, shape = load_model(str(ROOT / server["config"]))
    (gpu,) = matching_gpus(RAN_ON[server["tag"]])
    scenario, _ = log_scenario(run, name, shape, gpu_profile(gpu))
    rows = {term: (predicted, logged) for term, predicted, logged in compare_log(run, scenario).rows}
    predicted, logged = rows["max_tokens"]
    assert abs(predicted / logged - 1) <= 0.01, f"{server['tag']}: {predicted:,} predicted, {logged:,} logged"


def _memory_predictions() -> list:
    """Each server's KV tokens as committed before its batch ran (scripts/predict_serving_memory.py; b17's one server
    as a single object), with its log where the server has run."""
    out = []
    for path in sorted(SERVING.glob("*-memory-predictions-*.json")):
        data = json.loads(path.read_text())
        for row in data.get("servers", [data]):
            batch = data["batch"]
            log = SERVING / batch / row["server"] / "server.log"
            marks = _known_miss(row["server"]) if log.exists() else []
            out.append(pytest.param(row, log, id=f"{row['server']}{'' if log.exists() else ' (not run)'}", marks=marks))
    return out


def test_memory_predictions_are_committed_for_planned_servers():
    # memory figures are committed before a server runs from batch b17 on (b16's TP 2 lane waited for them); every
    # server planned since, run or not, has its own
    since = PLAN["batches"][PLAN["batches"].index("b17-unsplit-check"):]
    planned = {s["tag"] for s in PLAN["servers"]
               if s["batch"] in since or not (SERVING / s["batch"] / s["tag"] / "server.log").exists()}
    predicted = {p.values[0]["server"] for p in _memory_predictions()}
    assert planned and planned <= predicted, f"no memory figures committed for {sorted(planned - predicted)}"


@pytest.mark.parametrize("row,log", [p for p in _memory_predictions() if p.values[1].exists()])
def test_the_kv_tokens_committed_before_a_server_ran_held_within_1_percent(row, log):
    run = read_log(log.read_text(encoding="utf-8", errors="replace"))
    logged = run.figures["max_tokens"]
    assert abs(row["kv_tokens"] / logged - 1) <= 0.01, \
        f"{row['server']}: {row['kv_tokens']:,} committed, {logged:,} logged"

"""kvsize's predictions for the serving points of one batch of measure/serving/plan.json, as kvsize stands now,
written before the batch runs (issue 48): measure/serving/<batch>-predictions.json.

For a closed-loop point (N requests in flight) kvsize's own fleet model is asked about one replica whose peak is
N requests of the point's lengths (one bucket: prompt = input_len, output = output_len), on the plan's GPU, KV
format and TP, with the server's settings (max_model_len, gpu_memory_utilization, max_num_seqs,
max_num_batched_tokens):

- the decode step at that batch: sizing.fleet.replica_model(...).step_at(1), i.e. sizing.speed.decode_step over
  the weights one rank reads and the KV of N requests at their mean decode length (prompt + output / 2), with
  kvsize's measured kernel efficiencies (sizing.profiles.measured_efficiency) - the "ITL at peak" of `kvsize plan`;
- prefill of one prompt: sizing.speed.prefill_seconds (compute-bound, the efficiency's MFU);
- both together as `kvsize plan --ttft-ms/--itl-ms` designs them for an aggregated replica: sizing.slo.aggregated_at
  (the replica also prefills: ITL = step / (1 - rho), TTFT = prefill + M/D/1 wait, requests/s by Little's law).

Two predictions are kept per point: `plan` (the candidate table: ITL = the decode step at the peak, TTFT = the
prefill of one prompt alone, output tokens/s = N / step) and `design` (the aggregated design above). kvsize gives
one figure per quantity (a mean, steady state); it is recorded as its prediction of the p50. Where
kvsize has no model the figure is null with the reason: an open-loop point (kvsize takes a peak concurrency, not an
arrival rate), a replica that prefill alone keeps busy, or a quantity it does not predict (p90/p99 tails).

usage: python scripts/predict_serving.py BATCH         (writes measure/serving/BATCH-predictions.json)
       python scripts/predict_serving.py --all
       python scripts/predict_serving.py --gpu=h200 --all (another GPU: BATCH-predictions-h200.json)
An existing predictions file is never rewritten (--overwrite: only before its batch has run).
"""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from sizing.profiles import gpu_profile, load_model, measured_efficiency  # noqa: E402

try:  # sizing/ split into packages
    from sizing.cache.formats import get_format
    from sizing.capacity.scenario import Scenario
    from sizing.planners.fleet import Candidate, GpuOffer, replica_model
    from sizing.planners.slo import aggregated_at
    from sizing.planners.speed import prefill_seconds
    from sizing.planners.workload import Bucket, Workload
except ImportError:  # the flat layout the committed predictions were made with
    from sizing.fleet import Candidate, GpuOffer, replica_model
    from sizing.formats import get_format
    from sizing.plan import Scenario
    from sizing.slo import aggregated_at
    from sizing.speed import prefill_seconds
    from sizing.workload import Bucket, Workload

PLAN = ROOT / "measure" / "serving" / "plan.json"
SCHEMA = "kvsize.serving-predictions/1"
NO_RATE = ("kvsize has no model at a given arrival rate: `kvsize plan` and its designs take a peak concurrency "
           "(requests in flight), not a Poisson rate, and have no queue for arrivals")
NO_TAILS = "kvsize predicts one steady figure per quantity; it has no model of p90/p99 tails"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 4)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def predict_point(server: dict, point: dict, gpu_id: str, engine: str) -> dict:
    name, shape = load_model(str(ROOT / server["config"]))
    offer = GpuOffer.from_profile(gpu_id, gpu_profile(gpu_id))
    fmt = get_format(server["kv_cache_dtype"], shape.serving_dtype).name
    tp = server["tensor_parallel_size"]
    i, o = point["input_len"], point["output_len"]
    base = offer.scenario(Scenario(
        model_name=name, shape=shape, gpu_name=offer.name, gpu_memory_bytes=offer.memory_bytes, engine=engine,
        tensor_parallel_size=tp, max_model_len=server["max_model_len"],
        memory_fraction=server["gpu_memory_utilization"], max_num_seqs=server["max_num_seqs"],
        max_num_batched_tokens=server["max_num_batched_tokens"]))
    efficiency = measured_efficiency()
    record = dict(id=point["id"], server=server["tag"], model=server["model"], kv_cache_dtype=server["kv_cache_dtype"],
                  kv_format=fmt, tensor_parallel_size=tp, input_len=i, output_len=o,
                  concurrency=point["concurrency"], request_rate=point["request_rate"],
                  num_prompts=point["num_prompts"])
    n = point["concurrency"] if point["concurrency"] is not None else 1
    workload = Workload(name=point["id"], peak_concurrency=n,
                        buckets=(Bucket(max_context_tokens=i + o, share_percent=100, output_tokens=o,
                                        prompt_tokens=i),))
    model = replica_model(replace(base, max_model_len=None), Candidate(offer, fmt, tp), workload, efficiency)
    step = model.step_at(1)
    prefill = prefill_seconds(shape, i, tp, offer.bf16_dense_tflops, model.efficiency.mfu)
    components = dict(
        decode_batch=step.batch, decode_step_ms=_ms(step.seconds), decode_weights_ms=_ms(step.weights_seconds),
        decode_kv_ms=_ms(step.kv_seconds), prefill_one_prompt_ms=_ms(prefill),
        kv_bytes_per_token_per_rank=model.estimate.kv_bytes_per_token, cache_tokens=model.estimate.max_tokens,
        pool_requests_per_replica=model.shared.requests_per_replica, pool_limited_by=model.shared.limited_by,
        efficiency_basis=model.basis)
    keys = ("itl_p50_ms", "ttft_p50_ms", "output_tokens_per_s", "requests_per_s")
    tails = ("itl_p90_ms", "itl_p99_ms", "ttft_p90_ms", "ttft_p99_ms")
    plan_fig = dict.fromkeys(keys + tails)
    design_fig = dict.fromkeys(keys + tails)
    plan_why = {k: NO_TAILS for k in tails}
    design_why = {k: NO_TAILS for k in tails}
    notes = []
    if point["concurrency"] is None:
        for k in keys:
            plan_why[k] = design_why[k] = NO_RATE
        notes.append("decode_step_ms and prefill_one_prompt_ms are kvsize's terms at one request in flight, "
                     "for reference; they are not a prediction of this open-loop point")
    else:
        if model.shared.requests_per_replica < n:
            notes.append(f"kvsize's pool holds {model.shared.requests_per_replica} such requests per replica, "
                         f"fewer than the {n} in flight: the plan would add replicas; the figures are one replica "
                         f"at batch {n} all the same (kvsize has no model of the engine's queue or preemption)")
        # `kvsize plan`'s candidate table: ITL at the peak = the decode step; prefill_ms = one prompt alone;
        # fleet tokens/s = N / step
        plan_fig.update(itl_p50_ms=_ms(step.seconds), ttft_p50_ms=_ms(prefill),
                        output_tokens_per_s=round(n / step.seconds, 3))
        plan_why["ttft_p50_ms"] = ("the plan's prefill_ms column: one prompt prefilled alone, no queue and no "
                                   "decode mixed in; the plan has no TTFT of its own")
        plan_why["requests_per_s"] = "the plan's candidate table gives no request rate"
        agg = aggregated_at(1, step.seconds, prefill, workload)
        if agg is None:
            why = ("kvsize: prefill alone keeps the replica busy (rho >= 0.95, prompts prefilled one at a time): "
                   "its aggregated design has no steady state here")
            for k in keys:
                design_why[k] = why
        else:
            itl, ttft, rate = agg
            design_fig.update(itl_p50_ms=_ms(itl), ttft_p50_ms=_ms(ttft), output_tokens_per_s=round(rate * o, 3),
                              requests_per_s=round(rate, 5))
            components["prefill_busy_fraction"] = round(rate * prefill, 5)
    predicted = dict(plan=plan_fig, design=design_fig)
    reasons = dict(plan=plan_why, design=design_why)
    record.update(predicted=predicted, null_reasons=reasons, components=components, notes=notes)
    return record


def predictions(batch: str, gpu: str | None = None) -> dict:
    plan = json.loads(PLAN.read_text())
    gpu = gpu or plan["gpu"]
    if batch not in plan["batches"]:
        raise SystemExit(f"predict_serving: no batch {batch!r} in {PLAN.name} (batches: {', '.join(plan['batches'])})")
    engine = f"vllm@{plan['vllm_version']}"
    points = [predict_point(s, p, gpu, engine) for s in plan["servers"] if s["batch"] == batch
              for p in s["points"]]
    return dict(schema=SCHEMA, batch=batch, kvsize_commit=_commit(), engine=engine, gpu=gpu,
                efficiency_source=measured_efficiency().source,
                method=__doc__.split("usage:")[0].strip(), points=points)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.split("usage:")[1].strip(), file=sys.stderr)
        return 2
    gpu, overwrite = None, False
    while argv and argv[0].startswith("--") and argv[0] != "--all":
        if argv[0].startswith("--gpu="):
            gpu = argv[0].split("=", 1)[1]
        elif argv[0] == "--overwrite":
            overwrite = True
        else:
            print(f"predict_serving: unknown option {argv[0]}", file=sys.stderr)
            return 2
        argv = argv[1:]
    plan = json.loads(PLAN.read_text())
    batches = plan["batches"] if argv == ["--all"] else argv
    for b in batches:
        # the plan's GPU: BATCH-predictions.json; another (should the machine lent be another kind): a suffix
        suffix = "" if gpu in (None, plan["gpu"]) else f"-{gpu}"
        out = PLAN.parent / f"{b}-predictions{suffix}.json"
        if out.exists() and not overwrite:
            # predictions are written once, before their batch runs, and never edited after its results are seen
            print(f"predict_serving: {out.relative_to(ROOT)} exists; a new batch gets a new name (--overwrite only "
                  f"before its batch has run)", file=sys.stderr)
            return 2
        record = predictions(b, gpu)
        out.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {out.relative_to(ROOT)}: {len(record['points'])} points")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

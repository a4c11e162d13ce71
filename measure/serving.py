"""Serving runs of a real vLLM OpenAI server (issue 48): the committed fixtures under measure/serving/, read and
checked.

Layout (see measure/serving/README.md):

    measure/serving/plan.json                    servers and points as planned (scripts/serving_plan.py)
    measure/serving/<batch>-predictions.json     kvsize's predictions, committed before the batch ran
    measure/serving/<batch>/env.txt              the GPU machine: nvidia-smi, vLLM and torch versions
    measure/serving/<batch>/<server>/env.txt     the same, where a server of the batch ran on another machine
    measure/serving/<batch>/<server>/            server.cmd, server.log, metrics.tsv (/metrics scraped each second),
                                                 <point>.json.gz (vllm bench serve --save-result --save-detailed,
                                                 gzipped),
                                                 <point>.meta.json (the bench command and its wall-clock span)
    measure/serving/points.json                  one typed record per measured point (this module builds it)

Every file is read with a size bound; a malformed record is refused with one line naming the file and the field.

usage: python -m measure.serving build      (rewrites measure/serving/points.json from the raw files)
       python -m measure.serving check      (validates points.json and every raw file it names)
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
import sys
import zlib
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sizing.evidence.bench import tokens_per_chunk

ROOT = Path(__file__).resolve().parents[1]
SERVING = ROOT / "measure" / "serving"
POINTS_SCHEMA = "kvsize.serving-points/1"
RAW_LIMIT = 4 * 1024 * 1024  # one bench result as stored, gzipped (per-request TTFT and ITL lists included)
RAW_UNPACKED_LIMIT = 16 * 1024 * 1024  # the same, once unpacked
TEXT_LIMIT = 8 * 1024 * 1024  # a server log or a metrics scrape file
JSON_LIMIT = 16 * 1024 * 1024  # points.json, plan.json, a predictions file
PERCENTILES = (50, 90, 99)


class ServingError(ValueError):
    """A serving fixture that cannot be read: the message is one line naming the file and the field."""


# ---------------------------------------------------------------------------------------------- bounded reads


def read_bounded(path: Path, limit: int) -> bytes:
    """The bytes of the regular file `path`, refused past `limit` bytes (checked before and while reading)."""
    try:
        if not path.is_file():
            raise ServingError(f"{path}: not a regular file")
        if path.stat().st_size > limit:
            raise ServingError(f"{path}: {path.stat().st_size:,} bytes, more than the {limit:,} a serving fixture may hold")
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ServingError(f"{path}: cannot read ({e.strerror or e})") from None
    if len(data) > limit:
        raise ServingError(f"{path}: more than the {limit:,} bytes a serving fixture may hold")
    return data


def read_gzip(path: Path, limit: int = RAW_LIMIT, unpacked_limit: int = RAW_UNPACKED_LIMIT) -> bytes:
    """The unpacked bytes of a gzipped file, both sizes bounded."""
    packed = read_bounded(path, limit)
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(packed)) as gz:
            data = gz.read(unpacked_limit + 1)
    except (OSError, EOFError, zlib.error) as e:
        raise ServingError(f"{path}: not a gzip file ({e})") from None
    if len(data) > unpacked_limit:
        raise ServingError(f"{path}: unpacks to more than the {unpacked_limit:,} bytes a serving fixture may hold")
    return data


def read_json(path: Path, limit: int = JSON_LIMIT):
    """A JSON file (gzipped where its name ends in .gz), size-bounded."""
    data = read_gzip(path, limit) if path.name.endswith(".gz") else read_bounded(path, limit)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ServingError(f"{path}: not JSON ({e})") from None


def read_text(path: Path, limit: int = TEXT_LIMIT) -> str:
    return read_bounded(path, limit).decode("utf-8", errors="replace")


def _field_error(where: str, e: ValidationError) -> ServingError:
    err = e.errors()[0]
    loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
    return ServingError(f"{where}: {loc}: {err['msg']}")


# ---------------------------------------------------------------------------------------------- records

Ms = Annotated[float, Field(ge=0, allow_inf_nan=False)]
PositiveInt = Annotated[int, Field(gt=0)]
_STRICT = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class Settings(BaseModel):
    """What the server ran and how the load was driven."""

    model_config = _STRICT

    vllm_version: str = Field(min_length=1)
    gpu_name: str = Field(min_length=1)
    gpus: PositiveInt  # GPUs the server used (its tensor parallel size)
    model: str = Field(min_length=1)
    config: str = Field(min_length=1)  # the config.json the dummy weights were built from, relative to the repo
    load_format: Literal["dummy"]
    kv_cache_dtype: str = Field(min_length=1)
    tensor_parallel_size: PositiveInt
    max_model_len: PositiveInt
    max_num_batched_tokens: PositiveInt
    max_num_seqs: PositiveInt
    gpu_memory_utilization: float = Field(gt=0, le=1)
    enable_prefix_caching: bool
    # --compilation-config's max_cudagraph_capture_size where the server set it (None: the release's default, 512)
    max_cudagraph_capture_size: PositiveInt | None = None
    # vllm serve --api-server-count where the server set it (None: one API server); the simulation has no front-end
    # term, so its figures are the same whatever the count
    api_server_count: PositiveInt | None = None
    input_len: PositiveInt
    output_len: PositiveInt
    loop: Literal["closed", "open"]
    concurrency: PositiveInt | None  # closed loop: requests in flight
    request_rate: float | None = Field(gt=0)  # open loop: Poisson arrivals per second
    num_prompts: PositiveInt
    seed: int


class Measured(BaseModel):
    """From the client's own timestamps (vllm bench serve's per-request output), in milliseconds."""

    model_config = _STRICT

    completed: int = Field(ge=0)
    failed: int = Field(ge=0)
    duration_s: float = Field(gt=0, allow_inf_nan=False)
    ttft_p50_ms: Ms
    ttft_p90_ms: Ms
    ttft_p99_ms: Ms
    itl_p50_ms: Ms
    itl_p90_ms: Ms
    itl_p99_ms: Ms
    tpot_p50_ms: Ms
    e2el_p50_ms: Ms
    output_tokens_per_s: Ms
    requests_per_s: Ms
    total_output_tokens: int = Field(ge=0)
    # the mean tokens a streamed chunk carried (vllm bench serve times an ITL per chunk); None: no gaps kept
    tokens_per_chunk: float | None = Field(default=None, gt=0)
    # an open loop's completed requests' send times, seconds after the first, to the microsecond, in order (the
    # simulation replays them: the same Poisson draws the server got); None: a closed loop, or none recorded
    sent_s: list[Annotated[float, Field(ge=0, allow_inf_nan=False)]] | None = None


class ServerMetrics(BaseModel):
    """The server's /metrics scraped about once a second while the point ran (None: not scraped)."""

    model_config = _STRICT

    scrapes: int = Field(ge=0)
    running_max: float | None = Field(ge=0)
    running_mean: float | None = Field(ge=0)
    waiting_max: float | None = Field(ge=0)
    kv_cache_usage_max: float | None = Field(ge=0, le=1)
    kv_cache_usage_mean: float | None = Field(ge=0, le=1)
    preemptions: float | None = Field(ge=0)  # counter at the last scrape minus the first


class ServerStart(BaseModel):
    """The server's startup KV lines."""

    model_config = _STRICT

    gpu_kv_cache_tokens: PositiveInt | None
    maximum_concurrency: float | None = Field(gt=0)  # requests of max_model_len tokens
    lines: list[str]


class Point(BaseModel):
    model_config = _STRICT

    id: str = Field(min_length=1)
    batch: str = Field(min_length=1)
    server: str = Field(min_length=1)
    raw: str = Field(min_length=1)  # the bench result, relative to measure/serving/
    settings: Settings
    measured: Measured
    metrics: ServerMetrics
    server_start: ServerStart
    # the most requests the server had running at once before this point: its earlier points' /metrics peak (their
    # concurrency where none was scraped), at least the load generator's one-prompt test run before each point
    server_running_before: int = Field(default=1, ge=1)


class PointsFile(BaseModel):
    model_config = _STRICT

    schema_: Literal["kvsize.serving-points/1"] = Field(alias="schema")
    points: list[Point]


class BenchResult(BaseModel):
    """The fields of a `vllm bench serve --save-result --save-detailed` file this module reads."""

    model_config = ConfigDict(extra="allow", allow_inf_nan=False)

    num_prompts: PositiveInt
    completed: int = Field(ge=0)
    failed: int = Field(default=0, ge=0)
    duration: float = Field(gt=0)
    total_output_tokens: int = Field(ge=0)
    request_throughput: float = Field(ge=0)
    output_throughput: float = Field(ge=0)
    median_ttft_ms: Ms
    p50_ttft_ms: Ms
    p90_ttft_ms: Ms
    p99_ttft_ms: Ms
    median_itl_ms: Ms
    p50_itl_ms: Ms
    p90_itl_ms: Ms
    p99_itl_ms: Ms
    median_tpot_ms: Ms
    median_e2el_ms: Ms
    ttfts: list[Annotated[float, Field(ge=0)]]
    itls: list[list[Annotated[float, Field(ge=0)]]]
    output_lens: list[Annotated[int, Field(ge=0)]]
    errors: list[str]
    start_times: list[Annotated[float, Field(allow_inf_nan=False)]] | None = None


def sent_times(bench: BenchResult) -> list[float] | None:
    """The successful requests' send times, seconds after the first of them, to the microsecond, in order (None:
    the result kept none)."""
    if not bench.start_times or len(bench.start_times) != len(bench.errors):
        return None
    sent = sorted(bench.start_times[i] for i in successful(bench))
    return [round(t - sent[0], 6) for t in sent] if sent else None


def read_bench(path: Path) -> BenchResult:
    data = read_json(path, RAW_LIMIT)
    try:
        return BenchResult.model_validate(data)
    except ValidationError as e:
        raise _field_error(str(path), e) from None


# ---------------------------------------------------------------------------------------------- percentiles


def percentile(values: list[float], q: float) -> float:
    """numpy.percentile's default (linear) method, which vllm bench serve uses; 0 for no values, as it gives."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def successful(bench: BenchResult) -> list[int]:
    """Indices of the requests that succeeded (vllm bench serve's metrics count only those)."""
    return [i for i, err in enumerate(bench.errors) if not err]


def raw_percentiles(bench: BenchResult) -> dict[str, float]:
    """TTFT and ITL percentiles (ms) recomputed from the per-request lists: TTFT over successful requests, ITL
    over every gap of every successful request, as vllm bench serve computes its summary."""
    ok = successful(bench)
    ttfts = [bench.ttfts[i] for i in ok]
    itls = [x for i in ok for x in bench.itls[i]]
    out = {}
    for q in PERCENTILES:
        out[f"ttft_p{q}_ms"] = percentile(ttfts, q) * 1000
        out[f"itl_p{q}_ms"] = percentile(itls, q) * 1000
    return out


# ---------------------------------------------------------------------------------------------- building


_KV_TOKENS = re.compile(r"GPU KV cache size: ([\d,]+) tokens")
_MAX_CONC = re.compile(r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x")


def server_start(log: str) -> ServerStart:
    lines = [ln.strip() for ln in log.splitlines() if "GPU KV cache size" in ln or "Maximum concurrency" in ln]
    tokens = [int(m.group(1).replace(",", "")) for ln in lines if (m := _KV_TOKENS.search(ln))]
    conc = [float(m.group(1)) for ln in lines if (m := _MAX_CONC.search(ln))]
    return ServerStart(gpu_kv_cache_tokens=tokens[-1] if tokens else None,
                       maximum_concurrency=conc[-1] if conc else None, lines=[ln[-300:] for ln in lines[-4:]])


def metrics_rows(text: str) -> list[tuple[float, str, str, float]]:
    rows = []
    for ln in text.splitlines():
        parts = ln.split("\t")
        if len(parts) != 4 or parts[2] == "error":
            continue
        try:
            rows.append((float(parts[0]), parts[1], parts[2], float(parts[3])))
        except ValueError:
            continue
    return rows


def point_metrics(rows: list[tuple[float, str, str, float]], point: str) -> ServerMetrics:
    mine = [r for r in rows if r[1] == point]

    def series(name: str) -> list[float]:
        return [r[3] for r in mine if r[2] == name]

    running, waiting = series("vllm:num_requests_running"), series("vllm:num_requests_waiting")
    usage, pre = series("vllm:kv_cache_usage_perc"), series("vllm:num_preemptions_total")
    # one engine per server (TP shares one scheduler): a scrape holds one line of each
    return ServerMetrics(
        scrapes=len(running), running_max=max(running) if running else None,
        running_mean=round(sum(running) / len(running), 4) if running else None,
        waiting_max=max(waiting) if waiting else None, kv_cache_usage_max=max(usage) if usage else None,
        kv_cache_usage_mean=round(sum(usage) / len(usage), 6) if usage else None,
        preemptions=pre[-1] - pre[0] if len(pre) > 1 else (0.0 if pre else None))


def _env(batch_dir: Path) -> tuple[str, str]:
    """(vLLM version, GPU name) from the env.txt of a batch (or of a server that ran on a machine of its own)."""
    text = read_text(batch_dir / "env.txt", 64 * 1024)
    version = re.search(r"^vllm (\S+) torch", text, re.M)
    gpu = re.search(r"^\d+, (NVIDIA [^,]+),", text, re.M)
    if version is None or gpu is None:
        raise ServingError(f"{batch_dir / 'env.txt'}: no 'vllm VERSION torch ...' line or nvidia-smi GPU line")
    return version.group(1), gpu.group(1).strip()


def _per_chunk(bench: BenchResult) -> float | None:
    ok = successful(bench)
    per_chunk = tokens_per_chunk([bench.output_lens[i] for i in ok], [bench.itls[i] for i in ok])
    return None if per_chunk is None else round(per_chunk, 4)


def build_points(serving: Path = SERVING) -> list[Point]:
    plan = read_json(serving / "plan.json")
    servers = {s["tag"]: s for s in plan["servers"]}
    out = []
    for batch in plan["batches"]:
        batch_dir = serving / batch
        if not batch_dir.is_dir():
            continue
        for tag, s in servers.items():
            d = batch_dir / tag
            if s["batch"] != batch or not d.is_dir():
                continue
            version, gpu_name = _env(d if (d / "env.txt").exists() else batch_dir)
            log = read_text(d / "server.log") if (d / "server.log").exists() else ""
            start = server_start(log)
            rows = metrics_rows(read_text(d / "metrics.tsv")) if (d / "metrics.tsv").exists() else []
            running_before = 1  # `vllm bench serve` sends one prompt alone before each load
            for p in s["points"]:
                raw = d / f"{p['id']}.json.gz"
                if not raw.exists():
                    continue
                bench = read_bench(raw)
                if bench.completed == 0:
                    continue  # nothing measured
                settings = Settings(
                    vllm_version=version, gpu_name=gpu_name, gpus=s["tensor_parallel_size"], model=s["model"],
                    config=s["config"], load_format=plan["load_format"], kv_cache_dtype=s["kv_cache_dtype"],
                    tensor_parallel_size=s["tensor_parallel_size"], max_model_len=s["max_model_len"],
                    max_num_batched_tokens=s["max_num_batched_tokens"], max_num_seqs=s["max_num_seqs"],
                    gpu_memory_utilization=s["gpu_memory_utilization"],
                    enable_prefix_caching=s["enable_prefix_caching"],
                    max_cudagraph_capture_size=s.get("max_cudagraph_capture_size"),
                    api_server_count=s.get("api_server_count"), input_len=p["input_len"],
                    output_len=p["output_len"], loop="closed" if p["concurrency"] is not None else "open",
                    concurrency=p["concurrency"], request_rate=p["request_rate"], num_prompts=p["num_prompts"],
                    seed=p["seed"])
                measured = Measured(
                    completed=bench.completed, failed=bench.failed, duration_s=bench.duration,
                    ttft_p50_ms=bench.p50_ttft_ms, ttft_p90_ms=bench.p90_ttft_ms, ttft_p99_ms=bench.p99_ttft_ms,
                    itl_p50_ms=bench.p50_itl_ms, itl_p90_ms=bench.p90_itl_ms, itl_p99_ms=bench.p99_itl_ms,
                    tpot_p50_ms=bench.median_tpot_ms, e2el_p50_ms=bench.median_e2el_ms,
                    output_tokens_per_s=bench.output_throughput, requests_per_s=bench.request_throughput,
                    total_output_tokens=bench.total_output_tokens, tokens_per_chunk=_per_chunk(bench),
                    sent_s=sent_times(bench) if p["request_rate"] is not None else None)
                metrics = point_metrics(rows, p["id"])
                out.append(Point(id=p["id"], batch=batch, server=tag, raw=str(raw.relative_to(serving)),
                                 settings=settings, measured=measured, metrics=metrics, server_start=start,
                                 server_running_before=running_before))
                peak = metrics.running_max if metrics.running_max is not None else p["concurrency"]
                running_before = max(running_before, int(peak or 0))
    return out


# kvsize's GPU profile of a card as nvidia-smi names it (the predictions of a batch are per GPU)
GPU_PROFILES = {"NVIDIA H100 80GB HBM3": "h100-sxm", "NVIDIA H200": "h200"}
PLAN_GPU = "h100-sxm"


def predictions_file(batch: str, gpu_name: str) -> Path:
    """kvsize's committed predictions of `batch` for the GPU named (scripts/predict_serving.py)."""
    gpu = GPU_PROFILES.get(gpu_name)
    if gpu is None:
        raise ServingError(f"no kvsize GPU profile is known for {gpu_name!r}; add it to GPU_PROFILES")
    return SERVING / (f"{batch}-predictions.json" if gpu == PLAN_GPU else f"{batch}-predictions-{gpu}.json")


def planned_server_settings(plan: dict, server: dict, device_name: str) -> dict:
    """A planned server's settings as a measured point's settings name them (sizing.evidence.serving reads both), on
    the device nvidia-smi names `device_name`."""
    keep = ("model", "config", "tensor_parallel_size", "kv_cache_dtype", "max_model_len", "max_num_batched_tokens",
            "max_num_seqs", "gpu_memory_utilization")
    return {**{k: server[k] for k in keep}, "max_cudagraph_capture_size": server.get("max_cudagraph_capture_size"),
            "api_server_count": server.get("api_server_count"),
            "vllm_version": plan["vllm_version"], "gpu_name": device_name}


def prediction_inputs(gpu: str) -> tuple[str, dict, str]:
    """What predicting a planned batch on the bundled GPU `gpu` starts from: the device name nvidia-smi prints for it
    (the profile's name less its form factor, as a measured point names it: "NVIDIA H100 80GB HBM3"), plan.json and
    the commit that predicts."""
    import subprocess

    from sizing.profiles import gpu_profile

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return gpu_profile(gpu).name.split(" (")[0], read_json(SERVING / "plan.json"), commit


def new_predictions_files(plan: dict, batches: list[str], kind: str, gpu: str) -> list[tuple[str, Path]]:
    """(batch, measure/serving/<batch>-<kind>-predictions-<gpu>.json) for each of `batches` whose file is still to be
    written: one that exists is left out, named on stderr (predictions are made once, before the batch runs, and
    never rewritten). Every batch is checked against plan.json before any is predicted."""
    unknown = [b for b in batches if b not in plan["batches"]]
    if unknown:
        raise ServingError(f"no batch {unknown[0]!r} in plan.json (batches: {', '.join(plan['batches'])})")
    todo = []
    for batch in batches:
        out = SERVING / f"{batch}-{kind}-predictions-{gpu}.json"
        if out.exists():
            print(f"{out.relative_to(ROOT)} exists: predictions are made once, before the batch runs", file=sys.stderr)
        else:
            todo.append((batch, out))
    return todo


def points_record(points: list[Point]) -> dict:
    return {"schema": POINTS_SCHEMA, "points": [p.model_dump(mode="json") for p in points]}


def load_points(path: Path = SERVING / "points.json") -> list[Point]:
    data = read_json(path)
    try:
        return PointsFile.model_validate(data).points
    except ValidationError as e:
        raise _field_error(str(path), e) from None


def main(argv: list[str]) -> int:
    if argv == ["build"]:
        points = build_points()
        (SERVING / "points.json").write_text(json.dumps(points_record(points), indent=1) + "\n")
        print(f"wrote measure/serving/points.json: {len(points)} points")
        return 0
    if argv == ["check"]:
        try:
            points = load_points()
            for p in points:
                read_bench(SERVING / p.raw)
        except ServingError as e:
            print(f"measure.serving: error: {e}", file=sys.stderr)
            return 2
        print(f"measure/serving/points.json: {len(points)} points, every raw file readable")
        return 0
    print(__doc__.split("usage:")[1].strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

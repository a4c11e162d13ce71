"""A load generator's result as data: `vllm bench serve --save-result` JSON (gzipped or not), read through a size
bound into the load it sent and the figures it measured, so a planner can hold kvsize to their own server."""

from __future__ import annotations

import gzip
import io
import math
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..errors import KvsizeError
from ..inputs import NotJson, load_json
from ..planners.serving import Load
from ..units import MiB

MAX_BENCH_BYTES = 256 * MiB  # --save-detailed keeps every request's inter-token gaps: tens of MB for 10^4 requests


class BenchResult(BaseModel):
    """The fields of a `vllm bench serve --save-result` file kvsize reads; the rest are known not to matter here."""

    model_config = ConfigDict(extra="ignore", frozen=True)
    completed: int = Field(ge=1, le=10**8)
    max_concurrency: int | None = Field(default=None, ge=1, le=10**7)
    request_rate: float | str
    burstiness: float = Field(default=1.0, gt=0)
    duration: float = Field(gt=0, le=10**8)
    total_input_tokens: int = Field(ge=1, le=10**13)
    total_output_tokens: int = Field(ge=1, le=10**13)
    output_throughput: float = Field(ge=0)
    request_throughput: float = Field(ge=0)
    median_ttft_ms: float = Field(ge=0, le=1e9)
    p99_ttft_ms: float = Field(ge=0, le=1e9)
    median_itl_ms: float = Field(ge=0, le=1e9)
    p99_itl_ms: float = Field(ge=0, le=1e9)
    # --save-detailed: each request's lengths (a failed request's output is 0: it never ran)
    input_lens: list[int] | None = Field(default=None, max_length=10**7)
    output_lens: list[int] | None = Field(default=None, max_length=10**7)
    # --save-detailed: when each request was sent (the load generator's clock, seconds)
    start_times: list[float] | None = Field(default=None, max_length=10**7)

    @field_validator("request_rate")
    @classmethod
    def _rate(cls, value):
        if isinstance(value, str) and value.strip().lower() in ("inf", "infinity"):
            return math.inf
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            raise ValueError("must be a positive number of requests per second or 'inf'")
        return float(value)

    @field_validator("median_ttft_ms", "p99_ttft_ms", "median_itl_ms", "p99_itl_ms", "duration",
                     "output_throughput", "request_throughput")
    @classmethod
    def _finite(cls, value):
        if isinstance(value, bool) or not math.isfinite(value):
            raise ValueError("must be a finite number")
        return value


# past this many tokens a streamed chunk on average, the API server is joining tokens it fell behind on
JOINED_CHUNKS = 1.1


def tokens_per_chunk(output_lens: list[int], itls: list[list[float]]) -> float | None:
    """The mean tokens a chunk carried after each request's first: the tokens past the first over the gaps the load
    generator timed between chunks (vllm bench serve times an ITL per chunk, not per token). None without gaps."""
    chunks = sum(len(gaps) for gaps, out in zip(itls, output_lens) if out > 0)
    tokens = sum(out - 1 for gaps, out in zip(itls, output_lens) if out > 0)
    return tokens / chunks if chunks else None


@dataclass(frozen=True)
class BenchRun:
    load: Load
    measured: dict[str, float]  # ttft_p50_ms, ttft_p99_ms, itl_p50_ms, itl_p99_ms, output_tokens_per_s, requests_per_s
    # the mean tokens a streamed chunk carried (None: the result kept no per-request gaps); past JOINED_CHUNKS the
    # measured ITL is the API server's pace of chunks, not the engine's of tokens
    tokens_per_chunk: float | None = None

    @property
    def chunks_joined(self) -> bool:
        return self.tokens_per_chunk is not None and self.tokens_per_chunk > JOINED_CHUNKS


def read_bench(data: bytes, where: str) -> BenchRun:
    """The load a result file says was sent and what it measured: each request's lengths where the result kept them
    (--save-detailed: a dataset of varied lengths is replayed request by request), else the means; an open loop's
    requests sent when the result says they were (the same Poisson draws), where it kept that."""
    if data[:2] == b"\x1f\x8b":
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as f:
                data = f.read(MAX_BENCH_BYTES + 1)
        except (OSError, EOFError) as e:
            raise KvsizeError(f"{where}: not a readable gzip file ({e})") from None
        if len(data) > MAX_BENCH_BYTES:
            raise KvsizeError(f"{where}: more than {MAX_BENCH_BYTES:,} bytes once unpacked; a load generator's "
                              "result is smaller")
    try:
        raw = load_json(data, where, "the file `vllm bench serve --save-result` wrote", MAX_BENCH_BYTES)
    except NotJson as e:
        raise KvsizeError(f"{where}: not JSON ({e.detail}); give the file `vllm bench serve "
                          "--save-result` wrote") from None
    if not isinstance(raw, dict):
        raise KvsizeError(f"{where}: a JSON {type(raw).__name__}, not the object `vllm bench serve --save-result` "
                          "writes")
    try:
        b = BenchResult.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or "(top level)"
        raise KvsizeError(f"{where}: field {field}: {err['msg']}") from None
    closed = b.request_rate == math.inf
    if not closed and b.max_concurrency is not None:
        raise KvsizeError(f"{where}: a request rate ({b.request_rate:g}/s) and a concurrency limit "
                          f"({b.max_concurrency}) together; kvsize simulates a closed loop (--request-rate inf "
                          "--max-concurrency N) or an open loop (--request-rate R), one of them")
    if not closed and b.burstiness != 1.0:
        raise KvsizeError(f"{where}: burstiness {b.burstiness:g}; kvsize simulates Poisson arrivals (burstiness 1)")
    lengths = ()
    if b.input_lens is not None and b.output_lens is not None:
        if len(b.input_lens) != len(b.output_lens):
            raise KvsizeError(f"{where}: input_lens has {len(b.input_lens):,} entries and output_lens "
                              f"{len(b.output_lens):,}; a result gives one of each per request")
        lengths = tuple((i, o) for i, o in zip(b.input_lens, b.output_lens) if o > 0 and i > 0)
        if len(lengths) != b.completed:
            raise KvsizeError(f"{where}: {len(lengths):,} requests have lengths, but {b.completed:,} completed")
    sent_at = ()
    if not closed and lengths and b.start_times is not None:
        if len(b.start_times) != len(b.output_lens) or not all(math.isfinite(x) for x in b.start_times):
            raise KvsizeError(f"{where}: field start_times: must be one finite send time a request "
                              f"({len(b.output_lens):,}), has {len(b.start_times):,}")
        ran = sorted((s, (i, o)) for s, i, o in zip(b.start_times, b.input_lens, b.output_lens) if o > 0 and i > 0)
        sent_at = tuple(s - ran[0][0] for s, _ in ran)
        lengths = tuple(pair for _, pair in ran)
    load = Load(max(1, round(b.total_input_tokens / b.completed)), max(1, round(b.total_output_tokens / b.completed)),
                b.completed, (b.max_concurrency or b.completed) if closed else None, None if closed else b.request_rate,
                lengths=lengths, sent_at=sent_at)
    per_chunk = None
    gaps = raw.get("itls")  # each request's gaps between the chunks it streamed: only their counts are read
    if gaps is not None and b.output_lens is not None:
        if not isinstance(gaps, list) or not all(isinstance(g, list) for g in gaps):
            raise KvsizeError(f"{where}: field itls: must be a list of each request's list of gaps")
        if len(gaps) != len(b.output_lens):
            raise KvsizeError(f"{where}: itls has {len(gaps):,} entries and output_lens {len(b.output_lens):,}; a "
                              "result gives one of each per request")
        per_chunk = tokens_per_chunk(b.output_lens, gaps)
    return BenchRun(load, dict(ttft_p50_ms=b.median_ttft_ms, ttft_p99_ms=b.p99_ttft_ms, itl_p50_ms=b.median_itl_ms,
                               itl_p99_ms=b.p99_itl_ms, output_tokens_per_s=b.output_throughput,
                               requests_per_s=b.request_throughput), per_chunk)

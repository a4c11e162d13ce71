"""The one server a plan or an estimate deploys, written into their JSON and read back by `kvsize watch --plan`.

An estimate's JSON (`kvsize.estimate/1`) and a plan's (`kvsize.plan/1`) carry a `deployment` object: what one
server was planned as (model, GPU, engine release, TP, KV format, context, the requests it is to hold) and the
pool the plan gave it (blocks of tokens, and the requests of full length they hold). `watch` holds the running
server to those figures as written, not to a new estimate under whatever kvsize's defaults are by then.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import KvsizeError

DEPLOYMENT_SCHEMAS = ("kvsize.estimate/1", "kvsize.plan/1")
MAX_PLAN_BYTES = 64 * 2**20  # a plan with every candidate, pool and design is a few hundred kB


@dataclass(frozen=True)
class PlannedPool:
    """What the plan holds one server to: its pool (blocks of tokens), its KV format and the requests it was
    sized for. From an estimate (`of`), or from a plan's or an estimate's JSON (Deployment below)."""
    num_blocks: int
    block_size: int
    kv_cache_dtype: str  # as asked (auto, fp8, ...)
    kv_format: str  # what it resolved to (bf16, fp8_e4m3, ...)
    max_model_len: int
    max_concurrency: int  # requests of max_model_len the pool holds
    holds_requests: int | None = None  # requests of the plan's own mix the pool holds (a plan's; None: max_concurrency)

    @property
    def holds(self) -> int:
        """The requests the plan counts its pool to hold: of its mix where it had one, else of max_model_len."""
        return self.max_concurrency if self.holds_requests is None else self.holds_requests

    @classmethod
    def of(cls, e) -> "PlannedPool":
        return cls(e.num_blocks, e.block_size, e.scenario.k_cache_dtype, e.k_format, e.max_model_len,
                   e.max_concurrency)


class Deployment(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str = Field(min_length=1, max_length=4096)  # as given to --model
    gpu: str = Field(min_length=1, max_length=256)
    engine: str = Field(min_length=1, max_length=64)  # NAME@VERSION whose rules sized it
    tensor_parallel_size: int = Field(ge=1, le=1024)
    kv_cache_dtype: str = Field(min_length=1, max_length=64)  # as asked
    kv_format: str = Field(min_length=1, max_length=64)  # as resolved
    max_model_len: int = Field(ge=1, le=2**31)
    concurrency: int = Field(ge=1, le=10**7)  # requests one server is to hold
    num_blocks: int = Field(ge=0, le=2**40)
    block_size: int = Field(ge=1, le=2**20)
    max_concurrency: int = Field(ge=0, le=2**40)  # requests of max_model_len the pool holds
    hit_rate: float | None = Field(default=None, ge=0, le=1)
    holds_requests: int | None = Field(default=None, ge=0, le=2**40)  # of the plan's mix (plans written since)

    def pool(self) -> PlannedPool:
        return PlannedPool(self.num_blocks, self.block_size, self.kv_cache_dtype, self.kv_format, self.max_model_len,
                           self.max_concurrency, self.holds_requests)


def deployment_record(**fields) -> dict:
    """The `deployment` object of an estimate's or a plan's JSON (validated as `watch --plan` will read it); an
    estimate's has no mix, so no holds_requests."""
    record = Deployment(**fields).model_dump()
    if record["holds_requests"] is None:
        del record["holds_requests"]
    return record


def read_deployment(text: str | bytes, where: str) -> Deployment:
    """The deployment of an estimate's or a plan's JSON text; one line naming the field when it is not one."""
    from ..inputs import NotJson, load_json

    try:
        record = load_json(text, where, "a plan's or an estimate's JSON", MAX_PLAN_BYTES)
    except NotJson:
        raise KvsizeError(f"{where}: not JSON; expected the file `kvsize plan --out plan.json` or "
                          "`kvsize estimate --format json` wrote") from None
    if not isinstance(record, dict) or record.get("schema") not in DEPLOYMENT_SCHEMAS:
        found = record.get("schema") if isinstance(record, dict) else type(record).__name__
        raise KvsizeError(f"{where}: schema {str(found)[:60]!r}; expected one of {', '.join(DEPLOYMENT_SCHEMAS)} "
                          "(a plan's or an estimate's JSON)")
    if "deployment" not in record:
        raise KvsizeError(f"{where}: no 'deployment' object (written by kvsize since watch --plan was added; "
                          "plan or estimate again, or give --model, --gpu, --engine ... to watch instead)")
    if record["deployment"] is None:
        raise KvsizeError(f"{where}: the plan deploys nothing (no candidate served its workload)")
    try:
        return Deployment.model_validate(record["deployment"], strict=True)
    except ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(p) for p in err["loc"]) or "deployment"
        raise KvsizeError(f"{where}: deployment.{field}: {err['msg']}") from None


def pinned_engine(engine) -> str:
    """NAME@VERSION of the release whose rules sized the plan (the default follows the newest started release,
    which may change; the deployment keeps the one it was planned with)."""
    version = engine.followed_version
    return f"{engine.name}@{version}" if version else engine.name


def estimate_deployment(e, model: str, gpu: str, concurrency: int | None = None,
                        holds_requests: int | None = None) -> dict:
    """The deployment of an estimate (`e`, a sizing.capacity.Estimate) made with these --model and --gpu; a plan
    gives the requests each replica is to hold as `concurrency`, and those of its mix the pool holds."""
    s = e.scenario
    return deployment_record(model=model, gpu=gpu, engine=pinned_engine(e.engine),
                             tensor_parallel_size=s.tensor_parallel_size, kv_cache_dtype=s.k_cache_dtype,
                             kv_format=e.k_format, max_model_len=e.max_model_len,
                             concurrency=concurrency or s.concurrency, num_blocks=e.num_blocks,
                             block_size=e.block_size, max_concurrency=e.max_concurrency,
                             holds_requests=holds_requests)

"""A workload: the traffic mix a fleet must serve, read from YAML or JSON.

Lengths are in tokens. A bucket's requests are charged KV at the bucket's
`max_context_tokens` (prompt + output), the length an engine must be able to hold; speed
uses the mean length during decode (mean prompt + half the output).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import KvsizeError, shown
from ..inputs import limited_text, read_limited

MAX_WORKLOAD_BYTES = 1024 * 1024
MAX_NESTING = 32  # a workload is 3 levels deep; deeper files are refused before anything walks them
# Beyond what kvsize plans (every count stays an exact integer below them): 10 million requests in flight,
# 16 Mi tokens a request.
MAX_PEAK = 10**7
MAX_TOKENS = 1 << 24
TABLE_SUFFIXES = (".xlsx", ".xlsm", ".xls", ".ods", ".csv", ".tsv", ".parquet")  # never read as a workload
MAX_NUMBER_DIGITS = 30  # a number written longer than this is no workload's
# Numbers must be numbers (not "55" or true) and finite; validated in JSON mode so lists fill tuples.
_STRICT = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
SHARE_TOLERANCE_PERCENT = 0.01


class Bucket(BaseModel):
    model_config = _STRICT

    name: str | None = None
    max_context_tokens: int = Field(gt=0, le=MAX_TOKENS, description="longest prompt + output in this bucket")
    share_percent: float = Field(gt=0, le=100, description="share of requests")
    output_tokens: int = Field(gt=0, le=MAX_TOKENS, description="mean output tokens per request")
    prompt_tokens: int | None = Field(default=None, gt=0, le=MAX_TOKENS,
                                      description="mean prompt tokens; default max_context_tokens - output_tokens")

    @model_validator(mode="after")
    def _lengths(self) -> Bucket:
        if self.output_tokens >= self.max_context_tokens:
            raise ValueError(f"output_tokens {self.output_tokens} must be below max_context_tokens "
                             f"{self.max_context_tokens}")
        if self.prompt_tokens is not None and self.prompt_tokens + self.output_tokens > self.max_context_tokens:
            raise ValueError(f"prompt_tokens + output_tokens = {self.prompt_tokens + self.output_tokens} exceeds "
                             f"max_context_tokens {self.max_context_tokens}")
        return self

    @property
    def label(self) -> str:
        return self.name or f"≤{self.max_context_tokens:,}"

    @property
    def mean_prompt_tokens(self) -> int:
        return self.prompt_tokens if self.prompt_tokens is not None else self.max_context_tokens - self.output_tokens

    @property
    def mean_decode_length(self) -> int:
        """Mean tokens in the cache while this bucket's requests decode."""
        return self.mean_prompt_tokens + self.output_tokens // 2


class Percentile(BaseModel):
    model_config = _STRICT

    percentile: float = Field(gt=0, le=100)
    context_tokens: int = Field(gt=0, le=MAX_TOKENS)
    output_tokens: int = Field(gt=0, le=MAX_TOKENS)


class DraftModel(BaseModel):
    """Speculative decoding: the draft model's weights and KV cache sit beside the target's."""

    model_config = _STRICT

    model: str = Field(min_length=1, max_length=4096, description="bundled profile id or path to a config.json")
    kv_cache_dtype: str = "auto"

    @field_validator("kv_cache_dtype")
    @classmethod
    def _known_format(cls, value: str) -> str:
        from ..cache.formats import canonical_format_name

        try:
            canonical_format_name(value, "bf16", "draft.kv_cache_dtype")
        except KvsizeError as e:
            raise ValueError(str(e)) from None
        return value


class Sessions(BaseModel):
    """Requests that come back to a prefix kept from before: a shared system prompt, a conversation's
    history, a document asked about again. What a KV tier holds for them is reused, not recomputed."""

    model_config = _STRICT

    name: str | None = None
    share_percent: float = Field(gt=0, le=100, description="share of requests that reuse a prefix of this kind")
    sessions: int = Field(gt=0, le=10**9, description="distinct prefixes alive at once (users, conversations, documents)")
    reused_tokens: int = Field(gt=0, le=MAX_TOKENS, description="tokens of the prefix a returning request finds cached")
    reuse_interval_s: float = Field(gt=0, description="mean seconds between two requests of one session")

    @property
    def label(self) -> str:
        return self.name or f"{self.sessions:,} × {self.reused_tokens:,} tokens"


class Workload(BaseModel):
    model_config = _STRICT

    name: str = "workload"
    peak_concurrency: int = Field(gt=0, le=MAX_PEAK, description="requests in flight at the peak")
    buckets: tuple[Bucket, ...] | None = None
    percentiles: tuple[Percentile, ...] | None = None
    prefix_cache_share: float = Field(default=0.0, ge=0, lt=1,
                                      description="share of prompt tokens served from one shared prefix")
    draft: DraftModel | None = None
    itl_target_ms: float | None = Field(default=None, gt=0,
                                        description="inter-token latency each replica must keep at the peak")
    ttft_target_ms: float | None = Field(default=None, gt=0,
                                         description="time to first token the design must keep at the peak")
    sessions: tuple[Sessions, ...] = ()
    target_percentile: Literal[50, 90, 99] = Field(
        default=50, description="percentile of requests at which the TTFT and ITL targets hold")

    @model_validator(mode="after")
    def _sessions(self) -> Workload:
        total = sum(g.share_percent for g in self.sessions)
        if total > 100 + SHARE_TOLERANCE_PERCENT:
            raise ValueError(f"sessions: share_percent must sum to at most 100, got {total:g}")
        return self

    @model_validator(mode="after")
    def _mix(self) -> Workload:
        if (self.buckets is None) == (self.percentiles is None):
            raise ValueError("give exactly one of buckets or percentiles")
        if self.buckets is not None:
            if not self.buckets:
                raise ValueError("buckets: at least one bucket is needed")
            total = sum(b.share_percent for b in self.buckets)
            if abs(total - 100) > SHARE_TOLERANCE_PERCENT:
                raise ValueError(f"buckets: share_percent must sum to 100, got {total:g}")
        else:
            points = self.percentiles
            if not points or points[-1].percentile != 100:
                raise ValueError("percentiles: the last entry must be percentile 100 (the longest request)")
            for a, b in zip(points, points[1:]):
                if not (a.percentile < b.percentile and a.context_tokens <= b.context_tokens):
                    raise ValueError("percentiles: percentile and context_tokens must increase entry by entry")
            for p in points:
                if p.output_tokens >= p.context_tokens:
                    raise ValueError(f"percentiles: output_tokens {p.output_tokens} must be below context_tokens "
                                     f"{p.context_tokens}")
        return self

    def mix(self) -> tuple[Bucket, ...]:
        """The buckets, shortest first; percentiles become one bucket per step of the distribution."""
        if self.buckets is not None:
            return tuple(sorted(self.buckets, key=lambda b: b.max_context_tokens))
        out, previous = [], 0.0
        for p in self.percentiles:
            out.append(Bucket(name=f"p{p.percentile:g}", max_context_tokens=p.context_tokens,
                              share_percent=p.percentile - previous, output_tokens=p.output_tokens))
            previous = p.percentile
        return tuple(out)

    def mean(self, attribute: str) -> float:
        """A bucket figure (mean_prompt_tokens, output_tokens, mean_decode_length) averaged over requests."""
        return sum(b.share_percent / 100 * getattr(b, attribute) for b in self.mix())

    def share_above(self, tokens: int) -> float:
        """Percent of requests in buckets whose longest request exceeds `tokens`."""
        return sum(b.share_percent for b in self.mix() if b.max_context_tokens > tokens)


def _where(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def parse_workload(data: Any, where: str = "workload") -> Workload:
    if not isinstance(data, dict):
        raise KvsizeError(f"{where}: expected a mapping of workload fields, got {type(data).__name__}")
    _check_nesting(data, where)
    try:
        return Workload.model_validate_json(json.dumps(data, allow_nan=True))
    except ValidationError as e:
        err = e.errors()[0]
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            allowed = _allowed_fields(err["loc"])
            msg = f"unknown field; allowed: {', '.join(allowed)}"
        field = _where(err["loc"])
        raise KvsizeError(f"{where}: {field + ': ' if field else ''}{msg}") from None


def _check_nesting(data: Any, where: str) -> None:
    stack = [(data, 1)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_NESTING:
            raise KvsizeError(f"{where}: nested more than {MAX_NESTING} levels deep; a workload is a few levels")
        if isinstance(value, dict):
            stack.extend((v, depth + 1) for v in value.values())
        elif isinstance(value, (list, tuple)):
            stack.extend((v, depth + 1) for v in value)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise KvsizeError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _depth_before_parsing(text: str, where: str) -> None:
    """Brackets nested deeper than MAX_NESTING are refused before a parser recurses into them."""
    depth = deepest = 0
    for ch in text:
        if ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_NESTING:
                raise KvsizeError(f"{where}: nested more than {MAX_NESTING} levels deep; a workload is a few levels")
        elif ch in "]}":
            depth -= 1


def _allowed_fields(loc: tuple) -> list[str]:
    model: type[BaseModel] = Workload
    for part in loc[:-1]:
        if isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        inner = getattr(field, "annotation", None)
        for candidate in (Bucket, Percentile, DraftModel):
            if candidate.__name__ in str(inner):
                model = candidate
    return list(model.model_fields)


def read_workload(path: str | Path) -> Workload:
    p = Path(path)
    if not p.is_file():
        raise KvsizeError(f"--workload: {p} is not a file; give a .yaml, .yml or .json workload")
    if p.suffix.lower() in TABLE_SUFFIXES:
        raise KvsizeError(f"--workload: {p.name} is named as a table ({p.suffix}); a workload is a .yaml, .yml or "
                          ".json file of fields (examples/workload.yaml shows them)")
    return parse_workload_text(read_limited(p, MAX_WORKLOAD_BYTES, "--workload", "a workload file"), p.name)


def parse_workload_text(data: bytes | str, where: str = "workload") -> Workload:
    data = limited_text(data, MAX_WORKLOAD_BYTES, where, "a workload file")
    _depth_before_parsing(data, where)
    # a standalone number (not digits inside a name) longer than any count kvsize plans
    long_number = re.search(r"(?<![\w.-])-?\d{%d,}(?![\w-])" % (MAX_NUMBER_DIGITS + 1), data)
    if long_number:
        line = data.count("\n", 0, long_number.start()) + 1
        raise KvsizeError(f"{where}: line {line} holds a number of {len(long_number.group()):,} digits; kvsize plans "
                          f"up to {MAX_PEAK:,} requests in flight and {MAX_TOKENS:,} tokens a request")
    stripped = data.lstrip()
    if stripped.startswith("{"):
        try:
            loaded = json.loads(data, object_pairs_hook=_no_duplicates)
        except json.JSONDecodeError as e:
            raise KvsizeError(f"{where}: not valid JSON ({e.msg} at line {e.lineno})") from None
        except KvsizeError as e:
            raise KvsizeError(f"{where}: {e}") from None
        return parse_workload(loaded, where)
    import yaml  # only plan reads YAML; keep CLI start-up light

    try:
        loaded = yaml.load(data, Loader=_UniqueKeyLoader.get())  # plain data only, never objects
    except yaml.YAMLError as e:
        raise KvsizeError(f"{where}: not valid YAML ({str(e).splitlines()[0]})") from None
    except (KvsizeError, RecursionError) as e:
        raise KvsizeError(f"{where}: {e if isinstance(e, KvsizeError) else 'nested too deep'}") from None
    except (TypeError, ValueError, LookupError, AttributeError, OverflowError) as e:  # a tag applied to the wrong node
        raise KvsizeError(f"{where}: not valid YAML for a workload ({type(e).__name__}: {shown(str(e), 80)})") from None
    return parse_workload(loaded, where)


class _UniqueKeyLoader:
    """yaml's SafeLoader that refuses a key given twice in one mapping (safe_load keeps the last)."""

    _loader = None

    @classmethod
    def get(cls):
        if cls._loader is None:
            import yaml

            class Loader(yaml.SafeLoader):
                def compose_node(self, parent, index):
                    # An alias repeats a node by reference: nine of them nested nine deep make 9^9
                    # values for the checks after (a "billion laughs"). A workload needs none.
                    if self.check_event(yaml.events.AliasEvent):
                        event = self.peek_event()
                        raise KvsizeError(f"line {event.start_mark.line + 1}: YAML aliases (*name) are not "
                                          "accepted in a workload; write the values out")
                    return super().compose_node(parent, index)

                def construct_object(self, node, deep=False):
                    # a value its tag cannot build (!!int 0x1, !!float abc, !!bool maybe, !!map [a]) is one line
                    # naming the line, never the constructor's own exception
                    try:
                        return super().construct_object(node, deep=deep)
                    except (ValueError, TypeError, LookupError, OverflowError, AttributeError) as e:
                        if isinstance(e, KvsizeError):
                            raise
                        raise KvsizeError(f"line {node.start_mark.line + 1}: {shown(getattr(node, 'value', ''), 40)} "
                                          f"is not a value of the YAML tag {node.tag.rsplit(':', 1)[-1]!r}; give "
                                          "plain text, numbers, lists and mappings") from None

                def construct_mapping(self, node, deep=False):
                    keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
                    for (key_node, _), key in zip(node.value, keys):
                        # a field's name is text: a number, a date, a flag or null as a key names no field
                        if not isinstance(key, str):
                            written = f" {shown(key_node.value, 40)}" if isinstance(key_node, yaml.ScalarNode) else ""
                            kind = {bool: "true or false", int: "a number", float: "a number", type(None): "null",
                                    list: "a list", dict: "a mapping"}.get(type(key), type(key).__name__)
                            raise KvsizeError(f"line {key_node.start_mark.line + 1}: the key{written} is {kind}, "
                                              "not text; field names are text")
                    for key in keys:
                        if keys.count(key) > 1:
                            raise KvsizeError(f"duplicate key {key!r}")
                    return super().construct_mapping(node, deep=deep)

            # Values JSON holds only: a date-like scalar (name: 2024-01-01) stays text, and the tags
            # that build other types (!!binary, !!set, !!omap, !!timestamp) are refused by name.
            # Numbers and booleans as JSON (and YAML 1.2) read them: 010 is ten, not octal 8; 1:30 is text, not
            # the sexagesimal 90; yes/no/on/off stay text. YAML 1.1's own resolvers for these are dropped.
            replaced = {f"tag:yaml.org,2002:{t}" for t in ("timestamp", "int", "float", "bool")}
            Loader.yaml_implicit_resolvers = {
                first: [(tag, regexp) for tag, regexp in resolvers if tag not in replaced]
                for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()}
            Loader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:true|false|True|False|TRUE|FALSE)$"),
                                         list("tTfF"))
            Loader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?[0-9]+$"), list("-+0123456789"))
            Loader.add_implicit_resolver(
                "tag:yaml.org,2002:float",
                re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
                list("-+.0123456789"))
            # a decimal integer as written (YAML 1.1's constructor reads a leading 0 as octal)
            Loader.add_constructor("tag:yaml.org,2002:int", _decimal_int)
            for tag in ("binary", "set", "omap", "pairs", "timestamp"):
                Loader.add_constructor(f"tag:yaml.org,2002:{tag}", _refuse_tag)
            cls._loader = Loader
        return cls._loader


def _decimal_int(loader, node) -> int:
    """A decimal integer as written (YAML 1.1's constructor reads a leading 0 as octal), of bounded digits."""
    text = loader.construct_scalar(node)
    if not isinstance(text, str) or len(text.replace("_", "").lstrip("+-")) > MAX_NUMBER_DIGITS:
        raise KvsizeError(f"line {node.start_mark.line + 1}: a number of more than {MAX_NUMBER_DIGITS} digits; kvsize "
                          f"plans up to {MAX_PEAK:,} requests in flight and {MAX_TOKENS:,} tokens a request")
    return int(text, 10)


def _refuse_tag(loader, node):
    raise KvsizeError(f"line {node.start_mark.line + 1}: the YAML tag {node.tag.rsplit(':', 1)[-1]!r} makes a "
                      "value a workload cannot hold; give plain text, numbers, lists and mappings")

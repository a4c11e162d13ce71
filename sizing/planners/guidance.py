"""Planners' rules of thumb, shown with the numbers behind them, never as a bare verdict."""

from __future__ import annotations

from dataclasses import dataclass

from ..cache.formats import get_format
from .workload import Workload


@dataclass(frozen=True)
class Rule:
    name: str
    above_tokens: int
    min_share_percent: float
    advice: str
    formats: tuple[str, ...]  # formats the advice points at


# A bucket counts as above a threshold when its longest request is: KV is charged at that
# length, so this is the reading that matches the capacity figures.
RULES = (
    Rule("8-bit KV for long traffic", 8192, 30.0,
         "an 8-bit KV cache is a near-certain win: it halves KV bytes per token (capacity ×2, ITL slope ×½) "
         "at near-lossless quality", ("fp8_e4m3", "int8_per_token_head", "q8_0", "lmdeploy_int8")),
    Rule("4-bit KV for very long traffic", 16384, 10.0,
         "a 4-bit KV cache is worth a trial: about a quarter of bf16's bytes with its scales; check quality on "
         "your own long-context evaluation first",
         ("int4_per_token_head", "nvfp4", "lmdeploy_int4", "q4_0", "kivi4")),
)


# Formats whose published accuracy is the model dtype's or near-lossless (each format's quality note in
# sizing/cache/formats.py: "reference precision", "near-lossless", "close to fp8 per-tensor quality"): the ones a
# recommendation may name without the planner's own evaluation.
NEAR_LOSSLESS_FORMATS = frozenset({"fp32", "fp16", "bf16", "fp8_e4m3", "fp8_e5m2", "fp8_per_token_head",
                                   "int8_per_token_head", "q8_0", "lmdeploy_int8", "lmdeploy_fp8"})


@dataclass(frozen=True)
class RuleResult:
    rule: Rule
    share_percent: float
    fires: bool
    explanation: str


def runnable_formats(formats: tuple[str, ...], engine: str | None, gpu_ids: tuple[str, ...]) -> list[str]:
    """The formats `engine` has and runs on at least one of the GPUs (sizing/engines/support.py runs_on), those no
    source confirms there marked so; every format where no engine or GPU is named."""
    if engine is None or not gpu_ids:
        return list(formats)
    from ..engines.support import runs_on
    from ..profiles import gpu_profile

    name = get_engine_name(engine)
    out = []
    for f in formats:
        if name not in get_format(f).engines:  # the engine has no such cache (compare's "not this engine")
            continue
        verdicts = [runs_on(name, get_format(f), gpu_profile(g)).status for g in gpu_ids]
        if "supported" in verdicts:
            out.append(f)
        elif "unconfirmed" in verdicts:
            out.append(f"{f} (unconfirmed with {name})")
    return out


def evaluate_rules(workload: Workload, rules: tuple[Rule, ...] = RULES, engine: str | None = None,
                   gpu_ids: tuple[str, ...] = ()) -> list[RuleResult]:
    """Each rule on the workload; the formats a fired rule names are those the engine runs on the GPUs given."""
    out = []
    for r in rules:
        share = workload.share_above(r.above_tokens)
        fires = share >= r.min_share_percent
        verdict = "fires" if fires else "does not fire"
        named = runnable_formats(r.formats, engine, tuple(gpu_ids))
        where = f"{get_engine_name(engine)} on {', '.join(gpu_ids)}" if engine and gpu_ids else ""
        formats = (f"{', '.join(named)}" + (f", as {where} runs them" if where else "") if named else
                   f"none of {', '.join(r.formats)} runs with {where}")
        formats += "".join(f"; {note}" for note in _slow_kernels(named, engine))
        out.append(RuleResult(r, share, fires, (
            f"{r.name}: {share:.1f}% of requests are in buckets longer than {r.above_tokens:,} tokens "
            f"(threshold {r.min_share_percent:g}%) → {verdict}" + (f": {r.advice} ({formats})" if fires else "")
        )))
    return out


def _slow_kernels(named: list[str], engine: str | None) -> list[str]:
    """The notes of the named formats the engine's own servers ran slower than bf16 (the serving fit's engine only:
    another engine's kernels are not the ones measured)."""
    from .step_model import step_overhead
    from .step_notes import slow_kernel_note

    if engine is None or get_engine_name(engine) != step_overhead().fitted_engine_name:
        return []
    return [n for n in (slow_kernel_note(f.split(" ", 1)[0]) for f in named) if n]


def get_engine_name(engine: str) -> str:
    from ..engines import get_engine

    return get_engine(engine).name


@dataclass(frozen=True)
class QualityNote:
    format: str
    published: str
    source: str
    measured_attention_error: float | None  # worst relative error in a measurement report
    measured_where: str | None


def quality_notes(formats: list[str], serving_dtype: str, report: dict | None = None,
                  report_name: str | None = None) -> list[QualityNote]:
    """Published figures per format and, given a measurement report, its worst attention error."""
    worst: dict[str, float] = {}
    for p in (report or {}).get("decode", []) or []:
        if isinstance(p, dict) and "format" in p and "attention_rel_error" in p:
            worst[p["format"]] = max(worst.get(p["format"], 0.0), float(p["attention_rel_error"]))
    device = (report or {}).get("device", {}).get("name") if report else None
    notes = []
    for name in dict.fromkeys(formats):
        fmt = get_format(name, serving_dtype)
        err = worst.get(fmt.name)
        notes.append(QualityNote(fmt.name, fmt.quality, fmt.quality_source, err,
                                 f"{report_name or 'report'} on {device}" if err is not None else None))
    return notes

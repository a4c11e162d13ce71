"""Where a simulated replica's step terms come from, in words for the answers: what was measured where
(profiles/serving.json), and what of it is carried to another GPU, engine, release, KV format or count of query heads
a KV head."""

from __future__ import annotations

from ..efficiency import DecodeEfficiency
from .step_model import step_overhead


def simulation_source(engine: str, version: str | None, gpu_id: str, kv_format: str,
                      queries_per_kv: int | None = None) -> str:
    """Where a simulated replica's step terms were measured, and what of them is carried from there: to another GPU
    (by its bandwidth and FLOP/s), another engine or release, a KV format whose read no engine server measured
    (kvsize's own kernel's efficiency stands in), or a format's waves to a count of query heads a KV head
    (`queries_per_kv`, the model's) whose kernel no server ran."""
    fit = step_overhead()
    carried = []
    groups = fit.engine_waves_query_groups.get(fit.engine_kernel_twins.get(kv_format, kv_format), ())
    if queries_per_kv is not None and groups and queries_per_kv not in groups:
        carried.append(f"{kv_format}'s decode waves to {queries_per_kv} query heads a KV head from "
                       f"{', '.join(map(str, groups))} (the engine compiles its kernel for each count; no server "
                       f"ran {queries_per_kv})")
    if gpu_id != fit.fitted_gpu:
        carried.append(f"to {gpu_id} by its bandwidth and FLOP/s")
        if fit.engine_kernel_twins.get(kv_format, kv_format) in fit.engine_program_pace_tokens_per_s:
            carried.append(f"{kv_format}'s program pace unchanged (a pace of the SM's, not measured on {gpu_id})")
    if engine != fit.fitted_engine_name or (version or "") != fit.fitted_engine_version:
        carried.append(f"to {engine}{' ' + version if version else ''}")
    if kv_format in fit.engine_kernel_twins:
        carried.append(f"{kv_format}'s kernel as {fit.engine_kernel_twins[kv_format]}'s (the engine's same attention "
                       "path), no engine server measured it")
    elif kv_format not in fit.engine_kv_efficiency:
        carried.append(f"{kv_format}'s KV read at kvsize's own kernel's efficiency, no engine server measured")
    own = f"step terms fitted on {fit.fitted_engine} servers on {fit.fitted_gpu}"
    return own + (f"; carried {'; '.join(carried)}" if carried else "")


def slow_kernel_note(kv_format: str) -> str | None:
    """Where the engine's servers ran `kv_format` in a kernel slower than bf16's (its prompt attention below the
    prefill rate: sizing's fitted engine_prefill_attention_share, a twin's included), the figures that say so."""
    fit = step_overhead()
    measured = fit.engine_kernel_twins.get(kv_format, kv_format)
    share = fit.engine_prefill_attention_share.get(measured)
    if share is None or share >= 1.0:
        return None
    twin = f" (as {measured}, the same kernel)" if measured != kv_format else ""
    split = fit.engine_split_kv_efficiency.get(measured)
    whole = fit.engine_kv_efficiency[measured]
    few = f"{split:g} (a few requests, each cache split) to " if split not in (None, whole) else ""
    pace = fit.engine_program_pace_tokens_per_s.get(measured)
    paced = (f", a program of a split cache reading {pace.split / 1e6:g} tokens a microsecond" if pace is not None
             else "")
    return (f"{kv_format}: {fit.fitted_engine}'s servers ran it slower than bf16{twin}, decode reading at "
            f"{few}{whole:g} of the HBM rate against bf16's {fit.engine_kv_efficiency.get('bf16', 1.0):g}{paced} "
            f"and prompt attention at {share:g} of the prefill rate at a full tile (docs/speed-accuracy.md)")


def engine_read_basis(kv_format: str, gpu_id: str, efficiency: DecodeEfficiency) -> str | None:
    """Where the engine's own read share of `kv_format` was measured (None: no engine server ran it or its twin, or
    the user set the format's figure in `efficiency`)."""
    fit = step_overhead()
    measured = fit.engine_kernel_twins.get(kv_format, kv_format)
    if measured not in fit.engine_kv_efficiency or kv_format in efficiency.given:
        return None
    twin = f" as {measured}'s (the same kernel)" if measured != kv_format else ""
    where = f"{fit.fitted_engine} servers on {fit.fitted_gpu}"
    return (f"the engine's own read share{twin}, {fit.engine_kv_efficiency[measured]:g}, measured on {where}"
            + ("" if gpu_id == fit.fitted_gpu else f", carried to {gpu_id} as a share of its bandwidth"))


def engine_shares_note(efficiency: DecodeEfficiency) -> str:
    """What engine_efficiency puts over `efficiency`: the engine's own read shares, named with where they were
    measured (the user's figures excepted)."""
    fit = step_overhead()
    shares = {k: v for k, v in fit.engine_kv_efficiency.items() if k not in efficiency.given}
    weights = ("" if fit.engine_weights_efficiency is None or "weights" in efficiency.given
               else f", weights {fit.engine_weights_efficiency:g}")
    return ("read at the engine's own shares where its servers ran the format ("
            f"{fit.fitted_engine} on {fit.fitted_gpu}, profiles/serving.json): "
            + ", ".join(f"{k} {v:g}" for k, v in shares.items()) + weights)

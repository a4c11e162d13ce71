"""Fit the per-release constants of vLLM's CUDA-graph estimate to the corpus of real starts.

usage: python scripts/fit_vllm_terms.py
vLLM's profile_cudagraph_memory logs, at DEBUG, each mode's first capture and per-graph figure
("Estimated PIECEWISE CUDA graph memory: 134.00 MiB first-capture + (51-1) x 4.00 MiB per-graph").
The starts of tests/fixtures/vllm-starts that ran at DEBUG give those figures, so each part of the
estimate (sizing/engines/cudagraphs.py cuda_graph_estimate) is fitted to vLLM's own figure for it by least squares:
  the first PIECEWISE capture: first_capture_bytes + activation_copies x (largest size x 2 x MLP width x dtype);
  the further graphs: per_graph_layer_bytes (or per_graph_mla_layer_bytes) x layers x further graphs.
The first FULL capture (the split-KV accumulators) is printed beside its prediction, not fitted: its
constants are vLLM's (32 splits for CUDA graphs) plus a 2 MiB base, the page the capture rounds to.
With --write the constants go into profiles/engines/vllm-*.json with the starts they were fitted on;
tests/test_vllm_starts.py fails when the shipped constants and this fit drift apart. A leave-one-family-out
run (each family predicted from constants fitted on the others) shows how far the fit carries.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sizing.engines import get_engine  # noqa: E402
from sizing.config import DTYPE_BYTES  # noqa: E402
from sizing.engines.cudagraphs import graph_captures, split_kv_accumulator_bytes  # noqa: E402
from sizing.engines.releases import penalty_state_bytes  # noqa: E402
from sizing.capacity.scenario import with_engine_defaults  # noqa: E402
from sizing.evidence.starts import CORPUS, start_scenario  # noqa: E402
from sizing.units import MiB  # noqa: E402
# the fits of the V2 graph estimate and the parts the fits share, kept in their own modules; fa3_part_by_part is named
# here too, where tests/test_graph_samples_starts.py reaches it
from fit_vllm_graphs import (fa3_part_by_part, fit_v2_flash_attn_mla, fit_v2_graph_per_layer,  # noqa: E402
                             write_v2_flash_attn_mla, write_v2_graph_per_layer)
from vllm_fit_corpus import (FITTED_FILES, LOGIT_FILE, _edit_release, built_scenario, fitted_corpus,  # noqa: E402
                             mxfp4_experts)


# rank 0's lines only (every rank prints the same figures)
MODE_LINE = re.compile(r"^\((?:EngineCore|Worker_TP0)[^)]*\).*Estimated (PIECEWISE|FULL) CUDA graph memory: "
                       r"([\d.]+) MiB first-capture \+ \((\d+)-1\) × ([\d.]+) MiB per-graph")


def printed_modes(log: str) -> dict[str, tuple[float, int, float]]:
    """mode -> (first capture MiB, graphs, per-graph MiB) as vLLM logged them."""
    modes: dict[str, tuple[float, int, float]] = {}
    for line in log.splitlines():
        m = MODE_LINE.search(line)
        if m and m.group(1) not in modes:
            modes[m.group(1)] = (float(m.group(2)), int(m.group(3)), float(m.group(4)))
    return modes


# sub-ranges whose non-torch figure the starts show to be measured alike are fitted together: 0.27.1 and 0.30.0
# print the same figures per model, with an embedding-sized part; 0.31.0 and 0.32.0 print the same figures as each
# other, without it, and 0.16 GiB above 0.33.0's, whose Worker.init_device creates the cuBLAS handles before the
# baseline snapshot (tests/fixtures/vllm-starts: the one-GPU panels of each release)
NON_TORCH_GROUPS = {"0.27": "0.27-0.30", "0.29": "0.27-0.30", "0.31": "0.31-0.32", "0.33": "0.33"}


def collect() -> tuple[list, list, list]:
    """(first PIECEWISE captures, further graphs, first FULL captures): per start that logged them, its id, its
    family, the regressors and vLLM's figure in bytes."""
    from sizing.config.family import family

    first, further, full = [], [], []
    for start in fitted_corpus():
        if start.status != "sized" or start.args.get("pipeline_parallel_size", 1) != 1:
            continue  # a pipeline stage captures its own layers' graphs: PP starts are held apart
        modes = printed_modes((CORPUS / start.log).read_text(errors="replace"))
        if not modes:
            continue
        s = built_scenario(start)
        shape, tp = s.shape, s.tensor_parallel_size
        release = get_engine(s.engine).release
        model = release.cuda_graph_estimate
        if model is None:
            continue  # a release whose rules model no graph estimate has no constant to fit
        c = graph_captures(shape, model, tp, range(shape.num_layers), s.max_num_seqs, s.max_num_batched_tokens,
                           s.cudagraph_capture_sizes, s.max_cudagraph_capture_size)
        fam = family(shape)
        if "PIECEWISE" in modes:
            activation = max(c.piecewise) * 2 * c.mlp_width_values * DTYPE_BYTES[shape.serving_dtype]
            first.append((start.id, fam, [1.0, activation], modes["PIECEWISE"][0] * MiB))
        if "FULL" in modes:
            predicted = model.full_first_capture_bytes + split_kv_accumulator_bytes(
                shape, model, tp, max(c.full), s.k_cache_dtype, s.gpu_architecture, s.gpu_multiprocessors)
            full.append((start.id, fam, predicted, modes["FULL"][0] * MiB))
        graphs = sum(n - 1 for _, n, _ in modes.values())
        row = [0.0, graphs * c.splitting_layers] if c.mla else [graphs * c.splitting_layers, 0.0]
        further.append((start.id, fam, row, sum((n - 1) * per * MiB for _, n, per in modes.values())))
    return first, further, full


def _solve(rows) -> np.ndarray:
    x = np.array([r[2] for r in rows], float)
    y = np.array([r[3] for r in rows], float)
    return np.linalg.lstsq(x, y, rcond=None)[0]


def fitted_constants(first=None, further=None) -> dict:
    """The shipped constants as the least-squares fit gives them, rounded as the release files keep them
    (bytes to the byte, copies to 0.001), and the starts each was fitted on."""
    if first is None or further is None:
        first, further, _ = collect()
    a, b = _solve(first), _solve(further)
    return {"first_capture_bytes": int(round(a[0])), "activation_copies": round(float(a[1]), 3),
            "per_graph_layer_bytes": int(round(b[0])), "per_graph_mla_layer_bytes": int(round(b[1])),
            "fitted_on": sorted({r[0] for r in (*first, *further)})}


def leave_one_family_out() -> list[tuple[str, int, float, float]]:
    """Per family: (family, its starts, worst and median absolute error in MiB of the graph estimate's fitted
    parts, first capture plus further graphs) when the constants are fitted on the other families alone."""
    first, further, _ = collect()
    out = []
    for fam in sorted({r[1] for r in (*first, *further)}):
        train_a = [r for r in first if r[1] != fam]
        train_b = [r for r in further if r[1] != fam]
        if len({r[0] for r in train_a}) < 2 or not any(r[2][1] for r in train_b) or not any(r[2][0] for r in train_b):
            continue  # too few others to fit both parts (the MLA per-layer figure has MLA starts alone)
        a, b = _solve(train_a), _solve(train_b)
        errors: dict[str, float] = {}
        for rows, coef in ((first, a), (further, b)):
            for sid, f, x, y in rows:
                if f == fam:
                    errors[sid] = errors.get(sid, 0.0) + (np.array(x) @ coef - y) / MiB
        if errors:
            values = sorted(abs(e) for e in errors.values())
            out.append((fam, len(errors), max(errors.values(), key=abs), values[len(values) // 2]))
    return out


def fit_non_torch() -> dict[str, dict[str, tuple[int, list[str]]]]:
    """Per release file and model runner ("v1", "v2"; "tp" for its starts at TP >= 2, either runner): the
    non-torch memory of its starts as the release file keeps it, the middle of the range they print (two
    decimals of GiB) in bytes, and the starts it comes from. Pipeline stages have no start: their figure is
    the public logs'."""
    import json

    from sizing.engines.releases import ENGINES_DIR, version_key
    from sizing.units import GiB

    files = []
    for path in sorted(ENGINES_DIR.glob("vllm-*.json")):
        data = json.loads(path.read_text())
        if data.get("non_torch"):
            files.append((path.name, version_key(data["first_version"]), version_key(data["last_version"])))
    groups: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for start in fitted_corpus():
        p = start.printed
        tp, pp = start.args.get("tensor_parallel_size", 1), start.args.get("pipeline_parallel_size", 1)
        if start.status != "sized" or not p.non_torch_gib or pp != 1:
            continue
        v = version_key(start.release)
        name = next((n for n, lo, hi in files if lo <= v[:len(lo)] and v[:len(hi)] <= hi), None)
        if name is not None:
            # at TP >= 2 every rank prints its own figure: the largest is the one the budget must leave room for
            groups.setdefault((name, "tp" if tp > 1 else p.runner), []).append(
                (max(map(float, p.non_torch_gib)), start.id))
    out: dict[str, dict[str, tuple[int, list[str]]]] = {}
    for (name, runner), rows in groups.items():
        values = [v for v, _ in rows]
        middle = (min(values) + max(values)) / 2
        out.setdefault(name, {})[runner] = (int(round(middle * GiB)), sorted(i for _, i in rows))
    return out


# The V2 sampler's per-request penalty state (v1/worker/gpu/sample/penalties.py PenaltiesState, 0.27.0-0.33.0):
# output_bin_counts int32 [max_num_reqs, vocab] and prompt_bin_mask int32 [max_num_reqs, cdiv(vocab, 32)]. Taken from
# the source rather than fitted: starts at 1,024 sequences alone cannot tell it from the base, and the two 0.29.0
# starts at 256 sequences (small-gpu-defaults) print 0.40 and 0.47 GiB less, 4.3 B a logit, as this predicts.
PENALTY_STATE_BYTES_PER_LOGIT = penalty_state_bytes(1, 32) / 32  # 4.125: a vocabulary of a whole number of words


def fit_sampled_logit_non_torch() -> dict[str, dict]:
    """Per sub-range of LOGIT_FILE: the V2 runner's non-torch memory on one GPU as base + the sampler's penalty
    state (PENALTY_STATE_BYTES_PER_LOGIT x max_num_seqs x vocab_size) + bytes per element of the vocab x hidden
    embedding where the sub-range has that term, least squares over its starts (printed non-KV total less weights
    and torch peak, two decimals of GiB). MLA models are left out of the least squares: on the V2 runner their
    embedding-sized copy shows in the torch peak instead (DeepSeek-V2-Lite, tests/test_vllm_starts.py). The V1
    runner's as the middle of its starts' figures."""
    import json

    from sizing.engines.releases import ENGINES_DIR, version_key
    from sizing.evidence.starts import printed_non_torch_gib
    from sizing.units import GiB

    data = json.loads((ENGINES_DIR / LOGIT_FILE).read_text())
    subs = [(sub["release"], version_key(sub["first_version"]), version_key(sub["last_version"]))
            for sub in data["sub_ranges"]]
    mla = set(data["mla_model_types"])
    rows: dict[tuple[str, str], list] = {}
    for start in fitted_corpus():
        if start.status != "sized" or start.args.get("tensor_parallel_size", 1) != 1 \
                or start.args.get("pipeline_parallel_size", 1) != 1 or not start.printed.non_kv_gib:
            continue
        v = version_key(start.release)
        name = next((n for n, lo, hi in subs if lo <= v[:len(lo)] and v[:len(hi)] <= hi), None)
        if name is None:
            continue
        s = with_engine_defaults(start_scenario(start))
        if mxfp4_experts(s):
            continue
        rows.setdefault((name, start.printed.runner), []).append(
            (start.id, s.max_num_seqs * s.shape.vocab_size, printed_non_torch_gib(start.printed),
             s.shape.vocab_size * s.shape.hidden_size, s.shape.model_type in mla))
    embedding = {sub["release"]: "v2_bytes_per_embedding_element" in sub["non_torch"] for sub in data["sub_ranges"]}
    grouped: dict[tuple[str, str], list] = {}
    for (name, runner), found in rows.items():
        grouped.setdefault((NON_TORCH_GROUPS.get(name, name), runner), []).extend(found)
    out = {}
    for name, _, _ in subs:
        group = NON_TORCH_GROUPS.get(name, name)
        v2, v1 = [r for r in grouped.get((group, "v2"), []) if not r[4]], grouped.get((group, "v1"), [])
        if len(v2) < 3:
            continue
        x = np.array([[1.0, *([r[3]] if embedding[name] else [])] for r in v2])
        y = np.array([r[2] for r in v2]) * GiB - PENALTY_STATE_BYTES_PER_LOGIT * np.array([r[1] for r in v2], float)
        coef = np.linalg.lstsq(x, y, rcond=None)[0]
        v1_values = [r[2] for r in v1]
        out[name] = {"single_gpu_v2_bytes": int(round(coef[0])),
                     "v2_bytes_per_sampled_logit": PENALTY_STATE_BYTES_PER_LOGIT,
                     **({"v2_bytes_per_embedding_element": round(float(coef[1]), 3)} if embedding[name] else {}),
                     "single_gpu_bytes": int(round((min(v1_values) + max(v1_values)) / 2 * GiB)) if v1_values
                     else int(round(coef[0])),
                     "v2_starts": sorted(r[0] for r in v2), "v1_starts": sorted(r[0] for r in v1)}
    return out


def _tensor_parallel_v2_starts():
    """The V2 runner's starts at TP >= 2 (one pipeline stage) of LOGIT_FILE's releases that print the non-KV total,
    each with its sub-range's name and its scenario with the engine's defaults."""
    import json

    from sizing.engines.releases import ENGINES_DIR, version_key

    data = json.loads((ENGINES_DIR / LOGIT_FILE).read_text())
    subs = [(sub["release"], version_key(sub["first_version"]), version_key(sub["last_version"]))
            for sub in data["sub_ranges"]]
    out = []
    for start in fitted_corpus():
        p = start.printed
        if start.status != "sized" or start.args.get("tensor_parallel_size", 1) < 2 \
                or start.args.get("pipeline_parallel_size", 1) != 1 or p.runner != "v2" or not p.non_kv_gib:
            continue
        v = version_key(start.release)
        name = next((n for n, lo, hi in subs if lo <= v[:len(lo)] and v[:len(hi)] <= hi), None)
        s = with_engine_defaults(start_scenario(start)) if name is not None else None
        if s is not None and not mxfp4_experts(s):
            out.append((start, name, s))
    return out


def fit_tensor_parallel_non_torch() -> dict:
    """The V2 runner's non-torch memory at TP >= 2 (printed non-KV total less weights and torch peak, rank 0; every
    rank prints the same) as base + bytes per logit of max_num_seqs x vocab_size + the sub-range's bytes per
    embedding element over the rank's shard of the vocab-parallel embedding. The per-logit figure is the
    one-GPU fit's of each sub-range (fit_sampled_logit_non_torch): the sampler's per-request state
    (v1/worker/gpu/sample/penalties.py output_bin_counts, int32 max_num_reqs x vocab) is built over the whole
    vocabulary on every rank. The base is the largest of what the starts of every sub-range leave beside it, so
    that no start's non-torch memory is above kvsize's (the costly side is a pool larger than the engine's)."""
    from sizing.evidence.starts import printed_non_torch_gib
    from sizing.units import GiB

    fits = fit_sampled_logit_non_torch()
    per_logit = {name: fit["v2_bytes_per_sampled_logit"] for name, fit in fits.items()}
    rows = []
    tp_sizes = set()
    for start, name, s in _tensor_parallel_v2_starts():
        tp_sizes.add(s.tensor_parallel_size)
        a, per_element = per_logit[name], fits[name].get("v2_bytes_per_embedding_element", 0)
        embedding = per_element * s.shape.vocab_size * s.shape.hidden_size / s.tensor_parallel_size
        rest = printed_non_torch_gib(start.printed) * GiB - a * s.max_num_seqs * s.shape.vocab_size - embedding
        rows.append((start.id, name, a, rest))
    if not rows:
        return {}
    base = max(r[3] for r in rows)
    # the sub-ranges whose starts the base comes from; the others of LOGIT_FILE carry it
    source = sorted({r[1] for r in rows})
    return {"tensor_parallel_bytes": int(round(base)), "per_logit_by_range": per_logit,
            "from": source, "starts": sorted(r[0] for r in rows), "tp_sizes": sorted(tp_sizes),
            "residuals_gib": {r[0]: round(r[3] / GiB, 3) for r in rows}}


# The sub-ranges whose V2 sampler peaks alike at TP: 0.33.0's profiling run samples a second time with every sampling
# parameter set (see write_tensor_parallel); its TP starts print about 2.8 model-dtype copies of the logits where
# 0.27.0-0.32.0's print about 2.0
LOGIT_COPY_GROUPS = {"0.27": "0.27-0.32", "0.29": "0.27-0.32", "0.31": "0.27-0.32", "0.33": "0.33"}


def _sampler_peak_parts(s, copies_field: str) -> tuple[int, int, int]:
    """A start's profiling peak taken apart around the V2 sampler's logit copies (`copies_field` set to 0): the
    model-dtype logits of its sampled rows, what the sampler's peak holds beside the copies (the workspaces, the
    sampler's hidden states and, at TP, the rank's shard), and the largest of the other peaks (the forward, the dense
    layers before the MoE workspace, the compile-time examples)."""
    from sizing.engines.memory import DTYPE_BYTES, profiling_peak

    run = get_engine(s.engine).release.activation_v2
    tokens = s.max_num_batched_tokens
    rows = min(s.max_num_seqs, tokens)
    bare = profiling_peak(s.shape, run.model_copy(update={copies_field: 0.0}), tokens, rows, s.tensor_parallel_size,
                          range(s.shape.num_layers), True, True, s.gpu_multiprocessors or rows,
                          s.torch_compile and not s.compile_cache_hit)
    others = max(bare.workspace_bytes + bare.moe_workspace_bytes + bare.forward_bytes,
                 bare.workspace_bytes + bare.forward_before_moe_bytes, bare.compile_examples_bytes)
    return (rows * s.shape.vocab_size * DTYPE_BYTES[s.shape.serving_dtype],
            bare.workspace_bytes + bare.moe_workspace_bytes + bare.sampler_bytes, others)


def fit_tensor_parallel_logit_copies() -> dict:
    """Model-dtype copies of the full logits at the V2 sampler's peak at TP >= 2 (activation_v2
    tensor_parallel_logit_copies) beside the rank's shard, least squares (no intercept) per group of
    LOGIT_COPY_GROUPS over the TP starts whose printed torch peak is above every other part of kvsize's profiling
    peak (the forward, the compile-time examples, the MoE workspace): what is left of the peak once the workspace,
    the hidden states and the shard are taken out, per logit of the model dtype. Models with soft-capped logits are
    left out (their capped copy is a floor)."""
    from sizing.units import GiB

    groups: dict[str, tuple[list, list, list]] = {}
    for start, sub_range, s in _tensor_parallel_v2_starts():
        if not start.printed.torch_peak_gib or s.shape.logit_softcap:
            continue  # a soft-capped model's sampler keeps a capped copy whatever the copies (memory.py)
        logits, beside, others = _sampler_peak_parts(s, "tensor_parallel_logit_copies")
        printed = max(map(float, start.printed.torch_peak_gib)) * GiB
        if others >= printed:
            continue  # the sampler is not this start's peak
        x, y, ids = groups.setdefault(LOGIT_COPY_GROUPS[sub_range], ([], [], []))
        x.append(logits)
        y.append(printed - beside)
        ids.append(start.id)
    by_group = {}
    for group, (x, y, ids) in groups.items():
        xs, ys = np.array(x, float), np.array(y, float)
        by_group[group] = {"tensor_parallel_logit_copies": round(float(xs @ ys / (xs @ xs)), 3), "starts": sorted(ids)}
    return by_group


def fit_single_gpu_logit_copies() -> dict:
    """Model-dtype copies of the logits at the V2 sampler's peak on one GPU (activation_v2 single_gpu_logit_copies),
    least squares (no intercept) over the one-GPU starts of the releases that set the figure whose printed torch
    peak is the sampler's by kvsize's own parts at the fitted figure (the forward, the compile-time examples and the
    MoE workspace below it): what is left of the peak once the workspace, the MoE workspace and the hidden states are
    taken out, per logit of the model dtype. Soft-capped models are left out (their capped copy is a floor), and MLA
    models (their attention's context may be the peak). Empty where no release sets the figure."""
    import json

    from sizing.engines.releases import ENGINES_DIR
    from sizing.units import GiB

    if "single_gpu_logit_copies" not in json.loads((ENGINES_DIR / LOGIT_FILE).read_text())["activation_v2"]:
        return {}
    rows = []
    for start in fitted_corpus():
        p = start.printed
        if start.status != "sized" or p.runner != "v2" or not p.torch_peak_gib \
                or start.args.get("tensor_parallel_size", 1) != 1 or start.args.get("pipeline_parallel_size", 1) != 1:
            continue
        s = with_engine_defaults(start_scenario(start))
        run = get_engine(s.engine).release.activation_v2
        if run is None or run.single_gpu_logit_copies is None or s.shape.logit_softcap or s.shape.is_mla:
            continue  # an MLA model's peak may be its attention's context, which the block size sets
        logits, beside, others = _sampler_peak_parts(s, "single_gpu_logit_copies")
        rows.append((start.id, logits, max(map(float, p.torch_peak_gib)) * GiB - beside, others - beside))
    copies = None
    for _ in range(10):  # the starts whose peak is the sampler's at the figure, until the figure settles
        kept = [r for r in rows if copies is None or r[3] < copies * r[1]]
        xs, ys = np.array([r[1] for r in kept], float), np.array([r[2] for r in kept], float)
        fitted = round(float(xs @ ys / (xs @ xs)), 3)
        if fitted == copies:
            break
        copies = fitted
    return {"single_gpu_logit_copies": copies, "starts": sorted(r[0] for r in kept)}


def write_single_gpu_logit_copies(fit: dict) -> None:
    def change(data: dict) -> None:
        data["activation_v2"]["single_gpu_logit_copies"] = fit["single_gpu_logit_copies"]
        data["sources"]["activation_v2.single_gpu_logit_copies"] = (
            "scripts/fit_vllm_terms.py --write (fit_single_gpu_logit_copies): model-dtype copies of the logits at "
            "the V2 sampler's peak on one GPU, least squares over the one-GPU starts whose printed torch peak is "
            "the sampler's: " + ", ".join(fit["starts"]) + ". 0.33.0's sampler warm-up samples a second time with "
            "every sampling parameter set (see activation_v2.tensor_parallel_logit_copies): the model-dtype logits "
            "and their fp32 copy are 3 copies, the fit a little more. The TP figure (2.8) held on one GPU left "
            "every such start's peak 0.07-0.15 GiB short, 1.0-1.1% of the pool of the small-pool-0.33 starts "
            "(Qwen3-30B-A3B at 0.5, gpt-oss-120b at 0.6). 0.27.0-0.32.0's one-GPU starts print the model-dtype "
            "logits alone (Qwen3-30B-A3B: 0.87 on 0.30.0)")

    _edit_release(LOGIT_FILE, change)


def write_tensor_parallel(non_torch: dict, copies: dict) -> None:
    def change(data: dict) -> None:
        starts = ", ".join(non_torch["starts"])
        per_logit = non_torch["per_logit_by_range"]  # each sub-range's one-GPU figure, which TP takes as it is
        for part in (data, *data["sub_ranges"]):
            # the range's own figures are its newest sub-range's (the top level names that release)
            part["non_torch"].update(tensor_parallel_bytes=non_torch["tensor_parallel_bytes"])
        newest = copies[LOGIT_COPY_GROUPS[data["sub_ranges"][-1]["release"]]]
        data["activation_v2"]["tensor_parallel_logit_copies"] = newest["tensor_parallel_logit_copies"]
        for sub in data["sub_ranges"]:
            figure = copies.get(LOGIT_COPY_GROUPS[sub["release"]], newest)["tensor_parallel_logit_copies"]
            if figure == newest["tensor_parallel_logit_copies"]:
                sub.pop("tensor_parallel_logit_copies", None)
            else:
                sub["tensor_parallel_logit_copies"] = figure
        data["sources"]["non_torch.tensor_parallel"] = (
            "scripts/fit_vllm_terms.py --write (fit_tensor_parallel_non_torch): at TP >= 2 under the V2 runner, "
            f"{non_torch['tensor_parallel_bytes']:,} B + the sub-range's one-GPU B per logit of max_num_seqs x "
            "vocab_size (" + ", ".join(f"{k}: {v}" for k, v in per_logit.items()) + "). vLLM 0.33.0 counts as non-KV memory all it consumed since its "
            "baseline (vllm/utils/mem_utils.py memory_profiling: mem_get_info's total_consumed plus the "
            "transient peak), so the sampler's per-request state, built in load_model after the weights are "
            "measured (v1/worker/gpu/sample/penalties.py: output_bin_counts, int32 max_num_reqs x vocab, and "
            "prompt_bin_mask), lands outside weights and torch peak, over the whole vocabulary on every rank: the "
            "per-logit figure is each sub-range's one-GPU fit. The base is the largest of what the TP starts (of "
            + ", ".join(non_torch["from"]) + ") leave beside it, so none uses more than kvsize keeps: "
            f"{starts} (GiB: " + ", ".join(f"{k} {v}" for k, v in non_torch["residuals_gib"].items()) + "). "
            "Sub-ranges without a TP start carry it. TP sizes started: "
            + ", ".join(str(n) for n in non_torch["tp_sizes"]) + "; MXFP4 experts are kept out (mxfp4_experts); the V1 "
            "runner at TP takes the base alone")
        data["sources"]["activation_v2.tensor_parallel_logit_copies"] = (
            "scripts/fit_vllm_terms.py --write (fit_tensor_parallel_logit_copies): model-dtype copies of the full "
            "logits at the V2 sampler's peak at TP >= 2, beside the rank's shard, least squares over the TP starts "
            "whose printed torch peak is the sampler's, one figure a group of sub-ranges: "
            + "; ".join(f"{g}: {c['tensor_parallel_logit_copies']} over " + ", ".join(c["starts"])
                        for g, c in sorted(copies.items())) + ". 0.33.0's profiling "
            "run samples a second time with every sampling parameter set (v1/worker/gpu/model_runner.py "
            "_dummy_sampler_run, SamplingParams.for_sampler_warmup), which copies the logits to fp32 "
            "(sample/sampler.py apply_sampling_params): the model-dtype logits and that copy are 3 model-dtype "
            "copies, the fit a little less; 0.27.0-0.32.0's TP starts print about 2. At TP 1 the compile-time "
            "examples stay above it in every start")

    _edit_release(LOGIT_FILE, change)


def write_sampled_logit_non_torch(fits: dict[str, dict]) -> None:
    def change(data: dict) -> None:
        for sub in data["sub_ranges"]:
            fit = fits.get(sub["release"])
            if fit is None:
                continue
            sub["non_torch"].update({k: fit[k] for k in ("single_gpu_bytes", "single_gpu_v2_bytes",
                                                          "v2_bytes_per_sampled_logit", "v2_bytes_per_embedding_element")
                                     if k in fit})
            v1 = (f"; V1 as the middle of {', '.join(fit['v1_starts'])}" if fit["v1_starts"]
                  else "; no start ran the V1 runner, which takes the V2 base")
            sub["sources"]["non_torch"] = (
                "scripts/fit_vllm_terms.py --write: the V2 runner's one-GPU non-torch memory (the 'Total non KV cache "
                "memory' line less weights and torch peak) as base + the V2 sampler's penalty state, 4.125 B per "
                "logit of max_num_seqs x vocab_size (v1/worker/gpu/sample/penalties.py PenaltiesState: int32 "
                "output_bin_counts and a 1-bit prompt_bin_mask packed in int32; from the source, and the 0.29.0 starts "
                "at 256 sequences print what it predicts)" + (" + bytes per element of the vocab x hidden embedding"
                                                             if "v2_bytes_per_embedding_element" in fit else "")
                + ", least squares over " + ", ".join(fit["v2_starts"]) + " (MLA models left out: their "
                "embedding-sized copy is in the torch peak on the V2 runner)" + v1)

    _edit_release(LOGIT_FILE, change)


def main() -> int:
    first, further, full = collect()
    for title, names, rows in (("first PIECEWISE capture", ("first_capture_bytes", "activation_copies"), first),
                               ("further graphs", ("per_graph_layer_bytes", "per_graph_mla_layer_bytes"), further)):
        coef = _solve(rows)
        print(f"{title} ({len(rows)} starts): " + ", ".join(f"{n} {v:,.3f}" for n, v in zip(names, coef)))
        for (name, _, row, target) in rows:
            print(f"  {name:52} printed {target / MiB:7.1f} MiB  fit {np.array(row) @ coef / MiB:7.1f}")
    print(f"first FULL capture ({len(full)} starts), predicted from vLLM's split count:")
    for name, _, predicted, target in full:
        print(f"  {name:52} printed {target / MiB:7.1f} MiB  predicted {predicted / MiB:7.1f}")
    print("non-torch memory at TP 1 (the middle of what the starts print):")
    for name, runners in sorted(fit_non_torch().items()):
        for runner, (value, ids) in sorted(runners.items()):
            print(f"  {name:24} {runner}: {value:,} B over {len(ids)} starts")
    print("leave one family out (the fitted parts, MiB):")
    for fam, n, worst, median in leave_one_family_out():
        print(f"  {fam:24} {n:3} starts  worst {worst:+7.1f}  median |error| {median:6.1f}")
    logits = fit_sampled_logit_non_torch()
    print(f"V2 non-torch per sampled logit ({LOGIT_FILE}):")
    for name, fit in logits.items():
        print(f"  {name}: {fit['single_gpu_v2_bytes']:,} B + {fit['v2_bytes_per_sampled_logit']} B per logit + "
              f"{fit.get('v2_bytes_per_embedding_element', 0)} B per embedding element over "
              f"{len(fit['v2_starts'])} starts; V1 {fit['single_gpu_bytes']:,} B")
    per_layer, v2_ids = fit_v2_graph_per_layer()
    print(f"V2 graph estimate above the V1 model: {per_layer:,} B per layer over {len(v2_ids)} starts")
    unsplit_per_layer, unsplit_ids = fit_v2_graph_per_layer(unsplit=True)
    print(f"  where the decode attention runs unsplit: {unsplit_per_layer:,} B per layer over "
          f"{len(unsplit_ids)} starts ({', '.join(unsplit_ids)})")
    mla_base, mla_per_graph_layer, mla_ids = fit_v2_flash_attn_mla()
    print(f"V2 FLASH_ATTN_MLA PIECEWISE phase: {mla_base:,} B + {mla_per_graph_layer:,} B a further graph and layer "
          f"over {len(mla_ids)} starts ({', '.join(mla_ids)})")
    fa3 = fa3_part_by_part()
    if fa3:
        print(f"FlashAttention 3's V2 estimate part by part (not adopted): {fa3['base_bytes']:,} B + "
              f"{fa3['per_graph_layer_bytes']:,} B a further graph and layer over {len(fa3['starts'])} starts; "
              "each probed start above it (MB): " + ", ".join(f"{k} {v / 1e6:+.0f}"
                                                            for k, v in sorted(fa3["above_fit_bytes"].items())))
    tp_non_torch, tp_copies = fit_tensor_parallel_non_torch(), fit_tensor_parallel_logit_copies()
    if tp_non_torch:
        per_logit = ", ".join(f"{k} {v}" for k, v in tp_non_torch["per_logit_by_range"].items())
        print(f"V2 non-torch at TP >= 2 ({LOGIT_FILE}): {tp_non_torch['tensor_parallel_bytes']:,} B + each "
              f"sub-range's B per logit ({per_logit}); what each start leaves beside the per-logit part (GiB):")
        for sid, rest in tp_non_torch["residuals_gib"].items():
            print(f"  {sid:52} {rest:+.3f}")
    for group, fit in sorted(tp_copies.items()):
        print(f"V2 sampler's logit copies at TP >= 2, {group}: {fit['tensor_parallel_logit_copies']} over "
              f"{len(fit['starts'])} starts")
    single = fit_single_gpu_logit_copies()
    if single:
        print(f"V2 sampler's logit copies on one GPU: {single['single_gpu_logit_copies']} over "
              f"{len(single['starts'])} starts ({', '.join(single['starts'])})")
    if "--write" in sys.argv:
        write(fitted_constants(first, further))
        write_sampled_logit_non_torch(logits)
        write_v2_graph_per_layer(per_layer, v2_ids, unsplit_per_layer, unsplit_ids)
        if mla_ids:
            write_v2_flash_attn_mla(mla_base, mla_per_graph_layer, mla_ids)
        if tp_non_torch and tp_copies:
            write_tensor_parallel(tp_non_torch, tp_copies)
        if single:
            write_single_gpu_logit_copies(single)
    return 0


def write(constants: dict) -> None:
    """Put the fitted constants into the release files that use them, naming the starts."""
    ids = constants.pop("fitted_on")

    def change(data: dict) -> None:
        data["cuda_graph_estimate"].update(constants)
        data["sources"]["cuda_graph_estimate.fitted_on"] = (
            f"scripts/fit_vllm_terms.py --write, least squares over the {len(ids)} starts of tests/fixtures/vllm-starts "
            "that log each mode's figures at DEBUG: " + ", ".join(ids))

    for name in FITTED_FILES:
        _edit_release(name, change)


if __name__ == "__main__":
    sys.exit(main())

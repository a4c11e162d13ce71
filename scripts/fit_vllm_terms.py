"""Fit the per-release constants of vLLM's CUDA-graph estimate to the corpus of real starts.

usage: python scripts/fit_vllm_terms.py
vLLM's profile_cudagraph_memory logs, at DEBUG, each mode's first capture and per-graph figure
("Estimated PIECEWISE CUDA graph memory: 134.00 MiB first-capture + (51-1) x 4.00 MiB per-graph").
The starts of tests/fixtures/vllm-starts that ran at DEBUG give those figures, so each part of the
estimate (sizing/memory.py cuda_graph_estimate) is fitted to vLLM's own figure for it by least squares:
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sizing.engines import get_engine  # noqa: E402
from sizing.memory import DTYPE_BYTES, graph_captures, split_kv_accumulator_bytes  # noqa: E402
from sizing.plan import with_engine_defaults  # noqa: E402
from sizing.starts import CORPUS, load_corpus, start_scenario  # noqa: E402
from sizing.units import MiB  # noqa: E402

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


FITTED_FILES = ("vllm-0.20.json", "vllm-0.21-0.25.json", "vllm-0.26.json")


def collect() -> tuple[list, list, list]:
    """(first PIECEWISE captures, further graphs, first FULL captures): per start that logged them, its id, its
    family, the regressors and vLLM's figure in bytes."""
    from sizing.starts import family

    first, further, full = [], [], []
    for start in load_corpus():
        if start.status != "sized":
            continue
        modes = printed_modes((CORPUS / start.log).read_text(errors="replace"))
        if not modes:
            continue
        s = with_engine_defaults(start_scenario(start))
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
            predicted = model.full_first_capture_bytes + split_kv_accumulator_bytes(shape, model, tp, max(c.full))
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
    """Per release file and model runner: the non-torch memory of its one-GPU starts as the release file keeps
    it, the middle of the range they print (two decimals of GiB) in bytes, and the starts it comes from."""
    import json

    from sizing.releases import ENGINES_DIR, version_key
    from sizing.units import GiB

    files = []
    for path in sorted(ENGINES_DIR.glob("vllm-*.json")):
        data = json.loads(path.read_text())
        if data.get("non_torch"):
            files.append((path.name, version_key(data["first_version"]), version_key(data["last_version"])))
    groups: dict[tuple[str, str], list[tuple[float, str]]] = {}
    for start in load_corpus():
        p = start.printed
        if start.status != "sized" or not p.non_torch_gib or start.args.get("tensor_parallel_size", 1) != 1 \
                or start.args.get("pipeline_parallel_size", 1) != 1:
            continue
        v = version_key(start.release)
        name = next((n for n, lo, hi in files if lo <= v[:len(lo)] and v[:len(hi)] <= hi), None)
        if name is not None:
            groups.setdefault((name, p.runner), []).append((float(p.non_torch_gib[0]), start.id))
    out: dict[str, dict[str, tuple[int, list[str]]]] = {}
    for (name, runner), rows in groups.items():
        values = [v for v, _ in rows]
        middle = (min(values) + max(values)) / 2
        out.setdefault(name, {})[runner] = (int(round(middle * GiB)), sorted(i for _, i in rows))
    return out


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
    if "--write" in sys.argv:
        write(fitted_constants(first, further))
    return 0


def write(constants: dict) -> None:
    """Put the fitted constants into the release files that use them, naming the starts."""
    import json

    from sizing.releases import ENGINES_DIR

    ids = constants.pop("fitted_on")
    for name in FITTED_FILES:
        path = ENGINES_DIR / name
        data = json.loads(path.read_text())
        data["cuda_graph_estimate"].update(constants)
        data["sources"]["cuda_graph_estimate.fitted_on"] = (
            f"scripts/fit_vllm_terms.py --write, least squares over the {len(ids)} starts of tests/fixtures/vllm-starts "
            "that log each mode's figures at DEBUG: " + ", ".join(ids))
        tmp = path.with_suffix(".json.part")
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        tmp.replace(path)
        print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())

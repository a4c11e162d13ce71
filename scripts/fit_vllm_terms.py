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
The constants go into profiles/engines/vllm-*.json by hand, with this fit as their source.
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


def main() -> int:
    first, further, full = [], [], []
    for start in load_corpus():
        if start.status != "sized":
            continue
        modes = printed_modes((CORPUS / start.log).read_text(errors="replace"))
        if not modes:
            continue
        s = with_engine_defaults(start_scenario(start))
        shape, tp = s.shape, s.tensor_parallel_size
        model = get_engine(s.engine).release.cuda_graph_estimate
        c = graph_captures(shape, model, tp, range(shape.num_layers), s.max_num_seqs, s.max_num_batched_tokens,
                           s.cudagraph_capture_sizes, s.max_cudagraph_capture_size)
        if "PIECEWISE" in modes:
            activation = max(c.piecewise) * 2 * c.mlp_width_values * DTYPE_BYTES[shape.serving_dtype]
            first.append((start.id, [1.0, activation], modes["PIECEWISE"][0] * MiB))
        if "FULL" in modes:
            predicted = model.full_first_capture_bytes + split_kv_accumulator_bytes(shape, model, tp, max(c.full))
            full.append((start.id, predicted, modes["FULL"][0] * MiB))
        graphs = sum(n - 1 for _, n, _ in modes.values())
        row = [0.0, graphs * c.splitting_layers] if c.mla else [graphs * c.splitting_layers, 0.0]
        further.append((start.id, row, sum((n - 1) * per * MiB for _, n, per in modes.values())))
    for title, names, rows in (("first PIECEWISE capture", ("first_capture_bytes", "activation_copies"), first),
                               ("further graphs", ("per_graph_layer_bytes", "per_graph_mla_layer_bytes"), further)):
        x = np.array([r[1] for r in rows], float)
        y = np.array([r[2] for r in rows], float)
        coef, *_ = np.linalg.lstsq(x, y, rcond=None)
        print(f"{title} ({len(rows)} starts): " + ", ".join(f"{n} {v:,.3f}" for n, v in zip(names, coef)))
        for (name, _, target), row in zip(rows, x):
            print(f"  {name:52} printed {target / MiB:7.1f} MiB  fit {row @ coef / MiB:7.1f}")
    print(f"first FULL capture ({len(full)} starts), predicted from vLLM's split count:")
    for name, predicted, target in full:
        print(f"  {name:52} printed {target / MiB:7.1f} MiB  predicted {predicted / MiB:7.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Fit the per-release constants of vLLM's CUDA-graph estimate to the corpus of real starts.

usage: python scripts/fit_vllm_terms.py [--release 0.22]
The estimate is linear in its four constants (sizing/memory.py cuda_graph_estimate), so each start's
features are the estimate with one constant at 1 and the others at 0; least squares over every
start that printed "Estimated CUDA graph memory" gives the constants, printed with each start's
residual. The constants go into profiles/engines/vllm-*.json by hand, with this fit as their source.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sizing.memory import cuda_graph_estimate  # noqa: E402
from sizing.plan import with_engine_defaults  # noqa: E402
from sizing.releases import CudaGraphEstimateModel  # noqa: E402
from sizing.starts import load_corpus, start_scenario  # noqa: E402
from sizing.units import MiB  # noqa: E402

CONSTANTS = ("first_capture_bytes", "activation_copies", "per_graph_layer_bytes", "per_graph_mla_layer_bytes")


def features(scenario, base: CudaGraphEstimateModel) -> list[float]:
    s = with_engine_defaults(scenario)
    out = []
    for name in CONSTANTS:
        unit = base.model_copy(update={c: (1 if c == name else 0) for c in CONSTANTS})
        out.append(cuda_graph_estimate(s.shape, unit, s.cudagraph_mode or "FULL_AND_PIECEWISE", s.tensor_parallel_size,
                                       range(s.shape.num_layers), s.max_num_seqs, s.max_num_batched_tokens,
                                       s.cudagraph_capture_sizes, s.max_cudagraph_capture_size))
    return out


def main() -> int:
    from sizing.engines import get_engine

    rows, targets, names = [], [], []
    base = None
    for start in load_corpus():
        printed = start.printed.cuda_graph_gib
        if start.status != "sized" or not printed:
            continue
        scenario = start_scenario(start)
        model = get_engine(scenario.engine).release.cuda_graph_estimate
        if model is None:
            continue
        base = base or model
        rows.append(features(scenario, model))
        targets.append(max(float(x) for x in printed) * 1024 * MiB)
        names.append(start.id)
    x, y = np.array(rows, float), np.array(targets, float)
    coef, *_ = np.linalg.lstsq(x, y, rcond=None)
    for name, value in zip(CONSTANTS, coef):
        print(f"{name:28} {value:,.3f}")
    for name, row, target in zip(names, x, y):
        print(f"  {name:58} printed {target / MiB:7.0f} MiB  fit {row @ coef / MiB:7.0f}  {(row @ coef - target) / MiB:+5.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

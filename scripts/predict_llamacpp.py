"""kvsize's predictions for the planned panel of llama.cpp loads (measure/llamacpp/panel.py), written before any
load of the panel is run, with the llama.cpp rules kvsize has at the commit that holds this file.

    python scripts/predict_llamacpp.py [--out measure/llamacpp/predictions.json]

The rules as they stood: llama.cpp is an exact pool (sizing/engines/llamacpp.py: ExactPool padded to 256 tokens,
every layer holding min(tokens, its window) of each sequence, from kvsize's own reading of the config). A load of
n_ctx cells for n_seq_max sequences is read as kvsize's serving command writes it (sizing/engines/serve.py:
-c is the whole cache): with kv_unified, one stream of n_ctx tokens; without, n_seq_max sequences of
n_ctx / n_seq_max tokens each. Every load is predicted to load (no rule refused a cache type or a setting).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.llamacpp.panel import panel  # noqa: E402
from sizing.cache.layers import build_layout  # noqa: E402
from sizing.engines.registry import get_engine  # noqa: E402
from sizing.errors import KvsizeError  # noqa: E402
from sizing.profiles import bundled_shape  # noqa: E402

# llama.cpp cache type -> kvsize format name (sizing/cache/formats.py)
FORMAT = {"f32": "fp32", "f16": "fp16", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1",
          "q5_0": "q5_0", "q5_1": "q5_1", "iq4_nl": "iq4_nl"}


def predict(load) -> dict:
    engine = get_engine("llamacpp")
    shape = bundled_shape(load.model)
    try:
        layout = build_layout(shape, FORMAT[load.type_k], FORMAT[load.type_v])
        pool = engine.pool(layout, 1, load.n_batch)
    except KvsizeError as e:
        return {"loads": False, "refusal": str(e)}
    if load.kv_unified:
        streams, tokens = 1, load.n_ctx
    else:
        streams, tokens = load.n_seq_max, load.n_ctx // load.n_seq_max
    cells = -(-tokens // pool.pad) * pool.pad
    kv_bytes = streams * pool.request_units(tokens)
    state_bytes = load.n_seq_max * layout.state_bytes_per_sequence()
    return {"loads": True, "cells": cells, "streams": streams, "kv_bytes": kv_bytes,
            "recurrent_state_bytes": state_bytes}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "measure" / "llamacpp" / "predictions.json"))
    args = ap.parse_args(argv)
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    rows = [{"load": load.as_dict(), "prediction": predict(load)} for load in panel()]
    out = {"schema": "kvsize.llamacpp-predictions/1", "code_commit": commit,
           "rules": "sizing/engines/llamacpp.py as of code_commit (ExactPool, context padded to 256)",
           "loads": rows}
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"{len(rows)} loads predicted -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`kvsize measure`: measure on an NVIDIA GPU and write a report (needs torch)."""

from __future__ import annotations

import argparse
from pathlib import Path

from app.options import _fraction, _list, _positive_int
from app.output import _check_out


def add_parser(sub) -> None:
    p = sub.add_parser("measure", help="measure on an NVIDIA GPU and write a report (needs torch)")
    p.add_argument("--model", action="append", required=True, help="bundled model id (repeatable)")
    p.add_argument("--kv-cache-dtype", type=_list, default=["bf16"])
    p.add_argument("--blocks", type=_positive_int, default=256)
    p.add_argument("--layers", type=_positive_int, default=None, help="scale the model down to N layers")
    p.add_argument("--gpu-memory-utilization", type=_fraction, default=0.9)
    p.add_argument("--max-num-batched-tokens", type=_positive_int, default=2048)
    p.add_argument("--decode-batches", type=_list, default=["1", "8", "32"])
    p.add_argument("--decode-contexts", type=_list, default=["1024", "4096", "16384"])
    p.add_argument("--skip", type=_list, default=[], help="parts to skip: allocation, capacity, decode")
    p.add_argument("--out", required=True)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from measure.run import _model_and_layers, run_measurement
    from sizing.profiles import model_profile

    for spec in args.model:
        model_profile(_model_and_layers(spec, args.layers)[0])  # an unknown name is refused before the GPU is asked
    _check_out(Path(args.out))

    return run_measurement(args)

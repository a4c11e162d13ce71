"""`kvsize validate`: re-check a measurement report against today's predictions."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="re-check a measurement report against today's predictions")
    p.add_argument("reports", nargs="+")
    p.add_argument("--tolerance", type=float, default=None, help="override every relative tolerance")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from measure.validate import validate_files

    return validate_files(args.reports, args.tolerance)

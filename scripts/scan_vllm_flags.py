"""List the flags of an installed vLLM's `vllm serve` (its argument parser's destinations) into
profiles/engines/vllm-flags/<release>.json's `parser_dests`, keeping each flag's classification already there.

A flag kvsize reads (sizing/engines/vllm_args.py READ_FLAGS and NOT_MODELLED) needs none; every other flag the
parser has must be classified by hand from vLLM's source, as "none" (moves no GPU memory) or "memory" (moves memory
kvsize does not model), with the reason and the source line; tests/test_vllm_launch.py fails on a flag left out.

usage: python scripts/scan_vllm_flags.py        (with vLLM importable: a host with a CUDA driver)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure.report_io import write_report  # noqa: E402

FOLDER = ROOT / "profiles" / "engines" / "vllm-flags"


def parser_dests() -> tuple[str, list[str]]:
    import vllm
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = make_arg_parser(FlexibleArgumentParser())
    return vllm.__version__, sorted({a.dest for a in parser._actions if a.dest != "help"})


def main() -> int:
    version, dests = parser_dests()
    path = FOLDER / f"{version}.json"
    profile = json.loads(path.read_text()) if path.exists() else {"flags": {}}
    profile["release"], profile["parser_dests"] = version, dests
    write_report(path, profile)
    print(f"vLLM {version}: {len(dests)} flags written to {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

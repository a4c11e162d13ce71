"""`kvsize verify`: start the real vLLM with dummy weights and hold the estimate against what it prints."""

from __future__ import annotations

import argparse
from pathlib import Path

from sizing.errors import KvsizeError

from app.options import _add_scenario_options, _positive_int, launch_scenario
from app.output import _check_out


def add_parser(sub) -> None:
    p = sub.add_parser("verify", help="start the real vLLM on this GPU with dummy weights and hold the estimate "
                                      "against what it prints (needs an NVIDIA GPU and vLLM)")
    _add_scenario_options(p, model_required=False)
    p.add_argument("--kv-cache-dtype", default="auto", help="KV format, as vLLM spells it (default auto)")
    p.add_argument("--vllm-path", default=None, help="a folder holding the vllm package, where it is not installed")
    p.add_argument("--timeout", type=_positive_int, default=420, help="seconds a start may take (default 420)")
    p.add_argument("--out", required=True, help="the report (.json): the whole log, the config and the checks")
    p.add_argument("launch", nargs="*", help=argparse.SUPPRESS)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from measure.verify import run_verify
    from sizing.profiles import model_profile, read_config_file

    scenario = launch_scenario(args, args.kv_cache_dtype, args.kv_cache_dtype)
    out = _check_out(Path(args.out))
    if out.suffix.lower() != ".json":
        raise KvsizeError(f"--out {out.name!r}: a verify report is JSON; name it {out.stem}.json")
    path = Path(args.model)
    config = read_config_file(path) if path.suffix == ".json" or path.is_dir() else model_profile(args.model).config
    return run_verify(scenario, config, out, scenario.usage_context, args.vllm_path, args.timeout)

"""How decode time depends on the split count and on page order, per format, at a few grid
points: the evidence behind measure.kernels.wave_splits (prints a table, writes JSON).

    python benchmarks/split_sweep.py --out split-sweep.json

For each format's tuned launch configuration (from a committed kernel report) it times every
split count in --splits, with the block table in random order (the benchmark's worst case) and
in order, and records what limits residency: registers and shared memory per program.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--report", default="measure/reports/h200-decode-kernels.json",
                    help="kernel report whose tuned configurations are used")
    ap.add_argument("--formats", default="bf16,fp8_e4m3,int8_per_token_head,nvfp4")
    ap.add_argument("--points", default="4x32768,16x16384,16x32768,32x16384,32x32768",
                    help="BATCHxCONTEXT,...")
    ap.add_argument("--splits", default="1,2,3,4,5,6,8,10,12,16,24,32")
    args = ap.parse_args()

    import torch

    from measure.kernel_bench import _bench_graph, build_case, bytes_read, copy_bandwidth_gb_s
    from measure.kernels import kernel_arguments, kernel_constants, kernel_residency, paged_decode

    chosen = json.loads(Path(args.report).read_text())["tuning"]["chosen"]
    copy = copy_bandwidth_gb_s()
    props = torch.cuda.get_device_properties(0)
    rows, residency = [], {}
    for fmt in args.formats.split(","):
        config = dict(chosen[fmt])
        for point in args.points.split(","):
            batch, context = (int(x) for x in point.split("x"))
            cache, table, lens, _, _ = build_case(fmt, batch, context, 8, 128, 16, seed=3)
            q = torch.randn(batch, 32, 128, device="cuda")
            nbytes = bytes_read(cache, batch, context, None)
            tables = {"random": table, "ordered": torch.arange(table.numel(), device="cuda",
                                                                dtype=torch.int32).reshape(table.shape)}
            if fmt not in residency:
                options = {k: v for k, v in config.items() if k not in ("block_t", "num_warps", "num_stages",
                                                                         "maxnreg")}
                kernel, constants = kernel_constants(cache, 32, config["block_t"], **options)
                residency[fmt] = dict(kernel_residency(
                    kernel, constants, config["num_warps"], config["num_stages"], q.device, config.get("maxnreg"),
                    lambda: kernel_arguments(q, cache, table, lens, 2, constants=constants)[0]),
                    num_warps=config["num_warps"])
            tiles = -(-context // config["block_t"])
            for order, tab in tables.items():
                for splits in [None] + [int(s) for s in args.splits.split(",")]:
                    if splits is not None and splits > tiles:
                        continue
                    ms = _bench_graph(lambda: paged_decode(q, cache, tab, lens, max_context=context,
                                                           num_splits=splits, **config), rep_ms=30)
                    gbs = nbytes / ms / 1e6
                    label = "waves" if splits is None else splits  # None: wave_splits chooses
                    rows.append(dict(format=fmt, batch=batch, context=context, order=order, num_splits=label,
                                     median_ms=ms, pct_of_copy=100 * gbs / copy))
                    print(f"{fmt:22s} b{batch:<3d} {context:6d} {order:8s} splits {label!s:>5} "
                          f"{ms:8.4f} ms {100 * gbs / copy:6.1f}% of copy", flush=True)
            del cache, table, tables
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(dict(device=props.name, sm_count=props.multi_processor_count,
                                              copy_bandwidth_gb_s=copy, residency=residency, configs=chosen,
                                              rows=rows), indent=1) + "\n")
    print(json.dumps(residency, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Fused paged decode on an NVIDIA GPU: build, check and time every format over a grid in one
run, print a table, and write a measurement report (schema kvsize.measure/1) with the
`kernels`, `baselines`, `slopes` and `decode_efficiency` sections.

    python benchmarks/bench_decode.py --out measure/reports/h100-decode-kernels.json

Goals printed at the end (they live here, not in CI): at ≥ 16K tokens, batch ≥ 16, 8 KV
heads of 128, achieved bandwidth ≥ 80% of the measured copy bandwidth for every format; the
slope of time against context relative to bf16's within 10% of the bytes ratio; the fitted
inter-token model within 10% of every measured point of the grid.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

# maxnreg caps registers per thread (None: as compiled) so that more programs fit on an SM;
# splits are not tuned: measure.kernels.wave_splits fills whole waves of resident programs.
# 8 warps left the search: on the H200 they lost to 4 for every format by 1-27% (NOTES.md).
CONFIGS = [dict(block_t=bt, num_warps=4, num_stages=st) | ({} if reg is None else dict(maxnreg=reg))
           for bt in (64, 128) for st in (1, 2) for reg in (None, 128, 96)]
# Left out of the search, though the kernels keep them (the CPU tests check them): fp8 operands
# for e4m3 caches (fp8_dot), int8 tensor cores for q·k (int8_qk) and 4-bit rows as bytes of even
# and odd values (split_nibbles). In the H200 run before they left, each format's best config
# with them was 22-26% (fp8_dot, int8_qk) and 10-40% (split_nibbles) slower than its winner.
# The phase readings (split_bytes, split_words) run with inline-PTX decoding (asm_decode): its
# per-value form, which the CPU tests check, lost every comparison on the H200 (NOTES.md
# steps 15-17).
# 4-bit rows read as words also try tiles of 256 tokens: per byte, the loop's fixed work (block
# table, softmax bookkeeping) halves again; offline (sm_90) lmdeploy_int4 goes from 6.1 to 5.6
# lane-instructions per byte, while nvfp4 and KIVI-4 spill there
WORD_TILE = 256
# 2-bit rows read as words have phases 16 values wide, whose value dots ([16, T] x [T, 16]) four
# warps share by each decoding the same tile (offline, sm_90: 50 lane-instructions per byte with
# four warps, 24 with two, 15 with one); so they run as one-warp programs, tiles of 32 or 64
WORD2_CONFIGS = [dict(block_t=bt, num_warps=1, num_stages=st, split_words=True, asm_decode=True)
                 for bt in (32, 64) for st in (1, 2)]
# LMDeploy's unsigned codes (per-token scale and zero point) read in phases also try
# subnormal_codes: codes left in place as fp16 subnormals, one instruction per pair fewer


def _spec_bandwidth(name: str) -> tuple[float, str]:
    from sizing.profiles import gpu_ids, gpu_profile

    for gid in gpu_ids():
        p = gpu_profile(gid)
        if p.name.startswith(name) or name.startswith(p.name):
            return p.hbm_bandwidth_gb_s, gid
    raise SystemExit(f"no GPU profile matches {name!r}; add one under profiles/gpus/")


def _write(path: Path, report: dict) -> None:
    path.write_text(json.dumps(report, indent=1) + "\n")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true", help="a small grid, to check the script")
    ap.add_argument("--batches", default="1,4,16,32")
    ap.add_argument("--contexts", default="1024,4096,16384,32768")
    ap.add_argument("--formats", default="", help="comma-separated layouts (default: all)")
    args = ap.parse_args()

    import torch
    import triton

    from measure.kernel_bench import (baseline_points, copy_bandwidth_gb_s, efficiency_section,
                                      run_point, slopes, tune)
    from measure.kernels import phase_reading
    from measure.paged_cache import ASYM, FORMATS
    from measure.run import REPORT_SCHEMA

    t0 = time.monotonic()
    props = torch.cuda.get_device_properties(0)
    spec, gpu_id = _spec_bandwidth(props.name)
    out = Path(args.out)
    batches = [int(b) for b in args.batches.split(",")]
    contexts = [int(c) for c in args.contexts.split(",")]
    formats = args.formats.split(",") if args.formats else list(FORMATS)
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        raise SystemExit(f"--formats: unknown {', '.join(unknown)}; choose from {', '.join(FORMATS)}")
    configs = CONFIGS
    if args.quick:
        batches, contexts, formats, configs = [1, 16], [1024, 4096], ["bf16", "fp8_e4m3", "nvfp4", "kivi2"], CONFIGS[:3]
    report = dict(schema=REPORT_SCHEMA, device=dict(name=props.name, total_bytes=props.total_memory,
                                                   sm_count=props.multi_processor_count, torch=torch.__version__,
                                                   triton=triton.__version__, cuda=torch.version.cuda,
                                                   python=platform.python_version(), profile=gpu_id,
                                                   spec_bandwidth_gb_s=spec))
    copy = copy_bandwidth_gb_s()
    report["copy_bandwidth_gb_s"] = copy
    print(f"{props.name}: copy bandwidth {copy:,.0f} GB/s (read + write), spec {spec:,.0f} GB/s", flush=True)

    q_heads, kv_heads, head_dim, block_size = 32, 8, 128, 16
    tuned, tuning = {}, {}

    def options(fmt: str) -> list[dict]:
        reading, bits = phase_reading(FORMATS[fmt]), FORMATS[fmt].bits
        if reading == "split_bytes":
            phased = [dict(c, split_bytes=True, asm_decode=True) for c in configs]
        elif reading == "split_words" and bits == 4:
            phased = [dict(c, split_words=True, asm_decode=True) for c in configs] + [
                dict(c, block_t=WORD_TILE, split_words=True, asm_decode=True) for c in configs if c["block_t"] == 128]
        elif reading == "split_words":
            return configs + WORD2_CONFIGS
        else:
            return configs
        if FORMATS[fmt].kind == ASYM:
            phased += [dict(c, subnormal_codes=True) for c in phased]
        return configs + phased

    for fmt in formats:
        tuned[fmt], tuning[fmt] = tune(fmt, kv_heads, head_dim, q_heads, block_size, options(fmt))
        print(f"tuned {fmt:<22} {tuned[fmt]} at {time.monotonic() - t0:5.0f} s", flush=True)
    report["tuning"] = dict(configs=tuning, chosen=tuned, at="batch 16, 16384 tokens")
    _write(out, report)

    points, seed = [], 0
    for fmt in formats:
        for batch in batches:
            for ctx in contexts:
                seed += 1
                points.append(run_point(fmt, batch, ctx, q_heads, kv_heads, head_dim, block_size, tuned[fmt], copy,
                                        seed))
        torch.cuda.empty_cache()
        report["kernels"] = points
        _write(out, report)
        print(f"grid {fmt:<22} done at {time.monotonic() - t0:5.0f} s", flush=True)

    extras = []
    for fmt in [f for f in ("bf16", "fp8_e4m3", "int8_per_token_head", "nvfp4", "kivi4") if f in formats]:
        for hd in (64, 256):  # tuned at their own head size: a phase of a 64-wide row is too narrow to pay
            cfg, _ = tune(fmt, kv_heads, hd, q_heads, block_size, options(fmt))
            extras.append(run_point(fmt, 16, 16384, q_heads, kv_heads, hd, block_size, cfg, copy, 900 + hd))
        extras.append(run_point(fmt, 16, 32768, q_heads, kv_heads, head_dim, block_size, tuned[fmt], copy, 950,
                                window=4096))
    for fmt in [f for f in ("bf16", "fp8_e4m3", "fp8_per_token_head") if f in formats]:
        extras.append(run_point(fmt, 16, 16384, 16, 1, 576, block_size,
                                dict(block_t=32, num_warps=8, num_stages=2), copy, 990,
                                mla_v_dim=512))
    report["kernel_extras"] = extras
    # a context that ends inside a page, with never-written memory (NaN) in the page's tail
    report["kernel_checks"] = [run_point(fmt, 4, 16384 + 5, q_heads, kv_heads, head_dim, block_size, tuned[fmt],
                                         copy, 970, poison_tail=True) for fmt in formats]
    _write(out, report)
    print(f"extras done at {time.monotonic() - t0:5.0f} s", flush=True)

    baselines = []
    for ctx in contexts:
        baselines += baseline_points(16, ctx, q_heads, kv_heads, head_dim, block_size, 2000 + ctx)
    report["baselines"] = baselines
    report["decode_efficiency"] = efficiency_section(points, spec, min(batches))  # fitted on the whole grid
    slope_batch = 16 if 16 in batches else max(batches)
    report["slopes"] = dict(batch=slope_batch, formats=slopes(points, slope_batch))
    report["seconds"] = time.monotonic() - t0
    _write(out, report)
    print_table(report)
    return 0


def print_table(report: dict) -> None:
    copy = report["copy_bandwidth_gb_s"]
    print(f"\n{'format':<21}{'batch':>6}{'ctx':>7}{'MB read':>9}{'ms':>9}{'GB/s':>8}{'%copy':>7}"
          f"{'pred ms':>9}{'pred%':>7}{'kern err':>10}{'attn err':>10}")
    for p in report["kernels"] + report.get("kernel_extras", []):
        attn = f"{p['attention_rel_error']:.4f}" if p["attention_rel_error"] is not None else "-"
        pred = f"{p['predicted_ms']:.3f}" if "predicted_ms" in p else "-"
        perr = f"{p['prediction_error_pct']:+.1f}" if "prediction_error_pct" in p else "-"
        tag = p["format"] + (" mla" if p["mla"] else "") + (f" w{p['window']}" if p["window"] else "") + (
            f" d{p['head_dim']}" if p["head_dim"] != 128 and not p["mla"] else "")
        print(f"{tag:<21}{p['batch']:>6}{p['context']:>7}{p['bytes_read'] / 1e6:>9.1f}{p['median_ms']:>9.3f}"
              f"{p['achieved_gb_s']:>8.0f}{p['pct_of_copy']:>7.1f}{pred:>9}{perr:>7}"
              f"{p['kernel_rel_error']:>10.2e}{attn:>10}")
    print("\nbaselines (bf16, batch 16):")
    fused = {p["context"]: p for p in report["kernels"] if p["format"] == "bf16" and p["batch"] == 16}
    for b in report["baselines"]:
        if "median_ms" not in b:
            print(f"  {b['kernel']:<30} ctx {b['context']:>6}: {b.get('error')}")
            continue
        f = fused.get(b["context"])
        ratio = f" fused is {b['median_ms'] / f['median_ms']:.2f}x faster" if f else ""
        print(f"  {b['kernel']:<30} ctx {b['context']:>6}: {b['median_ms']:8.3f} ms {b['achieved_gb_s']:7.0f} GB/s"
              f"{ratio}")
    s = report["slopes"]
    print(f"\nslope of time vs context at batch {s['batch']} (ms per 1K tokens), ratio to bf16 vs bytes ratio:")
    for fmt, r in s["formats"].items():
        print(f"  {fmt:<22}{r['ms_per_1k_tokens']:8.4f}  slope ratio {r.get('slope_ratio', 0):.3f}  "
              f"bytes ratio {r.get('bytes_ratio', 0):.3f}  gap {r.get('ratio_gap_pct', 0):+.1f}%")
    eff = report["decode_efficiency"]
    print(f"\nefficiency vs spec {eff['reference_bandwidth_gb_s']:.0f} GB/s (fit on batch ≥ "
          f"{eff['fitted_on_batch_at_least']}):")
    for fmt, e in eff["kv"].items():
        print(f"  {fmt:<22} {e:.3f}  overhead {eff['overhead_s'][fmt] * 1e6:6.1f} us  per sequence "
              f"{eff['per_sequence_s'][fmt] * 1e6:6.3f} us  per context token {eff['per_context_token_s'][fmt] * 1e9:6.3f} ns")
    print("\ngoals:")
    long = [p for p in report["kernels"] if p["context"] >= 16384 and p["batch"] >= 16]
    worst = {}
    for p in long:
        worst[p["format"]] = min(worst.get(p["format"], 1e9), p["pct_of_copy"])
    for fmt, pct in worst.items():
        print(f"  bandwidth {fmt:<22} worst {pct:5.1f}% of copy ({copy:,.0f} GB/s) -> "
              f"{'met' if pct >= 80 else 'NOT met'}")
    for fmt, r in s["formats"].items():
        if "ratio_gap_pct" in r:
            print(f"  slope     {fmt:<22} gap {r['ratio_gap_pct']:+5.1f}% -> "
                  f"{'met' if abs(r['ratio_gap_pct']) <= 10 else 'NOT met'}")
    fitted = [p for p in report["kernels"] if p["batch"] >= eff["fitted_on_batch_at_least"] and "prediction_error_pct"
              in p]
    bad = [p for p in fitted if abs(p["prediction_error_pct"]) > 10]
    print(f"  model     {len(fitted) - len(bad)}/{len(fitted)} points within 10% of measured")
    from measure.kernel_bench import error_ok

    for p in report.get("kernel_checks", []):
        print(f"  tail      {p['format']:<22} ctx {p['context']}: finite {p['finite']}, kernel err "
              f"{p['kernel_rel_error']:.2e}, attention err {p['attention_rel_error']:.4f}")
    errs = [p for p in report["kernels"] + report.get("kernel_extras", []) + report.get("kernel_checks", [])
            if not error_ok(p)]
    print(f"  accuracy  {len(errs)} point(s) outside their bounds")


if __name__ == "__main__":
    sys.exit(main())

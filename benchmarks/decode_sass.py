"""What the decode kernels compile to on Hopper, without a GPU: each format's kernel (with its
tuned options from a benchmark report) is compiled for sm_90 by Triton, disassembled with the
cuobjdump that Triton ships, and its main loop's instructions are counted.

    python benchmarks/decode_sass.py [--report measure/reports/h200-decode-kernels.json] [--formats ...]

Printed per format: instructions in one pass of the main loop, lane-instructions per KV byte
(loop instructions x threads / bytes of K and V the pass reads) and the commonest instructions.
A kernel that must issue more instructions per byte than the SMs can issue in the time the
bytes take to arrive is instruction-bound; measure/NOTES.md uses these counts.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAUNCH_SETTINGS = ("block_t", "num_warps", "num_stages", "maxnreg")


def _signature(kernel, args: tuple, constants: dict) -> tuple[dict, dict, dict]:
    """Triton's signature, constants and pointer alignment for `args` as paged_decode passes them:
    each argument typed as Triton types it at launch, pointers 16-byte aligned (as Triton
    specialises them when they are)."""
    from triton.runtime.jit import mangle_type

    params = list(inspect.signature(kernel.fn).parameters)
    sig = dict(zip(params, (mangle_type(a) for a in args)))
    sig.update({name: "constexpr" for name in constants})
    attrs = {(i,): [["tt.divisibility", 16]] for i, p in enumerate(params) if sig[p].startswith("*")}
    return sig, {(params.index(k),): v for k, v in constants.items()}, attrs


def main_loop(sass: str) -> list[str]:
    """Instructions of the first backward-branch loop (the tile loop) of a SASS listing."""
    ins = [(int(a, 16), t.strip()) for a, t in re.findall(r"/\*([0-9a-f]{4,})\*/\s+([^;]*);", sass)]
    loops = sorted({(int(m.group(1), 16), a) for a, t in ins if (m := re.search(r"BRA\s+.*?0x([0-9a-f]+)", t))
                    and int(m.group(1), 16) < a})
    if not loops:
        raise SystemExit("no loop found in the kernel's SASS")
    lo, hi = loops[0]
    return [re.sub(r"^@!?U?P\w+\s+", "", t).split()[0] for a, t in ins if lo <= a <= hi]


def inspect_format(fmt: str, config: dict, q_heads=32, kv_heads=8, head_dim=128, block_size=16) -> dict:
    import torch
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from measure.kernels import kernel_arguments, kernel_constants
    from measure.paged_cache import FORMATS, KIVI, add_kivi_residual, pack

    k = torch.randn(block_size, kv_heads, head_dim)
    cache = pack(fmt, k, k.clone(), block_size)
    if FORMATS[fmt].kind == KIVI:
        r = torch.zeros(1, 1, kv_heads, head_dim)
        add_kivi_residual(cache, r, r, torch.zeros(1, dtype=torch.int32))
    # a tuned config is launch settings plus kernel options, as paged_decode takes them
    options = {k: v for k, v in config.items() if k not in LAUNCH_SETTINGS}
    kernel, constants = kernel_constants(cache, q_heads, config.get("block_t", 64), **options)
    args, _ = kernel_arguments(torch.zeros(1, q_heads, head_dim), cache, torch.zeros(1, 1, dtype=torch.int32),
                               torch.ones(1, dtype=torch.int32), num_splits=2,
                               constants=constants)
    sig, consts, attrs = _signature(kernel, args, constants)
    warps = config.get("num_warps", 4)
    compiled = triton.compile(ASTSource(fn=kernel, signature=sig, constexprs=consts, attrs=attrs),
                              target=GPUTarget("cuda", 90, 32),
                              options=dict(num_warps=warps, num_stages=config.get("num_stages", 2),
                                           **({"maxnreg": config["maxnreg"]} if config.get("maxnreg") else {})))
    cuobjdump = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "kernel.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([str(cuobjdump), "-sass", str(cubin)], capture_output=True, text=True,
                              check=True).stdout
        usage = subprocess.run([str(cuobjdump), "-res-usage", str(cubin)], capture_output=True, text=True,
                               check=True).stdout
    registers = int(re.search(r"REG:(\d+)", usage).group(1))
    body = main_loop(sass)
    bits = FORMATS[fmt].bits
    kv_bytes = constants["BLOCK_T"] * (head_dim + head_dim) * bits / 8
    return dict(format=fmt, config=config, loop_instructions=len(body), registers=registers,
                shared_bytes=compiled.metadata.shared,
                lane_instructions_per_byte=len(body) * 32 * warps / kv_bytes,
                top=Counter(body).most_common(10))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--report", default=str(ROOT / "measure" / "reports" / "h200-decode-kernels.json"))
    ap.add_argument("--formats", default="", help="comma-separated layouts (default: every tuned one)")
    args = ap.parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    chosen = json.loads(Path(args.report).read_text())["tuning"]["chosen"]
    formats = args.formats.split(",") if args.formats else list(chosen)
    unknown = sorted(set(formats) - set(chosen))
    if unknown:
        raise SystemExit(f"--formats: {', '.join(unknown)} not tuned in {args.report}; choose from {', '.join(chosen)}")
    print(f"{'format':<22}{'regs':>5}{'shared':>8}{'loop instr':>11}{'per KV byte':>13}  commonest")
    for fmt in formats:
        r = inspect_format(fmt, chosen[fmt])
        top = ", ".join(f"{op} {n}" for op, n in r["top"][:6])
        print(f"{fmt:<22}{r['registers']:>5}{r['shared_bytes']:>8}{r['loop_instructions']:>11}"
              f"{r['lane_instructions_per_byte']:>13.2f}  {top}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

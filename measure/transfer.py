"""KV transfer rates on real GPUs: the links a tiered cache and a disaggregated deployment use.

Host (one GPU): `python -m measure.transfer host --out R.json`
  1. Contiguous copies between HBM and pinned host memory, 1 MiB to 1 GiB, each direction, and
     within HBM: each link's latency and bandwidth are fitted from these (sizing.planners.tiers.fit_link).
  2. Paged KV blocks of each format and block size, gathered from random places in a pool and
     copied to pinned memory as one batch (offload), and back and scattered into the pool (reload),
     as offload connectors batch them. These are the points the tier model must predict.

Peer (two GPUs of one host, NCCL, NVLink multicast off):
`torchrun --nproc-per-node 2 -m measure.transfer peer --out R.json`
  1. One send/recv of 1 MiB to 1 GiB from GPU 0 to GPU 1, and 16 MiB, 256 MiB and 1 GiB in 4, 16
     and 64 sends: the start latency, the cost of each further send and the bandwidth are fitted
     from the sends of 8 MiB or more (sizing.planners.tiers.PEER_FIT_MIN_MESSAGE_BYTES).
  2. A request's KV sent layer by layer (one send per layer, as layer-wise P/D connectors do) for
     each format and prompt length: the points the disaggregation model must predict.

The block layout is the model's (sizing.cache.layers): a block holds every layer's page of block_size
tokens, contiguous, as host-side KV stores keep it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from .report_io import write_report

FORMATS = ("bf16", "fp8_e4m3", "int8_per_token_head", "nvfp4")
BLOCK_SIZES = (16, 32, 64, 128, 256)
SESSION_TOKENS = (2048, 32768)
PROMPT_TOKENS = (8192, 32768, 131072)
SIZES = tuple(1 << s for s in range(20, 31, 2))  # 1 MiB .. 1 GiB


def _timed(fn, sync, repeats: int) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def _block_bytes(model: str, fmt: str, block_size: int) -> tuple[int, int]:
    """(bytes of one block across every layer, layers) on one GPU at TP 1."""
    from sizing.cache.layers import build_layout
    from sizing.profiles import load_model

    _, shape = load_model(model)
    layout = build_layout(shape, fmt, fmt)
    return sum(spec.page_bytes(block_size) for spec in layout.kv.values()), len(layout.kv)


def _device(torch) -> dict:
    import pynvml

    from .run import nvml_handle

    pynvml.nvmlInit()
    handle = nvml_handle(pynvml, torch)
    link = {}
    try:
        link = {"pcie_generation": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                "pcie_width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)}
    except pynvml.NVMLError:
        pass
    return {"name": torch.cuda.get_device_name(), "driver": pynvml.nvmlSystemGetDriverVersion(),
            "torch": torch.__version__, "cuda": torch.version.cuda, **link}


def host(model: str, repeats: int, formats=FORMATS) -> dict:
    import torch

    sync = torch.cuda.synchronize
    contiguous = []
    for size in SIZES:
        gpu = torch.empty(size, dtype=torch.uint8, device="cuda")
        cpu = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        for direction, fn in (("d2h", lambda: cpu.copy_(gpu, non_blocking=True)),
                              ("h2d", lambda: gpu.copy_(cpu, non_blocking=True))):
            contiguous.append({"direction": direction, "bytes": size,
                               "seconds": _timed(fn, sync, repeats if size < 1 << 28 else max(3, repeats // 3))})
        del gpu, cpu
    hbm = []
    for size in SIZES:
        src = torch.empty(size, dtype=torch.uint8, device="cuda")
        dst = torch.empty_like(src)
        hbm.append({"bytes": size, "seconds": _timed(lambda: dst.copy_(src), sync, repeats)})
        del src, dst
    paged = []
    for fmt in formats:
        for block_size in BLOCK_SIZES:
            block_bytes, layers = _block_bytes(model, fmt, block_size)
            for tokens in SESSION_TOKENS:
                n = -(-tokens // block_size)
                # Rows of 8-byte words where the block allows: index_select and index_copy_ move one
                # element per thread, and byte elements would make the gather, not the link, the cost.
                word = next(w for w in (8, 4, 2, 1) if block_bytes % w == 0)
                dtype = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.uint8}[word]
                pool = torch.empty((2 * n, block_bytes // word), dtype=dtype, device="cuda")
                ids = torch.randperm(2 * n, device="cuda")[:n]
                staging = torch.empty((n, block_bytes // word), dtype=dtype, device="cuda")
                cpu = torch.empty((n, block_bytes // word), dtype=dtype, pin_memory=True)

                def offload():
                    torch.index_select(pool, 0, ids, out=staging)
                    cpu.copy_(staging, non_blocking=True)

                def reload():
                    staging.copy_(cpu, non_blocking=True)
                    pool.index_copy_(0, ids, staging)

                for direction, fn in (("d2h", offload), ("h2d", reload)):
                    paged.append({"model": model, "format": fmt, "block_size": block_size, "tokens": tokens,
                                  "blocks": n, "layers": layers, "block_bytes": block_bytes,
                                  "bytes": n * block_bytes, "direction": direction,
                                  "seconds": _timed(fn, sync, repeats)})
                del pool, staging, cpu
    return {"host_contiguous": contiguous, "hbm_contiguous": hbm, "host_paged": paged}


def peer(model: str, repeats: int) -> dict | None:
    """Timed on the receiver, GPU 1, from the first receive's start to the last's end (CUDA events)."""
    import torch
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")

    def timed(buffers) -> float:
        times = []
        for i in range(repeats + 1):
            dist.barrier()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for buf in buffers:
                (dist.send if rank == 0 else dist.recv)(buf, 1 - rank)
            end.record()
            end.synchronize()
            if i:  # the first is a warm-up
                times.append(start.elapsed_time(end) / 1000)
        return statistics.median(times)

    contiguous = []
    for size in SIZES:
        buf = torch.empty(size, dtype=torch.uint8, device="cuda")
        contiguous.append({"bytes": size, "transfers": 1, "seconds": timed([buf])})
        del buf
    for size in (1 << 24, 1 << 28, 1 << 30):  # the same bytes in k sends: the cost of each further send
        for k in (4, 16, 64):
            bufs = [torch.empty(size // k, dtype=torch.uint8, device="cuda") for _ in range(k)]
            contiguous.append({"bytes": size, "transfers": k, "seconds": timed(bufs)})
            del bufs
    layered = []
    from sizing.cache.layers import build_layout
    from sizing.profiles import load_model

    _, shape = load_model(model)
    for fmt in FORMATS:
        layout = build_layout(shape, fmt, fmt)
        for tokens in PROMPT_TOKENS:
            per_layer = [sum(spec.bytes_for(tokens)) for spec in layout.kv.values()]
            buffers = [torch.empty(b, dtype=torch.uint8, device="cuda") for b in per_layer]
            layered.append({"model": model, "format": fmt, "tokens": tokens, "layers": len(per_layer),
                            "bytes": sum(per_layer), "seconds": timed(buffers)})
            del buffers
    dist.barrier()
    dist.destroy_process_group()
    if rank != 1:
        return None
    return {"peer_contiguous": contiguous, "peer_layered": layered}


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=["host", "peer"])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--formats", default=",".join(FORMATS), help="host mode: the formats, in order")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    import torch

    from .run import REPORT_SCHEMA

    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    sections = host(args.model, args.repeats, formats) if args.mode == "host" else peer(args.model, args.repeats)
    if sections is None:
        return 0
    device = _device(torch)
    if args.mode == "peer":
        device["peers"] = torch.cuda.device_count()
        device["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    report = {"schema": REPORT_SCHEMA, "device": device, "method": __doc__, **sections}
    write_report(Path(args.out), report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

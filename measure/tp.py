"""Tensor parallel on the GPUs of one host, measured per rank: `torchrun --nproc-per-node N -m measure.tp`.

Each rank holds its shard of a Llama-family model as vLLM splits it (QKV and gate/up column-parallel
with the KV heads divided among the ranks or replicated when there are fewer than ranks, o_proj and
down row-parallel, a vocabulary-parallel embedding and lm_head padded to 64 rows per rank, norms
replicated) with random weights, runs a real forward pass (an all-reduce after every row-parallel
layer, the logits gathered) and holds its KV pool. Read from each GPU: the weights, the forward
pass's peak above them, the memory outside torch at each step (CUDA context, NCCL communicator,
NCCL's buffers after the first collective) and the pool's peak with a forward pass. NVLink
multicast stays off (NCCL_NVLS_ENABLE=0).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from .report_io import write_report

PAD = 64  # vLLM's VocabParallelEmbedding pads the vocabulary to a multiple of 64 per rank


def _shard_shapes(shape, tp: int) -> dict[str, tuple[int, ...]]:
    """Every weight one rank holds, as vLLM's Llama splits it (vllm/model_executor/models/llama.py,
    layers/linear.py, layers/vocab_parallel_embedding.py)."""
    h, d = shape.hidden_size, shape.head_dim
    q = shape.num_attention_heads // tp
    kv = max(1, shape.num_kv_heads // tp)
    inter = shape.intermediate_size // tp
    vocab = -(-shape.vocab_size // (PAD * tp)) * PAD  # padded, per rank
    out = {"embed": (vocab, h), "norm": (h,), "lm_head": (vocab, h)}
    for i in range(shape.num_layers):
        out |= {f"{i}.qkv": ((q + 2 * kv) * d, h), f"{i}.o": (h, q * d), f"{i}.gate_up": (2 * inter, h),
                f"{i}.down": (h, inter), f"{i}.in_norm": (h,), f"{i}.post_norm": (h,)}
    return out


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--layers", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--formats", default="bf16,fp8_e4m3")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)

    import pynvml
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from .run import model_shape, nvml_handle, pool_tensors, predict_capacity

    rank, world, local = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    pynvml.nvmlInit()
    handle = nvml_handle(pynvml, torch)  # CUDA's index `local` is NVML's only where CUDA sees every GPU

    def non_torch() -> int:
        torch.cuda.synchronize()
        mine = sum(p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
                   if p.pid == os.getpid())
        return mine - torch.cuda.memory_reserved()

    steps = {}
    torch.empty(1, device="cuda")
    steps["cuda_context"] = non_torch()
    dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    steps["nccl_communicator"] = non_torch()
    probe = torch.ones(1 << 20, device="cuda")
    dist.all_reduce(probe)
    del probe
    torch.cuda.empty_cache()
    steps["after_first_all_reduce"] = non_torch()

    _, shape = model_shape(args.model, args.layers)
    total = torch.cuda.get_device_properties(local).total_memory
    a0 = torch.cuda.memory_allocated()
    w = {name: torch.empty(dims, dtype=torch.bfloat16, device="cuda").normal_(0, 0.02)
         for name, dims in _shard_shapes(shape, world).items()}
    torch.cuda.synchronize()
    weights = torch.cuda.memory_allocated() - a0
    q_local = shape.num_attention_heads // world
    kv_local = max(1, shape.num_kv_heads // world)
    d, inter = shape.head_dim, shape.intermediate_size // world
    vocab_local = w["embed"].shape[0]
    ids = torch.randint(0, shape.vocab_size, (args.tokens,), device="cuda")

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)).to(x.dtype)

    def forward() -> None:
        with torch.no_grad():
            local_ids = ids - rank * vocab_local
            inside = (local_ids >= 0) & (local_ids < vocab_local)
            x = F.embedding(local_ids.clamp(0, vocab_local - 1), w["embed"]) * inside[:, None]
            dist.all_reduce(x)
            for i in range(shape.num_layers):
                qkv = rms(x, w[f"{i}.in_norm"]) @ w[f"{i}.qkv"].T
                q, k, v = qkv.split([q_local * d, kv_local * d, kv_local * d], dim=-1)
                q = q.view(1, -1, q_local, d).transpose(1, 2)
                k = k.view(1, -1, kv_local, d).transpose(1, 2)
                v = v.view(1, -1, kv_local, d).transpose(1, 2)
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                o = o.transpose(1, 2).reshape(-1, q_local * d) @ w[f"{i}.o"].T
                dist.all_reduce(o)
                x = x + o
                gate, up = (rms(x, w[f"{i}.post_norm"]) @ w[f"{i}.gate_up"].T).split([inter, inter], dim=-1)
                y = (F.silu(gate) * up) @ w[f"{i}.down"].T
                dist.all_reduce(y)
                x = x + y
            logits = rms(x[-1:], w["norm"]) @ w["lm_head"].T
            gathered = [torch.empty_like(logits) for _ in range(world)]
            dist.all_gather(gathered, logits)
        torch.cuda.synchronize()

    forward()
    torch.cuda.reset_peak_memory_stats()
    forward()
    activation = torch.cuda.max_memory_allocated() - weights
    torch.cuda.empty_cache()
    steps["after_forward"] = non_torch()
    measured_non_torch = steps["after_forward"]
    limit = int(total * args.gpu_memory_utilization) - measured_non_torch
    available = limit - weights - activation

    records = []
    for fmt in args.formats.split(","):
        run = (args.model, shape, total, args.gpu_memory_utilization, args.tokens, 16, fmt)
        derived = predict_capacity(*run, measured_non_torch, available, tp=world)
        predicted = predict_capacity(*run, measured_non_torch, tp=world)
        # The page one rank holds per layer, from the shard's own KV heads: 16 tokens x K and V.
        value_bytes = 2 if fmt in ("bf16", "fp16", "auto") else 1
        page_from_shard = 16 * kv_local * d * 2 * value_bytes
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
        pool = pool_tensors(derived.pool, derived.layout, derived.num_blocks, "cuda")
        pool_bytes = sum(t.numel() for t in pool)
        rounding = torch.cuda.memory_allocated() - before - pool_bytes
        forward()
        peak = torch.cuda.max_memory_allocated()
        del pool
        torch.cuda.empty_cache()
        records.append(dict(
            model=args.model, layers=args.layers, kv_cache_dtype=fmt, tensor_parallel_size=world, rank=rank,
            gpu_memory_utilization=args.gpu_memory_utilization, max_num_batched_tokens=args.tokens,
            total_bytes=total,
            measured=dict(weights_bytes=weights, activation_bytes=activation, non_torch_bytes=measured_non_torch,
                          non_torch_steps=steps, kv_page_bytes_per_layer=page_from_shard,
                          pool_peak_allocated_bytes=peak, pool_rounding_bytes=rounding),
            derived=dict(kv_budget_bytes=available, num_blocks=derived.num_blocks, pool_bytes=pool_bytes),
            predicted=dict(weights_bytes=predicted.breakdown.weights_bytes,
                           activation_bytes=predicted.breakdown.activation_bytes,
                           non_torch_bytes_vllm=predict_capacity(*run, None, tp=world).breakdown.non_torch_bytes,
                           kv_page_bytes_per_layer=derived.block_bytes // max(1, len(derived.layout.kv)),
                           num_blocks=predicted.num_blocks),
            limit_bytes=limit,
        ))
    gathered: list = [None] * world
    dist.all_gather_object(gathered, records)
    if rank == 0:
        report = dict(schema="kvsize.measure/1", capacity_version=2,
                      device=dict(name=torch.cuda.get_device_name(local), gpus=world, torch=torch.__version__,
                                  cuda=torch.version.cuda, nccl=".".join(map(str, torch.cuda.nccl.version())),
                                  nccl_nvls_enable=os.environ.get("NCCL_NVLS_ENABLE")),
                      started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                      tensor_parallel=[r for per_rank in gathered for r in per_rank])
        write_report(Path(args.out), report)
        print(f"wrote {args.out}", flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

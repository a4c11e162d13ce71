import sys, traceback; sys.path.insert(0, ".")
import torch
from measure.kernel_bench import build_case
from measure.kernels import paged_decode
cache, table, lens, _, _ = build_case("fp8_e4m3", 2, 1024, 8, 128, 16, 1)
q = torch.randn(2, 32, 128, device="cuda")
try:
    paged_decode(q, cache, table, lens, fp8_dot=True, block_t=64)
    print("fp8 dot compiled")
except Exception as e:
    print("".join(traceback.format_exception(e))[-3000:])

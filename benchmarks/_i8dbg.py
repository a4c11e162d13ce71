import sys, traceback; sys.path.insert(0, ".")
import torch
from measure.kernel_bench import build_case
from measure.kernels import paged_decode
from measure.paged_cache import reference_decode, relative_error
for fmt in ("int8_per_token_head", "lmdeploy_int8"):
    cache, table, lens, _, _ = build_case(fmt, 2, 1024, 8, 128, 16, 1)
    q = torch.randn(2, 32, 128, device="cuda")
    try:
        out = paged_decode(q, cache, table, lens, int8_qk=True, block_t=64)
        print(fmt, "int8 qk ok", relative_error(out, reference_decode(q, cache, table, lens)))
    except Exception as e:
        print("".join(traceback.format_exception(e))[-1500:])

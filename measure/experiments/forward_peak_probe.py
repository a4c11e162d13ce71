"""Why does a forward pass peak higher with the KV pool held than without it? Prints torch's
allocated bytes around each step for one model (a diagnostic kept with the capacity notes)."""

import sys

import torch
from transformers import AutoConfig, AutoModelForCausalLM

from measure.run import model_shape

model, layers = sys.argv[1], (int(sys.argv[2]) if len(sys.argv) > 2 else None)
config, shape = model_shape(model, layers)
with torch.device("meta"):
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(**config), dtype=torch.bfloat16,
                                          attn_implementation="sdpa")
hf = hf.to_empty(device="cuda")
hf.tie_weights()
with torch.no_grad():
    for p in hf.parameters():
        p.normal_(0, 0.02)
torch.cuda.synchronize()
print("attn implementation", hf.config._attn_implementation)
ids = torch.randint(0, shape.vocab_size, (1, 2048), device="cuda")
MiB = 2**20


def step(label):
    torch.cuda.synchronize()
    print(f"{label:<40} allocated {torch.cuda.memory_allocated() / MiB:10.1f} MiB  peak "
          f"{torch.cuda.max_memory_allocated() / MiB:10.1f}  reserved {torch.cuda.memory_reserved() / MiB:10.1f}")


def forward():
    with torch.no_grad():
        hf(input_ids=ids, logits_to_keep=1, use_cache=False)


step("weights")
for i in range(3):
    torch.cuda.reset_peak_memory_stats()
    forward()
    step(f"forward {i}")
torch.cuda.empty_cache()
step("after empty_cache")
torch.cuda.reset_peak_memory_stats()
forward()
step("forward after empty_cache")
free = torch.cuda.mem_get_info()[0]
big = torch.empty(int(free * 0.9), dtype=torch.uint8, device="cuda")
torch.cuda.reset_peak_memory_stats()
step("pool-sized tensor held")
forward()
step("forward with it held")

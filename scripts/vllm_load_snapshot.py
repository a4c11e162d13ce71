"""Every block PyTorch's caching allocator holds when vLLM measures its model load ("Model loading took").

usage (on a GPU machine with vLLM installed):
    python scripts/vllm_load_snapshot.py CONFIG_DIR OUT.json [ENGINE_ARGS_JSON]
CONFIG_DIR holds a config.json; vLLM loads it with dummy weights in this process (no engine subprocess),
with the engine arguments given as JSON (e.g. '{"language_model_only": true}'), and at the end of the load
(its DeviceMemoryProfiler) the allocator's snapshot is written as [block bytes, requested bytes, where]
triples (where: the innermost vLLM model file and line that allocated it), then the process exits:
tests/fixtures/allocator/ keeps what it wrote.
"""

from __future__ import annotations

import json
import os
import sys


def _where(frames: list[dict]) -> str:
    """The innermost frame in vLLM's model code (its layers and models), else in vLLM, else unknown."""
    for marker in ("vllm/model_executor/", "vllm/"):
        for f in frames:
            name = f.get("filename", "")
            if marker in name:
                return f"{name.split('vllm/', 1)[1]}:{f.get('line')}"
    return "?"


def main(config_dir: str, out: str, engine_args: dict) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, so the patch holds
    import torch
    import vllm
    import vllm.utils.mem_utils as mem_utils

    profiler = mem_utils.DeviceMemoryProfiler
    enter, leave = profiler.__enter__, profiler.__exit__

    def recorded_enter(self):
        torch.cuda.memory._record_memory_history(max_entries=400_000)
        return enter(self)

    def snapshot_exit(self, *exc):
        leave(self, *exc)
        blocks = [[b["size"], b.get("requested_size"), _where(b.get("frames", []))]
                  for segment in torch.cuda.memory._snapshot()["segments"] for b in segment["blocks"]
                  if b["state"] == "active_allocated"]
        if any(requested is None for _, requested, _ in blocks):  # the history was not recorded: say so, guess nothing
            raise SystemExit("the allocator's snapshot has no requested sizes: its history was not recorded")
        report = dict(release=vllm.__version__, gpu=torch.cuda.get_device_name(),
                      model_loading_consumed_bytes=self.consumed_memory,
                      allocated_bytes=torch.cuda.memory_allocated(),
                      blocks=sorted(blocks, key=lambda b: (-b[0], -b[1])))
        with open(out + ".tmp", "w") as f:
            json.dump(report, f)
        os.replace(out + ".tmp", out)
        print(f"{len(blocks)} blocks, {self.consumed_memory} B consumed", flush=True)
        os._exit(0)  # the load is what was asked for; the rest of the start is not needed

    profiler.__enter__, profiler.__exit__ = recorded_enter, snapshot_exit
    args = dict(load_format="dummy", max_model_len=4096, enforce_eager=True, skip_tokenizer_init=True)
    vllm.LLM(model=config_dir, **{**args, **engine_args})


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: python scripts/vllm_load_snapshot.py CONFIG_DIR OUT.json [ENGINE_ARGS_JSON]")
    main(sys.argv[1], sys.argv[2], json.loads(sys.argv[3]) if len(sys.argv) == 4 else {})

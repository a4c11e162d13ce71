"""The memory lines llama.cpp prints when it loads a model and makes a context, read into figures.

Each pattern is the format string of the line in llama.cpp's source (named beside it); a line no pattern knows is
ignored. Every figure keeps the text it was read from, so a report can be re-read from its raw lines.
"""

from __future__ import annotations

import re
from typing import Any

_MIB = r"(-?\d+\.\d+) MiB"

# src/llama-kv-cache.cpp, llama_kv_cache::llama_kv_cache:
#   "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u/%u seqs), K (%s): %7.2f MiB, V (%s): %7.2f MiB"
KV_SIZE = re.compile(r"llama_kv_cache: size =\s*" + _MIB + r" \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+)/(\d+) seqs\), "
                     r"K \((\w+)\):\s*" + _MIB + r", V \((\w+)\):\s*" + _MIB)
# src/llama-kv-cache-iswa.cpp: "%s: creating non-SWA KV cache, size = %u cells" (and "creating     SWA KV cache")
ISWA = re.compile(r"llama_kv_cache_iswa: creating\s+(non-SWA|SWA) KV cache, size = (\d+) cells")
# src/llama-memory-recurrent.cpp: "%s: size = %7.2f MiB (%6u cells, %3d layers, %2u seqs %2u rs_seq), R (%s): %7.2f
#   MiB, S (%s): %7.2f MiB, P (%s): %7.2f MiB"
RS_SIZE = re.compile(r"llama_memory_recurrent: size =\s*" + _MIB + r" \(\s*(\d+) cells,\s*(\d+) layers,\s*(\d+) seqs\s+"
                     r"(\d+) rs_seq\), R \((\w+)\):\s*" + _MIB + r", S \((\w+)\):\s*" + _MIB
                     + r"(?:, P \((\w+)\):\s*" + _MIB + r")?")
# "%s: %10s KV buffer size = %8.2f MiB" (llama-kv-cache.cpp), "RS buffer size" (llama-memory-recurrent.cpp),
# "compute buffer size" and "output buffer size" (llama-context.cpp), "model buffer size" (llama-model.cpp)
BUFFER = re.compile(r"(\w+):\s+(\S+)\s+(KV|RS|compute|output|model) buffer size =\s*" + _MIB)
# src/llama-context.cpp: "%s: n_ctx                 = %u" and the other context parameters
CPARAM = re.compile(r"llama_context: (n_seq_max|n_ctx|n_ctx_seq|n_batch|n_ubatch|flash_attn|kv_unified|n_rs_seq)"
                    r"\s+= (\S+)\s*$")
# src/llama-context.cpp, llama_init_from_model: the refusals of a context
REFUSAL = re.compile(r"llama_init_from_model: ((?:quantized V cache requires flash_attn|model does not support "
                     r"different K|K cache type|V cache type|failed to initialize).*)$")


def _mib(text: str) -> dict[str, Any]:
    return {"mib": text}


def parse(lines: list[str]) -> dict[str, Any]:
    """Figures of one load's log: context parameters, each KV cache (its role: kv, non-SWA or SWA), each
    recurrent memory, the buffers, and the refusal if the context was refused."""
    out: dict[str, Any] = {"context": {}, "caches": [], "recurrent": [], "buffers": [], "refusal": None}
    role = "kv"
    iswa_cells: dict[str, int] = {}
    for line in lines:
        line = line.rstrip("\n")
        if m := ISWA.search(line):
            role = m.group(1)
            iswa_cells[role] = int(m.group(2))
        elif m := KV_SIZE.search(line):
            out["caches"].append({
                "role": role, "size_mib": m.group(1), "cells": int(m.group(2)), "layers": int(m.group(3)),
                "seqs": int(m.group(4)), "streams": int(m.group(5)), "type_k": m.group(6), "k_mib": m.group(7),
                "type_v": m.group(8), "v_mib": m.group(9)})
        elif m := RS_SIZE.search(line):
            out["recurrent"].append({
                "size_mib": m.group(1), "cells": int(m.group(2)), "layers": int(m.group(3)), "seqs": int(m.group(4)),
                "rs_seq": int(m.group(5)), "type_r": m.group(6), "r_mib": m.group(7), "type_s": m.group(8),
                "s_mib": m.group(9), "p_mib": m.group(11)})
        elif m := BUFFER.search(line):
            out["buffers"].append({"source": m.group(1), "device": m.group(2), "kind": m.group(3),
                                   "mib": m.group(4)})
        elif m := CPARAM.search(line):
            value = m.group(2)
            out["context"][m.group(1)] = int(value) if value.isdigit() else value
        elif m := REFUSAL.search(line):
            out["refusal"] = out["refusal"] or m.group(1).strip()
    for cache in out["caches"]:
        if cache["role"] in iswa_cells and iswa_cells[cache["role"]] != cache["cells"]:
            raise ValueError(f"the {cache['role']} cache says {cache['cells']} cells, its header "
                             f"{iswa_cells[cache['role']]}")
    return out


MEMORY_LINE = re.compile(r"llama_kv_cache|llama_memory_recurrent|llama_context:|llama_init_from_model|"
                         r"buffer size|llama_model_load|load_tensors:|print_info: (arch|n_ctx_train|n_layer|n_head|"
                         r"n_embd_head|n_swa|n_embd_k_gqa|n_embd_v_gqa|ssm_)")


# the debug lines written once per layer: no figure the report needs
PER_LAYER = re.compile(r"layer\s+\d+: (dev|does not|filtered)|n_embd_head_k_all|assigned to device")


def memory_lines(text: str) -> list[str]:
    """The lines of a load's log worth keeping as evidence: every memory line, the context's parameters, the
    model's shape as llama.cpp read it, and any refusal."""
    return [line for line in text.splitlines() if MEMORY_LINE.search(line) and not PER_LAYER.search(line)]


def printed(figures: dict, kind: str) -> dict[str, str]:
    """The buffers of a kind llama.cpp printed (model, KV, output, compute), MiB by device, as parse read them."""
    return {b["device"]: b["mib"] for b in figures["buffers"] if b["kind"] == kind}


def compute_error(predicted_bytes: int, printed_mib: str) -> float:
    """kvsize's figure against a buffer llama.cpp printed in MiB, signed: predicted / printed - 1."""
    measured = float(printed_mib) * (1 << 20)
    return (predicted_bytes - measured) / measured

"""One llama.cpp load, run in its own process by the Python that has llama-cpp-python: load the GGUF on the CPU
and make one context with the settings given as JSON; llama.cpp's log goes to stderr, the outcome to stdout.

    PYTHON -m measure.llamacpp.child MODEL.gguf '{"n_ctx": 4096, "n_seq_max": 1, "type_k": "q8_0", ...}'

Imports nothing of kvsize: it runs where only llama-cpp-python is installed.
"""

from __future__ import annotations

import json
import sys

# ggml/include/ggml.h enum ggml_type
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}


def load(path: str, settings: dict) -> dict:
    import llama_cpp

    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0
    mparams.use_mmap = settings.get("use_mmap", True)  # llama_model_default_params: mmap on
    model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        return {"model_loaded": False, "context_made": False}
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = settings["n_ctx"]
    cparams.n_seq_max = settings["n_seq_max"]
    cparams.n_batch = settings["n_batch"]
    cparams.n_ubatch = settings["n_ubatch"]
    cparams.type_k = GGML_TYPE[settings["type_k"]]
    cparams.type_v = GGML_TYPE[settings["type_v"]]
    cparams.flash_attn_type = (llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED if settings["flash_attn"]
                               else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED)
    cparams.kv_unified = settings["kv_unified"]
    cparams.swa_full = settings["swa_full"]
    cparams.n_threads = cparams.n_threads_batch = settings.get("n_threads", 1)
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    made = bool(ctx)
    sys.stderr.flush()
    if made:
        llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    return {"model_loaded": True, "context_made": made}


def main() -> int:
    path, settings = sys.argv[1], json.loads(sys.argv[2])
    import llama_cpp

    out = load(path, settings)
    out["llama_cpp_python"] = llama_cpp.__version__
    sys.stderr.flush()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

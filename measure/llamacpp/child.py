"""One llama.cpp load, run in its own process by the Python that has llama-cpp-python: load the GGUF and make one
context with the settings given as JSON; llama.cpp's log goes to stderr, the outcome to stdout.

    PYTHON -m measure.llamacpp.child MODEL.gguf '{"n_ctx": 4096, "n_seq_max": 1, "type_k": "q8_0", ...}'

On the CPU unless the settings ask for layers on the GPU ("n_gpu_layers": -1 offloads every layer, as
llama_model_default_params and llama-server's -ngl default do); then the outcome also holds the GPU's free memory
as CUDA reports it before the load, after the model and after the context (cudaMemGetInfo; informational: another
process on the same GPU moves it). Imports nothing of kvsize: it runs where only llama-cpp-python is installed.
"""

from __future__ import annotations

import json
import sys

# ggml/include/ggml.h enum ggml_type
GGML_TYPE = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "iq4_nl": 20, "bf16": 30}
# include/llama.h enum llama_load_mode (llama_model_default_params and common/common.h: auto, which maps the file)
LOAD_MODE = {"auto": -1, "none": 0, "mmap": 1}


def cuda_memory() -> dict | None:
    """(free, total) bytes of the current CUDA device from the runtime llama.cpp's CUDA backend loaded, or None."""
    import ctypes

    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so"):
        try:
            runtime = ctypes.CDLL(name)
            break
        except OSError:
            continue
    else:
        return None
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    if runtime.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)) != 0:
        return None
    return {"free_bytes": free.value, "total_bytes": total.value}


def load(path: str, settings: dict) -> dict:
    import llama_cpp

    gpu = settings.get("n_gpu_layers", 0) != 0
    memory: dict = {}
    llama_cpp.llama_backend_init()
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = settings.get("n_gpu_layers", 0)
    # llama-cpp-python 0.3.36's struct has load_mode and no use_mmap field: a ctypes Structure takes an unknown
    # attribute silently, so the setting goes to whichever field the struct has
    mode = settings.get("load_mode") or ("auto" if settings.get("use_mmap", True) else "none")
    fields = {name for name, _ in type(mparams)._fields_}
    if "load_mode" in fields:
        mparams.load_mode = LOAD_MODE[mode]
    elif "use_mmap" in fields:
        mparams.use_mmap = mode != "none"
    else:
        raise SystemExit(f"llama_model_params has neither load_mode nor use_mmap (fields: {sorted(fields)})")
    if gpu:
        memory["before_load"] = cuda_memory()
    model = llama_cpp.llama_model_load_from_file(path.encode(), mparams)
    if not model:
        return {"model_loaded": False, "context_made": False}
    if gpu:
        memory["after_model"] = cuda_memory()
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
    if gpu:
        memory["after_context"] = cuda_memory()
    sys.stderr.flush()
    if made:
        llama_cpp.llama_free(ctx)
    llama_cpp.llama_model_free(model)
    out = {"model_loaded": True, "context_made": made}
    if gpu:
        out["gpu_offload"] = bool(llama_cpp.llama_supports_gpu_offload())
        out["cuda_memory"] = memory
    return out


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

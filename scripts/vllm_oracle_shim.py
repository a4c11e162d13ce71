"""Run the vLLM oracle for models whose construction touches a GPU outside their KV cache specs.

    python vllm_oracle_shim.py PATH/vllm_oracle.py CONFIG_DIR [oracle options]

DeepSeek sparse attention models (DeepSeek-V3.2, GLM-5, DeepSeek-V4) and phi-2 cannot be built on the
meta device as they are: their layers create CUDA streams and events, allocate tensors on the
accelerator by name, ask a workspace manager that the GPU model runner creates first, refuse to build
the sparse indexer unless DeepGEMM is installed (it ships with vLLM's CUDA wheels), and compile
kernels while building (JIT warmup). None of that touches a layer's get_kv_cache_spec, so this wrapper
stands in for each of them and then runs the oracle unchanged:

- torch.cuda.Stream and torch.cuda.Event are objects whose methods do nothing;
- a factory call that names the accelerator as its device gets the meta device instead;
- the workspace manager is created on the meta device on first use, and emptying the accelerator's
  cache does nothing;
- the sparse indexer sees DeepGEMM as present, as it is on an H100 or H200 with vLLM's wheels;
- KernelConfig.enable_jit_warmup is False (`--kernel-config '{"enable_jit_warmup": false}'`).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import runpy
import sys

import torch
from torch.overrides import TorchFunctionMode


class _Event:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def record(self, *args, **kwargs) -> None:
        pass

    def wait(self, *args, **kwargs) -> None:
        pass

    def synchronize(self) -> None:
        pass


class _Stream:
    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, *args, **kwargs) -> None:
        pass

    def wait_event(self, *args, **kwargs) -> None:
        pass

    def record_event(self, *args, **kwargs) -> _Event:
        return _Event()


class _AcceleratorToMeta(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs = {**kwargs, "device": "meta"}
        return func(*args, **kwargs)


def _no_jit_warmup(module) -> None:
    set_defaults = module.KernelConfig.set_platform_defaults

    def set_platform_defaults(self, vllm_config) -> None:
        set_defaults(self, vllm_config)
        self.enable_jit_warmup = False

    module.KernelConfig.set_platform_defaults = set_platform_defaults


def _workspace_on_meta(module) -> None:
    current = module.current_workspace_manager

    def current_workspace_manager():
        if module._manager is None:
            module.init_workspace_manager(torch.device("meta"))
        return current()

    module.current_workspace_manager = current_workspace_manager


def _deep_gemm_present(module) -> None:
    module.has_deep_gemm = lambda: True


# Applied right after each module is first imported: the oracle installs its own stubs before vLLM loads,
# so nothing here may import vLLM itself.
_AFTER_IMPORT = {
    "vllm.config.kernel": _no_jit_warmup,
    "vllm.v1.worker.workspace": _workspace_on_meta,
    "vllm.model_executor.layers.sparse_attn_indexer": _deep_gemm_present,
}


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _AFTER_IMPORT:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None:
            return None
        loader = spec.loader

        class Loader(importlib.abc.Loader):
            def create_module(self, module_spec):
                return loader.create_module(module_spec)

            def exec_module(self, module):
                loader.exec_module(module)
                _AFTER_IMPORT[name](module)

        spec.loader = Loader()
        return spec


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__.strip().splitlines()[2].strip())
    torch.cuda.Stream = _Stream
    torch.cuda.Event = _Event
    torch.accelerator.empty_cache = lambda: None
    _AcceleratorToMeta().__enter__()
    sys.meta_path.insert(0, _PatchAfterImport())
    oracle = sys.argv[1]
    sys.argv = [oracle, *sys.argv[2:]]
    runpy.run_path(oracle, run_name="__main__")


if __name__ == "__main__":
    main()

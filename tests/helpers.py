from sizing.plan import Scenario
from sizing.profiles import gpu_profile, load_model


def scenario(model="llama-3.1-8b", gpu="h100-sxm", **kw) -> Scenario:
    name, shape = load_model(model)
    g = gpu_profile(gpu)
    kw.setdefault("gpu_multiprocessors", g.multiprocessors)
    kw.setdefault("gpu_nvml_mib", g.nvml_memory_mib)
    return Scenario(name, shape, g.name, g.memory_bytes, **kw)

import re

from sizing.capacity.scenario import Scenario
from sizing.profiles import gpu_profile, load_model


def scenario(model="llama-3.1-8b", gpu="h100-sxm", **kw) -> Scenario:
    name, shape = load_model(model)
    g = gpu_profile(gpu)
    kw.setdefault("gpu_multiprocessors", g.multiprocessors)
    kw.setdefault("gpu_nvml_mib", g.nvml_memory_mib)
    return Scenario(name, shape, g.name, g.memory_bytes, **kw)


def load_script(name: str):
    """A script of scripts/ (or benchmarks/) as a module, to call its functions from a test."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    path = next(p for p in (root / "scripts" / f"{name}.py", root / "benchmarks" / f"{name}.py") if p.exists())
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def wait_until_catching(proc, signum: int, bound_s: float = 120.0) -> None:
    """Wait (bounded) until the process catches `signum` (its handler installed: the signal's bit in /proc's
    SigCgt mask), or ends; before that Python's default action would end it without a word."""
    import time
    from pathlib import Path

    deadline = time.monotonic() + bound_s
    while proc.poll() is None and time.monotonic() < deadline:
        status = Path(f"/proc/{proc.pid}/status")
        caught = next((line.split()[1] for line in status.read_text().splitlines() if line.startswith("SigCgt:")),
                      "0") if status.exists() else "0"
        if int(caught, 16) & (1 << (signum - 1)):
            return
        time.sleep(0.05)


def plain(markdown: str) -> str:
    """An app error's text as the page shows it: app/ui.py markdown_text's backslash escapes taken off."""
    return re.sub(r"\\([\\`*_{}\[\]()#+\-.!|<>~$])", r"\1", markdown)

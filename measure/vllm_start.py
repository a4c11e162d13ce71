"""Start the real vLLM engine on a config.json with dummy weights and keep its log.

Each start runs `measure.vllm_child` in its own process group on the GPUs it is given, with the
NVLink multicast switches off; once vLLM has printed its KV cache lines ("Maximum concurrency for
... tokens per request") the group is stopped, so a start costs the profiling run and no more.
`run_starts` schedules a list of starts over the machine's GPUs (a start at TP n takes n of them)
until a deadline. Standard library only: this runs where vLLM is installed, beside any torch.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SIZED = re.compile(r"Maximum concurrency for [\d,]+ tokens per request")
# vLLM must never touch NVLink multicast on a shared host (NCCL NVLS, torch symmetric memory, NVSHMEM).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1",
            "VLLM_USE_FLASHINFER_SAMPLER": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",
            # CUDA numbers GPUs as nvidia-smi does, so the indices a start is given are the GPUs it gets
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            # the profiling result (weights, torch peak, non-torch increase) is logged at DEBUG only
            "VLLM_LOGGING_LEVEL": "DEBUG"}
MEMORY_LINES = re.compile(r"non-default args|Model loading took|Estimated CUDA graph|Available KV cache memory|"
                          r"GPU KV cache size|Maximum concurrency|Error|error:")


@dataclass(frozen=True)
class StartSpec:
    id: str
    config: str  # path of the config.json the start runs
    args: dict = field(default_factory=dict)  # EngineArgs fields
    context: str = "serve"  # "serve" (vllm serve's defaults) or "llm" (the LLM() class's)
    release: str | None = None  # names the site-packages folder of that vLLM release, where several are staged

    @property
    def gpus(self) -> int:
        return int(self.args.get("tensor_parallel_size", 1)) * int(self.args.get("pipeline_parallel_size", 1))


@dataclass(frozen=True)
class StartResult:
    id: str
    status: str  # "sized" (the KV lines are in the log), "failed" (vLLM exited first) or "timeout"
    seconds: float
    gpu_ids: list[int]
    returncode: int | None


def gpu_inventory() -> list[dict]:
    """nvidia-smi's view of each GPU: index, name, NVML total (MiB); only those CUDA_VISIBLE_DEVICES names
    (by index or UUID) where it is set, so starts stay off GPUs another job holds."""
    out = subprocess.run(["nvidia-smi", "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True).stdout
    rows = []
    for line in out.strip().splitlines():
        index, uuid, name, total = (part.strip() for part in line.split(","))
        rows.append({"index": int(index), "uuid": uuid, "name": name, "nvml_total_mib": int(total)})
    return visible(rows, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible(rows: list[dict], setting: str | None) -> list[dict]:
    """The GPUs CUDA_VISIBLE_DEVICES lets a process use, in its order (CUDA stops at the first entry it cannot
    match, so does this)."""
    if setting is None:
        return rows
    chosen = []
    for entry in (e.strip() for e in setting.split(",")):
        match = [r for r in rows if entry == str(r["index"]) or (entry.startswith("GPU-") and r["uuid"].startswith(entry))]
        if not match:
            break
        chosen.append(match[0])
    return chosen


def _used_mib(gpu_ids: list[int]) -> int:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout
    except FileNotFoundError:
        return 0
    used = 0
    for line in out.strip().splitlines():
        index, mib = (part.strip() for part in line.split(","))
        if int(index) in gpu_ids:
            used = max(used, int(mib))
    return used


GPU_FREE_MIB = 1024  # what a GPU may hold and still be free to start on
CLEAR_WAIT_S = 60


def _gpu_processes(gpu_ids: list[int]) -> list[int]:
    """The PIDs nvidia-smi lists as compute processes on these GPUs."""
    try:
        buses = subprocess.run(["nvidia-smi", "--query-gpu=index,pci.bus_id", "--format=csv,noheader"],
                               capture_output=True, text=True).stdout
        apps = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,gpu_bus_id", "--format=csv,noheader"],
                              capture_output=True, text=True).stdout
    except FileNotFoundError:
        return []
    mine = {bus.strip() for index, bus in (line.split(",") for line in buses.strip().splitlines() if "," in line)
            if int(index) in gpu_ids}
    return [int(pid) for pid, bus in (line.split(",") for line in apps.strip().splitlines() if "," in line)
            if bus.strip() in mine]


def clear_gpus(gpu_ids: list[int], wait_s: float = CLEAR_WAIT_S, used=None, processes=None, kill=os.kill,
               sleep=time.sleep) -> int:
    """Free a start's GPUs before it launches and return the MiB they still hold. A stopped start's workers can
    outlive its process group: vLLM 0.29.0's TP 4 start, whose custom all-reduce failed on shutdown, kept ~131 GiB on
    each GPU, and every start after it failed for want of memory. The GPUs this launcher is given are its own, so
    the compute processes left on them are its starts': they are killed, and the memory waited for."""
    used = used or _used_mib
    processes = processes or _gpu_processes
    if used(gpu_ids) < GPU_FREE_MIB:
        return used(gpu_ids)
    for pid in processes(gpu_ids):
        try:
            kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            continue
    waited = 0.0
    while used(gpu_ids) >= GPU_FREE_MIB and waited < wait_s:
        sleep(1)
        waited += 1
    return used(gpu_ids)


def _model_dir(config: str, root: Path) -> Path:
    """A folder holding only the config (vLLM reads a model folder; dummy weights need nothing else)."""
    folder = root / Path(config).stem
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config, folder / "config.json")
    return folder


class Running:
    def __init__(self, spec: StartSpec, gpu_ids: list[int], log_path: Path, models: Path, port: int,
                 sitedirs: dict[str, str]) -> None:
        self.spec, self.gpu_ids, self.log_path = spec, gpu_ids, log_path
        env = dict(os.environ, **SAFE_ENV, CUDA_VISIBLE_DEVICES=",".join(map(str, gpu_ids)), VLLM_PORT=str(port))
        site = sitedirs.get(spec.release or "", "")
        if site:
            env["PYTHONPATH"] = site + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        here = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = env.get("PYTHONPATH", "") + os.pathsep + here
        self.log = open(log_path, "w")
        self.started = time.time()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "measure.vllm_child", str(_model_dir(spec.config, models)), spec.context,
             json.dumps(spec.args)], stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.sized_at: float | None = None

    def poll(self, grace_s: float) -> str | None:
        """None while the start runs; else its status."""
        if self.sized_at is None and SIZED.search(self.log_path.read_text(errors="replace")):
            self.sized_at = time.time()
        if self.sized_at is not None and time.time() - self.sized_at >= grace_s:
            return "sized"
        if self.proc.poll() is not None:
            text = self.log_path.read_text(errors="replace")
            return "sized" if SIZED.search(text) else "failed"
        return None

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=10)
                break
            except subprocess.TimeoutExpired:
                continue
        # the engine's workers share the group; give the driver a moment to free their memory
        for _ in range(30):
            if _used_mib(self.gpu_ids) < 1024:
                break
            time.sleep(1)
        self.log.close()


def run_starts(specs: list[StartSpec], log_dir: Path, deadline_s: float, gpu_ids: list[int],
               sitedirs: dict[str, str] | None = None, start_cost_s: float = 110, grace_s: float = 2,
               timeout_s: float = 300) -> list[StartResult]:
    """Run the starts over the GPUs, several at once where they fit, launching none that could not
    finish before the deadline (seconds from now)."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="kvsize-models-") as models:
        return _run(specs, log_dir, deadline_s, gpu_ids, sitedirs or {}, start_cost_s, grace_s, timeout_s, Path(models))


def _run(specs, log_dir, deadline_s, gpu_ids, sitedirs, start_cost_s, grace_s, timeout_s, models,
         clear=clear_gpus) -> list[StartResult]:
    end = time.time() + deadline_s
    pending, running, results = list(specs), [], []
    free = list(gpu_ids)
    launched = 0
    while pending or running:
        for spec in list(pending):
            if spec.gpus <= len(free) and end - time.time() > start_cost_s:
                take, free = free[:spec.gpus], free[spec.gpus:]
                held = clear(take)
                if held >= GPU_FREE_MIB:  # kept out of every later start too: they would fail the same way
                    print(f"== GPU {take} still holds {held} MiB after its processes were killed: not used again",
                          flush=True)
                    continue
                pending.remove(spec)
                # ports keyed by the first GPU, so launchers on disjoint GPUs of one host never share one
                port = 20000 + 1000 * take[0] + 100 * (launched % 10)
                launched += 1
                running.append(Running(spec, take, log_dir / f"{spec.id}.log", models, port, sitedirs))
                print(f"== start {spec.id} on GPU {take}", flush=True)
        if not running:
            break  # nothing fits before the deadline
        time.sleep(1)
        for r in list(running):
            status = r.poll(grace_s)
            age = time.time() - r.started
            if status is None and (age > timeout_s or time.time() > end):
                status = "timeout"
            if status is None:
                continue
            rc = r.proc.poll()
            r.stop()
            running.remove(r)
            free = sorted(free + r.gpu_ids)
            results.append(StartResult(r.spec.id, status, round(age, 1), r.gpu_ids, rc))
            print(f"== {r.spec.id} {status} in {age:.0f}s", flush=True)
            for line in r.log_path.read_text(errors="replace").splitlines():
                if MEMORY_LINES.search(line):
                    print("   " + line[-220:], flush=True)
    for spec in pending:
        results.append(StartResult(spec.id, "not started", 0.0, [], None))
    # hand the GPUs back free: a stopped PP start's workers outlived their group and held 131 GiB of GPU 0,
    # so the serving lane that took the GPU next could not start its server
    clear(list(gpu_ids))
    return results


def main(argv: list[str]) -> int:
    """usage: python -m measure.vllm_start PLAN.json OUT_DIR DEADLINE_S [RELEASE=SITEDIR ...]"""
    plan, out, deadline = Path(argv[1]), Path(argv[2]), float(argv[3])
    sitedirs = dict(a.split("=", 1) for a in argv[4:])
    specs = [StartSpec(**row) for row in json.loads(plan.read_text())]
    gpus = gpu_inventory()
    if not gpus:
        print("no GPU to start on: nvidia-smi lists none that CUDA_VISIBLE_DEVICES lets this process use", flush=True)
        return 2
    results = run_starts(specs, out / "logs", deadline, [g["index"] for g in gpus], sitedirs)
    by_id = {s.id: s for s in specs}
    with open(out / "starts.jsonl", "w") as f:
        for r in results:
            f.write(json.dumps({**asdict(by_id[r.id]), **asdict(r), "gpu": gpus[0]["name"],
                                "nvml_total_mib": gpus[0]["nvml_total_mib"], "gpu_count": len(gpus)}) + "\n")
    done = sum(r.status == "sized" for r in results)
    print(f"== {done} of {len(results)} starts sized", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

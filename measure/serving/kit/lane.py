"""GPU-machine side of the serving runs: one lane of measure/serving/plan.json.

A lane is a GPU set that runs its servers one after another. For each server: start `vllm serve` (the OpenAI
server, `python3 -m vllm.entrypoints.openai.api_server`) on dummy weights in its own process session, wait for
/health, then run each of its points with vLLM's own `vllm bench serve` code (vllm.benchmarks.serve: the same
argument parser and main() the CLI calls, called in this one process so that vLLM is imported once), scrape
/metrics every second while a point runs, and stop the server when its points are done.

State lives under RES/<batch>/<server>/: a point is done when its result (or error) file exists, so a later
call resumes where an earlier one stopped at its deadline (a running server is reused).

usage: python3 lane.py --lane 0 --deadline EPOCH_SECONDS     (PYTHONPATH=/tmp/vsite: the staged vLLM)
       SERVING_ORDER=TAG,TAG,... SERVING_GPUS=0 python3 lane.py --lane one --deadline EPOCH_SECONDS
           (a machine of one GPU: the servers named, one after another, every one on GPU 0)
       python3 lane.py --summary
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import urllib.request
from pathlib import Path

KIT = Path(__file__).resolve().parent
RES = Path(os.environ.get("SERVING_RES", "/tmp/res"))
ENV = dict(PYTHONUNBUFFERED="1", VLLM_USE_FLASHINFER_SAMPLER="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
           PYTORCH_SKIP_CUDNN_COMPATIBILITY_CHECK="1", VLLM_NCCL_SO_PATH="/tmp/vsite/nvidia/nccl/lib/libnccl.so.2",
           NCCL_NVLS_ENABLE="0", TORCH_SYMM_MEM_DISABLE_MULTICAST="1", NVSHMEM_DISABLE_NVLS="1",
           VLLM_ALLREDUCE_USE_SYMM_MEM="0", PYTHONPATH=os.environ.get("PYTHONPATH", "/tmp/vsite"))
SCRAPED = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
           "vllm:num_preemptions_total")
START_TIMEOUT_S = 420


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fetch(url: str, timeout: float = 3.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read().decode()


def healthy(port: int) -> bool:
    try:
        fetch(f"http://127.0.0.1:{port}/health", 2.0)
        return True
    except Exception:
        return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:  # a zombie child of this process counts as gone
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return True


def gpus(s: dict) -> str:
    """The GPUs a server runs on: the plan's, or SERVING_GPUS where the machine has fewer GPUs than the plan's lanes."""
    return os.environ.get("SERVING_GPUS") or s["gpus"]


def server_dir(s: dict) -> Path:
    d = RES / s["batch"] / s["tag"]
    d.mkdir(parents=True, exist_ok=True)
    return d


def model_dir(s: dict) -> Path:
    return KIT / "models" / s["model"]


def tokenizer_dir(s: dict) -> Path:
    """The model folder, or where the plan says so a folder holding only the tokenizer (go.sh writes it)."""
    return KIT / s["tokenizer"] if s.get("tokenizer") else model_dir(s)


def server_args(s: dict) -> list[str]:
    own = ["--tokenizer", str(tokenizer_dir(s))] if s.get("tokenizer") else []
    # several API server processes in front of one engine only start through the CLI (vllm serve MODEL
    # --api-server-count N); the api_server module runs one
    head = (["-m", "vllm.entrypoints.cli.main", "serve", str(model_dir(s)), "--api-server-count",
             str(s["api_server_count"])] if s.get("api_server_count") else
            ["-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir(s))])
    return [sys.executable, *head, *own,
            "--served-model-name", "m", "--load-format", "dummy", "--port", str(s["port"]),
            "--max-model-len", str(s["max_model_len"]), "--gpu-memory-utilization", str(s["gpu_memory_utilization"]),
            "--max-num-seqs", str(s["max_num_seqs"]), "--max-num-batched-tokens", str(s["max_num_batched_tokens"]),
            "--tensor-parallel-size", str(s["tensor_parallel_size"]), "--kv-cache-dtype", s["kv_cache_dtype"],
            "--enable-prefix-caching" if s["enable_prefix_caching"] else "--no-enable-prefix-caching",
            *(["--compilation-config", json.dumps({"max_cudagraph_capture_size": s["max_cudagraph_capture_size"]})]
              if s.get("max_cudagraph_capture_size") else [])]


def step_trace_env(d: Path, pythonpath: str) -> dict:
    """The variables that make a server's engine core write its per-step timing into d/steps (measure/step_trace.py,
    installed as a vLLM general plugin in RES/step-trace-plugin)."""
    root = next(p for p in KIT.parents if (p / "measure" / "step_trace.py").exists())
    sys.path.insert(0, str(root))
    from measure.step_trace import ENV_DIR, install_dir
    plugin = install_dir(RES / "step-trace-plugin")
    return {ENV_DIR: str(d / "steps"), "PYTHONPATH": f"{plugin}:{pythonpath}"}


def ensure_server(s: dict, deadline: float) -> str:
    """'up', 'failed' or 'deadline'."""
    d = server_dir(s)
    pidf = d / "server.pid"
    if pidf.exists() and alive(int(pidf.read_text())):
        pid = int(pidf.read_text())
        t0 = float((d / "server.started").read_text())
        # a server an earlier call started may have been up for longer than a start may take: it gets its health
        # checks all the same (b31's Qwen3-8B server, up 294 s after its start, was stopped as failed without one)
        resumed = time.time() + 30
        log(f"{s['tag']}: a server (pid {pid}) is already running")
    else:
        args = server_args(s)
        env = {**os.environ, **ENV, "CUDA_VISIBLE_DEVICES": gpus(s)}
        if s.get("step_trace"):
            env.update(step_trace_env(d, env["PYTHONPATH"]))
        (d / "server.cmd").write_text(" ".join(args[1:]) + "\n")
        with open(d / "server.log", "ab") as out:
            p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd="/tmp",
                                 start_new_session=True)
        pid, t0 = p.pid, time.time()
        resumed = t0
        pidf.write_text(str(pid))
        (d / "server.started").write_text(f"{t0:.3f}\n")
        (d / "server.gpus").write_text(gpus(s) + "\n")
        log(f"{s['tag']}: starting pid {pid} on GPUs {gpus(s)}")
    while time.time() < min(deadline, max(t0 + START_TIMEOUT_S, resumed)):
        if healthy(s["port"]):
            if not (d / "server.ready").exists():
                (d / "server.ready").write_text(f"{time.time():.3f}\n")
            log(f"{s['tag']}: up, {time.time() - t0:.0f} s after its start")
            return "up"
        if not alive(pid):
            (d / "start_failed").write_text("exited while starting\n")
            log(f"{s['tag']}: exited while starting")
            return "failed"
        time.sleep(2)
    if time.time() >= t0 + START_TIMEOUT_S:
        (d / "start_failed").write_text(f"not healthy after {START_TIMEOUT_S} s\n")
        stop_server(s)
        return "failed"
    return "deadline"  # still starting: the next call finds it (or starts it again)


def stop_server(s: dict) -> None:
    pidf = server_dir(s) / "server.pid"
    if not pidf.exists():
        return
    pid = int(pidf.read_text())
    for sig, wait in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
        try:
            os.killpg(pid, sig)
        except OSError:
            break
        t = time.time()
        while alive(pid) and time.time() - t < wait:
            time.sleep(0.5)
        if not alive(pid):
            break
    try:  # engine processes left in the group
        os.killpg(pid, signal.SIGKILL)
    except OSError:
        pass
    pidf.unlink()
    # wait until the lane's GPUs are free again
    for _ in range(60):
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                              "-i", gpus(s)], capture_output=True, text=True).stdout.split()
        if out and all(float(x) < 3000 for x in out):
            break
        time.sleep(1)
    log(f"{s['tag']}: stopped")


class Scraper(threading.Thread):
    """Appends the scraped gauges and counters, one line each: epoch seconds, point, name, value."""

    def __init__(self, port: int, path: Path):
        super().__init__(daemon=True)
        self.port, self.path, self.point = port, path, None

    def run(self) -> None:
        with open(self.path, "a") as f:
            while True:
                point = self.point
                if point is not None:
                    try:
                        text, t = fetch(f"http://127.0.0.1:{self.port}/metrics", 2.0), time.time()
                        for line in text.splitlines():
                            if line.startswith(SCRAPED):
                                f.write(f"{t:.3f}\t{point}\t{line.split('{')[0].split(' ')[0]}\t{line.split()[-1]}\n")
                        f.flush()
                    except Exception as e:
                        f.write(f"{time.time():.3f}\t{point}\terror\t{type(e).__name__}\n")
                time.sleep(1.0)


def bench_argv(s: dict, p: dict, d: Path) -> list[str]:
    argv = ["--backend", "vllm", "--base-url", f"http://127.0.0.1:{s['port']}", "--endpoint", "/v1/completions",
            "--model", "m", "--served-model-name", "m", "--tokenizer", str(tokenizer_dir(s)),
            "--dataset-name", "random", "--random-input-len", str(p["input_len"]),
            "--random-output-len", str(p["output_len"]), "--random-range-ratio", "0", "--num-prompts",
            str(p["num_prompts"]), "--ignore-eos", "--seed", str(p["seed"]), "--percentile-metrics",
            "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99", "--save-result", "--save-detailed",
            "--result-dir", str(d), "--result-filename", f"{p['id']}.json", "--disable-tqdm"]
    if p["concurrency"] is not None:
        argv += ["--max-concurrency", str(p["concurrency"]), "--request-rate", "inf"]
    else:
        argv += ["--request-rate", str(p["request_rate"])]
    return argv


def run_points(s: dict, deadline: float) -> str:
    """'done', 'deadline', 'halted' or 'failed'."""
    from vllm.benchmarks.serve import add_cli_args, main as bench_main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    d = server_dir(s)
    if (d / "halted").exists():  # a earlier call stopped after repeated errors: try those points again
        for f in d.glob("*.error.txt"):
            f.unlink()
        (d / "halted").unlink()
    scraper = Scraper(s["port"], d / "metrics.tsv")
    scraper.start()
    errors_in_a_row = 0
    for p in s["points"]:
        if (d / f"{p['id']}.json").exists() or (d / f"{p['id']}.error.txt").exists():
            continue
        if time.time() + p["est_s"] > deadline:
            log(f"{p['id']}: left for the next call (about {p['est_s']} s, {deadline - time.time():.0f} s left)")
            return "deadline"
        parser = FlexibleArgumentParser()
        add_cli_args(parser)
        argv = bench_argv(s, p, d)
        args = parser.parse_args(argv)
        meta = dict(point=p["id"], argv=["vllm", "bench", "serve", *argv], started=time.time())
        scraper.point = p["id"]
        log(f"{p['id']}: running")
        try:
            bench_main(args)
            meta["ok"] = True
        except BaseException as e:  # noqa: BLE001 - a point's failure is recorded, the lane goes on
            meta["ok"] = False
            (d / f"{p['id']}.error.txt").write_text(traceback.format_exc())
            log(f"{p['id']}: failed: {type(e).__name__}: {e}")
            if isinstance(e, KeyboardInterrupt):
                raise
        finally:
            scraper.point = None
            meta["ended"] = time.time()
            (d / f"{p['id']}.meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        log(f"{p['id']}: {meta['ended'] - meta['started']:.1f} s")
        errors_in_a_row = 0 if meta["ok"] else errors_in_a_row + 1
        if errors_in_a_row >= 2:
            (d / "halted").write_text(f"after {p['id']}\n")
            log(f"{s['tag']}: two points in a row failed: halted (the server is left running)")
            return "halted"
        pid = (d / "server.pid").read_text() if (d / "server.pid").exists() else None
        if pid is None or not alive(int(pid)):
            (d / "server_died").write_text(f"after {p['id']}\n")
            log(f"{s['tag']}: the server died")
            return "failed"
    return "done"


def finished(s: dict) -> bool:
    d = RES / s["batch"] / s["tag"]
    return (d / "done").exists() or (d / "start_failed").exists() or (d / "server_died").exists()


def _import_bench() -> None:
    try:
        import vllm.benchmarks.serve  # noqa: F401 - imported while the server starts
    except Exception:  # noqa: BLE001 - run_points imports it again and reports
        pass


def run_lane(lane: str, deadline: float) -> None:
    threading.Thread(target=_import_bench, daemon=True).start()
    plan = json.loads((KIT / "plan.json").read_text())
    servers = {s["tag"]: s for s in plan["servers"]}
    others = [t for key, tags in plan["lanes"].items() if key != lane for t in tags]
    if "," in lane and not os.environ.get("SERVING_LANE_ALONE") and not all(finished(servers[t]) for t in others):
        log(f"lane {lane}: waiting for the one-GPU lanes to finish first")
        return
    tags = os.environ["SERVING_ORDER"].split(",") if lane == "one" else plan["lanes"][lane]
    for tag in tags:
        s = servers[tag]
        if finished(s):
            continue
        if s.get("instead_of") and not (RES / s["batch"] / s["instead_of"] / "start_failed").exists():
            # a fallback: started only where the server it stands in for failed to start
            if finished(servers[s["instead_of"]]):
                log(f"lane {lane}: {tag} not needed ({s['instead_of']} started)")
            continue
        state = ensure_server(s, deadline)
        if state != "up":
            log(f"lane {lane}: {tag} {state}")
            if state == "deadline":
                return
            continue
        state = run_points(s, deadline)
        if state in ("deadline", "halted"):
            return
        stop_server(s)
        if state == "done":
            (server_dir(s) / "done").write_text(f"{time.time():.3f}\n")
    log(f"lane {lane}: all done")


def summary() -> None:
    for f in sorted(RES.glob("*/*/*.json")):
        if f.name.endswith(".meta.json"):
            continue
        try:
            r = json.loads(f.read_text())
            print(f"{f.stem:48s} ok {r.get('completed')}/{r.get('num_prompts')} ttft50 {r.get('median_ttft_ms', 0):8.1f} "
                  f"itl50 {r.get('median_itl_ms', 0):7.2f} itl99 {r.get('p99_itl_ms', 0):7.2f} "
                  f"out/s {r.get('output_throughput', 0):8.0f} dur {r.get('duration', 0):5.1f}")
        except Exception as e:  # noqa: BLE001
            print(f"{f.stem}: unreadable ({e})")
    for f in sorted(RES.glob("*/*/*.error.txt")):
        print(f"{f.name}: {f.read_text().strip().splitlines()[-1][:200]}")
    for f in sorted(RES.glob("*/*/server.log")):
        lines = [ln.strip()[-160:] for ln in f.read_text(errors="replace").splitlines()
                 if "GPU KV cache size" in ln or "Maximum concurrency" in ln]
        print(f.parent.name, *lines[-2:], sep="\n  ")
    for name in ("start_failed", "server_died"):
        for f in sorted(RES.glob(f"*/*/{name}")):
            print(f"{f.parent.name}: {name}: {f.read_text().strip()}")
            tail = (f.parent / "server.log").read_text(errors="replace").splitlines()[-25:]
            print("\n".join("   | " + ln[-220:] for ln in tail))


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--lane")
    ap.add_argument("--deadline", type=float)
    ap.add_argument("--summary", action="store_true")
    a = ap.parse_args()
    if a.summary:
        summary()
    else:
        run_lane(a.lane, a.deadline)

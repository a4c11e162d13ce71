"""Prints cold-start times of `kvsize estimate` and sweep throughput (goals in the README)."""

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cold(argv, runs=7):
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "app.cli", *argv], cwd=ROOT, check=True, capture_output=True)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main():
    print(f"cold start, bundled profile: median {cold(['estimate', '--model', 'llama-3.1-8b']):.3f} s (goal <= 0.5 s)")
    with tempfile.TemporaryDirectory() as d:
        config = Path(d) / "config.json"
        config.write_text(json.dumps(json.loads((ROOT / "profiles/models/qwen3-8b.json").read_text())["config"]))
        print(f"cold start, raw config.json: median {cold(['estimate', '--model', str(config)], 5):.3f} s (goal <= 4 s)")
    sys.path.insert(0, str(ROOT))
    from sizing.capacity.scenario import Scenario
    from sizing.profiles import gpu_profile, load_model
    from sizing.planners.sweep import SweepGrid, run_sweep

    models = ["llama-3.1-8b", "llama-3.1-70b", "qwen3-8b", "gpt-oss-20b", "mistral-7b-v0.1", "deepseek-v3",
              "gemma-2-9b", "qwen3-30b-a3b", "mixtral-8x7b-v0.1", "falcon-7b"]
    grid = SweepGrid(models=models, gpus=["h100-sxm", "h200", "b200", "a100-80gb", "l40s"],
                     engines=["vllm", "sglang", "ideal", "trtllm"],
                     formats=["auto", "fp8_e4m3", "nvfp4", "fp8_per_token_head", "kivi2"],
                     contexts=[1024 * k for k in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 160, 192, 256,
                                                  384, 512, 1024)],
                     tensor_parallel_sizes=[1, 2, 4, 8, 16])
    name, shape = load_model(models[0])
    g = gpu_profile("h100-sxm")
    base = Scenario(name, shape, g.name, g.memory_bytes)
    t = time.perf_counter()
    rows = run_sweep(grid, base)
    dt = time.perf_counter() - t
    print(f"sweep: {len(rows):,} rows in {dt:.2f} s = {len(rows) / dt:,.0f} rows/s (goal >= 100,000 rows in <= 2 s)")
    from app.cli import _csv_text

    t = time.perf_counter()
    text = _csv_text(rows)
    print(f"sweep CSV: {len(text) / 1e6:.1f} MB written in {time.perf_counter() - t:.2f} s")


if __name__ == "__main__":
    main()

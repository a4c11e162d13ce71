"""Regenerate the vLLM reference fixtures in tests/fixtures/vllm-reference/.

For every bundled model profile and every config in tests/fixtures/configs/, this runs vLLM's own
model construction on the meta device (the CPU-only oracle `vllm_oracle.py`, which needs its own
virtual environment with vLLM installed: vLLM is not a dependency of kvsize) at TP 1 and TP 8, with
the model's dtype and with fp8 KV, for a fixed KV budget, and keeps what vLLM says about the cache:
per-layer specs, page sizes, groups, block size, num_blocks, max concurrency and the "GPU KV cache
size" tokens. tests/test_vllm_reference.py holds kvsize to these figures.

    python scripts/vllm_reference.py --oracle PATH/vllm_oracle.py --python PATH/bin/python [NAME ...]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "fixtures" / "vllm-reference"
BUDGET_BYTES = 10 * 2**30  # the KV memory every variant is given (vLLM's "available KV cache memory")
VARIANTS = ("1:auto", "1:fp8", "8:auto", "8:fp8")
# Every --kv-cache-dtype of vLLM 0.33's CacheDType, run once on one dense GQA config (head size 128).
FORMAT_CONFIG = "Llama-3.1-8B"
FORMAT_DTYPES = ("fp8_e4m3", "fp8_e5m2", "fp8_inc", "fp8_per_token_head", "int8_per_token_head",
                 "int4_per_token_head", "nvfp4", "nvfp4_4over6", "turboquant_k8v4", "turboquant_4bit_nc",
                 "turboquant_k3v4_nc", "turboquant_3bit_nc", "ultraquant_4bit", "octave_k3v4", "octave_k3v3",
                 "octave_k3v3_compact")
KEEP = ("tp", "kv_cache_dtype", "error", "block_size_effective", "mamba_page_size_padded", "layer_specs",
        "kv_bytes_per_token", "kv_cache_groups", "attn_backends", "available_bytes", "num_blocks",
        "pool_bytes_per_block", "max_concurrency", "max_model_len", "kv_cache_size_tokens",
        "vllm_refuses_to_start")


def inputs() -> dict[str, tuple[str, dict]]:
    """name -> (where the config comes from, config.json contents)."""
    found = {}
    for path in sorted((ROOT / "profiles" / "models").glob("*.json")):
        data = json.loads(path.read_text())
        found[f"profile-{path.stem}"] = (f"kvsize model profile {path.stem} ({data.get('hf_id', '')})",
                                         data["config"])
    for path in sorted((ROOT / "tests" / "fixtures" / "configs").glob("*.json")):
        found[f"config-{path.stem}"] = (f"tests/fixtures/configs/{path.name}", json.loads(path.read_text()))
    return found


def language_model_config(config: dict) -> dict | None:
    """A multimodal config's language model as its own causal-LM config: the vision tower holds no
    KV cache, and the oracle cannot build the multimodal classes on CPU (they import torchvision)."""
    text = config.get("text_config")
    archs = config.get("architectures") or []
    if not isinstance(text, dict) or not archs or not archs[0].endswith("ForConditionalGeneration"):
        return None
    built = dict(text)
    built["architectures"] = [archs[0].replace("ForConditionalGeneration", "ForCausalLM")]
    for key in ("torch_dtype", "dtype"):
        if key in config and key not in built:
            built[key] = config[key]
    return built


# What vLLM's model construction asks of a GPU outside the KV cache specs (DeepSeek sparse attention's
# streams, scratch tensors, workspace, DeepGEMM check): such a model is built again through SHIM.
SHIM = ROOT / "scripts" / "vllm_oracle_shim.py"
NEEDS_SHIM = ("torch.cuda.Stream requires CUDA", "Torch not compiled with CUDA enabled",
              "requires DeepGEMM", "WorkspaceManager not initialized", "tilelang is required")


def run_oracle(config: dict, oracle: str, python: str, variants=VARIANTS,
               shim: bool = False) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as folder:
        (Path(folder) / "config.json").write_text(json.dumps(config))
        args = [python, *([str(SHIM)] if shim else []), oracle, folder]
        for variant in variants:
            args += ["--variant", f"{variant}:{BUDGET_BYTES}"]
        return subprocess.run(args, capture_output=True, text=True, timeout=3600)


def run_one(name: str, origin: str, config: dict, oracle: str, python: str, variants=VARIANTS) -> dict:
    done = run_oracle(config, oracle, python, variants)
    built_from = None
    shimmed = done.returncode == 0 and any(reason in done.stdout for reason in NEEDS_SHIM)
    if shimmed:
        done = run_oracle(config, oracle, python, variants, shim=True)
    if done.returncode == 0 and '"error"' in done.stdout and (text := language_model_config(config)):
        retry = run_oracle(text, oracle, python)
        if retry.returncode == 0 and '"error"' not in retry.stdout:
            done, built_from = retry, f"its text_config, built as {text['architectures'][0]}"
    if done.returncode != 0 or not done.stdout.strip():
        return {"config": origin, "error": done.stderr.strip().splitlines()[-1:] or ["no output"]}
    raw = json.loads(done.stdout)
    variants = []
    for variant in raw.get("variants", []):
        kept = {key: variant[key] for key in KEEP if key in variant}
        if isinstance(kept.get("vllm_refuses_to_start"), str):
            kept["vllm_refuses_to_start"] = kept["vllm_refuses_to_start"][:160]
        if isinstance(kept.get("error"), str):
            kept["error"] = kept["error"][:300]
        variants.append(kept)
    return {
        "source": f"vLLM {raw.get('vllm_version')}'s own model construction on the meta device "
                  f"({raw.get('platform')}), {BUDGET_BYTES} bytes of KV memory per variant",
        "vllm_version": raw.get("vllm_version"),
        "config": origin,
        "built_from": built_from or "the config as given",
        "built_with": "scripts/vllm_oracle_shim.py: CUDA streams, the workspace and DeepGEMM's presence "
                      "stood in for, JIT warmup off" if shimmed else "the oracle as it is",
        "model_config": raw.get("model_config"),
        "variants": variants,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--oracle", required=True, help="path to vllm_oracle.py")
    parser.add_argument("--python", default=sys.executable, help="the Python of the venv that has vLLM")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("names", nargs="*", help="only these (profile-ID or config-FILESTEM)")
    args = parser.parse_args(argv)
    chosen = {k: v for k, v in inputs().items() if not args.names or k in args.names}
    OUT.mkdir(parents=True, exist_ok=True)

    def one(item):
        name, (origin, config) = item
        result = run_one(name, origin, config, args.oracle, args.python)
        (OUT / f"{name}.json").write_text(json.dumps(result, indent=1) + "\n")
        return name, result

    if not args.names or f"formats-{FORMAT_CONFIG}" in args.names:
        path = ROOT / "tests" / "fixtures" / "configs" / f"{FORMAT_CONFIG}.json"
        result = run_one(f"formats-{FORMAT_CONFIG}", f"tests/fixtures/configs/{path.name}",
                         json.loads(path.read_text()), args.oracle, args.python, tuple(f"1:{d}" for d in FORMAT_DTYPES))
        (OUT / f"formats-{FORMAT_CONFIG}.json").write_text(json.dumps(result, indent=1) + "\n")
        print(f"formats-{FORMAT_CONFIG}", flush=True)
    with ThreadPoolExecutor(args.jobs) as pool:
        for name, result in pool.map(one, chosen.items()):
            errors = [v.get("error") for v in result.get("variants", []) if v.get("error")]
            print(name, "error: " + str(result["error"]) if "error" in result else f"{len(errors)} variant errors",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the vLLM start fits share (scripts/fit_vllm_terms.py, scripts/fit_vllm_graphs.py): the release files they
write, the starts they keep out, the scenario a start's graph rules see, and the edit of a release file."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sizing.capacity.scenario import built_shape, with_engine_defaults  # noqa: E402
from sizing.engines import get_engine  # noqa: E402
from sizing.evidence.starts import load_corpus, start_scenario  # noqa: E402


FITTED_FILES = ("vllm-0.20.json", "vllm-0.21-0.25.json", "vllm-0.26.json", "vllm-0.27-0.33.json")


# the file whose sub-ranges keep a V2 non-torch figure that grows with the sampler's logits
LOGIT_FILE = "vllm-0.27-0.33.json"


# starts kept out of the fits of the other models' terms: the mla-graphs-0.33 batch (its check and
# graphs-edge-0.33's MLA starts), which took FLASH_ATTN_MLA's V2 graph estimate apart
# (tests/fixtures/vllm-starts/graph-samples-0.33-h200.json) and is what fit_v2_flash_attn_mla fits; their non-torch
# memory and weights show GLM-4.7-Flash's own misses (tests/test_vllm_starts.py), which would otherwise move the
# dense models' terms; and graphs-edge-0.33's MiniCPM3-4B, whose V2 graph estimate is 0.36 GB
# above the V1 model where the dense models' per-layer figure gives 0.80 (62 layers): the V2 part does not follow the
# layers there, a miss named in tests/test_vllm_starts.py (MINICPM3_V2_TERMS) rather than spread over the others
HELD_OUT = frozenset(f"h200-0.33.0-{tag}" for tag in (
    "deepseek-v2-lite-s1024", "deepseek-v2-lite-s256", "deepseek-v2-lite-s64", "deepseek-v2-lite-tp2-probe",
    "glm-4.7-flash", "glm-4.7-flash-s256", "glm-4.7-flash-s64", "glm-4.7-flash-tp2",
    "deepseek-v2-lite-s512", "glm-4.7-flash-s512", "deepseek-v2-lite-s128", "deepseek-v2-lite-s384",
    "glm-4.7-flash-s128", "glm-4.7-flash-s384", "minicpm3-4b", "minicpm3-4b-s512",
    # dense-probe-0.33: the probes of FlashAttention 3's V2 estimate (graph-samples-0.33-h200.json), which show the
    # per-layer figure 35-186 MB off and are kept to take that estimate apart as FLASH_ATTN_MLA's was
    "qwen2.5-7b-instruct", "llama-3.2-1b-instruct", "phi-3-mini-128k-instruct", "gemma-3-1b-it"))


def built_scenario(start):
    """The start's scenario with the model as the engine builds it, the shape its graph rules see: vLLM builds
    MiniCPM3 without an MLA cache (sizing/engines/vllm.py _vllm_model), so its decode runs FLASH_ATTN, not
    FLASH_ATTN_MLA."""
    s = with_engine_defaults(start_scenario(start))
    return replace(s, shape=built_shape(s))


def fitted_corpus() -> list:
    """The start corpus less HELD_OUT."""
    return [s for s in load_corpus() if s.id not in HELD_OUT]


def mxfp4_experts(scenario) -> bool:
    """Routed experts in MXFP4 (gpt-oss), which vLLM runs through kernels that hold memory no non-torch term models:
    gpt-oss-120b leaves 0.33 GiB of non-torch memory at TP 4 beside the sampler's state, where the other models leave
    at most 0.13 GiB. Their starts are kept out of the non-torch fits and held to the result like any other
    (docs/accuracy.md), not fitted to."""
    return scenario.shape.weights_quantization == "mxfp4" and bool(scenario.shape.num_experts)


def graphs_built_otherwise(scenario) -> bool:
    """A model whose CUDA graphs the estimate builds otherwise (a capture size or an unsplit attention of its own:
    gpt-oss): what V2 adds above the V1 model is not the same there (gpt-oss-120b, 3.6 MB a layer against 9-15)."""
    model = get_engine(scenario.engine).release.cuda_graph_estimate
    return model is not None and (scenario.shape.model_type in model.unsplit_model_types
                                  or scenario.shape.model_type in model.max_capture_size_by_model_type)


def _edit_release(name: str, change) -> None:
    """Apply `change` to a release file's data and write it whole (a temporary file, renamed)."""
    import json

    from sizing.engines.releases import ENGINES_DIR

    path = ENGINES_DIR / name
    data = json.loads(path.read_text())
    change(data)
    tmp = path.with_suffix(".json.part")
    try:
        tmp.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"wrote {path}")

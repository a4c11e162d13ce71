"""A FULL graph whose decode attention keeps its split-KV scratch outside the graph (vLLM's TRITON_ATTN, the only
backend of the per-token-head formats: its metadata builder allocates the scratch when it is made) holds no
FlashAttention accumulators, and the V2 runner's estimate above the V1 model is its own figure there
(profiles/engines/vllm-0.27-0.33.json, cuda_graph_estimate.unsplit_kv_formats and unsplit_v2_per_layer)."""

import json

import pytest

from conftest import ROOT
from helpers import load_script, scenario
from sizing.capacity.estimate import estimate
from sizing.engines.cudagraphs import cuda_graph_estimate, graph_captures, split_kv_accumulator_bytes
from sizing.engines.releases import ENGINES_DIR, find_release
from sizing.profiles import load_model

RELEASE = find_release("vllm", "0.33.0")
MODEL = RELEASE.cuda_graph_estimate


def _full_only(shape, kv_format, architecture="sm90"):
    return cuda_graph_estimate(shape, MODEL, "FULL", 1, range(shape.num_layers), 256, 2048,
                               architecture=architecture, kv_format=kv_format)


@pytest.mark.parametrize("kv_format", ["int4_per_token_head", "int8_per_token_head", "fp8_per_token_head"])
def test_the_per_token_head_formats_hold_no_accumulators_on_sm90(kv_format):
    _, shape = load_model("qwen3-8b")
    held = split_kv_accumulator_bytes(shape, MODEL, 1, 256)
    assert held == 32 * 256 * 32 * 128 * 4  # splits x batch x query heads x head width x fp32
    assert _full_only(shape, "fp8") - _full_only(shape, kv_format) == held
    assert _full_only(shape, kv_format) == _full_only(shape, "fp8", architecture="sm89")  # as FA2 would


def test_mla_keeps_its_accumulators_whatever_the_format():
    _, shape = load_model("deepseek-v2")
    assert _full_only(shape, "int8_per_token_head") == _full_only(shape, "auto")


QWEN25_32B = str(ROOT / "measure" / "serving" / "models" / "qwen2.5-32b-instruct" / "config.json")


def _graphs(model: str, kv: str) -> int:
    s = scenario(model=model, gpu="h200", engine="vllm@0.33.0", k_cache_dtype=kv, v_cache_dtype=kv,
                 max_model_len=32768, max_num_seqs=1024, max_num_batched_tokens=8192, gpu_architecture="sm90")
    return estimate(s).breakdown.cuda_graph_bytes


def test_the_v2_estimate_of_an_unsplit_attention_takes_its_own_figure_per_layer():
    # Qwen2.5-32B (64 layers) in bf16 against int4_per_token_head on an H200: the V1 model drops the accumulators
    # of the largest FULL graph (512 requests, 40 heads; the first PIECEWISE capture is then the larger first
    # capture, so by less than them), and V2's part drops by 64 x the gap between the two per-layer figures
    _, shape = load_model(QWEN25_32B)
    layers = range(shape.num_layers)
    c = graph_captures(shape, MODEL, 1, layers, 1024, 8192)
    accumulators = split_kv_accumulator_bytes(shape, MODEL, 1, max(c.full))
    v1 = {kv: cuda_graph_estimate(shape, MODEL, None, 1, layers, 1024, 8192, architecture="sm90", kv_format=kv)
          for kv in ("auto", "int4_per_token_head")}
    assert 0 < v1["auto"] - v1["int4_per_token_head"] <= accumulators == 32 * 512 * 40 * 128 * 4
    per_layer_gap = MODEL.v2_per_layer_bytes - MODEL.unsplit_v2_per_layer_bytes
    assert per_layer_gap > 0
    assert _graphs(QWEN25_32B, "auto") - _graphs(QWEN25_32B, "int4_per_token_head") == \
        v1["auto"] - v1["int4_per_token_head"] + 64 * per_layer_gap


def test_the_fit_reproduces_the_unsplit_figure_and_names_its_start():
    fit = load_script("fit_vllm_terms")
    per_layer, ids = fit.fit_v2_graph_per_layer(unsplit=True)
    data = json.loads((ENGINES_DIR / fit.LOGIT_FILE).read_text())
    assert ids and data["cuda_graph_estimate"]["unsplit_v2_per_layer_bytes"] == per_layer
    assert all(i in data["sources"]["cuda_graph_estimate.unsplit_v2_per_layer"] for i in ids)
    # the per-token-head formats' servers are not among the starts it was fitted on: they judge it from outside
    assert not any("per_token_head" in i or "int4" in i or "int8" in i for i in ids)
    assert (ROOT / "measure" / "serving" / "b16-wave-edges" / "b16-qwen25-32b-int4" / "server.log").exists()


def test_an_fp8_mla_cache_on_hopper_holds_flashmlas_accumulators_not_the_splits():
    # FLASH_ATTN_MLA takes 16-bit caches only, so fp8 runs FlashMLA's dense kernel: batch + SM-part rows of the
    # latent's fp32 partial output and log-sum-exp (H200: 132 SMs, DeepSeek-V2's 128 heads make 2 tiles of 64)
    from sizing.engines.cudagraphs import flashmla_decode, own_decode_scratch
    from sizing.errors import KvsizeError

    _, shape = load_model("deepseek-v2")
    latent = shape.mla_latent_dim - shape.rotary_dim
    fp8 = split_kv_accumulator_bytes(shape, MODEL, 1, 256, "fp8_e4m3", "sm90", 132)
    assert fp8 == (256 + 132 // 2) * 128 * (latent + 1) * 4
    assert split_kv_accumulator_bytes(shape, MODEL, 8, 256, "fp8", "sm90", 132) == (256 + 132) * 16 * (latent + 1) * 4
    splits = split_kv_accumulator_bytes(shape, MODEL, 1, 256, "bf16", "sm90", 132)
    assert splits == MODEL.mla_attention_splits * 256 * 128 * latent * 4 > 20 * fp8
    # not on a GPU where FlashMLA's dense kernel does not run, and not for a model without MLA
    assert split_kv_accumulator_bytes(shape, MODEL, 1, 256, "fp8_e4m3", "sm100", 148) == splits
    _, dense = load_model("qwen3-8b")
    assert not flashmla_decode(dense, MODEL, "fp8_e4m3", "sm90")
    # V2's per-layer figure is the one of the decodes that schedule their own splits
    assert own_decode_scratch(shape, MODEL, "fp8_e4m3", "sm90") and not own_decode_scratch(shape, MODEL, "bf16", "sm90")
    with pytest.raises(KvsizeError, match="multiprocessor count"):
        split_kv_accumulator_bytes(shape, MODEL, 1, 256, "fp8_e4m3", "sm90")


def test_the_fp8_mla_starts_graph_estimates_come_within_the_bar():
    # the two one-GPU fp8 MLA starts of 0.33.0 (mla-fp8-0.33) printed 0.43 and 0.88 GiB, where the splits rule
    # gave 0.75 and 2.36
    from sizing.evidence.starts import check_start, load_corpus

    starts = {s.id: s for s in load_corpus()}
    for sid, printed in (("h200-0.33.0-deepseek-v2-lite-fp8-s128", 0.43), ("h200-0.33.0-glm-4.7-flash-fp8", 0.88)):
        term = check_start(starts[sid]).term("cuda_graphs")
        assert term.printed == printed and abs(term.predicted - printed) < 0.12, (sid, term)

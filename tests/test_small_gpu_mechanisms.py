"""Three mechanisms of vLLM 0.27-0.33 that differ off Hopper or off one GPU, each read from vLLM's source (the
0.27.0, 0.28.0, 0.29.0, 0.31.0, 0.32.0 and 0.33.0 wheels):

1. the V2 sampler's penalty state on the last pipeline stage (v1/worker/gpu/sample/penalties.py);
2. MXFP4 experts through Marlin on sm80/86/89/120 (fused_moe/oracle/mxfp4.py, marlin_utils_fp4.py);
3. no FlashAttention split-KV accumulators in a FULL graph's first capture on FA2 GPUs (fa_utils.py,
   flash_attn.py).

The reference numbers are each formula evaluated by hand from the tensor shapes in those files; none is measured
(no start of 0.27-0.33 ran PP, or on a GPU other than an H100/H200)."""

import pytest

from helpers import scenario
from sizing.capacity.estimate import _estimate_stage
from sizing.capacity.scenario import pp_stages, prepared
from sizing.engines.cudagraphs import (cuda_graph_estimate, flash_attn_version, graph_captures,
                                       holds_split_kv_accumulators, split_kv_accumulator_bytes)
from sizing.engines.memory import engine_weight_format, resolve_weights_dtype, weight_bytes
from sizing.engines.mxfp4 import expert_tensors, intermediate_per_rank, mxfp4_moe_layout
from sizing.engines.releases import find_release, penalty_state_bytes
from sizing.profiles import gpu_profile, load_model


# --- 1. the V2 sampler's penalty state at PP > 1 -------------------------------------------------------------------

def _stages(model: str, gpu: str, engine: str, pp: int = 2, tp: int = 1):
    s, eng, k, v = prepared(scenario(model, gpu, engine=engine, max_model_len=8192, pipeline_parallel_size=pp,
                                     tensor_parallel_size=tp, gpu_architecture=gpu_profile(gpu).architecture))
    stages = pp_stages(s.shape.num_layers, pp)
    return s, [_estimate_stage(s, eng, k, v, i, r, len(stages)) for i, r in enumerate(stages)]


def test_penalty_state_is_4_125_bytes_per_sequence_and_vocabulary_entry():
    # penalties.py PenaltiesState: output_bin_counts int32 [1024, 151,936] + prompt_bin_mask int32 [1024, 4,748]
    assert penalty_state_bytes(1024, 151936) == 1024 * 151936 * 4 + 1024 * 4748 * 4 == 641_777_664
    # 256 sequences (the < 70 GiB batch default) and a 128,256 vocabulary (Llama 3): cdiv(128,256, 32) = 4,008
    assert penalty_state_bytes(256, 128256) == 256 * (128256 + 4008) * 4


@pytest.mark.parametrize("engine", ["vllm@0.27.1", "vllm@0.30.0", "vllm@0.33.0"])
def test_the_last_pipeline_stage_carries_the_one_gpu_non_torch_figure(engine):
    # 0.33.0's PP 2 starts: the last stage prints the one-GPU non-torch figure (the sampler's penalty state among
    # it, +0.60 GiB for Qwen3-8B at 1,024 sequences), the first stage none
    s, (first, last) = _stages("qwen3-8b", "rtx-pro-6000", engine)
    assert first.model_runner == last.model_runner == "v2" and s.max_num_seqs == 1024
    release = find_release("vllm", engine.split("@")[1])
    one_gpu = release.non_torch_bytes(1, 1, "v2", 1024 * 151936, 151936 * 4096)
    assert first.breakdown.non_torch_bytes == 0  # no sampler on the first stage
    assert last.breakdown.non_torch_bytes == one_gpu
    assert one_gpu > penalty_state_bytes(1024, 151936)  # the state is part of it


def test_releases_whose_penalty_state_is_not_read_keep_the_flat_pipeline_term():
    # vLLM 0.26's V2 runner was not read for it (its source not read), 0.19 runs V1
    for engine in ("vllm@0.26.0", "vllm@0.19.1"):
        _, stages = _stages("qwen3-8b", "rtx-pro-6000", engine)
        assert {e.breakdown.non_torch_bytes for e in stages} == {find_release("vllm", engine[5:]).non_torch.pipeline_bytes}


def test_one_gpu_and_the_v1_runner_are_unchanged():
    release = find_release("vllm", "0.33.0")
    n = release.non_torch
    logits = 1024 * 151936
    assert release.non_torch_bytes(1, 1, "v2", logits, 0, True) == release.non_torch_bytes(1, 1, "v2", logits)
    assert release.non_torch_bytes(1, 2, "v1", logits, 0, True) == n.pipeline_bytes


def test_at_tp_and_pp_only_the_last_stage_holds_the_sampler_state():
    # the TP rule's per-logit term is the same state (non_torch.tensor_parallel source): last PP rank only
    release = find_release("vllm", "0.33.0")
    n, logits = release.non_torch, 1024 * 151936
    assert release.non_torch_bytes(2, 2, "v2", logits, 0, False) == n.tensor_parallel_bytes
    assert release.non_torch_bytes(2, 2, "v2", logits, 0, True) == release.non_torch_bytes(2, 1, "v2", logits)


# --- 2. MXFP4 experts through Marlin ---------------------------------------------------------------------------------

def _layout(version: str, architecture: str):
    release = find_release("vllm", version)
    return mxfp4_moe_layout(release.engine, release.first_version, architecture, "mxfp4")


@pytest.mark.parametrize("architecture", ["sm80", "sm86", "sm89", "sm120"])
@pytest.mark.parametrize("version", ["0.27.1", "0.30.0", "0.33.0"])
def test_marlin_gpus_get_the_marlin_layout(architecture, version):
    layout = _layout(version, architecture)
    assert layout.backend == "MARLIN" and layout.intermediate_align == 128 and layout.hidden_align == 256
    assert _layout(version, "sm90").backend == "TRITON"  # Hopper keeps its own


def test_marlin_rows_start_at_0_27_and_leave_other_gpus_alone():
    assert _layout("0.26.0", "sm89") is None and _layout("0.25.1", "sm80") is None  # 0.21-0.26 not read for Marlin
    assert _layout("0.33.0", "sm100") is None and _layout("0.33.0", "gfx942") is None


def test_one_gpt_oss_20b_layer_through_marlin():
    # mxfp4_round_up_hidden_size_and_intermediate_size (MARLIN): hidden 2,880 -> 3,072, intermediate 2,880 -> 2,944
    # at TP 1 (1,440 -> 1,536 at TP 2); prepare_moe_fp4_layer_for_marlin: values 4 bits, E8M0 scales 1 B per 32
    # values, no padding of the scales, biases in bf16
    layout = _layout("0.33.0", "sm89")
    assert [intermediate_per_rank(layout, 2880, tp) for tp in (1, 2, 4)] == [2944, 1536, 768]
    assert expert_tensors(layout, 32, 2880, 2880, 1, True) == [
        32 * 2 * 2944 * 3072 // 2, 32 * 2 * 2944 * (3072 // 32),
        32 * 3072 * 2944 // 2, 32 * 3072 * (2944 // 32),
        32 * 2 * 2944 * 2, 32 * 3072 * 2]


def test_gpt_oss_20b_weighs_about_0_87_gib_more_through_marlin():
    # 24 layers of 32 experts: (3,072 x 2,944) / (2,880 x 2,880) = +9.0% of the expert values and scales
    _, shape = load_model("gpt-oss-20b")
    layers = range(shape.num_layers)
    fmt = resolve_weights_dtype("auto", shape)

    def weights(architecture):
        kept = engine_weight_format(fmt, shape, None, architecture, False, _layout("0.33.0", architecture))
        return weight_bytes(shape, kept, 1, layers, True, True).total_bytes

    marlin, checkpoint = weights("sm89"), weights("sm100")
    per_layer = sum(expert_tensors(_layout("0.33.0", "sm89"), 32, 2880, 2880, 1, True))
    # the checkpoint's bytes, 4.25 bits a weight (kvsize's path without a layout carries no expert biases)
    stored = 32 * 3 * 2880 * 2880 * 17 // 32
    assert marlin - checkpoint == 24 * (per_layer - stored)
    # 0.867 GiB: gpt-oss-20b's 24 layers of 32 experts, padded as the Marlin branch pads them
    assert 0.85 < (marlin - checkpoint) / 2**30 < 0.88


# --- 3. the split-KV accumulators of a FULL graph ----------------------------------------------------------------------

def test_the_flash_attention_version_by_compute_capability():
    # fa_utils.py get_flash_attn_version: major 9 -> FA3, major 10 -> FA4, any other CUDA GPU -> FA2
    assert {a: flash_attn_version(a) for a in ("sm80", "sm86", "sm89", "sm90", "sm100", "sm103", "sm120")} == {
        "sm80": 2, "sm86": 2, "sm89": 2, "sm90": 3, "sm100": 4, "sm103": 4, "sm120": 2}
    assert flash_attn_version("gfx942") is None and flash_attn_version(None) is None
    assert not holds_split_kv_accumulators("sm89") and holds_split_kv_accumulators("sm90")
    assert holds_split_kv_accumulators(None)  # no GPU given: kept as before


def _full_only(shape, model, tp, seqs, architecture):
    return cuda_graph_estimate(shape, model, "FULL", tp, range(shape.num_layers), seqs, 2048,
                               architecture=architecture)


@pytest.mark.parametrize("architecture", ["sm80", "sm86", "sm89", "sm120"])
def test_fa2_gpus_capture_no_split_kv_accumulators(architecture):
    # Qwen3-8B at 256 sequences: 32 splits x 256 x 32 heads x 128 x 4 B = 128 MiB held on sm90, none on FA2
    _, shape = load_model("qwen3-8b")
    model = find_release("vllm", "0.33.0").cuda_graph_estimate
    accumulators = split_kv_accumulator_bytes(shape, model, 1, 256)
    assert accumulators == 32 * 256 * 32 * 128 * 4 == 128 * 2**20
    assert _full_only(shape, model, 1, 256, "sm90") - _full_only(shape, model, 1, 256, architecture) == accumulators
    assert _full_only(shape, model, 1, 256, "sm90") == _full_only(shape, model, 1, 256, None)


def test_the_default_mode_keeps_the_larger_first_capture():
    # FULL_AND_PIECEWISE takes max(first PIECEWISE, first FULL): on FA2 the FULL one loses its accumulators
    _, shape = load_model("qwen3-8b")
    model = find_release("vllm", "0.33.0").cuda_graph_estimate
    layers = range(shape.num_layers)
    c = graph_captures(shape, model, 1, layers, 256, 2048)
    fa3 = cuda_graph_estimate(shape, model, None, 1, layers, 256, 2048, architecture="sm90")
    fa2 = cuda_graph_estimate(shape, model, None, 1, layers, 256, 2048, architecture="sm89")
    # the first FULL capture (2 MiB + 128 MiB) is above the first PIECEWISE one on sm90 and under it on sm89: the
    # estimate drops by less than the accumulators (about 9 MB here), never by more
    assert 0 < fa3 - fa2 < split_kv_accumulator_bytes(shape, model, 1, max(c.full))


def test_mla_keeps_its_accumulators_on_every_gpu():
    # MLA layers do not run FlashAttention's kernel (FlashMLA and the other MLA backends): not changed here
    _, shape = load_model("deepseek-v2")
    model = find_release("vllm", "0.33.0").cuda_graph_estimate
    assert _full_only(shape, model, 1, 256, "sm89") == _full_only(shape, model, 1, 256, "sm90")

"""vLLM's MLA attention in the profiling run allocates the largest up-projected context a chunked prefill builds
(vllm/model_executor/layers/attention/mla_attention.py forward_impl with no attention metadata, 0.20.0-0.33.0):
workspace tokens x heads per rank x (qk_nope_head_dim + v_head_dim) in the model dtype, beside the layer's inputs."""

from conftest import ROOT
from sizing.engines.memory import mla_context_bytes, mla_workspace_tokens
from sizing.evidence.starts import check_start, load_corpus
from sizing.profiles import load_model

STARTS = ROOT / "tests" / "fixtures" / "vllm-starts" / "configs"


def test_the_workspace_follows_vllms_rule():
    # min(max(8 x max_model_len, 4 x max_num_seqs x block_size), 64 Ki), in whole blocks
    assert mla_workspace_tokens(32768, 1024, 16) == 65536
    assert mla_workspace_tokens(2048, 256, 16) == 16384
    assert mla_workspace_tokens(1000, 8, 64) == 8000
    assert mla_workspace_tokens(1001, 8, 64) == 8064


def test_the_context_is_heads_by_the_up_projection_width():
    _, dsv2 = load_model(str(STARTS / "deepseek-v2-lite.json"))
    assert mla_context_bytes(dsv2, 65536, 1) == 65536 * 16 * (128 + 128) * 2  # 0.50 GiB
    assert mla_context_bytes(dsv2, 65536, 2) == 65536 * 8 * (128 + 128) * 2
    _, glm = load_model(str(STARTS / "glm-4.7-flash.json"))
    assert mla_context_bytes(glm, 65536, 1) == 65536 * 20 * (192 + 256) * 2
    _, llama = load_model("llama-3.1-8b")
    assert mla_context_bytes(llama, 65536, 1) == 0


def test_it_is_the_v2_runners_peak_of_the_mla_moe_starts():
    # the one-GPU V2 starts whose sampler is not their peak: the torch peak within the bar, from 0.67-0.71 GiB under
    # the rule without the context against 1.06-1.13 printed
    starts = [s for s in load_corpus() if s.status == "sized" and s.printed.runner == "v2"
              and s.args.get("tensor_parallel_size", 1) == 1 and s.config.endswith("deepseek-v2-lite.json")
              and s.printed.torch_peak_gib]
    assert len(starts) >= 10
    for s in starts:
        term = check_start(s).term("activation")
        assert abs(term.predicted - term.printed) < 0.12, (s.id, term)


def test_minicpm3_built_with_regular_attention_allocates_none():
    from sizing.evidence.starts import start_scenario
    from sizing.capacity.estimate import prepared
    from sizing.capacity.budget import stage_setup

    start = next(s for s in load_corpus() if s.id == "h200-0.26.0-minicpm3-4b")
    s, engine, k, v = prepared(start_scenario(start))
    setup = stage_setup(s, engine, k, v, 0, range(s.shape.num_layers), 1)
    assert s.shape.is_mla and setup.activation.mla_attention_bytes == 0

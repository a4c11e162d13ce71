"""kvsize against real vLLM starts: every start in tests/fixtures/vllm-starts (its log kept whole, its
settings and what vLLM printed in manifest.jsonl; measure/vllm_start.py made them on H100 and H200
GPUs with dummy weights) predicted by `estimate` from its settings and by check-log from its log."""

import json

import pytest

from sizing.errors import KvsizeError
from sizing.evidence.logs import log_scenario, read_log
from sizing.profiles import gpu_profile, load_model
from sizing.evidence.starts import CORPUS, accuracy_rows, check_start, check_start_log, load_corpus, start_scenario

STARTS = load_corpus()
SIZED = [s for s in STARTS if s.status == "sized"]

# Open residuals, strict: each fails the day kvsize matches it, and the mark goes then.
NEMOTRON3_ACTIVATION = (
    "Nemotron-3-Nano-30B-A3B (Mamba-2 layers and relu² MoE) on the V1 runner (0.26.0) prints a torch peak of "
    "3.26 GiB at 8,192 tokens against kvsize's 2.39 (the sampler 1.87 beside the MoE workspace 0.49); with "
    "compilation off it prints 2.39, and at 4,096 tokens 2.12 (kvsize 2.15): a peak of the compiled forward "
    "at 8,192 tokens that kvsize does not hold, so its KV budget is +1.5%; kvsize's estimate warns of it")
QWEN35_FP8_GRAPHS = (
    "Qwen3.5-35B-A3B with fp8 KV: vLLM measures 18 MiB per PIECEWISE graph (6 MiB with bf16 KV, same start "
    "otherwise), so its CUDA-graph estimate is 1.23 GiB against kvsize's 0.60 and the KV budget +1.09%")
MOE_PER_GRAPH = (
    "vLLM measures 6 MiB per PIECEWISE graph for Nemotron-3-Nano (Mamba-2 and MoE) where the per-layer constant "
    "fitted over all 61 DEBUG starts (scripts/fit_vllm_terms.py) gives less: the estimate is 0.50 GiB against "
    "vLLM's 0.64 (-0.14)")
MLA_PER_GRAPH = (
    "GLM-4.7-Flash (MLA, 47 layers): the MLA per-layer constant of the joint fit (130,143 B a layer-graph, pulled "
    "up by DeepSeek-V2-Lite's one-GPU starts) gives 1.82 GiB against vLLM's 1.64 (+0.18); its KV budget is -0.21% "
    "(-0.37% at utilization 0.7)")
MLA_TP4_GRAPHS = (
    "DeepSeek-V2-Lite at TP 4 (0.22.1) prints 0.32 GiB of graphs where the MLA per-layer constant, set by its "
    "one-GPU starts (0.89 printed, 0.83 fitted, on 0.20.1-0.22.1), gives 0.45 (+0.13): a rank's MLA graphs hold less "
    "at TP 4 than one GPU's, which a per-layer constant does not follow; its KV budget is -0.06%")
PHI_MOE_GRAPHS = (
    "Phi-3.5-MoE (0.26.0, 32 layers of 16 experts) prints 0.65 GiB of graphs where the per-layer constant of the "
    "joint fit gives 0.53 (-0.12), as for Nemotron-3-Nano's MoE (MOE_PER_GRAPH); its KV budget is +0.29%")
TP2_U80_GRAPHS = (
    "Llama-3.1-8B at TP 2 and utilization 0.8 (0.22.1) prints 0.27 GiB of graphs where the fit gives 0.40 (+0.13): "
    "the same model at TP 1 prints 0.50 and is fitted to 0.53; its KV budget is -0.09%")
GPT_OSS_MXFP4 = (
    "gpt-oss on 0.33.0 (MXFP4 experts) holds memory no term models: 0.18 GiB of non-torch memory at TP 2 "
    "(gpt-oss-20b) and 0.33 at TP 4 (gpt-oss-120b) beside the sampler's state, where the other models leave at most "
    "0.13; its starts are kept out of those fits (scripts/fit_vllm_terms.py mxfp4_experts), and its KV budgets stay "
    "within 1%. Its one-GPU start is the fit of V2's graph estimate where the decode attention runs unsplit "
    "(4.6 MB a layer against 12.9 for the others), which the per-token-head formats' servers judge from outside")
GLM_TP_WEIGHTS = (
    "GLM-4.7-Flash at TP 2 loads 28.08 GiB a rank against kvsize's 27.91: 0.17 GiB that TP does not split, not "
    "found in kvsize's sharding of its MLA and MoE layers; KV tokens -0.26% before its graph estimate was modelled "
    "part by part, +0.08% after")
GLM_V2_NON_TORCH = (
    "GLM-4.7-Flash on 0.33.0 leaves 0.09-0.14 GiB more non-torch memory than kvsize's rule at 64, 128, 256, 384, 512 "
    "and 1,024 sequences (0.25, 0.28, 0.36, 0.45, 0.53 and 0.86 GiB printed; the 128, 384 and 512 starts predicted "
    "before they ran), as with fp8 KV at 1,024 (GLM_FLASH_NON_TORCH); DeepSeek-V2-Lite's starts are within 0.03")
MINICPM3_V2_TERMS = (
    "MiniCPM3-4B on 0.33.0 (graphs-edge-0.33, predicted before it ran; vLLM builds it without an MLA cache and "
    "decodes with FLASH_ATTN): V2's graph estimate 1.11 GiB against kvsize's 1.52 (the dense models' per-layer V2 "
    "figure over 62 layers; the probe, graph-samples-0.33-h200.json, gives vLLM's figure to the byte), its torch peak "
    "0.65 GiB at the default 1,024 sequences against 0.47 (0.43 both at 512: 6.3 B a logit more per added row), and "
    "0.05-0.08 GiB more non-torch memory; the three offset, and its KV tokens are -0.13% and -0.30%. Kept out of "
    "the fits (scripts/vllm_fit_corpus.py HELD_OUT)")
GLM_SPLIT_BLOCK = (
    "GLM-4.7-Flash on 0.33.0 at the default 1,024 sequences and at 512 (bf16 KV, FLASH_ATTN_MLA; both capture the "
    "same graphs, up to 512 requests): V2's graph estimate printed 3.24 GiB against kvsize's 2.02. The probe "
    "(graph-samples-0.33-h200.json) shows both FULL warm-ups' split accumulators held twice (the second sample "
    "released 1,340 MB, one copy 650) where PyTorch's allocator split the freed block, the same line in three runs; "
    "kvsize's model holds them once (within 0.03 GiB of the other 8 probed starts) and its answer names the second "
    "copies (1.23 GiB) as KV the pool may lack. KV tokens +2.23% and +2.17% (the 512 start predicted before it ran), "
    "on the dangerous side, open in issue 49")
GEMMA3_V2_TERMS = (
    "Gemma-3-1B on 0.33.0 (dense-probe-0.33, predicted before it ran): V2's graph estimate 0.46 GiB against kvsize's "
    "0.64 (the per-layer V2 figure over 26 layers of 4 query heads; the probe, graph-samples-0.33-h200.json, shows "
    "its FlashAttention accumulators at 69 MB); its torch peak, 1.66 GiB, kvsize now makes 1.67 (the V2 sampler at "
    "3.2 copies of its 262,144-token vocabulary, fitted on the one-GPU starts; 2.8 copies gave 1.45), so the graph "
    "term is no longer offset and its KV tokens are -0.11%. Kept out of the fits (scripts/vllm_fit_corpus.py "
    "HELD_OUT)")
CHECK_LOG_SEQS = (
    "check-log on an LLM-class start of 0.33.0 at fewer than the default 1,024 sequences: the log prints no "
    "max_num_seqs (LLM() logs no non-default args), so kvsize takes the default and says so ('assumed'); estimate, "
    "given the setting, is within 0.36%")
SCOUT_V2_PEAK = (
    "Llama-4-Scout FP8 (language model only) on 0.33.0 at the default 0.9 (small-pool-0.33, predicted before it ran: "
    "a 16.45 GiB pool, 12% of the GPU): its torch peak printed 2.76 GiB against kvsize's 2.08 (0.26.0's start "
    "printed 3.31, within 0.01 of kvsize's V1 model), and V2's graph estimate 0.81 against 0.98 (PIECEWISE only: "
    "its chunked local attention captures no FULL graph); KV tokens +2.96%, above the engine. The peak's 0.68 GiB "
    "is not found: the V2 sampler at 3.2 copies of its 202,048-token vocabulary is in kvsize's figure, and 0.26.0's "
    "V1 forward held more")
LLAMA70_FP8W_GRAPHS = (
    "Llama-3.1-70B with fp8 weights (quantization fp8 on a bf16 checkpoint) on 0.33.0 at 0.6 (small-pool-0.33, "
    "predicted before it ran: an 11.05 GiB pool): the probe (graph-samples-0.33-h200.json) shows the allocator's "
    "split, the second sample releasing two copies of FlashAttention 3's accumulators (1,080 MB against 520 for "
    "one), and V2's estimate 2.25 GiB against kvsize's 2.08 (tests/test_graph_samples_starts.py SPLIT_BLOCK_FA3); "
    "its torch peak 2.27 against 2.21. KV tokens +1.90%, above the engine")
KNOWN_BUDGET_GAPS = {"h200-0.26.0-nemotron-3-nano-30b-a3b": NEMOTRON3_ACTIVATION,
                     "h200-0.26.0-qwen3.5-35b-a3b-text-fp8": QWEN35_FP8_GRAPHS,
                     "h200-0.33.0-glm-4.7-flash": GLM_SPLIT_BLOCK, "h200-0.33.0-glm-4.7-flash-s512": GLM_SPLIT_BLOCK,
                     "h200-0.33.0-llama-4-scout-17b-16e-instruct-fp8-dynamic-text": SCOUT_V2_PEAK,
                     "h200-0.33.0-llama-3.1-70b-fp8w-u60": LLAMA70_FP8W_GRAPHS}
QWEN3_MOE_V1_TP = (
    "Qwen3-30B-A3B at TP 2 on 0.27.1 runs the V1 runner (as 0.27.0's TP 4 start did; kvsize predicts it, and its "
    "torch peak within 0.01 GiB). Its graph estimate is vLLM's own sampling of a few captures, each rounded to 2 MiB "
    "pages: the two ranks measured 8 and 10 MiB a PIECEWISE graph and printed 0.62 and 0.71 GiB (kvsize 0.54; "
    "0.22.1's TP 2 start printed 0.52, 0.27.0's TP 4 ranks 6-8 MiB a graph, 0.57). Its non-torch memory is 0.38 "
    "GiB against kvsize's 0.18 (0.27.0's TP 4: 0.19), mechanism not found; KV tokens +0.40%, within 1% but above "
    "the engine")
GEMMA2_V2_GRAPHS = (
    "gemma-2-9b on 0.33.0 (42 layers, FLASH_ATTN with soft-capped attention): V2's graph estimate printed 1.23 GiB "
    "against kvsize's 1.11, the per-layer V2 figure (11.9 MB, refitted with the small-pool-0.33 starts) 0.12 GiB "
    "short here; the figure does not follow the layers alike on every model (DENSE_V2_GRAPHS in "
    "tests/test_graph_samples_starts.py); KV tokens within 0.1%")
KNOWN_GRAPH_GAPS = {"h200-0.26.0-nemotron-3-nano-30b-a3b": MOE_PER_GRAPH,
                    "h200-0.26.0-nemotron-3-nano-30b-a3b-bt4096": MOE_PER_GRAPH,
                    "h200-0.26.0-glm-4.7-flash": MLA_PER_GRAPH, "h200-0.26.0-glm-4.7-flash-u70": MLA_PER_GRAPH,
                    "h200-0.22.1-llama-3.1-8b-tp2-u80": TP2_U80_GRAPHS,
                    "h200-0.26.0-qwen3.5-35b-a3b-text-fp8": QWEN35_FP8_GRAPHS,
                    "h200-0.22.1-deepseek-v2-lite-tp4": MLA_TP4_GRAPHS,
                    "h200-0.26.0-phi-3.5-moe-instruct": PHI_MOE_GRAPHS,
                    "h200-0.27.1-qwen3-30b-a3b-tp2": QWEN3_MOE_V1_TP,
                    "h200-0.33.0-glm-4.7-flash-tp2": GLM_TP_WEIGHTS,
                    "h200-0.33.0-glm-4.7-flash": GLM_SPLIT_BLOCK,  # its 512 start's log ends before the estimate
                    "h200-0.33.0-minicpm3-4b": MINICPM3_V2_TERMS, "h200-0.33.0-minicpm3-4b-s512": MINICPM3_V2_TERMS,
                    "h200-0.33.0-gemma-3-1b-it": GEMMA3_V2_TERMS,
                    "h200-0.33.0-llama-4-scout-17b-16e-instruct-fp8-dynamic-text": SCOUT_V2_PEAK,
                    "h200-0.33.0-gemma-2-9b": GEMMA2_V2_GRAPHS}
COHERE_EAGER_FORWARD = (
    "Command-R without torch.compile prints 1.69 GiB against kvsize's 1.56: its attention and MLP run in "
    "parallel off one normed input, so the attention's output (8,192 x 8,192 bf16, 0.125 GiB) is alive beside "
    "the MLP's tensors, a copy kvsize's forward does not hold (its KV budget is still +0.20%)")
DEEPSEEK_V2_EMBEDDING_NON_TORCH = (
    "DeepSeek-V2-Lite on the V2 runner of 0.27.0-0.30.0 leaves 0.74 GiB of non-torch memory against kvsize's 1.02: "
    "the sub-range's embedding-sized part (one model-dtype copy of the embedding, 2.02 B an element, fitted with the "
    "MLA starts left out) comes to 0.13 GiB here, not 0.39; its torch peak is the MLA attention's context "
    "(mla_context_bytes), within 0.05 GiB; KV tokens -0.22% to -0.34%, below the engine")
GLM_FLASH_NON_TORCH = (
    "GLM-4.7-Flash with fp8 KV on 0.33.0 leaves 0.86 GiB of non-torch memory against kvsize's 0.72 (0.33.0's base "
    "and the V2 sampler's penalty state for 1,024 requests of 154,880 logits); DeepSeek-V2-Lite's starts of the "
    "release are within 0.04 GiB of the same rule; KV tokens +0.37%")
PP_LAST_STAGE_NON_TORCH = (
    "Qwen3-8B at PP 2 on 0.33.0: the last stage leaves 0.77 GiB of non-torch memory where kvsize gives the one-GPU "
    "figure, 0.71 (its one-GPU start prints 0.71); the other two PP 2 starts' last stages are 0.04 and -0.01 GiB from "
    "it. 0.06 GiB a stage that no term models (the stages' send and receive buffers are a candidate); its KV tokens "
    "are +0.21%")
PP_LAST_STAGE_SAMPLER = (
    "Llama-3.1-8B at PP 2 on 0.33.0: the last stage's torch peak printed 0.88 GiB where the one-GPU sampler figure "
    "(3.2 model-dtype copies of the logits, fitted on the one-GPU starts whose peak is the sampler's: 3.15-3.22 each) "
    "gives 1.02: the last stage samples with fewer copies live, over by 0.14 GiB, the safe side (its KV tokens within "
    "1%)")
TP_NON_TORCH_ENVELOPE = (
    "vLLM 0.27.0-0.33.0 at TP 2 and 4 leave -0.38 to +0.18 GiB of non-torch memory beside the sampler's per-request "
    "state and the rank's embedding shard (mostly 0.01-0.09 for the dense models and DeepSeek-V2-Lite, up to 0.18 for "
    "Qwen3-30B-A3B and 0.16 for gemma-2-9b); kvsize keeps the largest (scripts/fit_vllm_terms.py fit_tensor_parallel_non_torch) "
    "so that no start uses more than it leaves, and is above this start's figure by more than 0.05 GiB: its KV budget "
    "is below the engine's")
KNOWN_ACTIVATION_GAPS = {**{sid: TP_NON_TORCH_ENVELOPE for sid in (
                             "h200-0.33.0-llama-3.1-8b-tp2", "h200-0.33.0-llama-3.1-70b-tp2-fp8",
                             "h200-0.33.0-qwen3-8b-tp2-fp8", "h200-0.33.0-mixtral-8x7b-v0.1-tp2",
                             "h200-0.33.0-deepseek-v2-lite-tp2", "h200-0.33.0-llama-3.1-70b-tp4",
                             "h200-0.33.0-llama-3.1-8b-tp4", "h200-0.33.0-mixtral-8x7b-v0.1-tp4-fp8",
                             "h200-0.33.0-deepseek-v2-lite-tp4", "h200-0.33.0-qwen3-30b-a3b-tp2",
                             "h200-0.33.0-qwen3-30b-a3b-tp4", "h200-0.33.0-gemma-2-9b-tp2",
                             "h200-0.33.0-qwen3-8b-tp4-fp8", "h200-0.31.0-llama-3.1-70b-tp2-fp8",
                             "h200-0.32.0-llama-3.1-8b-tp2", "h200-0.28.0-llama-3.1-8b-tp2",
                             "h200-0.29.0-deepseek-v2-lite-tp2", "h200-0.27.0-llama-3.1-8b-tp2",
                             "h200-0.29.0-llama-3.1-8b-tp4", "h200-0.32.0-llama-3.1-70b-tp4",
                             "h200-0.32.0-gemma-2-9b-tp2", "h200-0.28.0-qwen3-8b-tp2-fp8",
                             "h200-0.29.0-qwen3-30b-a3b-tp2", "h200-0.33.0-deepseek-v2-lite-tp2-fp8",
                             "h200-0.30.0-llama-3.1-8b-tp2", "h200-0.27.1-llama-3.1-8b-tp2",
                             "h200-0.30.0-qwen3-30b-a3b-tp2", "h200-0.30.0-deepseek-v2-lite-tp2",
                             "h200-0.27.1-deepseek-v2-lite-tp2")},
                         "h200-0.27.1-qwen3-30b-a3b-tp2": QWEN3_MOE_V1_TP,
                         **{sid: GPT_OSS_MXFP4 for sid in ("h200-0.33.0-gpt-oss-120b", "h200-0.33.0-gpt-oss-120b-tp4")},
                         **{f"h200-{v}-deepseek-v2-lite": DEEPSEEK_V2_EMBEDDING_NON_TORCH
                            for v in ("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0")},
                         "h200-0.33.0-glm-4.7-flash-fp8": GLM_FLASH_NON_TORCH,
                         **{sid: GLM_V2_NON_TORCH for sid in ("h200-0.33.0-glm-4.7-flash-s256",
                                                             "h200-0.33.0-glm-4.7-flash-s64",
                                                             "h200-0.33.0-glm-4.7-flash-s512",
                                                             "h200-0.33.0-glm-4.7-flash",
                                                             "h200-0.33.0-glm-4.7-flash-s128",
                                                             "h200-0.33.0-glm-4.7-flash-s384")},
                         **{sid: MINICPM3_V2_TERMS for sid in ("h200-0.33.0-minicpm3-4b",
                                                              "h200-0.33.0-minicpm3-4b-s512")},
                         "h200-0.33.0-deepseek-v2-lite-tp2-probe": TP_NON_TORCH_ENVELOPE,
                         "h200-0.33.0-gpt-oss-120b-u60": GPT_OSS_MXFP4,
                         "h200-0.33.0-llama-4-scout-17b-16e-instruct-fp8-dynamic-text": SCOUT_V2_PEAK,
                         "h200-0.33.0-llama-3.1-8b-pp2": PP_LAST_STAGE_SAMPLER,
                         "h200-0.33.0-qwen3-8b-pp2": PP_LAST_STAGE_NON_TORCH,
                         "h200-0.26.0-nemotron-3-nano-30b-a3b": NEMOTRON3_ACTIVATION,
                         "h200-0.26.0-c4ai-command-r-v01-eager-compile0": COHERE_EAGER_FORWARD}


def known(starts, gaps):
    return [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=gaps[s.id])) if s.id in gaps else s
            for s in starts]


def test_the_corpus_is_broad():
    # the real-engine issue asks for starts over many architectures, releases, both GPUs and TP > 1
    assert len(SIZED) >= 60
    assert len({s.config for s in SIZED}) >= 20
    architectures = {json.loads((CORPUS / s.config).read_text())["architectures"][0] for s in SIZED}
    assert len(architectures) >= 20
    shapes = [load_model(str(CORPUS / s.config))[1] for s in SIZED]
    assert {"full", "sliding", "chunked", "recurrent"} <= {kind for shape in shapes for kind in shape.layer_kinds}
    assert any(shape.mla_latent_dim for shape in shapes) and any(shape.num_experts for shape in shapes)
    assert {"fp8", "mxfp4", "compressed-tensors"} <= {shape.weights_quantization for shape in shapes}
    # the TP issue asks for at least 12 starts at TP 2 and 4, one with fewer KV heads than ranks
    tp = [s for s in SIZED if s.args.get("tensor_parallel_size", 1) > 1]
    assert len(tp) >= 12 and {s.args["tensor_parallel_size"] for s in tp} >= {2, 4}
    assert any(s.config.endswith("qwen2.5-1.5b.json") and s.args["tensor_parallel_size"] == 4 for s in tp)
    # every vLLM release that pins torch 2.11 but 0.20.1-0.20.2 and 0.22.0 (their minor's other release was
    # started), each with the common panel where it was started last
    assert {s.release for s in SIZED} >= {"0.20.0", "0.21.0", "0.22.1", "0.23.0", "0.24.0", "0.25.0", "0.25.1",
                                          "0.26.0"}
    assert {s.gpu for s in SIZED} >= {"h100-sxm", "h200"}
    assert any(s.args.get("tensor_parallel_size", 1) == 4 for s in SIZED)
    assert any(s.context == "llm" for s in SIZED) and any(s.args.get("enforce_eager") for s in SIZED)


@pytest.mark.parametrize("start", STARTS, ids=[s.id for s in STARTS])
def test_every_start_keeps_its_log_and_config(start):
    log = (CORPUS / start.log).read_text()
    assert (CORPUS / start.config).is_file()
    assert f"vllm {start.release}" in log  # the launcher's first line names the release that ran
    if start.status == "sized":
        assert "GPU KV cache size" in log
    else:
        assert start.reason, "a start that did not size says why"


CHECK_LOG_GAPS = {sid: CHECK_LOG_SEQS for sid in ("h200-0.33.0-glm-4.7-flash-s256", "h200-0.33.0-glm-4.7-flash-s64",
                                                  "h200-0.33.0-deepseek-v2-lite-s64", "h200-0.33.0-glm-4.7-flash-s128",
                                                  "h200-0.33.0-deepseek-v2-lite-s128")}


def _start_checks():
    out = []
    for s in SIZED:
        for name, check in (("estimate", check_start), ("check-log", check_start_log)):
            reason = KNOWN_BUDGET_GAPS.get(s.id) or (CHECK_LOG_GAPS.get(s.id) if name == "check-log" else None)
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(s, check, marks=marks, id=f"{s.id}-{name}"))
    return out


@pytest.mark.parametrize(("start", "check"), _start_checks())
def test_within_one_percent_of_the_real_engine(start, check):
    # estimate from the start's settings, and check-log from its log alone (the GPU given)
    result = check(start)
    assert result.runner == start.printed.runner, "the model runner vLLM chose"
    for term in ("kv_budget", "kv_tokens"):
        t = result.term(term)
        if t is not None:
            assert abs(t.error) < 0.01, f"{term}: predicted {t.predicted:,.2f}, vLLM printed {t.printed:,.2f}"


@pytest.mark.parametrize("start", known(SIZED, KNOWN_GRAPH_GAPS), ids=[s.id for s in SIZED])
def test_weights_and_cuda_graphs_per_term(start):
    # "Model loading took" within 0.1 GiB (the widest: gpt-oss-20b, -0.07 GiB); the graph estimate from
    # vLLM's capture sizes within 0.12 GiB of "Estimated CUDA graph memory"
    check = check_start(start)
    weights = check.term("weights")
    assert weights is not None and abs(weights.predicted - weights.printed) < 0.1
    graphs = check.term("cuda_graphs")
    if graphs is not None:
        assert abs(graphs.predicted - graphs.printed) < 0.12


@pytest.mark.parametrize("start", SIZED, ids=[s.id for s in SIZED])
def test_check_log_reads_the_settings_the_start_ran_with(start):
    run = read_log((CORPUS / start.log).read_text())
    assert run.version == start.release
    ran = start_scenario(start)
    name, shape = load_model(str(CORPUS / start.config))
    read, where = log_scenario(run, name, shape, gpu_profile(start.gpu))
    for field in ("max_model_len", "tensor_parallel_size", "memory_fraction", "block_size", "max_num_seqs",
                  "kv_cache_memory_bytes"):
        if getattr(ran, field) is None:
            continue
        if field == "max_num_seqs" and "max_num_seqs" not in run.sources:
            # vLLM 0.31's log prints no non-default args line and no scheduler line with the batch limit: the
            # reader must then say it took the release default, not pass it off as read
            assert where.assumed.get("max_num_seqs") == ("the release default", "not in the log")
            continue
        assert getattr(read, field) == getattr(ran, field), field
    assert read.k_cache_dtype == ran.k_cache_dtype or ran.k_cache_dtype == "auto"
    uncompiled = start.args.get("compilation_config", {}).get("mode") == 0  # vLLM then captures no graphs
    assert (read.cudagraph_mode == "NONE") == (bool(start.args.get("enforce_eager")) or uncompiled)
    assert read.torch_compile == ran.torch_compile == (not start.args.get("enforce_eager") and not uncompiled)


def test_check_log_refuses_to_guess_the_gpu(tmp_path, capsys):
    from app.cli import main

    start = next(s for s in SIZED if s.release == "0.22.1" and s.config.endswith("llama-3.1-8b.json"))
    code = main(["check-log", str(CORPUS / start.log), "--model", str(CORPUS / start.config)])
    assert code == 2
    assert "does not say which GPU" in capsys.readouterr().err


def test_check_log_cli_names_what_it_read_and_what_it_assumed(capsys):
    from app.cli import main

    start = next(s for s in SIZED if s.id.endswith("0.22.1-llama-2-7b"))
    code = main(["check-log", str(CORPUS / start.log), "--model", str(CORPUS / start.config), "--gpu", start.gpu,
                 "--format", "json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["read_from_log"]["gpu_memory_utilization"] == {"value": 0.5, "from": "non-default args"}
    assert out["read_from_log"]["max_model_len"]["value"] == 4096
    assert out["assumed"]["gpu"]["value"] == gpu_profile("h200").name
    rows = {r["term"]: r for r in out["rows"]}
    assert abs(rows["kv_budget_bytes"]["difference_percent"]) < 1


@pytest.mark.parametrize("start", known([s for s in SIZED if s.printed.torch_peak_gib], KNOWN_ACTIVATION_GAPS),
                         ids=lambda s: s.id)
def test_profiling_terms_against_vllms_debug_lines(start):
    # the DEBUG profiling result: torch peak (activation) within 0.12 GiB, non-torch within 0.05 GiB
    check = check_start(start)
    for term, slack in (("activation", 0.12), ("non_torch", 0.05)):
        t = check.term(term)
        assert abs(t.predicted - t.printed) < slack, f"{term}: {t.predicted:.2f} vs printed {t.printed}"


def test_failed_starts_say_why():
    reasons = {s.id: s.reason for s in STARTS if s.status != "sized"}
    assert any("divisible by tensor parallel size" in r for r in reasons.values())  # 14 heads at TP 4


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_manifest_rejects_unknown_fields(tmp_path, engine):
    from sizing.evidence import sglang_starts

    folder, load = (CORPUS, load_corpus) if engine == "vllm" else (sglang_starts.CORPUS, sglang_starts.load_corpus)
    row = json.loads((folder / "manifest.jsonl").read_text().splitlines()[0])
    row["surprise"] = 1
    (tmp_path / "manifest.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(KvsizeError, match="line 1"):
        load(tmp_path)


def test_the_accuracy_page_is_generated_from_the_corpus():
    # docs/accuracy.md is what benchmarks/vllm_starts.py prints from the committed starts, to the byte
    from helpers import load_script

    bench = load_script("vllm_starts")
    assert (CORPUS.parents[2] / "docs" / "accuracy.md").read_text() == bench.report()


def test_the_readme_quotes_the_accuracy_page():
    # README's "Held to the real engine" figures are the benchmark's summary (docs/accuracy.md)
    import re

    root = CORPUS.parents[2]
    readme = (root / "README.md").read_text()
    page = (root / "docs" / "accuracy.md").read_text()
    within = re.search(r"Within 1% on both .*?: (\d+) of (\d+)", page).groups()
    assert f"{within[0]} of {within[1]} predictions within 1%" in readme
    budget = re.search(r"KV budget: median \|error\| ([\d.]+)%", page).group(1)
    errors = [e for r in accuracy_rows(STARTS) for e in (r.kv_budget_error, r.kv_tokens_error) if e is not None]
    worst = max(errors, key=abs)  # signed: above zero promises memory vLLM does not give
    assert f"median {budget}%, worst {100 * worst:+.2f}%" in readme
    sized = sum(1 for s in STARTS if s.status == "sized")
    assert f"{len(STARTS)} real starts ({sized} sized)" in readme
    assert f"{len({s.config for s in SIZED})} configs" in readme
    tp = sum(1 for s in SIZED if s.args.get("tensor_parallel_size", 1) > 1)
    assert f"{tp} starts at TP 2 and 4" in readme


def test_every_config_a_start_ran_cites_its_source():
    # configs/SOURCES.md: each config equals the cited fixture or profile field for field; a quantized
    # checkpoint's config ("BASE+quantization_config") is its base config with that block added
    import re

    root = CORPUS.parents[2]
    rows = dict(re.findall(r"^\| (\S+\.json) \| (\S+) \| .+ \|$", (CORPUS / "configs" / "SOURCES.md").read_text(), re.M))
    for config in sorted((CORPUS / "configs").glob("*.json")):
        assert config.name in rows, config.name
        cited_path, _, added = rows[config.name].partition("+")
        cited = json.loads((root / cited_path).read_text())
        expected = cited["config"] if cited_path.startswith("profiles/") else cited
        found = json.loads(config.read_text())
        if added:
            assert added == "quantization_config" and "quantization_config" not in expected
            found.pop(added)
        assert found == expected, config.name


def test_an_open_residual_is_said_in_the_estimate():
    # the Nemotron-3 activation gap (KNOWN_ACTIVATION_GAPS) reaches the user as a warning, not as a silent figure
    from sizing.capacity.estimate import estimate

    start = next(s for s in SIZED if s.id == "h200-0.26.0-nemotron-3-nano-30b-a3b")
    warnings = estimate(start_scenario(start)).warnings
    assert any("profiling forward of nemotron_h models ran above" in w for w in warnings)
    llama = next(s for s in SIZED if s.id == "h200-0.26.0-llama-3.1-8b")
    assert not any("profiling forward" in w for w in estimate(start_scenario(llama)).warnings)


def test_a_kv_format_a_real_start_failed_on_is_warned_of():
    # h200-0.26.0-llama-3.1-8b-fp8e5m2 did not size (its reason in the manifest); 0.22.1 has no such start
    from dataclasses import replace

    from sizing.capacity.estimate import estimate

    failed = next(s for s in STARTS if s.id == "h200-0.26.0-llama-3.1-8b-fp8e5m2")
    assert failed.status == "failed" and "TRITON_ATTN" in failed.reason
    scenario = start_scenario(failed)
    assert any("failed to start with fp8_e5m2 KV" in w for w in estimate(scenario).warnings)
    older = replace(scenario, engine="vllm@0.22.1")
    assert not any("failed to start" in w for w in estimate(older).warnings)


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-8b"])
def test_a_warm_compile_cache_frees_the_autotuning_copies(model):
    # the same start twice on one H200 (0.26.0): the second loads the first's compiled graph ("Directly load
    # the compiled graph" in its log) and its torch peak drops (Llama-3.1-8B 1.10 -> 0.88 GiB, Qwen3-8B
    # 1.29 -> 0.78 GiB); check-log reads which, and kvsize's activation follows within vLLM's two decimals
    cold, warm = (next(s for s in SIZED if s.id == f"h200-0.26.0-{model}-{kind}") for kind in ("cold", "warm"))
    assert cold.args == warm.args
    reads = []
    for start in (cold, warm):
        run = read_log((CORPUS / start.log).read_text())
        name, shape = load_model(str(CORPUS / start.config))
        scenario, _ = log_scenario(run, name, shape, gpu_profile(start.gpu))
        reads.append(scenario.compile_cache_hit)
    assert reads == [False, True]
    a, b = check_start(cold).term("activation"), check_start(warm).term("activation")
    assert a.printed - b.printed > 0.2 and abs((a.predicted - b.predicted) - (a.printed - b.printed)) < 0.1


def test_the_fp8_graph_residual_is_said_in_the_estimate():
    # QWEN35_FP8_GRAPHS (KNOWN_BUDGET_GAPS) reaches the user as a warning on fp8 KV, not on the bf16 start
    from sizing.capacity.estimate import estimate

    def warned(start_id):
        start = next(s for s in SIZED if s.id == start_id)
        return any("with an fp8 KV cache" in w for w in estimate(start_scenario(start)).warnings)

    assert warned("h200-0.26.0-qwen3.5-35b-a3b-text-fp8")
    assert not warned("h200-0.26.0-qwen3.5-35b-a3b-text")


def test_the_fit_reproduces_the_shipped_graph_constants():
    # scripts/fit_vllm_terms.py over the committed starts gives the constants every release file ships, and the
    # files name the starts they were fitted on
    from helpers import load_script
    from sizing.engines.releases import ENGINES_DIR

    fit = load_script("fit_vllm_terms")
    constants = fit.fitted_constants()
    ids = constants.pop("fitted_on")
    assert len(ids) >= 30
    for name in fit.FITTED_FILES:
        data = json.loads((ENGINES_DIR / name).read_text())
        shipped = {k: data["cuda_graph_estimate"][k] for k in constants}
        assert shipped == constants, name
        assert all(i in data["sources"]["cuda_graph_estimate.fitted_on"] for i in ids)


def test_the_readme_quotes_the_prospective_figure():
    import re

    root = CORPUS.parents[2]
    page = (root / "docs" / "accuracy.md").read_text()
    before, total = re.search(r"predicted before seen, (\d+) of (\d+) within 1%", page).groups()
    assert f"{before} of {total} starts came within 1%" in (root / "README.md").read_text()


def test_the_fit_reproduces_the_shipped_non_torch_constants():
    # each release file's one-GPU non-torch figure (V1 and V2 runner) is the middle of what its starts print
    import json

    from helpers import load_script
    from sizing.engines.releases import ENGINES_DIR

    fit = load_script("fit_vllm_terms").fit_non_torch()
    assert fit, "no start prints its non-torch memory"
    for name, runners in fit.items():
        shipped = json.loads((ENGINES_DIR / name).read_text())["non_torch"]
        for runner, (value, ids) in runners.items():
            key = {"v1": "single_gpu_bytes", "v2": "single_gpu_v2_bytes", "tp": "tensor_parallel_bytes"}[runner]
            assert shipped[key] == value, (name, runner, ids)


def test_the_fit_reproduces_the_v2_non_torch_and_graph_terms_of_0_27_to_0_33():
    # scripts/fit_vllm_terms.py --write wrote them; a start added or a value edited by hand makes them drift apart
    import json

    from helpers import load_script
    from sizing.engines.releases import ENGINES_DIR

    fit = load_script("fit_vllm_terms")
    data = json.loads((ENGINES_DIR / fit.LOGIT_FILE).read_text())
    logits = fit.fit_sampled_logit_non_torch()
    assert set(logits) == {sub["release"] for sub in data["sub_ranges"]}
    for sub in data["sub_ranges"]:
        got = logits[sub["release"]]
        for key in ("single_gpu_bytes", "single_gpu_v2_bytes", "v2_bytes_per_sampled_logit"):
            assert sub["non_torch"][key] == got[key], (sub["release"], key)
        assert all(i in sub["sources"]["non_torch"] for i in got["v2_starts"])
    per_layer, ids = fit.fit_v2_graph_per_layer()
    assert ids and data["cuda_graph_estimate"]["v2_per_layer_bytes"] == per_layer
    base, per_graph_layer, mla_ids = fit.fit_v2_flash_attn_mla()
    graphs = data["cuda_graph_estimate"]
    assert len(mla_ids) >= 5 and (graphs["v2_mla_piecewise_base_bytes"],
                                  graphs["v2_mla_piecewise_graph_layer_bytes"]) == (base, per_graph_layer)
    assert all(i in data["sources"]["cuda_graph_estimate.v2_mla_piecewise"] for i in mla_ids)


def test_every_started_release_of_0_27_to_0_33_is_within_1_percent():
    # the bar of the release panels: KV budget and tokens within 1% on every start of 0.27.1-0.33.0, TP 2 and 4 too
    rows = [r for r in accuracy_rows(STARTS) if r.release in ("0.27.0", "0.27.1", "0.28.0", "0.29.0", "0.30.0",
                                                               "0.31.0", "0.32.0", "0.33.0")]
    # the panel starts (6 a release, 0.30.0's five), the TP starts of the torch-2.13 releases (0.27.0: 2, 0.28.0: 2,
    # 0.29.0: 3, 0.31.0: 2, 0.32.0: 3), 0.28.0's and 0.29.0's one-GPU fp8 and gemma leftovers folded into their
    # panels, the small-GPU batch defaults (0.29.0: 2, 0.31.0: 1), and 0.33.0's 23, its 3 PP 2 starts and its 3 MLA
    # starts with fp8 KV (mla-fp8-0.33), the TP 2 starts of 0.27.1 and 0.30.0 (3 each, tp-0.30-0.27.1), and 0.33.0's
    # eight MLA graph starts (mla-graphs-0.33), whose check-log misses the sequences a start set (CHECK_LOG_GAPS) and
    # one of which is a named miss (GLM_SPLIT_BLOCK), the four of their check (mla-graphs-check-0.33), one the same
    # named miss, graphs-edge-0.33's four, dense-probe-0.33's four and the seven sized of small-pool-0.33 and its
    # rerun (two named misses, SCOUT_V2_PEAK and LLAMA70_FP8W_GRAPHS; the two refused at 32,768 tokens are not sized)
    assert len({r.id for r in rows}) == ((6 + 2) + 6 + (6 + 2) + (6 + 3 + 2) + 5 + (6 + 2 + 1) + (6 + 3) + 23 + 3 + 3
                                         + 3 + 3 + 8 + 4 + 4 + 4 + 7)
    rows = [r for r in rows if r.id not in KNOWN_BUDGET_GAPS
            and not (r.id in CHECK_LOG_GAPS and r.by == "check-log")]
    for r in rows:
        # a pipeline-parallel start's binding (last) stage prints no "Available KV cache memory": tokens alone
        assert r.kv_tokens_error is not None and abs(r.kv_tokens_error) < 0.01, r.id
        assert r.kv_budget_error is None or abs(r.kv_budget_error) < 0.01, r.id


def test_the_fit_reproduces_the_tensor_parallel_terms_of_0_27_to_0_33():
    # the TP non-torch base (one for the range) and each sub-range's per-logit figure, and the V2 sampler's logit
    # copies at TP, as scripts/fit_vllm_terms.py --write wrote them from the TP starts of 0.27.0-0.33.0
    import json

    from helpers import load_script
    from sizing.engines.releases import ENGINES_DIR

    fit = load_script("fit_vllm_terms")
    data = json.loads((ENGINES_DIR / fit.LOGIT_FILE).read_text())
    non_torch, copies = fit.fit_tensor_parallel_non_torch(), fit.fit_tensor_parallel_logit_copies()
    assert len(non_torch["starts"]) >= 17 and non_torch["from"] == ["0.27", "0.29", "0.31", "0.33"]
    for part in (data, *data["sub_ranges"]):
        assert part["non_torch"]["tensor_parallel_bytes"] == non_torch["tensor_parallel_bytes"], part["release"]
    for sub in data["sub_ranges"]:  # they tile the range, so the range's own non_torch is never used whole
        # TP takes each sub-range's one-GPU per-logit figure as it is (the sampler's state on every rank)
        assert sub["non_torch"]["v2_bytes_per_sampled_logit"] == non_torch["per_logit_by_range"][sub["release"]]
    assert all(i in data["sources"]["non_torch.tensor_parallel"] for i in non_torch["starts"])
    # the envelope: no TP start leaves more beside the sampler's state than kvsize keeps
    assert max(non_torch["residuals_gib"].values()) * 2**30 <= non_torch["tensor_parallel_bytes"] + 2**20
    # one figure a group of sub-ranges: 0.33.0's (the range's own) and 0.27.0-0.32.0's, which sample once
    assert data["activation_v2"]["tensor_parallel_logit_copies"] == copies["0.33"]["tensor_parallel_logit_copies"]
    for sub in data["sub_ranges"][:-1]:
        assert sub["tensor_parallel_logit_copies"] == copies["0.27-0.32"]["tensor_parallel_logit_copies"]
    assert copies["0.27-0.32"]["tensor_parallel_logit_copies"] < copies["0.33"]["tensor_parallel_logit_copies"]
    from sizing.engines.releases import find_release
    for version, group in (("0.28.0", "0.27-0.32"), ("0.32.0", "0.27-0.32"), ("0.33.0", "0.33")):
        run = find_release("vllm", version).activation_v2  # the sub-range's figure reaches the release it resolves to
        assert run.tensor_parallel_logit_copies == copies[group]["tensor_parallel_logit_copies"], version
    assert all(i in data["sources"]["activation_v2.tensor_parallel_logit_copies"]
               for fit in copies.values() for i in fit["starts"])

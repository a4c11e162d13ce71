"""Property-based tests over every reader and the CLI's options: whatever the input, kvsize answers
or refuses in one line (KvsizeError, exit 2); no other exception escapes, nothing hangs."""

import json

from hypothesis import HealthCheck, given, settings, strategies as st

from app.cli import INTERNAL_ERROR, main
from sizing.errors import KvsizeError
from sizing.evidence.logs import read_log
from sizing.engines.releases import version_key
from sizing.config import parse_config_text, resolve_shape
from sizing.units import parse_size
from sizing.engines.vllm_args import read_command, read_engine_args, read_logged_args
from sizing.planners.workload import parse_workload_text

# derandomize: CI runs the same examples each time (a red CI must mean a change broke something);
# raise KVSIZE_PROPERTY_EXAMPLES and drop derandomize locally to search further
FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

# JSON-like values of every kind, to put where a reader expects one kind
values = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True)
                      | st.text(max_size=12), lambda inner: st.lists(inner, max_size=4)
                      | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
CONFIG_FIELDS = ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                 "vocab_size", "intermediate_size", "max_position_embeddings", "sliding_window", "layer_types",
                 "num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "kv_lora_rank",
                 "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "rope_scaling", "torch_dtype",
                 "tie_word_embeddings", "architectures", "text_config", "quantization_config", "layers_block_type",
                 "hybrid_override_pattern", "mamba_head_dim", "ssm_state_size", "attention_chunk_size"]
MODEL_TYPES = ["llama", "qwen3_moe", "deepseek_v2", "gemma2", "nemotron_h", "mystery", "mixtral", "qwen3_next"]


def _only_kvsize_errors(fn, *args):
    try:
        fn(*args)
    except KvsizeError as e:
        assert "\n" not in str(e), str(e)


@FAST
@given(st.sampled_from(MODEL_TYPES), st.dictionaries(st.sampled_from(CONFIG_FIELDS), values, max_size=8))
def test_any_config_is_sized_or_refused(model_type, fields):
    base = {"model_type": model_type, "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
            "vocab_size": 100}
    base.update(fields)
    _only_kvsize_errors(lambda: resolve_shape(parse_config_text(json.dumps(base))))


@FAST
@given(st.text(max_size=400))
def test_any_config_text_is_read_or_refused(text):
    _only_kvsize_errors(parse_config_text, text)


@FAST
@given(st.lists(st.sampled_from(["Available KV cache memory: ", "GPU KV cache size: ", " tokens", " GiB",
                                 "non-default args: ", "{", "}", "'max_model_len': ", "Model loading took ",
                                 "Maximum concurrency for ", " tokens per request: ", "x", "LLM engine (v0.22.1)",
                                 "1", "2.5", ",", "-", ".", "nan", "\n", "'", "9" * 30]), max_size=40))
def test_any_log_is_read_or_refused(parts):
    _only_kvsize_errors(read_log, "".join(parts))


@FAST
@given(st.text(max_size=300))
def test_any_logged_args_line_is_read_or_refused(text):
    def read(t):
        read_engine_args(read_logged_args(t), from_log=True)
    _only_kvsize_errors(read, text)


@FAST
@given(st.text(max_size=300))
def test_any_workload_text_is_read_or_refused(text):
    _only_kvsize_errors(parse_workload_text, text)


@FAST
@given(st.dictionaries(st.sampled_from(["peak_concurrency", "buckets", "name", "itl_target_ms", "sessions",
                                        "prefix_cache_share", "draft"]), values, max_size=5))
def test_any_workload_structure_is_read_or_refused(data):
    _only_kvsize_errors(parse_workload_text, json.dumps(data, default=str))


@FAST
@given(st.lists(st.text(max_size=12) | st.sampled_from(["--max-model-len", "-tp", "--enforce-eager", "32k",
                                                       "--kv-cache-dtype", "--compilation-config", "-O3",
                                                       "--gpu-memory-utilization", "0.9", "vllm", "serve"]),
                max_size=10))
def test_any_vllm_command_is_read_or_refused(words):
    _only_kvsize_errors(read_command, words)


@FAST
@given(st.text(max_size=40))
def test_any_size_and_version_is_read_or_refused(text):
    _only_kvsize_errors(parse_size, text, "--gpu-memory")
    _only_kvsize_errors(version_key, text)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(st.sampled_from(["--max-model-len", "--gpu-memory", "--gpu-memory-utilization", "--block-size",
                        "--kv-cache-dtype", "--engine", "--tensor-parallel-size", "--concurrency",
                        "--max-num-seqs", "--kv-cache-memory", "--weights-dtype", "--layer-kv-dtype"]),
       st.text(max_size=20))
def test_any_estimate_option_value_answers_or_refuses(option, value):
    code = main(["estimate", "--model", "llama-3.1-8b", option, value, "--format", "json"])
    assert code in (0, 2) and code != INTERNAL_ERROR


OPTION_VALUES = st.text(max_size=10) | st.sampled_from(["0", "-1", "1", "1.5", "nan", "inf", "1e400", "32k", "80GiB",
                                                       "auto", "fp8", "nvfp4", "vllm@0.22", "sglang", "h200", "9" * 50])


@settings(max_examples=int(__import__("os").environ.get("KVSIZE_PROPERTY_EXAMPLES", 60)), deadline=None,
          derandomize=True)
@given(st.sampled_from(["estimate", "compare", "tiers"]),
       st.dictionaries(st.sampled_from(["--max-model-len", "--gpu", "--engine", "--gpu-memory", "--concurrency",
                                        "--kv-cache-dtype", "--block-size", "--tensor-parallel-size",
                                        "--pipeline-parallel-size", "--max-num-seqs", "--headroom",
                                        "--mtp-layers", "--cuda-graph-memory", "--host-memory", "--session-tokens"]),
                       OPTION_VALUES, max_size=4))
def test_any_option_values_answer_or_refuse(command, options):
    argv = [command, "--model", "llama-3.1-8b"]
    if command == "tiers":
        argv += ["--workload", "examples/multi-turn-chat.yaml"]
    for option, value in options.items():
        if command != "tiers" and option in ("--host-memory", "--session-tokens"):
            continue
        argv += [option, value]
    code = main(argv)
    assert code in (0, 1, 2), argv

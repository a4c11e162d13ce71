"""Every reader at kvsize's doors, fed text a fuzzer writes: it answers, or refuses in one line naming what it
read (a KvsizeError), and never raises anything else. The texts are built around each format's own shape (JSON
objects with the fields kvsize reads, /metrics lines, log lines, YAML workloads) so that the fuzzer reaches the
readers' field checks, not only their parsers."""

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sizing.errors import KvsizeError

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# values the fuzzer puts where a reader expects a number, a name or a list
LEAVES = st.one_of(st.none(), st.booleans(), st.integers(min_value=-10**30, max_value=10**30),
                   st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
                   st.lists(st.integers(min_value=-5, max_value=10**6), max_size=4))


def one_line_or_answer(read, *args):
    try:
        read(*args)
    except KvsizeError as e:
        text = str(e)
        assert text and "\n" not in text.strip(), text


def checked_or_refused(report):
    """validate's check of a report: a list of one-line problems, or a one-line refusal."""
    from measure.validate import checked

    try:
        problems = checked(report, None)
    except KvsizeError as e:
        assert "\n" not in str(e).strip()
    else:
        assert isinstance(problems, list) and all(isinstance(p, str) for p in problems)


CONFIG_KEYS = ["architectures", "model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
               "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
               "torch_dtype", "tie_word_embeddings", "sliding_window", "layer_types", "kv_lora_rank",
               "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "num_experts", "num_experts_per_tok",
               "moe_intermediate_size", "quantization_config", "rope_scaling", "text_config", "q_lora_rank"]
BASE_CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
               "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
               "intermediate_size": 14336, "vocab_size": 128256, "max_position_embeddings": 131072,
               "torch_dtype": "bfloat16"}


@SETTINGS
@given(st.dictionaries(st.sampled_from(CONFIG_KEYS), LEAVES, max_size=6))
def test_a_config_with_any_field_any_value_is_sized_or_refused_in_one_line(changes):
    from sizing.config import parse_config_text, resolve_shape

    def read(text):
        resolve_shape(parse_config_text(text))

    one_line_or_answer(read, json.dumps({**BASE_CONFIG, **changes}, allow_nan=True))


METRIC_NAMES = ["vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
                "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total",
                "vllm:cache_config_info"]
VALUES = st.one_of(st.sampled_from(["0", "1.5", "+Inf", "-Inf", "NaN", "1e400", "-3", "abc", ""]),
                   st.integers(min_value=-10**20, max_value=10**20).map(str))


@SETTINGS
@given(st.lists(st.tuples(st.sampled_from(METRIC_NAMES), st.text(max_size=20), VALUES), max_size=8))
def test_a_scrape_of_any_lines_is_read_or_refused_in_one_line(lines):
    from sizing.evidence.metrics import read_metrics

    text = "\n".join(f'{name}{{engine="0",{label}}} {value}' for name, label, value in lines)
    one_line_or_answer(read_metrics, text)


LOG_LINES = st.sampled_from([
    "non-default args: {{'model': 'm', 'max_model_len': {v}, 'gpu_memory_utilization': {v}}}",
    "Model loading took {v} GiB and 1.0 seconds", "Available KV cache memory: {v} GiB",
    "GPU KV cache size: {v} tokens", "Maximum concurrency for {v} tokens per request: {v}x",
    "Estimated CUDA graph memory: {v} GiB total", "vLLM version {v}",
    "max_total_num_tokens={v}, chunked_prefill_size={v}", "server_args=ServerArgs(model_path='m', tp_size={v})",
    "KV Cache is allocated. #tokens: {v}, K size: {v} GB, V size: {v} GB"])


@SETTINGS
@given(st.lists(st.tuples(LOG_LINES, VALUES), max_size=8))
def test_an_engine_log_of_any_lines_is_read_or_refused_in_one_line(lines):
    from sizing.evidence.logs import read_log

    one_line_or_answer(read_log, "\n".join(template.format(v=value) for template, value in lines))


WORKLOAD_KEYS = ["name", "peak_concurrency", "prefix_cache_share", "itl_target_ms", "ttft_target_ms", "buckets",
                 "percentiles", "draft", "sessions"]


@SETTINGS
@given(st.dictionaries(st.sampled_from(WORKLOAD_KEYS), LEAVES, max_size=5),
       st.lists(st.dictionaries(st.sampled_from(["name", "max_context_tokens", "share_percent", "output_tokens",
                                                 "prompt_tokens"]), LEAVES, max_size=5), max_size=3))
def test_a_workload_of_any_fields_is_read_or_refused_in_one_line(fields, buckets):
    from sizing.planners.workload import parse_workload_text

    record = {"name": "w", "peak_concurrency": 10, **fields}
    if buckets:
        record["buckets"] = buckets
    one_line_or_answer(parse_workload_text, json.dumps(record, allow_nan=True))


DEPLOYMENT_KEYS = ["model", "gpu", "engine", "tensor_parallel_size", "kv_cache_dtype", "kv_format", "max_model_len",
                   "concurrency", "num_blocks", "block_size", "max_concurrency", "hit_rate", "extra"]


@SETTINGS
@given(st.sampled_from(["kvsize.plan/1", "kvsize.estimate/1", "other", 5]),
       st.one_of(st.none(), st.dictionaries(st.sampled_from(DEPLOYMENT_KEYS), LEAVES, max_size=8)))
def test_a_plan_file_of_any_deployment_is_read_or_refused_in_one_line(schema, deployment):
    from sizing.planners.deployment import read_deployment

    one_line_or_answer(read_deployment, json.dumps({"schema": schema, "deployment": deployment}, allow_nan=True),
                       "plan.json")


@SETTINGS
@given(st.dictionaries(st.sampled_from(["schema", "device", "capacity", "decode", "allocation", "kernels", "log",
                                        "predicted", "settings"]), LEAVES, max_size=5))
def test_a_measurement_report_of_any_fields_is_checked_or_refused_in_one_line(fields):
    checked_or_refused({"schema": "kvsize.measure/1", **fields})


def _paths(value, prefix=()):
    """Every (path, leaf) of a JSON value."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list) and value:
        for i, v in enumerate(value[:3]):
            yield from _paths(v, (*prefix, i))
    else:
        yield prefix


def _committed(name):
    from pathlib import Path

    return json.loads((Path(__file__).resolve().parent.parent / "measure" / "reports" / name).read_text())


REPORTS = {path.name: _committed(path.name) for path in sorted(
    (__import__("pathlib").Path(__file__).resolve().parent.parent / "measure" / "reports").glob("*.json"))}
FIELDS = [(name, path) for name, report in REPORTS.items() for path in _paths(report) if path]


@settings(max_examples=int(__import__("os").environ.get("KVSIZE_FUZZ_EXAMPLES", "200")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FIELDS), LEAVES)
def test_a_committed_report_with_one_field_of_any_value_is_checked_or_refused_in_one_line(field, value):
    # every field of the committed reports (capacity, verify, decode kernels, transfers, TP) set to a number,
    # a string, NaN or a list in turn: validate names the problem, never crashes
    import copy

    name, path = field
    report = copy.deepcopy(REPORTS[name])
    node = report
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    checked_or_refused(report)


def test_a_flag_or_a_zero_where_a_measured_number_belongs_is_named():
    import copy

    from measure.validate import checked

    report = copy.deepcopy(REPORTS["h200-decode-kernels.json"])
    report["kernels"][1]["median_ms"] = False
    assert checked(report, None) == ["report.kernels[1].median_ms is true or false where a measured number belongs"]
    report["kernels"][1]["median_ms"] = 0
    assert any("a zero where a measured time" in p for p in checked(report, None))


def test_a_context_no_model_has_is_named_not_blamed_on_the_weights():
    # the rotary cache grows with max_position_embeddings: 10^15 positions are refused by that field's name
    from sizing.config import parse_config_text, resolve_shape

    try:
        resolve_shape(parse_config_text(json.dumps({**BASE_CONFIG, "max_position_embeddings": 10**15})))
    except KvsizeError as e:
        assert "'max_position_embeddings'" in str(e) and "weights" not in str(e)
    else:
        raise AssertionError("a context of 10^15 positions was sized")


def test_validate_refuses_a_flag_where_a_number_belongs_as_a_malformed_report(tmp_path, capsys):
    # a report that is not one is refused in one line (exit 2), not counted as a disagreeing measurement (exit 1)
    import copy

    from app.cli import main

    report = copy.deepcopy(REPORTS["h200-decode-kernels.json"])
    report["kernels"][1]["median_ms"] = False
    path = tmp_path / "r.json"
    path.write_text(json.dumps(report))
    assert main(["validate", str(path)]) == 2
    assert "median_ms is true or false" in capsys.readouterr().err
